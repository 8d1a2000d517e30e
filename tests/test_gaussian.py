"""The discrete Gaussian: exact acceptance decisions, closed forms, zCDP cost and the sampler.

Exact checks use 90-digit decimals over the support; sampled checks use fixed
seeds with 6-standard-error tolerances or chi-square at alpha = 1e-6.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats
from test_samplers import ScriptedWords, digits90  # noqa: F401 (a fixture)

from dpsql.accounting import Cost
from dpsql.mechanisms import gaussian
from dpsql.mechanisms.base import NoiseMechanism
from dpsql.mechanisms.gaussian import DiscreteGaussian, GridGaussian, discrete_gaussian
from dpsql.mechanisms.samplers import ExactReal, secure_generator

N = 1_000_000
SIGMAS = 6


pytestmark = pytest.mark.usefixtures("digits90")


def _dec(value: Fraction) -> Decimal:
    return Decimal(value.numerator) / Decimal(value.denominator)


def _pmf(sigma2: Fraction) -> dict[int, Decimal]:
    """N_Z(0, sigma^2) over |k| <= 40 sigma (the rest is below 1e-300)."""
    reach = math.ceil(40 * math.sqrt(sigma2)) + 1
    s2 = _dec(sigma2)
    weights = {k: (-Decimal(k * k) / (2 * s2)).exp() for k in range(-reach, reach + 1)}
    total = sum(weights.values())
    return {k: w / total for k, w in weights.items()}


SIGMA2S = [Fraction(1, 4), Fraction(1), Fraction(9, 4), Fraction(50), Fraction(1000, 3)]
# (L2 sensitivity, rho) giving those sigma^2 = Delta^2 / (2 rho)
MECHANISMS = [(1, 2.0), (1, 0.5), (3, 2.0), (10, 1.0), (10, 0.15)]


@pytest.mark.parametrize(("sensitivity", "rho"), MECHANISMS)
def test_closed_forms_match_exact_sums(sensitivity: int, rho: float) -> None:
    mech = DiscreteGaussian(sensitivity, rho)
    sigma2 = mech.sigma2
    assert sigma2 in SIGMA2S
    pmf = _pmf(sigma2)
    assert mech.expected_abs_error() == pytest.approx(
        float(sum(abs(k) * p for k, p in pmf.items())), rel=1e-12
    )
    assert mech.variance() == pytest.approx(
        float(sum(k * k * p for k, p in pmf.items())), rel=1e-12
    )
    if sigma2 <= 1:  # CKS: the variance is below sigma^2, visibly so only for small sigma
        assert sum(k * k * p for k, p in pmf.items()) < _dec(sigma2)
    m = int(mech.interval95())
    assert sum(p for k, p in pmf.items() if abs(k) <= m) >= Decimal("0.95")
    if m:
        assert sum(p for k, p in pmf.items() if abs(k) <= m - 1) < Decimal("0.95")


def test_large_sigma_expansions_match_direct_sums() -> None:
    sigma2 = Fraction(1 << 33)  # sigma ~ 92682, above the direct-sum limit
    expanded = gaussian._Sums(sigma2)
    assert not expanded.direct
    sigma = math.sqrt(sigma2)
    k = np.arange(0, math.ceil(40 * sigma) + 2, dtype=np.float64)
    weights = np.exp(-(k * k) / (2 * float(sigma2)))
    total = 2 * math.fsum(weights) - 1
    assert expanded.total == pytest.approx(total, rel=1e-14)
    assert expanded.abs_mean() == pytest.approx(2 * math.fsum(k * weights) / total, rel=1e-13)
    assert expanded.variance() == pytest.approx(2 * math.fsum(k * k * weights) / total, rel=1e-13)
    for m in (0, 1000, 181_000, 181_653, 400_000):
        direct = (2 * math.fsum(weights[: m + 1]) - 1) / total
        assert expanded.coverage(m) == pytest.approx(direct, abs=1e-14)
    m = gaussian._half_width(sigma2, Fraction(1, 20))
    assert (2 * math.fsum(weights[: m + 1]) - 1) / total >= 0.95
    assert (2 * math.fsum(weights[:m]) - 1) / total < 0.95


# --- privacy: rho-zCDP and the cost ---------------------------------------------------------------


@pytest.mark.parametrize(("sensitivity", "rho"), [(1, 0.5), (2, 0.1), (3, 1.7)])
def test_renyi_divergence_is_within_rho(sensitivity: int, rho: float) -> None:
    """D_alpha(N_Z(0,s^2) || N_Z(Delta,s^2)) <= alpha * rho for every alpha > 1 (rho-zCDP)."""
    mech = DiscreteGaussian(sensitivity, rho)
    assert mech.cost == Cost(rho=Fraction(repr(rho)))
    assert mech.sigma2 == Fraction(sensitivity**2) / (2 * Fraction(repr(rho)))
    pmf = _pmf(mech.sigma2)
    for alpha in (Decimal("1.5"), Decimal(2), Decimal(5), Decimal(20)):
        moment = sum(
            p**alpha * pmf[k - sensitivity] ** (1 - alpha)
            for k, p in pmf.items()
            if k - sensitivity in pmf
        )
        divergence = moment.ln() / (alpha - 1)
        assert divergence <= alpha * _dec(mech.cost.rho) * (1 + Decimal("1e-60"))
        # the bound is tight: the discrete Gaussian's divergence is the continuous one, alpha*rho
        assert divergence == pytest.approx(alpha * _dec(mech.cost.rho), rel=Decimal("1e-3"))


# --- exact acceptance -----------------------------------------------------------------------------


def test_acceptance_decisions_are_exact() -> None:
    plan = gaussian._plan(Fraction(50))
    candidates = np.arange(-60, 61, dtype=np.int64)
    floors = [plan.exact_probability(int(y)).floor_scaled(64) for y in candidates]
    # words just below, at and above each threshold: the float filter must leave the
    # close ones to the exact path, which reads the next word on a tie
    for shift, next_word, expected in ((-1, None, True), (1, None, False), (0, 0, True)):
        words = [max(0, f + shift) for f in floors]
        tie_words = [next_word] * len(words) if next_word is not None else []
        accepted = plan._accept(candidates, ScriptedWords(words + tie_words))
        exact = [w < f or (w == f and expected) for w, f in zip(words, floors, strict=True)]
        assert accepted.tolist() == exact
    # random words: the float filter and the exact comparison agree
    rng = secure_generator(4)
    many = rng.integers(-60, 61, 20_000)
    words = rng.bit_generator.random_raw(many.size)
    accepted = plan._accept(many, ScriptedWords(list(words)))
    by_candidate = dict(zip(candidates.tolist(), floors, strict=True))
    exact = [int(w) < by_candidate[int(y)] for y, w in zip(many, words, strict=True)]
    assert accepted.tolist() == exact


def test_a_tied_word_is_resolved_by_the_next_bits() -> None:
    plan = gaussian._plan(Fraction(9, 4))
    p = plan.exact_probability(3)
    word, digit = p.floor_scaled(64), p.floor_scaled(128) & ((1 << 64) - 1)
    assert plan._accept(np.array([3]), ScriptedWords([word, digit - 1]))[0]
    assert not plan._accept(np.array([3]), ScriptedWords([word, digit + 1]))[0]
    assert isinstance(p, ExactReal)


# --- the sampler against the closed forms ---------------------------------------------------------


@pytest.mark.parametrize("sigma2", SIGMA2S)
def test_samples_match_closed_forms(sigma2: Fraction) -> None:
    z = discrete_gaussian(sigma2, N, secure_generator(int(sigma2 * 4) + 1)).astype(np.float64)
    pmf = _pmf(sigma2)
    variance = float(sum(k * k * p for k, p in pmf.items()))
    fourth = float(sum(Decimal(k) ** 4 * p for k, p in pmf.items()))
    abs_mean = float(sum(abs(k) * p for k, p in pmf.items()))
    assert abs(z.mean()) <= SIGMAS * math.sqrt(variance / N)
    assert abs((z**2).mean() - variance) <= SIGMAS * math.sqrt((fourth - variance**2) / N)
    assert abs(np.abs(z).mean() - abs_mean) <= SIGMAS * math.sqrt((variance - abs_mean**2) / N)


@pytest.mark.parametrize("sigma2", [Fraction(9, 4), Fraction(50)])
def test_pmf_chi_square(sigma2: Fraction) -> None:
    z = discrete_gaussian(sigma2, N, secure_generator(7))
    pmf = _pmf(sigma2)
    support = [k for k, p in pmf.items() if p * N >= 50]
    observed = np.array([(z == k).sum() for k in support] + [(~np.isin(z, support)).sum()])
    expected = np.array([float(pmf[k]) * N for k in support])
    expected = np.append(expected, N - expected.sum())
    statistic = float(((observed - expected) ** 2 / expected).sum())
    assert stats.chi2.sf(statistic, len(support)) > 1e-6


def test_single_values_and_shapes() -> None:
    mech = DiscreteGaussian(1, 0.5)
    rng = secure_generator(3)
    assert isinstance(mech, NoiseMechanism)
    assert mech.name == "gaussian" and mech.scale == 1.0
    assert mech.sample(np.zeros((2, 5), dtype=np.int64), rng).shape == (2, 5)
    singles = np.array([mech.sample(np.array([10]), rng)[0] for _ in range(2000)]) - 10
    assert abs(singles.mean()) <= SIGMAS * math.sqrt(mech.variance() / 2000)
    assert discrete_gaussian(Fraction(2), 0, rng).shape == (0,)


def test_refusals() -> None:
    rng = secure_generator(1)
    for bad in (
        lambda: DiscreteGaussian(1, 0.0),
        lambda: DiscreteGaussian(0, 1.0),
        lambda: DiscreteGaussian(2**50, 1e-6),
        lambda: DiscreteGaussian(1, 1.0).sample(np.array([0.5]), rng),
        lambda: GridGaussian(1.0, 1.0, coordinates=0),
        lambda: GridGaussian(1.0, 1.0).sample(np.array([np.inf]), rng),
        lambda: discrete_gaussian(Fraction(0), 3, rng),
    ):
        with pytest.raises(ValueError):
            bad()


# --- the grid version for reals -------------------------------------------------------------------


@pytest.mark.parametrize(("sensitivity", "rho", "coordinates"), [(1.0, 0.5, 1), (37.5, 0.02, 4)])
def test_grid_gaussian(sensitivity: float, rho: float, coordinates: int) -> None:
    mech = GridGaussian(sensitivity, rho, coordinates)
    g = Fraction(mech.granularity)
    sigma = sensitivity / math.sqrt(2 * rho)
    assert (
        sigma / 2**gaussian.GRANULARITY_BITS <= g < 2 * (sigma + 1) / 2**gaussian.GRANULARITY_BITS
    )
    steps = Fraction(sensitivity) / g + math.ceil(math.sqrt(coordinates))
    assert mech.steps.sigma2 == steps**2 / (2 * Fraction(repr(rho)))
    assert mech.cost == Cost.of(rho=rho)
    assert mech.variance() == pytest.approx(sigma**2, rel=1e-4)
    values = np.repeat(np.array([0.0, 0.3, -12.125, 1e5 / 3]), N // 4)
    out = mech.sample(values, secure_generator(12))
    assert np.all(out / mech.granularity == np.rint(out / mech.granularity))
    noise = out - mech.round_to_grid(values) * mech.granularity
    variance = mech.variance()
    assert abs(noise.mean()) <= SIGMAS * math.sqrt(variance / N)
    assert abs((noise**2).mean() - variance) <= SIGMAS * math.sqrt(2 * variance**2 / N)


def test_a_plans_gaussian_noise_covers_its_l2_sensitivity_exactly():
    """A unit in `groups` groups moves a measurement by per_group * sqrt(groups) in L2;
    as a float sqrt that rounds down for 3, 6, 11, ... groups, and sigma^2 fell short of
    Delta_2^2 / (2 rho) by a relative 1e-16 (found by an audit)."""
    from conftest import pums_policy

    from dpsql.mechanisms.grid import privacy_parameter
    from dpsql.policy import load_policy
    from dpsql.sql import Options, PlanContext, plan_query
    from dpsql.sql.parse import parse_statement

    policy = pums_policy()
    table = policy["tables"]["pums_dup"]
    options = Options(epsilon=1.0, delta=1e-6, mechanism="gaussian")
    tree = parse_statement("SELECT age, COUNT(*) FROM pums_dup GROUP BY age", "duckdb").tree
    for groups in (2, 3, 6, 11, 99):
        table["max_groups_per_unit"], table["max_rows_per_unit"] = groups, 2
        plan = plan_query(tree, PlanContext(load_policy(policy), options, "duckdb", seed=1))
        noise = plan.measures[0].noise
        assert noise.sigma2 * 2 * privacy_parameter(noise.rho, "rho") >= 2**2 * groups, groups
