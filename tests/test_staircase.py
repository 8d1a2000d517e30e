"""The staircase mechanism: choice of the step, exact privacy ratio, closed forms and the sampler.

Exact checks use 90-digit decimals over the support (the tails beyond it are
below 1e-40); sampled checks use fixed seeds and 6-standard-error tolerances
from the exact moments.
"""

from __future__ import annotations

import importlib.util
import math
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from test_samplers import digits90  # noqa: F401 (a fixture)

from dpsql.accounting import Cost
from dpsql.mechanisms import samplers, staircase
from dpsql.mechanisms.base import NoiseMechanism
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.mechanisms.samplers import secure_generator
from dpsql.mechanisms.staircase import GridStaircase, Staircase, continuous_gamma

N = 1_000_000
SIGMAS = 6


pytestmark = pytest.mark.usefixtures("digits90")


def _b(epsilon: float) -> Decimal:
    return (-Decimal(Fraction(epsilon).numerator) / Decimal(Fraction(epsilon).denominator)).exp()


def _pmf(mech: Staircase, reach: int) -> dict[int, Decimal]:
    """The exact pmf over [-reach, reach], normalised over all of Z in closed form."""
    b = _b(mech.epsilon)
    delta, r = mech.sensitivity, mech.steps
    block = r + b * (delta - r)
    total = 2 * block / (1 - b) - 1
    return {i: b ** mech.weight_exponent(i) / total for i in range(-reach, reach + 1)}


def _reach(mech: Staircase) -> int:
    """Blocks enough that the pmf beyond is below 1e-40."""
    return mech.sensitivity * (math.ceil(92 / float(mech.epsilon)) + 1)


# --- the step r and the closed forms --------------------------------------------------------------

# (Delta, epsilon) -> (r*, E|X| staircase / E|X| discrete Laplace), mechanisms.md section 2
REFERENCE = {
    (2, 1): (1, 0.971),
    (2, 5): (1, 0.242),
    (2, 10): (1, 0.020),
    (10, 1): (4, 0.960),
    (10, 2): (3, 0.851),
    (10, 5): (1, 0.347),
    (100, 1): (38, 0.960),
    (100, 2): (27, 0.851),
    (100, 5): (8, 0.413),
    (100, 10): (1, 0.046),
}


@pytest.mark.parametrize(("delta", "epsilon"), list(REFERENCE))
def test_step_and_error_ratio_match_the_reference(delta: int, epsilon: float) -> None:
    mech = Staircase(delta, float(epsilon))
    steps, ratio = REFERENCE[delta, epsilon]
    assert mech.steps == steps
    laplace = DiscreteLaplace(delta, float(epsilon)).expected_abs_error()
    assert round(mech.expected_abs_error() / laplace, 3) == ratio


@pytest.mark.parametrize("objective", ["abs", "var"])
@pytest.mark.parametrize(("delta", "epsilon"), [(7, 1.0), (40, 2.5), (64, 6.0), (9, 0.3)])
def test_step_is_the_global_optimum(objective: str, delta: int, epsilon: float) -> None:
    mech = Staircase(delta, epsilon, objective)

    def value(r: int) -> float:
        other = Staircase(delta, epsilon, r / delta)
        assert other.steps == r
        return other.expected_abs_error() if objective == "abs" else other.variance()

    assert value(mech.steps) <= min(value(r) for r in range(1, delta + 1)) * (1 + 1e-12)


@pytest.mark.parametrize(
    ("delta", "epsilon", "gamma"), [(2, 1.0, "abs"), (10, 2.0, "var"), (25, 0.5, 0.3), (5, 7.0, 1)]
)
def test_closed_forms_match_exact_sums(delta: int, epsilon: float, gamma: float | str) -> None:
    mech = Staircase(delta, epsilon, gamma)
    pmf = _pmf(mech, _reach(mech))
    assert sum(pmf.values()) == pytest.approx(Decimal(1), abs=Decimal("1e-35"))
    abs_mean = sum(abs(i) * p for i, p in pmf.items())
    second = sum(i * i * p for i, p in pmf.items())
    assert mech.expected_abs_error() == pytest.approx(float(abs_mean), rel=1e-11)
    assert mech.variance() == pytest.approx(float(second), rel=1e-11)
    # the exact 95% interval: the smallest m with P(|Z| <= m) >= 0.95
    m = int(mech.interval95())
    assert sum(p for i, p in pmf.items() if abs(i) <= m) >= Decimal("0.95")
    if m:
        assert sum(p for i, p in pmf.items() if abs(i) <= m - 1) < Decimal("0.95")


def test_continuous_gammas_match_the_reference() -> None:
    for epsilon, abs_gamma, var_gamma in ((1, 0.37754, 0.41674), (5, 0.07586, 0.14448)):
        assert continuous_gamma(epsilon, "abs") == pytest.approx(abs_gamma, abs=1e-5)
        assert continuous_gamma(epsilon, "var") == pytest.approx(var_gamma, abs=1e-5)


# --- privacy: the exact ratio on the integer grid -------------------------------------------------


@pytest.mark.parametrize(
    ("delta", "epsilon", "gamma"), [(2, 1.0, "abs"), (10, 2.0, "abs"), (7, 0.7, 1)]
)
def test_exact_privacy_ratio_is_e_epsilon(delta: int, epsilon: float, gamma: float | str) -> None:
    mech = Staircase(delta, epsilon, gamma)
    reach = 6 * delta
    exponents = {i: mech.weight_exponent(i) for i in range(-reach - delta, reach + delta + 1)}
    # P(x) / P(x + d) = e^(epsilon * (e(x + d) - e(x))): at most e^epsilon for every
    # shift |d| <= Delta, and exactly e^epsilon for d = Delta (the bound is attained)
    worst = max(
        exponents[x + d] - exponents[x]
        for x in range(-reach, reach + 1)
        for d in range(-delta, delta + 1)
    )
    assert worst == 1
    assert all(exponents[x + delta] - exponents[x] == 1 for x in range(0, reach))


def test_negative_zero_would_double_the_ratio() -> None:
    """Sign times magnitude with magnitude 0 allowed under both signs: P(0)/P(Delta) = 2e^eps."""
    mech = Staircase(10, 1.0)
    b = _b(1.0)
    doubled_zero = 2 * b ** mech.weight_exponent(0)
    ratio = doubled_zero / b ** mech.weight_exponent(10)
    assert ratio == pytest.approx(2 * Decimal(1).exp(), rel=Decimal("1e-50"))
    assert ratio > Decimal(1).exp()


def _thresholds(level) -> list[int]:
    return [int(t) for t in level._thr[level._thr != samplers._PAD]]


def _cumulative(pmf: dict[int, Decimal], b: Decimal, stop: int) -> Decimal:
    """P(0) + P(first word picks one of the offsets giving magnitudes 1..stop), both signs:
    magnitude m <= Delta comes with block 0, which has probability 1 - b."""
    return pmf[0] + 2 / (1 - b) * sum(pmf[m] for m in range(1, stop + 1))


@pytest.mark.parametrize(
    ("delta", "epsilon", "gamma"),
    [(10, 1.0, "abs"), (3, 5.0, "var"), (6, 0.4, 1), (100, 9.0, "abs")],
)
def test_offset_table_is_the_exact_pmf(delta: int, epsilon: float, gamma: float | str) -> None:
    """One word picks magnitude 1..Delta (or 0) by thresholds that are the floors of the exact
    cumulative pmf, and the geometric block index scales it: P(k Delta + c) = b^k P(c)."""
    mech = Staircase(delta, epsilon, gamma)
    plan = staircase._plan(delta, mech.steps, Fraction(epsilon))
    b = _b(epsilon)
    pmf = _pmf(mech, 4 * delta)
    expected = [int(_cumulative(pmf, b, k) * 2**63) for k in range(delta)]
    assert _thresholds(plan._table) == expected
    for c in range(1, delta + 1):
        for k in range(3):
            assert pmf[k * delta + c] == pytest.approx(b**k * pmf[c], rel=Decimal("1e-80"))
            assert pmf[-(k * delta + c)] == pmf[k * delta + c]


def test_step_sampler_for_large_sensitivity_is_the_exact_pmf() -> None:
    """Above the table size one word picks zero / high / low step, one the offset in it."""
    delta, epsilon = 5000, 2.0
    mech = Staircase(delta, epsilon)
    plan = staircase._plan(delta, mech.steps, Fraction(epsilon))
    b = _b(epsilon)
    pmf = _pmf(mech, delta + 1)
    r = mech.steps
    expected = [pmf[0], _cumulative(pmf, b, r - 1)]
    assert _thresholds(plan._steps) == [int(c * 2**63) for c in expected]
    # every magnitude of a step is equally likely, so a uniform offset within it is exact
    for start, count in zip(plan._start.tolist()[1:], plan._count.tolist()[1:], strict=True):
        assert {pmf[m] for m in range(start, start + count)} == {pmf[start]}
    assert plan._start.tolist()[1:] == [1, r] and plan._count.tolist()[1:] == [r - 1, delta - r + 1]
    values = np.zeros(N // 4, dtype=np.int64)
    noise = mech.sample(values, secure_generator(17)).astype(np.float64)
    variance, abs_mean = mech.variance(), mech.expected_abs_error()
    assert abs(np.abs(noise).mean() - abs_mean) <= SIGMAS * math.sqrt(variance / (N // 4))


# --- the sampler against the closed forms ---------------------------------------------------------


@pytest.mark.parametrize(
    ("delta", "epsilon", "gamma"),
    [(10, 1.0, "abs"), (3, 5.0, "abs"), (100, 0.5, "var"), (2, 10.0, 1)],
)
def test_samples_match_closed_forms(delta: int, epsilon: float, gamma: float | str) -> None:
    mech = Staircase(delta, epsilon, gamma)
    values = np.arange(N, dtype=np.int64) % 1000 - 500
    out = mech.sample(values, secure_generator(delta * 10 + int(epsilon)))
    assert out.dtype == np.int64
    noise = (out - values).astype(np.float64)
    pmf = _pmf(mech, _reach(mech))
    fourth = float(sum(Decimal(i) ** 4 * p for i, p in pmf.items()))
    variance, abs_mean = mech.variance(), mech.expected_abs_error()
    assert abs(noise.mean()) <= SIGMAS * math.sqrt(variance / N)
    assert abs((noise**2).mean() - variance) <= SIGMAS * math.sqrt((fourth - variance**2) / N)
    assert abs(np.abs(noise).mean() - abs_mean) <= SIGMAS * math.sqrt((variance - abs_mean**2) / N)
    width = mech.interval95()
    inside = float(sum(p for i, p in pmf.items() if abs(i) <= width))
    covered = float((np.abs(noise) <= width).mean())
    assert abs(covered - inside) <= SIGMAS * math.sqrt(inside * (1 - inside) / N)
    zero = float(pmf[0])  # P(0) is not doubled
    assert abs(float((noise == 0).mean()) - zero) <= SIGMAS * math.sqrt(zero * (1 - zero) / N)


def test_sensitivity_one_is_the_geometric_mechanism() -> None:
    mech = Staircase(1, 0.8)
    laplace = DiscreteLaplace(1, 0.8)
    values = np.arange(1000)
    assert np.array_equal(
        mech.sample(values, secure_generator(5)), laplace.sample(values, secure_generator(5))
    )
    # exactly equal, so choosing between them never turns on a rounding error
    assert mech.expected_abs_error() == laplace.expected_abs_error()
    assert mech.variance() == laplace.variance()
    assert mech.interval95() == laplace.interval95()
    # and the staircase's own closed forms agree with them
    assert mech._shape.expected_abs() == pytest.approx(laplace.expected_abs_error(), rel=1e-12)
    assert mech._shape.variance() == pytest.approx(laplace.variance(), rel=1e-12)


def test_interface_and_refusals() -> None:
    mech = Staircase(4, 2.0)
    assert isinstance(mech, NoiseMechanism)
    assert mech.name == "staircase"
    assert mech.cost == Cost.of(2.0, 0)
    assert mech.scale == 2.0
    rng = secure_generator(1)
    assert mech.sample(np.zeros((2, 3), dtype=np.int32), rng).shape == (2, 3)
    for bad in (
        lambda: Staircase(0, 1.0),
        lambda: Staircase(2, 0.0),
        lambda: Staircase(2, 1.0, "median"),
        lambda: Staircase(2, 1.0, 1.5),
        lambda: Staircase(2**31, 1.0),
        lambda: mech.sample(np.array([0.5]), rng),
        lambda: GridStaircase(-1.0, 1.0),
        lambda: GridStaircase(1.0, 1.0).sample(np.array([np.nan]), rng),
    ):
        with pytest.raises(ValueError):
            bad()


# --- the grid version for reals -------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [1.0, 2.0, 5.0, 10.0])
def test_grid_staircase_is_the_continuous_staircase(epsilon: float) -> None:
    mech = GridStaircase(10.0, epsilon)
    assert mech.name == "staircase" and isinstance(mech, NoiseMechanism)
    # E|X| = Delta e^(eps/2) / (e^eps - 1) for the continuous staircase (mechanisms.md 2)
    continuous = 10.0 * math.exp(epsilon / 2) / math.expm1(epsilon)
    assert mech.expected_abs_error() == pytest.approx(continuous, rel=1e-5)
    b = math.exp(-epsilon)
    best_variance = 100 * (2 ** (-2 / 3) * (b * (1 + b)) ** (2 / 3) + b) / (1 - b) ** 2
    assert GridStaircase(10.0, epsilon, "var").variance() == pytest.approx(best_variance, rel=1e-5)


def test_grid_staircase_samples_on_the_grid() -> None:
    mech = GridStaircase(2.5, 2.0)
    g = mech.granularity
    values = np.repeat(np.array([0.0, 0.1, 1 / 3, -7.25, 1e6 + 0.3]), N // 5)
    out = mech.sample(values, secure_generator(9))
    assert np.all(out / g == np.rint(out / g))
    noise = out - mech.round_to_grid(values) * g
    variance, abs_mean = mech.variance(), mech.expected_abs_error()
    assert abs(noise.mean()) <= SIGMAS * math.sqrt(variance / N)
    assert abs(np.abs(noise).mean() - abs_mean) <= SIGMAS * math.sqrt((variance - abs_mean**2) / N)
    # neighbours Delta apart round at most floor(Delta/g) + 1 steps apart
    assert mech.steps.sensitivity == math.floor(2.5 / g) + 1


# --- the seed-002 example stays runnable ---------------------------------------------------------


def test_seed002_example_runs_at_a_tiny_size(tmp_path, capsys) -> None:
    path = Path(__file__).resolve().parent.parent / "examples" / "seed002_staircase.py"
    spec = importlib.util.spec_from_file_location("seed002_staircase", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    text = example.main(["--samples", "2000", "--out", str(tmp_path / "plot.png")])
    assert (tmp_path / "plot.png").stat().st_size > 10_000
    # the closed-form ratios land on the reference values, whatever the sample size
    for ratio in ("0.960 (0.96)", "0.851 (0.85)", "0.413 (0.41)", "0.067 (0.067)"):
        assert ratio in text
    assert "grid staircase (exact)" in capsys.readouterr().out
