"""The zCDP to (epsilon, delta) conversion: valid, tight, and never worse than the classic bound.

The reference values are computed here independently: the minimum over alpha
of the Canonne-Kamath-Steinke bound by ternary search in 60-digit decimals,
and the exact privacy profile of the Gaussian mechanism (Balle and Wang 2018),
which a valid conversion of its rho must never contradict.
"""

from __future__ import annotations

import decimal
import math
import random
from decimal import Decimal
from fractions import Fraction

import pytest
from scipy import stats

from dpsql.accounting import Cost, zcdp_epsilon

CASES = [
    (Fraction(1, 2), Fraction(1, 10**6)),
    (Fraction(1, 100), Fraction(1, 10**10)),
    (Fraction(1, 10**8), Fraction(1, 10**6)),
    (Fraction(10), Fraction(1, 2)),
    (Fraction(3, 7), Fraction(1, 10**30)),
    (Fraction(1, 5000), Fraction(1, 10**5)),
]


def _decimal(value: Fraction) -> Decimal:
    return Decimal(value.numerator) / Decimal(value.denominator)


def _cks_minimum(rho: Fraction, delta: Fraction) -> Decimal:
    """min over alpha > 1 of the CKS bound, by ternary search on log(alpha - 1)."""
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        r, log_inv = _decimal(rho), -_decimal(delta).ln()

        def bound(t: Decimal) -> Decimal:
            a = 1 + t.exp()
            return a * r + (log_inv + (a - 1) * (1 - 1 / a).ln() - a.ln()) / (a - 1)

        low, high = Decimal(-30), Decimal(30)
        for _ in range(300):
            left, right = low + (high - low) / 3, high - (high - low) / 3
            if bound(left) <= bound(right):
                high = right
            else:
                low = left
        return bound((low + high) / 2)


@pytest.mark.parametrize(("rho", "delta"), CASES)
def test_conversion_is_valid_and_tight(rho: Fraction, delta: Fraction) -> None:
    epsilon = zcdp_epsilon(rho, delta)
    optimum = _cks_minimum(rho, delta)
    # never below the best CKS bound (that would claim more privacy than proven) ...
    assert _decimal(epsilon) >= optimum
    # ... and within a relative 1e-9 of it
    assert _decimal(epsilon) <= optimum * (1 + Decimal("1e-9"))


@pytest.mark.parametrize(("rho", "delta"), CASES)
def test_never_worse_than_the_classic_bound(rho: Fraction, delta: Fraction) -> None:
    classic = rho + 2 * math.sqrt(rho * -math.log(delta))
    assert zcdp_epsilon(rho, delta) < Fraction(classic)


def _gaussian_delta(epsilon: float, rho: float) -> float:
    """Exact delta(epsilon) of the Gaussian mechanism with Delta^2 / (2 sigma^2) = rho."""
    sigma = 1 / math.sqrt(2 * rho)  # Delta = 1
    low = 1 / (2 * sigma) - epsilon * sigma
    high = -1 / (2 * sigma) - epsilon * sigma
    return stats.norm.cdf(low) - math.exp(epsilon) * stats.norm.cdf(high)


@pytest.mark.parametrize(("rho", "delta"), [(0.5, 1e-6), (0.01, 1e-10), (2.0, 1e-3), (0.1, 1e-5)])
def test_gaussian_privacy_profile_agrees(rho: float, delta: float) -> None:
    """The Gaussian mechanism is exactly rho-zCDP: its true delta at the converted epsilon
    must be at most delta, and the converted epsilon is close to its true one."""
    epsilon = float(zcdp_epsilon(Fraction(rho), Fraction(delta)))
    assert _gaussian_delta(epsilon, rho) <= delta
    low, high = 0.0, epsilon  # the exact epsilon for this delta, by bisection
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if _gaussian_delta(middle, rho) > delta else (low, middle)
    assert epsilon <= 1.25 * high  # zCDP loses little against the exact profile


def test_monotone_and_edges() -> None:
    rho = Fraction(1, 4)
    deltas = [Fraction(1, 10**k) for k in (2, 4, 8, 16)]
    values = [zcdp_epsilon(rho, d) for d in deltas]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert zcdp_epsilon(Fraction(1, 10), Fraction(1, 10**6)) < zcdp_epsilon(rho, Fraction(1, 10**6))
    assert zcdp_epsilon(Fraction(0), Fraction(1, 10**6)) == 0
    assert zcdp_epsilon(Fraction(1, 10), Fraction(99, 100)) == 0  # the bound falls below 0
    for bad in (Fraction(0), Fraction(1), Fraction(3, 2)):
        with pytest.raises(ValueError):
            zcdp_epsilon(rho, bad)


def test_budget_check_uses_the_conversion() -> None:
    budget = Cost.of(1.0, 1e-6)
    rho = Fraction(1, 40)
    spent = Cost(rho=rho)
    assert spent.fits_within(budget) == (zcdp_epsilon(rho, Fraction(1, 10**6)) <= 1)
    assert Cost(rho=Fraction(1, 10)).fits_within(budget) is False
    assert spent.approximate(budget.delta)[0] == zcdp_epsilon(rho, budget.delta)


def test_the_shares_of_a_charge_never_spend_more_than_it():
    """Each measurement takes its share of epsilon as the decimal it prints as, partition
    selection as its binary value: epsilon/parts rounded down in binary could print one
    digit up (9.03442905035 over 7 spent 1.2e-15 more than was charged; found by two
    audits). Every share, read either way, now sums within the charge."""
    from dpsql.accounting import _as_written, split_epsilon

    rng = random.Random(12)
    epsilons = [9.03442905035, 0.017, 0.1, 1.0, 1e-300, 5e-324, 1e6]
    epsilons += [round(rng.uniform(0, 10), rng.randint(1, 15)) or 0.5 for _ in range(3000)]
    for epsilon in epsilons:
        for parts in (1, 2, 3, 7, 11):
            for binary_too in (False, True):
                share = split_epsilon(epsilon, parts, binary_too=binary_too)
                assert parts * _as_written(share) <= _as_written(epsilon), (epsilon, parts)
                assert not binary_too or Fraction(share) <= _as_written(share)
                # and not needlessly less: within a few units in the last place
                assert share >= float(_as_written(epsilon) / parts) * (1 - 1e-14) or share == 0


def test_a_plans_measurements_and_selection_cost_no_more_than_its_charge():
    from conftest import pums_policy

    from dpsql.policy import load_policy
    from dpsql.sql import Options, PlanContext, plan_query
    from dpsql.sql.parse import parse_statement

    policy = load_policy(pums_policy())
    shapes = [
        "SELECT COUNT(*), SUM(age), SUM(income), AVG(age), AVG(income), COUNT(income) FROM pums",
        "SELECT age, COUNT(*), SUM(income), AVG(income) FROM pums_dup GROUP BY age",
        "SELECT STDDEV(income), VAR_POP(age), COUNT(DISTINCT educ) FROM pums",
        "SELECT sex, STDDEV_SAMP(income) FROM pums_dup GROUP BY sex",
    ]
    for epsilon in (9.03442905035, 0.017, 0.1, 0.3):
        options = Options(epsilon=epsilon, delta=1e-6)
        for shape in shapes:
            tree = parse_statement(shape, "duckdb").tree
            plan = plan_query(tree, PlanContext(policy, options, "duckdb", seed=1))
            spent = sum((m.noise.cost for m in plan.measures), Cost())
            if plan.selection is not None:  # its noise reads the share in binary
                spent += Cost(Fraction(plan.selection.epsilon), plan.selection.cost.delta)
            if plan.bounding is not None:  # pums_dup's bounding note
                spent += plan.bounding.cost
            assert spent.epsilon <= plan.cost.epsilon, (epsilon, shape)


def test_reported_costs_read_as_the_decimals_charged():
    """A reported spent or remaining budget is the float whose decimal is the exact value
    where one is (0.3, 0.0001: no 0.30000000000000004), else the next float outward."""
    from dpsql.accounting import round_down, round_up

    assert round_up(Fraction(3, 10)) == 0.3 and repr(round_up(Fraction(3, 10))) == "0.3"
    assert repr(round_down(Fraction(1, 10000))) == "0.0001"
    assert repr(round_down(Fraction(197, 10))) == "19.7"
    for value in (Fraction(1, 3), Fraction(2, 7), Fraction(10**20 + 1, 10**20)):
        up, down = round_up(value), round_down(value)
        assert Fraction(down) <= value <= Fraction(up)


def test_a_sum_of_costs_is_the_exact_sum_of_each_part() -> None:
    """Composition adds each part exactly, zero parts (pure measurements' delta and rho,
    which the sum skips) included, in any order."""
    rng = random.Random(7)
    parts = [Fraction(0), Fraction(1, 10), Fraction(3, 7), Fraction(1, 10**9), Fraction(5)]
    for _ in range(500):
        costs = [Cost(*(rng.choice(parts) for _ in range(3))) for _ in range(rng.randint(1, 6))]
        total = sum(costs, Cost())
        for part in ("epsilon", "delta", "rho"):
            exact = sum((getattr(c, part) for c in costs), Fraction(0))
            assert getattr(total, part) == exact and isinstance(getattr(total, part), Fraction)
