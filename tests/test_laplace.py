"""The Laplace mechanisms: calibration, grids, exact intervals, and the privacy of the grid.

Sampled checks use fixed seeds and 6-standard-error tolerances computed from
closed-form moments; privacy and intervals are computed exactly, not sampled.
"""

from __future__ import annotations

import decimal
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from dpsql.accounting import Cost
from dpsql.mechanisms.base import NoiseMechanism
from dpsql.mechanisms.laplace import (
    GRANULARITY_BITS,
    DiscreteLaplace,
    GridLaplace,
    laplace_for,
)
from dpsql.mechanisms.samplers import secure_generator

N = 1_000_000
SIGMAS = 6


def _a(scale: Fraction) -> Decimal:
    return (-Decimal(scale.denominator) / Decimal(scale.numerator)).exp()


def _coverage(scale: Fraction, m: int) -> Decimal:
    """P(|Z| <= m) = 1 - 2 a^(m+1) / (1+a), in 60-digit decimal."""
    a = _a(scale)
    return 1 - 2 * a ** (m + 1) / (1 + a)


@pytest.fixture(autouse=True)
def digits60():
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        yield


def _fourth_moment(scale: Fraction) -> float:
    """E Z^4 = 2a(1 + 11a + 11a^2 + a^3) / ((1+a)(1-a)^4), in grid units."""
    a = math.exp(-1 / scale)
    one_minus = -math.expm1(-1 / scale)
    return 2 * a * (1 + 11 * a + 11 * a**2 + a**3) / ((1 + a) * one_minus**4)


# --- DiscreteLaplace -----------------------------------------------------------------------------


def test_discrete_laplace_is_a_noise_mechanism() -> None:
    mech = DiscreteLaplace(2, 0.5)
    assert isinstance(mech, NoiseMechanism)
    assert mech.name == "laplace"
    assert mech.cost == Cost.of(0.5, 0)
    assert mech.scale == 4.0
    assert mech.exact_scale == Fraction(4)


def test_discrete_laplace_takes_epsilon_exactly() -> None:
    mech = DiscreteLaplace(1, 0.1)
    # the decimal 1/10 the ledger charges, not the float 0.1 (which is a little more than 1/10)
    assert mech.exact_scale == 10
    assert DiscreteLaplace(3, Fraction(1, 3)).exact_scale == 9


@pytest.mark.parametrize(("sensitivity", "epsilon"), [(1, 2.0), (1, 1.0), (3, 0.81), (10, 0.1)])
def test_discrete_laplace_sample_matches_closed_forms(sensitivity: int, epsilon: float) -> None:
    mech = DiscreteLaplace(sensitivity, epsilon)
    values = np.arange(N, dtype=np.int64) % 1000
    out = mech.sample(values, secure_generator(sensitivity * 100 + int(epsilon * 10)))
    assert out.dtype == np.int64
    noise = (out - values).astype(np.float64)
    variance, abs_mean = mech.variance(), mech.expected_abs_error()
    fourth_units = _fourth_moment(mech.exact_scale)
    assert abs(noise.mean()) <= SIGMAS * math.sqrt(variance / N)
    assert abs((noise**2).mean() - variance) <= SIGMAS * math.sqrt((fourth_units - variance**2) / N)
    assert abs(np.abs(noise).mean() - abs_mean) <= SIGMAS * math.sqrt((variance - abs_mean**2) / N)


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(1), Fraction(3.7), Fraction(100)])
def test_discrete_laplace_closed_forms(scale: Fraction) -> None:
    mech = DiscreteLaplace(1, 1 / scale)
    a = _a(scale)
    assert mech.expected_abs_error() == pytest.approx(float(2 * a / (1 - a * a)), rel=1e-12)
    assert mech.variance() == pytest.approx(float(2 * a / (1 - a) ** 2), rel=1e-12)


@pytest.mark.parametrize("scale", [0.5, 1, 3.7, 100, 1e4, 1e6])
def test_interval95_is_the_smallest_integer_covering_95_percent(scale: float) -> None:
    mech = DiscreteLaplace(1, 1 / Fraction(scale))
    m = mech.interval95()
    assert m == int(m)
    assert _coverage(mech.exact_scale, int(m)) >= Decimal("0.95")
    if m > 0:
        assert _coverage(mech.exact_scale, int(m) - 1) < Decimal("0.95")


def test_discrete_laplace_keeps_shape_and_checks_inputs() -> None:
    mech = DiscreteLaplace(1, 1.0)
    rng = secure_generator(2)
    assert mech.sample(np.zeros((3, 4), dtype=np.int32), rng).shape == (3, 4)
    assert mech.sample(np.array([2.0, 5.0]), rng).dtype == np.int64
    with pytest.raises(ValueError):
        mech.sample(np.array([2.5]), rng)
    with pytest.raises(ValueError):
        mech.sample(np.array(["a"]), rng)
    with pytest.raises(ValueError):  # an integral float beyond int64 must not wrap around
        mech.sample(np.array([1e30]), rng)
    with pytest.raises(ValueError):
        DiscreteLaplace(0, 1.0)
    with pytest.raises(ValueError):
        DiscreteLaplace(1, 0.0)
    with pytest.raises(ValueError):
        DiscreteLaplace(1, math.inf)
    with pytest.raises(ValueError):
        DiscreteLaplace(1.5, 1.0)  # type: ignore[arg-type]


# --- GridLaplace ---------------------------------------------------------------------------------


def test_grid_granularity_is_the_smallest_power_of_two_above_target() -> None:
    for sensitivity, epsilon in ((1.0, 1.0), (0.7, 1.0), (500000.0, 0.25), (1e-3, 3.0)):
        mech = GridLaplace(sensitivity, epsilon)
        target = Fraction(sensitivity) / Cost.of(epsilon).epsilon / 2**GRANULARITY_BITS
        g = Fraction(mech.granularity)
        assert g == Fraction(2) ** mech.exponent
        assert g >= target > g / 2
        assert mech.grid_scale == (Fraction(sensitivity) + g) / (Cost.of(epsilon).epsilon * g)
        assert mech.scale == float((Fraction(sensitivity) + g) / Cost.of(epsilon).epsilon)


def test_grid_outputs_are_multiples_of_g_for_every_input() -> None:
    mech = GridLaplace(3.0, 0.5)
    g = mech.granularity
    rng = secure_generator(4)
    values = np.array([0.0, 1e-300, 0.1, 1 / 3, 1 + 1 / 3, 12345.678901, -7.25, 2.0**40 + 0.1])
    for shifted in (values, values + 1.0, values + 3.0):
        out = mech.sample(np.repeat(shifted, 1000), rng)
        assert out.dtype == np.float64
        steps = out / g  # exact: g is a power of two
        assert np.all(steps == np.rint(steps))


def test_grid_rounding_is_exact_nearest_multiple() -> None:
    mech = GridLaplace(1.0, 1.0)
    g = Fraction(mech.granularity)
    values = [0.1, -0.1, 1 / 3, 2.5e-6, 1e10 / 3, -123.456]
    steps = mech.round_to_grid(np.array(values))
    for value, step in zip(values, steps.tolist(), strict=True):
        assert abs(Fraction(value) - step * g) <= g / 2


def test_grid_sample_matches_closed_forms() -> None:
    mech = GridLaplace(10.0, 0.5)
    g = mech.granularity
    value = 1234.56789
    out = mech.sample(np.full(N, value), secure_generator(8))
    center = float(mech.round_to_grid(np.array([value]))[0]) * g
    assert abs(center - value) <= g / 2
    noise = out - center
    variance, abs_mean = mech.variance(), mech.expected_abs_error()
    assert variance == pytest.approx(2 * mech.scale**2, rel=1e-4)
    assert abs_mean == pytest.approx(mech.scale, rel=1e-4)
    fourth = _fourth_moment(mech.grid_scale) * g**4
    assert abs(noise.mean()) <= SIGMAS * math.sqrt(variance / N)
    assert abs((noise**2).mean() - variance) <= SIGMAS * math.sqrt((fourth - variance**2) / N)
    assert abs(np.abs(noise).mean() - abs_mean) <= SIGMAS * math.sqrt((variance - abs_mean**2) / N)


def _worst_pairs(mech: GridLaplace, sensitivity: float) -> list[tuple[float, float]]:
    """Neighbouring inputs that round as far apart as possible: just off half-grid points."""
    g = mech.granularity
    pairs = []
    for base in (0.0, 1.0, 1234.5, -77.0):
        for offset in (0.5 * g, 0.5 * g + g * 1e-6, 0.5 * g - g * 1e-6, 0.0):
            low = base + offset
            for high in (low + sensitivity, np.nextafter(low + sensitivity, -np.inf)):
                if Fraction(high) - Fraction(low) <= Fraction(sensitivity):
                    pairs.append((low, float(high)))
    return pairs


@pytest.mark.parametrize(("sensitivity", "epsilon"), [(0.7, 1.0), (1.0, 1.0), (2.5, 0.1)])
def test_grid_pmf_ratio_between_neighbours_is_at_most_e_epsilon(
    sensitivity: float, epsilon: float
) -> None:
    mech = GridLaplace(sensitivity, epsilon)
    pairs = _worst_pairs(mech, sensitivity)
    low = mech.round_to_grid(np.array([p[0] for p in pairs]))
    high = mech.round_to_grid(np.array([p[1] for p in pairs]))
    worst = int(np.abs(high - low).max())
    # P(out = k | n) / P(out = k | n') = a^(|k-n| - |k-n'|) <= a^-|n-n'|, attained for k
    # beyond both; with a = exp(-1/grid_scale) the log-ratio is |n-n'| / grid_scale.
    assert Fraction(worst) / mech.grid_scale <= Cost.of(epsilon).epsilon
    if sensitivity == 0.7:
        # the rounding really does widen the gap beyond Delta/g: without the inflated
        # sensitivity the same pair would cost more than epsilon
        g = Fraction(mech.granularity)
        assert Fraction(worst) / (Fraction(sensitivity) / (Fraction(epsilon) * g)) > epsilon


def test_grid_pmf_ratio_computed_on_the_output_grid() -> None:
    mech = GridLaplace(0.7, 1.0)
    n, n_prime = mech.round_to_grid(np.array([0.0, 0.7])).tolist()
    a = _a(mech.grid_scale)
    bound = Decimal(1).exp()  # e^epsilon
    for k in range(n - 5, n_prime + 6, max(1, (n_prime - n) // 50)):
        ratio = a ** abs(k - n_prime) / a ** abs(k - n)
        assert ratio <= bound and 1 / ratio <= bound


@pytest.mark.parametrize(("sensitivity", "epsilon"), [(1.0, 1.0), (250.0, 0.3), (1e-2, 5.0)])
def test_grid_interval95_exact(sensitivity: float, epsilon: float) -> None:
    mech = GridLaplace(sensitivity, epsilon)
    steps = mech.interval95() / mech.granularity
    assert steps == int(steps)
    assert _coverage(mech.grid_scale, int(steps)) >= Decimal("0.95")
    assert _coverage(mech.grid_scale, int(steps) - 1) < Decimal("0.95")
    # close to the continuous Laplace answer scale * ln(20)
    assert mech.interval95() == pytest.approx(mech.scale * math.log(20), rel=1e-4)


def test_grid_rejects_non_finite_and_huge_values() -> None:
    mech = GridLaplace(1.0, 1.0)
    rng = secure_generator(1)
    with pytest.raises(ValueError):
        mech.sample(np.array([np.nan]), rng)
    with pytest.raises(ValueError):
        mech.sample(np.array([np.inf]), rng)
    with pytest.raises(ValueError):
        mech.sample(np.array([1e300]), rng)


def test_laplace_for_chooses_by_query_type() -> None:
    assert isinstance(laplace_for(1, 1.0, integer=True), DiscreteLaplace)
    grid = laplace_for(2.5, 1.0, integer=False)
    assert isinstance(grid, GridLaplace)
    assert grid.name == "laplace"
    assert isinstance(grid, NoiseMechanism)
