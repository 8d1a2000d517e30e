"""examples/reproduce.py at its smoke size: every seed's section, table and figure is written,
and the seed-001 central mechanisms the page compares behave as their closed forms say."""

from __future__ import annotations

import math
import re
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

import reproduce  # noqa: E402 -- examples/ is not a package
import seed001_central  # noqa: E402

from dpsql.mechanisms.laplace import DiscreteLaplace  # noqa: E402
from dpsql.mechanisms.selection import threshold  # noqa: E402


def test_reproduce_smoke_writes_every_section_and_figure(tmp_path: Path) -> None:
    page = reproduce.main(["--smoke", "--out", str(tmp_path)])
    text = page.read_text()
    for seed in ("Seed 000", "Seed 001", "Seed 002", "Seed 003", "Seed 004"):
        assert f"## {seed}" in text
    images = re.findall(r"!\[[^]]*\]\((img/[^)]+\.png)\)", text)
    assert len(images) >= 7
    for image in images:
        assert (tmp_path / image).stat().st_size > 20_000, image
    # the staircase's closed-form ratios, whatever the sample size
    for ratio in ("0.960 (0.96)", "0.851 (0.85)", "0.413 (0.41)", "0.067 (0.067)"):
        assert ratio in text
    assert text.count("Departures") >= 3


def test_stability_histogram_releases_no_empty_cell_and_nothing_below_tau() -> None:
    rng = np.random.default_rng(7)
    truth = np.zeros(5_000, dtype=np.int64)
    truth[:300] = rng.integers(1, 80, 300)
    for epsilon in (0.5, 2.0):
        released = seed001_central.central("stability", epsilon, truth, rng)
        tau = threshold(epsilon, 1 / (2 * truth.sum()), seed001_central.SENSITIVITY)
        assert np.all(released[truth == 0] == 0)
        assert np.all((released == 0) | (released >= tau))


def test_laplace_histogram_rmse_matches_its_closed_form() -> None:
    rng = np.random.default_rng(8)
    truth = rng.integers(0, 1_000, 20_000)
    released = seed001_central.central("laplace", 1.0, truth, rng)
    variance = DiscreteLaplace(seed001_central.SENSITIVITY, Fraction(1)).variance()
    # mean of 20,000 squared Laplace draws: relative sd sqrt(5 / 20,000) (kurtosis 6)
    measured = np.mean((released - truth) ** 2)
    assert measured == pytest.approx(variance, rel=5 * math.sqrt(5 / 20_000))
    assert seed001_central.closed_rmse("laplace", 1.0, truth) == pytest.approx(math.sqrt(variance))
