"""Domains, the factory, and the `dpsql ldp` commands run through `main`."""

from __future__ import annotations

import io
import math
import subprocess
import sys

import numpy as np
import pytest

from dpsql import ldp
from dpsql.cli.ldp import main
from dpsql.ldp.advise import compare, recommend
from dpsql.policy import LOCAL_EPSILON_RANGE


def test_domain_of_labels_and_errors():
    m = ldp.mechanism("grr", 1.0, ["a", "b", "c"])
    np.testing.assert_array_equal(m.domain.index(["c", "a", "c"]), [2, 0, 2])
    with pytest.raises(ValueError, match="not in the domain"):
        m.domain.index(["a", "z"])
    with pytest.raises(ValueError, match="not in the domain"):
        ldp.mechanism("oue", 1.0, range(4)).perturb([1, 4])
    with pytest.raises(ValueError, match="unknown mechanism"):
        ldp.mechanism("nope", 1.0, range(4))
    with pytest.raises(ValueError, match="epsilon"):
        ldp.mechanism("grr", 0.0, range(4))


def test_default_randomness_is_not_repeatable():
    m = ldp.mechanism("oue", 1.0, range(64))
    values = np.arange(64).repeat(10)
    assert not np.array_equal(m.perturb(values), m.perturb(values))


def test_perturb_then_estimate_round_trip(tmp_path):
    labels = [f"city{i}" for i in range(6)]
    (tmp_path / "domain.txt").write_text("\n".join(labels) + "\n")
    rng = np.random.default_rng(0)
    values = rng.choice(labels, size=20_000, p=[0.4, 0.3, 0.15, 0.1, 0.05, 0.0])
    for name in ("grr", "oue", "olh", "hr", "hh"):
        base = ["--mechanism", name, "--epsilon", "2", "--domain", str(tmp_path / "domain.txt")]
        out = io.StringIO()
        main(
            ["perturb", *base, "--seed", "1"],
            stdin=io.StringIO("city\n" + "\n".join(values)),
            stdout=out,
        )
        reports = out.getvalue()
        assert reports.count("\n") == 20_001
        est_out = io.StringIO()
        main(
            ["estimate", *base, "--postprocess", "norm-sub"],
            stdin=io.StringIO(reports),
            stdout=est_out,
        )
        lines = est_out.getvalue().splitlines()[1:]
        est = {k: float(v) for k, v in (line.split(",") for line in lines)}
        m = ldp.mechanism(name, 2.0, labels)
        tolerance = 6 * math.sqrt(m.variance(20_000, 8000))
        assert abs(est["city0"] - np.sum(values == "city0")) < tolerance, name
        assert sum(est.values()) == pytest.approx(20_000)


def test_advise_prints_a_recommendation():
    out = io.StringIO()
    main(["advise", "--domain-size", "1085", "--epsilon", "2", "--users", "2750000"], stdout=out)
    text = out.getvalue()
    assert "recommended:" in text and "oue" in text and "hr" in text


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0])
def test_randomised_response_wins_only_below_3e_eps_plus_2(epsilon):
    threshold = 3 * math.exp(epsilon) + 2
    for d in (3, 5, 8, 12, 20, 30, 60, 200, 1085):
        rows = compare(d, epsilon, 100_000)
        grr = next(r for r in rows if r.name == "grr")
        oue = next(r for r in rows if r.name == "oue")
        assert (grr.rmse < oue.rmse) == (d < threshold)
        if recommend(rows).name == "grr":
            assert d < threshold


def test_the_dpsql_command_runs_ldp_actions(tmp_path):
    # `dpsql ldp ...` printed dpsql's own help and did nothing: its actions set a
    # handler the ldp module's main called, but not the `run` that dpsql's main calls
    values = "\n".join(str(i % 5) for i in range(2000))
    perturbed = subprocess.run(
        [sys.executable, "-m", "dpsql.cli", "ldp", "perturb", "-m", "oue", "-e", "2",
         "--domain-size", "5"], input=values, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert perturbed.returncode == 0, perturbed.stderr
    assert perturbed.stdout.count("\n") >= 2000
    estimated = subprocess.run(
        [sys.executable, "-m", "dpsql.cli", "ldp", "estimate", "-m", "oue", "-e", "2",
         "--domain-size", "5"], input=perturbed.stdout, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert estimated.returncode == 0, estimated.stderr
    counts = [float(line.split(",")[1]) for line in estimated.stdout.splitlines()[1:]]
    assert len(counts) == 5 and sum(counts) == pytest.approx(2000, rel=0.3)


@pytest.mark.parametrize("epsilon", LOCAL_EPSILON_RANGE)
@pytest.mark.parametrize("name", [m for m in ldp.MECHANISMS if m != "dse"])  # dse: >= ln 2
def test_every_oracle_randomises_and_estimates_at_both_ends_of_its_range(name, epsilon):
    # OLH overflowed from epsilon 45 on, and HR, SHE, THE and RM divided by zero at 1e-20
    m = ldp.mechanism(name, epsilon, list(range(10)))
    values = np.arange(500) % 10
    estimate = m.estimate(m.perturb(values, np.random.default_rng(0)))
    assert np.all(np.isfinite(estimate)) and np.isfinite(m.variance(500, 50))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["perturb", "-m", "olh", "-e", "800"], "epsilon must be between 1e-12 and 40, got 800"),
        (["perturb", "-m", "hr", "-e", "nan"], "epsilon must be between 1e-12 and 40, got nan"),
        (["estimate", "-m", "oue", "-e", "1"], "cannot read the reports as oue reports"),
    ],
)
def test_bad_ldp_options_and_reports_are_one_line(argv, message, monkeypatch):
    from dpsql.cli import main as dpsql_main

    monkeypatch.setattr(sys, "stdin", io.StringIO("report\nnot-a-report\n"))
    with pytest.raises(SystemExit, match=message):
        dpsql_main(["ldp", *argv, "--domain-size", "10"])
