"""Privacy-cost arithmetic: (epsilon, delta) costs and their sequential composition.

Costs are exact rationals (fractions.Fraction of the floats the user wrote), so
sums never drift below the truth; a float shown to a user is rounded up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction


def _exact(value: float | int | Fraction, name: str) -> Fraction:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    # A float is taken as the decimal it prints as (0.1 is 1/10), which is what
    # the user wrote in a policy or SET; ten charges of 0.1 then fit in 1.0.
    exact = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    if exact < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    return exact


def round_up(value: Fraction) -> float:
    """The smallest float that is >= value, so a reported cost never understates."""
    approx = float(value)
    return approx if Fraction(approx) >= value else math.nextafter(approx, math.inf)


def round_down(value: Fraction) -> float:
    """The largest float that is <= value, so a reported remainder never overstates."""
    approx = float(value)
    return approx if Fraction(approx) <= value else math.nextafter(approx, -math.inf)


@dataclass(frozen=True, order=False)
class Cost:
    """An (epsilon, delta) privacy cost; composition is addition (basic composition)."""

    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)

    @classmethod
    def of(cls, epsilon: float | Fraction = 0, delta: float | Fraction = 0) -> Cost:
        return cls(_exact(epsilon, "epsilon"), _exact(delta, "delta"))

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.epsilon + other.epsilon, self.delta + other.delta)

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.epsilon - other.epsilon, self.delta - other.delta)

    def fits_within(self, budget: Cost) -> bool:
        return self.epsilon <= budget.epsilon and self.delta <= budget.delta

    def split(self, parts: int) -> Cost:
        """An equal share of this cost for each of `parts` measurements."""
        return Cost(self.epsilon / parts, self.delta / parts)

    def __str__(self) -> str:
        return f"epsilon={float(self.epsilon):.10g}, delta={float(self.delta):.4g}"


def total(costs: list[Cost]) -> Cost:
    """Sequential composition of several measurements."""
    result = Cost()
    for cost in costs:
        result = result + cost
    return result
