"""Every mechanism's central interval at any miss probability: `half_width(miss)` against
its closed form and against its own sampler's empirical tail (fixed seeds, tolerances
from the sample size)."""

from __future__ import annotations

import math
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest

from dpsql.mechanisms.base import COVERAGE_MISS, miss_probability
from dpsql.mechanisms.gaussian import DiscreteGaussian, GridGaussian
from dpsql.mechanisms.laplace import DiscreteLaplace, GridLaplace
from dpsql.mechanisms.staircase import GridStaircase, Staircase
from dpsql.mechanisms.tree import chernoff_halfwidths, subgaussian_halfwidths

MISSES = [0.5, 0.1, 0.05, 0.025, 0.001]
DRAWS = 200_000
# five binomial standard deviations of an empirical tail probability: never flaky at a fixed
# seed, and tight enough that a half-width one step off at these scales would fail
SIGMAS = 5


def _discrete_laplace_tail(scale: float, m: int) -> float:
    """P(|Z| > m) = 2 a^(m+1) / (1 + a), a = e^(-1/scale)."""
    a = math.exp(-1 / scale)
    return 2 * a ** (m + 1) / (1 + a)


def _empirical_tail(noise: np.ndarray, width: float) -> float:
    return float(np.mean(np.abs(noise) > width))


def _tolerance(miss: float) -> float:
    return SIGMAS * math.sqrt(miss * (1 - miss) / DRAWS)


@pytest.mark.parametrize("miss", MISSES)
@pytest.mark.parametrize("scale", [0.3, 1.0, 7.5, 1000.0])
def test_discrete_laplace_is_the_smallest_integer_of_its_closed_form(
    scale: float, miss: float
) -> None:
    mechanism = DiscreteLaplace(1, Fraction(1) / Fraction(scale))
    m = int(mechanism.half_width(miss))
    assert _discrete_laplace_tail(scale, m) <= miss < _discrete_laplace_tail(scale, m - 1) or (
        m == 0 and _discrete_laplace_tail(scale, 0) <= miss
    )
    a = math.exp(-1 / scale)
    assert m == max(0, math.ceil(scale * math.log(2 / (miss * (1 + a)))) - 1)


@pytest.mark.parametrize("miss", MISSES)
def test_large_scales_approach_the_continuous_closed_forms(miss: float) -> None:
    # Laplace: b ln(1/miss); Gaussian: sigma z_(1 - miss/2); both within a step or two
    laplace = DiscreteLaplace(1, Fraction(1, 10_000))
    assert laplace.half_width(miss) == pytest.approx(10_000 * math.log(1 / miss), abs=2)
    gaussian = DiscreteGaussian(1, Fraction(1, 2 * 10_000**2))  # sigma = 10,000
    z = NormalDist().inv_cdf(1 - miss / 2)
    assert gaussian.half_width(miss) == pytest.approx(10_000 * z, abs=2)


@pytest.mark.parametrize("miss", MISSES)
@pytest.mark.parametrize("sigma2", [Fraction(1, 4), Fraction(2), Fraction(900)])
def test_discrete_gaussian_is_the_smallest_integer_of_its_support(
    sigma2: Fraction, miss: float
) -> None:
    mechanism = DiscreteGaussian(1, 1 / (2 * sigma2))
    m = int(mechanism.half_width(miss))
    k = np.arange(-4000, 4001)
    weights = np.exp(-(k * k) / (2 * float(sigma2)))
    pmf = weights / math.fsum(weights)

    def tail(width: int) -> float:
        return math.fsum(pmf[np.abs(k) > width])

    assert tail(m) <= miss
    assert m == 0 or tail(m - 1) > miss


@pytest.mark.parametrize("miss", MISSES)
@pytest.mark.parametrize(("delta", "epsilon"), [(3, 0.5), (40, 1.0), (7, 2.5)])
def test_staircase_is_the_smallest_integer_of_its_own_tail(
    delta: int, epsilon: float, miss: float
) -> None:
    mechanism = Staircase(delta, epsilon)
    m = int(mechanism.half_width(miss))
    shape = mechanism._shape  # the float closed form of this very pmf
    assert shape.tail(m) <= miss * (1 + 1e-9)
    assert m == 0 or shape.tail(m - 1) > miss * (1 - 1e-9)


def test_staircase_of_sensitivity_one_is_the_geometric_mechanism() -> None:
    for miss in MISSES:
        assert Staircase(1, 0.7).half_width(miss) == DiscreteLaplace(1, 0.7).half_width(miss)


MECHANISMS = [
    pytest.param(lambda: DiscreteLaplace(2, 0.5), id="discrete-laplace"),
    pytest.param(lambda: GridLaplace(3.7, 0.8), id="grid-laplace"),
    pytest.param(lambda: DiscreteGaussian(2, 0.05), id="discrete-gaussian"),
    pytest.param(lambda: GridGaussian(3.7, 0.1), id="grid-gaussian"),
    pytest.param(lambda: Staircase(5, 1.0), id="staircase"),
    pytest.param(lambda: GridStaircase(3.7, 1.0), id="grid-staircase"),
]


@pytest.mark.parametrize("build", MECHANISMS)
def test_half_widths_match_the_samplers_empirical_tails(build) -> None:
    mechanism = build()
    step = getattr(mechanism, "granularity", 1.0)
    noise = mechanism.sample(np.zeros(DRAWS), np.random.default_rng(20261202))
    for miss in MISSES:
        width = mechanism.half_width(miss)
        # at most `miss` outside the interval, and one output step narrower leaves more
        assert _empirical_tail(noise, width) <= miss + _tolerance(miss)
        assert _empirical_tail(noise, width - step) >= miss - _tolerance(miss)


@pytest.mark.parametrize("build", MECHANISMS)
def test_half_width_shrinks_as_the_miss_grows_and_interval95_is_its_default(build) -> None:
    mechanism = build()
    widths = [mechanism.half_width(miss) for miss in sorted(MISSES)]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]
    assert mechanism.interval95() == mechanism.half_width(COVERAGE_MISS)
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="strictly between 0 and 1"):
            mechanism.half_width(bad)


def test_miss_probabilities_are_never_rounded_up() -> None:
    assert miss_probability(0.05) == Fraction(1, 20) <= Fraction(0.05)
    assert miss_probability(0.025) == Fraction(1, 40)
    for miss in (0.05 / 3, 1e-7, 0.3333333333):
        assert miss_probability(miss) <= Fraction(miss)


@pytest.mark.parametrize("miss", MISSES)
def test_tree_intervals_at_any_miss(miss: float) -> None:
    # a sum of 9 independent discrete Laplace nodes of scale 2: the Chernoff bound holds
    rng = np.random.default_rng(7)
    node = DiscreteLaplace(1, 0.5)
    noise = node.sample(np.zeros((DRAWS, 9), dtype=np.int64), rng).sum(axis=1)
    (width,) = chernoff_halfwidths(2.0, np.array([9.0]), np.array([1.0]), miss)
    assert _empirical_tail(noise, width) <= miss + _tolerance(miss)
    (default,) = chernoff_halfwidths(2.0, np.array([9.0]), np.array([1.0]))
    assert default == chernoff_halfwidths(2.0, np.array([9.0]), np.array([1.0]), 0.05)[0]
    (gaussian,) = subgaussian_halfwidths(3.0, np.array([9.0]), miss)
    assert gaussian == pytest.approx(3.0 * math.sqrt(2 * 9 * math.log(2 / miss)), rel=1e-8)
