"""Privacy-cost arithmetic: (epsilon, delta) and zCDP costs and their sequential composition.

Costs are exact rationals (fractions.Fraction of the floats the user wrote), so
sums never drift below the truth; a float shown to a user is rounded up.

A cost has three parts that compose by addition: pure/approximate epsilon,
delta, and zCDP rho (Bun and Steinke 2016). An analyst's budget is an
(epsilon, delta) pair; a total with rho > 0 is converted with the conversion of
Canonne, Kamath and Steinke (2020), spending the delta the (epsilon, delta)
part left over.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction


def _exact(value: float | int | Fraction, name: str) -> Fraction:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    exact = _as_written(value) if isinstance(value, float) else Fraction(value)
    if exact < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    return exact


@functools.lru_cache(maxsize=1024)
def _as_written(value: float) -> Fraction:
    # A float is taken as the decimal it prints as (0.1 is 1/10), which is what
    # the user wrote in a policy or SET; ten charges of 0.1 then fit in 1.0.
    # Cached: parsing the text costs microseconds, and every plan converts the
    # same few epsilons and deltas again (a Fraction is immutable, so shared).
    return Fraction(repr(value))


def round_up(value: Fraction) -> float:
    """The smallest float that is >= value, so a reported cost never understates; a value
    a float's decimal says exactly (3/10 is 0.3, as the ledger reads floats: _as_written)
    is that float, not the next one up (0.30000000000000004 would be an artefact)."""
    approx = float(value)
    if Fraction(approx) >= value or _as_written(approx) == value:
        return approx
    return math.nextafter(approx, math.inf)


def round_down(value: Fraction) -> float:
    """The largest float that is <= value, so a reported remainder never overstates; a
    value a float's decimal says exactly is that float (1/10000 is 0.0001)."""
    approx = float(value)
    if Fraction(approx) <= value or _as_written(approx) == value:
        return approx
    return math.nextafter(approx, -math.inf)


@functools.lru_cache(maxsize=256)  # the same few (epsilon, parts) recur query after query
def split_epsilon(epsilon: float, parts: int, *, binary_too: bool = False) -> float:
    """The largest epsilon each of `parts` measurements may spend when `epsilon` is charged.

    A mechanism takes a float epsilon as the decimal it prints as (the ledger's
    reading, _as_written): the share's decimal times `parts` stays within the
    charge. (A plain epsilon/parts could print one digit up: 9.03442905035 over 7
    spent 1.2e-15 more than was charged.) `binary_too`: partition selection reads
    the share as its binary value, which then stays within its decimal too.
    """
    charged = _as_written(float(epsilon))
    share = float(charged / parts)  # the nearest float; then down while it spends too much
    while share > 0 and not (
        parts * _as_written(share) <= charged
        and (not binary_too or Fraction(share) <= _as_written(share))
    ):
        share = math.nextafter(share, 0.0)
    return share


def set_aside(epsilon: float, parts: int) -> tuple[float, float]:
    """One part in `parts` of `epsilon` (at most), set aside, and the largest float left
    for the rest: the two, read as the decimals they print as, sum within `epsilon`."""
    aside = split_epsilon(epsilon, parts)
    left = _as_written(float(epsilon)) - _as_written(aside)
    rest = float(left)
    while rest > 0 and _as_written(rest) > left:
        rest = math.nextafter(rest, 0.0)
    return aside, rest


def _plus(a: Fraction, b: Fraction) -> Fraction:
    # Adding zero (the delta and rho of pure measurements, mostly) is free: a Fraction sum
    # costs a gcd, and every plan and charge adds up several costs.
    return a if not b else b if not a else a + b


@dataclass(frozen=True, order=False)
class Cost:
    """A privacy cost: (epsilon, delta) plus zCDP rho; composition is addition."""

    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)
    rho: Fraction = Fraction(0)

    @classmethod
    def of(
        cls, epsilon: float | Fraction = 0, delta: float | Fraction = 0, rho: float | Fraction = 0
    ) -> Cost:
        return cls(_exact(epsilon, "epsilon"), _exact(delta, "delta"), _exact(rho, "rho"))

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            _plus(self.epsilon, other.epsilon),
            _plus(self.delta, other.delta),
            _plus(self.rho, other.rho),
        )

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.epsilon - other.epsilon, self.delta - other.delta, self.rho - other.rho)

    def fits_within(self, budget: Cost) -> bool:
        """Whether this total is within an (epsilon, delta) budget, rho converted."""
        if not self.rho:
            return self.epsilon <= budget.epsilon and self.delta <= budget.delta
        delta_left = budget.delta - self.delta
        if delta_left <= 0:
            return False
        return self.epsilon + zcdp_epsilon(self.rho, delta_left) <= budget.epsilon

    def approximate(self, delta_budget: Fraction) -> tuple[Fraction, Fraction]:
        """The (epsilon, delta) this cost amounts to when rho may use the rest of `delta_budget`."""
        if not self.rho:
            return self.epsilon, self.delta
        return self.epsilon + zcdp_epsilon(self.rho, delta_budget - self.delta), delta_budget

    def split(self, parts: int) -> Cost:
        """An equal share of this cost for each of `parts` measurements."""
        return Cost(self.epsilon / parts, self.delta / parts, self.rho / parts)

    def __str__(self) -> str:
        text = f"epsilon={float(self.epsilon):.10g}, delta={float(self.delta):.4g}"
        return text + (f", rho={float(self.rho):.6g}" if self.rho else "")


_SMALLEST_RHO = Fraction(1, 2**1000)


def zcdp_epsilon(rho: Fraction | float, delta: Fraction | float) -> Fraction:
    """An epsilon such that rho-zCDP implies (epsilon, delta)-DP; never an underestimate.

    Canonne, Kamath and Steinke (2020), Proposition 12 solved for epsilon: for
    every alpha > 1,
    epsilon = alpha*rho + (log(1/delta) + (alpha-1) log(1-1/alpha) - log(alpha)) / (alpha-1).
    At alpha = 1 + sqrt(log(1/delta)/rho) this is below the classic
    rho + 2 sqrt(rho log(1/delta)) (the added terms are negative), and any alpha
    gives a valid epsilon, so the search for the best alpha runs in floating
    point; the bound at the alpha found (or at the classic alpha, if better) is
    then evaluated in 50-digit decimals and rounded up by far more than that
    evaluation's error, so the result is valid whatever the floating point did.
    """
    rho, delta = Fraction(rho), Fraction(delta)
    if rho <= 0:
        return Fraction(0)
    if not 0 < delta < 1:
        raise ValueError(f"converting zCDP needs 0 < delta < 1, got {float(delta)}")
    # The search below runs on float(rho), which is 0 below 2^-1074 (and then NaN).
    # rho-zCDP implies rho'-zCDP for every rho' >= rho, so the bound for the larger
    # _SMALLEST_RHO holds for a smaller rho too: conservative, never an underestimate.
    rho = max(rho, _SMALLEST_RHO)
    r, log_inv_delta = float(rho), -math.log(float(delta))

    def approximate(alpha: float) -> float:
        return alpha * r + (
            log_inv_delta + (alpha - 1) * math.log1p(-1 / alpha) - math.log(alpha)
        ) / (alpha - 1)

    # golden-section search on log(alpha - 1): the bound is unimodal there
    lo, hi = math.log(1e-6), math.log(1e6 + math.sqrt(log_inv_delta / r))
    golden = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
        if approximate(1 + math.exp(a)) <= approximate(1 + math.exp(b)):
            hi = b
        else:
            lo = a
    classic = 1 + math.sqrt(log_inv_delta / r)
    alpha = min(1 + math.exp(lo), classic, key=approximate)

    with localcontext() as ctx:
        ctx.prec = 50
        a = +Decimal(alpha)  # rounded to 50 digits: harmless, every alpha > 1 gives a valid bound
        rate = Decimal(rho.numerator) / Decimal(rho.denominator)
        log_inv = -(Decimal(delta.numerator) / Decimal(delta.denominator)).ln()
        loss = (a - 1) * (1 - 1 / a).ln() - a.ln()  # negative
        epsilon = a * rate + (log_inv + loss) / (a - 1)
        # 50-digit operations err by a few units in the 50th digit of the largest term
        margin = (a * rate + (log_inv - loss) / (a - 1)) * Decimal("1e-40")
    # for delta near 1 the bound can fall below 0, and (0, delta)-DP then holds
    return max(Fraction(0), Fraction(epsilon) + Fraction(margin))


@functools.lru_cache(maxsize=256)  # tens of conversions each; the same budget shares recur
def zcdp_rho(epsilon: float, delta: float) -> float:
    """The largest rho (to a relative 1e-9) whose zcdp_epsilon is within (epsilon, delta).

    Safe for calibrating noise: the rho returned converts to at most epsilon. As epsilon
    shrinks to 0, delta alone limits rho (to about 1.36 delta^2: at delta 1e-6, epsilon
    1e-300 gets the rho of 1e-20). 0.0 when none converts, which takes a tiny delta too
    (none at epsilon 1e-300 and delta 1e-80): no noise can be calibrated.
    """
    exact_epsilon, exact_delta = Fraction(repr(epsilon)), Fraction(repr(delta))
    if zcdp_epsilon(_SMALLEST_RHO, exact_delta) > exact_epsilon:
        return 0.0  # not even the smallest rho the conversion handles fits
    low, high = float(_SMALLEST_RHO), epsilon
    while zcdp_epsilon(Fraction(high), exact_delta) <= exact_epsilon:  # only for delta near 1
        low, high = high, high * 2
    while high - low > 1e-9 * high:
        middle = (low + high) / 2
        if zcdp_epsilon(Fraction(middle), exact_delta) <= exact_epsilon:
            low = middle
        else:
            high = middle
    return low


def total(costs: list[Cost]) -> Cost:
    """Sequential composition of several measurements."""
    result = Cost()
    for cost in costs:
        result = result + cost
    return result
