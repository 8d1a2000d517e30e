"""The 95% interval of a released AVG, from its two measurements (this module's one job).

AVG(x) is released as noisy SUM / noisy COUNT (both measured, both charged), so
its error depends on the group's count and has no closed form. The interval
here is a guaranteed, conservative one, post-processing of the two released
values and the two mechanisms' exact central intervals:

- Split the miss probability between the two (Bonferroni): with probability
  at least 1 - miss, both |S~ - S| <= a and |C~ - C| <= b, where a and b are
  the SUM's and the COUNT's exact half-widths at miss / 2 each.
- The SUM is taken over values rounded to its grid step g (rewrite.SumGrid),
  so the true sum of the clamped values lies within a + C g / 2 of S~.
- The true count is an integer in [max(C~ - b, 1), C~ + b] (a group with no
  rows has no mean to cover). On that event the true mean S / C lies between
  the extremes of (S~ -/+ a) / C -/+ g / 2 over that range of C, which sit at
  its ends (each is monotone in C), and within the column's declared bounds.
- Where even C~ + b is below 1, nothing bounds the count away from 0: the
  interval is the whole declared range.

It covers the truth with probability at least 95% (it ignores that the two
errors are rarely both extreme, hence conservative), and, unless the bounds
cut it, it is never narrower than a / C~, the SUM's own noise at the noisy
count (a / 2 (1/(C~ - b) + 1/(C~ + b)) >= a / C~ where both ends are positive).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpsql.mechanisms.base import COVERAGE_MISS, NoiseMechanism

# The share of the miss probability each of the two measurements may use.
SPLIT = 2


@dataclass(frozen=True)
class AvgWidths:
    """What an AVG's intervals need of its two mechanisms, in the column's units."""

    total: float  # the SUM's half-width at miss / SPLIT
    count: float  # the COUNT's half-width at miss / SPLIT
    step: float  # the SUM's grid step: each summed value was rounded to it


def avg_widths(
    sum_noise: NoiseMechanism,
    sum_step: float,
    count_noise: NoiseMechanism,
    miss: float = COVERAGE_MISS,
) -> AvgWidths:
    """The two half-widths for intervals that miss with probability at most `miss`;
    `sum_noise` draws in grid steps of `sum_step`. Exact searches that can fail on
    extreme parameters: planning computes them, before anything is charged."""
    return AvgWidths(
        sum_noise.half_width(miss / SPLIT) * sum_step,
        count_noise.half_width(miss / SPLIT),
        sum_step,
    )


def clamp(values: np.ndarray, lower: float, upper: float) -> np.ndarray:
    """np.clip(values, lower, upper) for scalar bounds, by two ufuncs: on the few values of a
    release, np.clip's Python wrapper costs more than the clamping. In this order a value
    equal to a bound is kept, and NaN stays NaN, as np.clip does (signed zeros included)."""
    return np.minimum(upper, np.maximum(lower, values))


def avg_intervals(
    total: np.ndarray, count: np.ndarray, widths: AvgWidths, bounds: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) per group, covering each group's true mean with probability at least
    1 - miss: `total` is the noisy SUM in the column's units, `count` the noisy COUNT,
    `bounds` the column's declared (lower, upper)."""
    lower, upper = bounds
    total = np.asarray(total, dtype=np.float64)
    count = np.asarray(count, dtype=np.float64)
    smallest = np.maximum(np.ceil(count - widths.count), 1.0)
    largest = np.floor(count + widths.count)
    possible = largest >= 1
    largest = np.maximum(largest, 1.0)  # only where impossible, then replaced by the range
    rounding = widths.step / 2
    top, bottom = total + widths.total, total - widths.total
    # (S~ + a) / C is largest at the smallest C when positive, at the largest C otherwise
    high = np.where(top >= 0, top / smallest, top / largest) + rounding
    low = np.where(bottom >= 0, bottom / largest, bottom / smallest) - rounding
    low = np.where(possible, clamp(low, lower, upper), lower)
    high = np.where(possible, clamp(high, lower, upper), upper)
    return low, high
