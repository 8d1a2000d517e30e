"""The bounding note: a noisy estimate of the share of rows contribution bounding cut.

A query over a table whose units may have many rows keeps at most
`max_rows_per_unit` rows per group and `max_groups_per_unit` groups of each
unit; the rest are cut without a trace in the answer. This measurement says so
when the cut is large. The bounded SQL (rewrite's `before_cap`) returns, per
group, the rows kept and, for each unit once, min(its rows before the bounding,
CAP x max_rows x max_groups). Summed over the groups they give two totals, each
unit contributing (cut_u, kept_u) with cut_u = min(rows_u, cap) - kept_u >= 0,
so cut_u + kept_u <= cap: the pair (cut, kept) has L1 sensitivity `cap`, and one
noise draw per coordinate calibrated to it is one measurement of epsilon
SHARE x the query's epsilon, taken from the query's own (its charge is unchanged).

The note is post-processing of the two noisy totals: it is shown only when the
lower end of a 95% interval of cut / (cut + kept) is at least NOTE_FROM, so noise
alone rarely raises it. The capped share is never above the true one (capping a
unit's rows lowers its cut and its total by the same amount), so the note's "at
least" holds for the rows the query read, not only for the capped count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import numpy as np

from dpsql.accounting import Cost
from dpsql.mechanisms.base import NoiseMechanism

#: Each unit's rows count, in the estimate, up to CAP times what the bounding keeps of it.
CAP = 4
#: The part of the query's epsilon the note's measurement spends: one in SHARE_PARTS.
SHARE_PARTS = 10
#: The lower end of the cut share's 95% interval from which the note is shown.
NOTE_FROM = 0.10
#: How the note begins (sql/scalars.py passes a subquery's note on by it).
NOTE_START = "contribution bounding cut at least"
# Two noisy totals, each within its half-width but for half the miss: both at 95%.
_MISS = 0.025


class BoundingNote:
    """The measurement behind the note, for one query's bounds."""

    def __init__(self, noise: NoiseMechanism, rows: int, groups: int, grouped: bool):
        self.noise = noise  # calibrated to sensitivity `cap` at the note's epsilon
        self.rows, self.groups, self.grouped = rows, groups, grouped
        self.cap = self.cap_for(rows, groups)

    @staticmethod
    def cap_for(rows: int, groups: int) -> int:
        """The most one unit adds to the estimate: CAP times the rows it may keep."""
        return CAP * rows * groups

    @property
    def cost(self) -> Cost:
        return self.noise.cost

    @staticmethod
    def counted(batches: Iterable[list[tuple]], totals: list[int]) -> Iterator[list[tuple]]:
        """The batches as they are, each row's last two columns (BEFORE_COLUMN, KEPT_COLUMN)
        added to `totals` on the way: every group the database returned, before any key
        selection."""
        for batch in batches:
            for row in batch:
                totals[0] += int(row[-2] or 0)
                totals[1] += int(row[-1] or 0)
            yield batch

    def notes(self, totals: list[int], rng: np.random.Generator) -> list[str]:
        """The note on the counted totals, if the cut is confidently large; the noise is
        drawn either way (whether a note is shown must depend on noisy values only)."""
        before, kept = totals
        exact = np.array([before - kept, kept], dtype=np.int64)
        cut, kept = (float(v) for v in self.noise.sample(exact, rng))
        low = cut_share_low(cut, kept, self.noise.half_width(_MISS))
        if low < NOTE_FROM:
            return []
        about = min(1.0, max(low, cut / (cut + kept)))
        rows = f"{self.rows} row{'' if self.rows == 1 else 's'}"
        bounds = f"{rows} (max_rows_per_unit = {self.rows})"
        raise_them = "SET dpsql.max_rows_per_unit"
        if self.grouped:
            bounds = (
                f"{rows} per group in {self.groups} group{'' if self.groups == 1 else 's'} "
                f"(max_rows_per_unit = {self.rows}, max_groups_per_unit = {self.groups})"
            )
            raise_them += " or dpsql.max_groups_per_unit"
        return [
            f"{NOTE_START} {math.floor(low * 100)}% of the rows this "
            f"query read (about {round(about * 100)}%): each unit kept at most {bounds}; a "
            "noisy estimate (95% confident), which counts at most "
            f"{CAP} times the kept rows of each unit, so the true share may be larger. "
            f"EXPLAIN shows the bounds; raise them with {raise_them} (the noise grows with "
            "them)"
        ]

    def explanation(self, epsilon: float) -> str:
        noise = self.noise
        return (
            f"{noise.name}, sensitivity {noise.sensitivity:g}, scale {float(noise.scale):.6g}, "
            f"epsilon {epsilon:.6g} (1/{SHARE_PARTS} of the query's, within its cost): the "
            "rows bounding cut and the rows it kept, each unit's rows counted up to "
            f"{CAP} x max_rows_per_unit x max_groups_per_unit; a note is shown when the cut "
            f"share is confidently {NOTE_FROM:.0%} or more. SET dpsql.bounding_note = off gives "
            "its epsilon back to the measurements"
        )


def cut_share_low(cut: float, kept: float, half_width: float) -> float:
    """The lower end of the interval of cut / (cut + kept) when each noisy total is within
    `half_width` of its exact value: the fewest cut rows over the most rows."""
    least_cut = max(0.0, cut - half_width)
    if least_cut == 0:
        return 0.0
    return least_cut / (least_cut + max(0.0, kept + half_width))
