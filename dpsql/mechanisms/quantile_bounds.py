"""A DP 95% value interval for a quantile: noisy signed rank distances at a few edges.

The exponential mechanism (mechanisms/quantiles.py) states how far its release is in
ranks; which values those ranks are needs the data. This releases an interval of
values that holds the quantile with probability at least 95%, whatever the data.

Over the same histogram (`counts[i]` values in candidate i, `rank(i)` the values at or
below candidate i's top), with q = a / D, the signed distance of an edge i is the
integer d(i) = D rank(i) - a n (D times rank(i) - q n). At the edges of `edges_around`
(those 0, 1, 4, 16, ... steps of the grid's finest width away from the quantile's
released candidate, either side, up to the grid's span: a function of that release
alone, fixed before this reads the data) each
d(i) is released with discrete Laplace noise (mechanisms/laplace.py, exact), and the
interval is

    lower: the top of the highest edge whose noisy d + margin < -D, else the domain's
           lower end (the histogram clamps every value into the domain);
    upper: the top of the lowest edge whose noisy d - margin >= D, else the upper end,

where `margin` bounds every edge's noise at once with probability 95% (each edge's
tail at most 0.05 / M, M the most edges the span has). On that event, the lower edge's rank is
below q n - 1 and the upper edge's at least q n + 1, so the interval holds every
value of rank within one of q n: PERCENTILE_DISC's (rank ceil(q n)) and both values
PERCENTILE_CONT interpolates between (ranks within [q n - q, q n + 1 - q]). The
coverage is that of the values as clamped into the declared domain.

Privacy map: a unit adding m <= s values (the histogram's rank sensitivity) moves
each rank by some r in [0, m] and a n by a m, so each d(i) by D r - a m, at most
max(a, D - a) s; M edges move by at most M max(a, D - a) s in L1, the noise's
sensitivity: the release is epsilon-DP, and composes sequentially with the quantile's
own (whose release chose the edges).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.mechanisms.laplace import DiscreteLaplace

# Edges EDGE_BASE^0, EDGE_BASE^1, ... positions either side of the released candidate's,
# and that one: geometric, so a bound is found within a factor EDGE_BASE of its
# distance at any data density, and few, since the noise grows with their number
# (base 4 gives narrower intervals than 2 or 8: fewer edges against a coarser step).
EDGE_BASE = 4
COVERAGE = Fraction(95, 100)


def most_edges(span: int) -> int:
    """The most edges over `span` positions: the pick and every power of EDGE_BASE up to
    the span, either side."""
    reach = 0
    while EDGE_BASE**reach < span:
        reach += 1
    return 2 * (reach + 1) + 1


def edges_around(positions: np.ndarray, pick: int) -> np.ndarray:
    """The candidates whose signed distances are released: `pick` and those holding the
    positions EDGE_BASE^j away from its position on either side, in order. `positions`:
    each candidate's first position on the grid's finest steps (sorted; a candidate of a
    uniform grid is one step), so the edges are spaced in values, not candidates."""
    span = int(positions[-1]) + 1
    reach = (most_edges(span) - 3) // 2
    steps = np.asarray([EDGE_BASE**j for j in range(reach + 1)], dtype=np.int64)
    at = int(positions[pick]) + np.concatenate([-steps[::-1], [0], steps])
    at = at[(at >= 0) & (at < span)]
    return np.unique(np.searchsorted(positions, at, side="right") - 1)


@dataclass(frozen=True)
class QuantileBounds:
    """The value interval of quantile `q` at `epsilon` over histograms of rank
    sensitivity `sensitivity` (the module docstring)."""

    q: Fraction
    epsilon: Fraction
    sensitivity: int
    span: int  # the grid's positions (edges_around)

    @property
    def edges(self) -> int:
        return most_edges(self.span)

    @functools.cached_property
    def noise(self) -> DiscreteLaplace:
        spread = max(self.q.numerator, self.q.denominator - self.q.numerator)
        return DiscreteLaplace(self.edges * spread * self.sensitivity, self.epsilon)

    @functools.cached_property
    def margin(self) -> int:
        """A bound on every edge's noise at once, with probability COVERAGE."""
        return int(self.noise.half_width(float((1 - COVERAGE) / self.edges)))

    def release(
        self, counts: np.ndarray, positions: np.ndarray, pick: int, rng: np.random.Generator
    ) -> tuple[int | None, int | None]:
        """The lower and upper edges (candidate indexes whose tops bound the quantile),
        each None where no edge is sure enough: the domain's end bounds it there."""
        edges = edges_around(positions, pick)
        ranks = np.cumsum(np.asarray(counts, dtype=np.int64))
        numerator, denominator = self.q.numerator, self.q.denominator
        # Python integers: D rank stays exact past int64 for a huge table
        distances = np.array(
            [denominator * int(ranks[e]) - numerator * int(ranks[-1]) for e in edges],
            dtype=object,
        )
        noisy = distances + self.noise.sample(np.zeros(len(edges), dtype=np.int64), rng)
        below = edges[noisy + self.margin < -denominator]
        above = edges[noisy - self.margin >= denominator]
        return (
            int(below.max()) if below.size else None,
            int(above.min()) if above.size else None,
        )
