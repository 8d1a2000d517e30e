"""The candidates of a DP quantile and the SQL that buckets a column's values over them.

A quantile is released as one candidate of a grid fixed before the data are read
(sql/quantiles.py): `uniform_grid` splits the column's declared domain into equal
buckets, as many as the quantile's epsilon makes worth it (docs/mechanisms.md,
"bucket choice"); `_bucket` writes the SQL that puts a row's value in its bucket.

Where a bucket of that grid may hold many rows (a float or timestamp domain, or an
integer or date domain with more values than buckets), a quantile is released in
two stages (`RefinedQuantiles`): a `Lattice` of fine buckets in groups of `factor`,
whose groups are the first stage's candidates, and then `Refined`: each fine bucket
of the groups within WINDOW groups of the first stage's picks, and every other group
whole. The second stage's base measure weighs each candidate by its width (a fine
bucket 1 / factor of a group), so the windows add resolution where the first stage
points and take no probability from elsewhere: a first stage that picked badly costs
the second only the resolution it did not add.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.mechanisms.quantiles import RatePrior, lattice_prior
from dpsql.policy import Table
from dpsql.sql.clamps import clamp
from dpsql.sql.intervals import Interval

# Buckets: about BUCKETS_PER_EPSILON per unit of a quantile's epsilon (a power of two),
# within [MIN_BUCKETS, MAX_BUCKETS]; an integer or date domain never has more buckets
# than values. A finer grid shrinks the grid's own error (a bucket's share of the
# ranks) while the mechanism's grows only as ln(buckets); the cap bounds the rows the
# database returns per group and the sampler's time (about 60 ms at 16384 buckets).
BUCKETS_PER_EPSILON = 4096
MIN_BUCKETS, MAX_BUCKETS = 256, 16384
# The second stage refines the groups around each first-stage pick in rings (radius,
# divisor): the RINGS[0] nearest into `factor` fine buckets each, out to WINDOW groups
# into factor / 64: the first stage's pick is nearest the quantile at most sizes, and
# the outer rings still split a group finer than its rows where a group holds few. A
# pick costs PICK_UNITS times `factor` fine buckets, FINE_CANDIDATES over all picks, so
# the histogram has at most a grid's buckets plus FINE_CANDIDATES rows per group.
WINDOW = 16
RINGS = ((1, 1), (4, 8), (WINDOW, 64))
FINE_CANDIDATES = 8192
MAX_FACTOR = 1024


def _ring_groups() -> list[tuple[int, int]]:
    """Each ring's own groups (past the inner rings') around one pick, and its divisor."""
    found, inner = [], 0
    for radius, divisor in RINGS:
        found.append((2 * radius + 1 - inner, divisor))
        inner = 2 * radius + 1
    return found


PICK_UNITS = sum(groups / divisor for groups, divisor in _ring_groups())  # 3 + 6/8 + 24/64
_EPOCH = dt.date(1970, 1, 1)
_MIDNIGHT = dt.datetime(1970, 1, 1)


@dataclass(frozen=True)
class Grid:
    """The histogram's buckets: bucket i holds [lower + i width, lower + (i + 1) width)."""

    lower: float
    width: float
    size: int
    kind: str  # the column's policy type: int, float, date or timestamp (in seconds)
    upper: float  # the domain's last value

    def value(self, index: int) -> Any:
        """Bucket `index`'s released value: its top (the upper edge; for int and date
        columns the largest value in it), the point whose rank the mechanism scores
        (the values in buckets 0..index)."""
        if self.kind in ("float", "timestamp"):
            return self._typed(min(self.upper, self.lower + (index + 1) * self.width))
        offset = min(int(self.upper), int(self.lower) + (index + 1) * int(self.width) - 1)
        return self._typed(offset)

    def _typed(self, offset: float) -> Any:
        if self.kind == "date":
            return _EPOCH + dt.timedelta(days=int(offset))
        if self.kind == "timestamp":  # to the microsecond, as the database stores it
            return _MIDNIGHT + dt.timedelta(microseconds=round(offset * 1e6))
        return int(offset) if self.kind == "int" else offset

    @property
    def most(self) -> int:
        """The most candidates it has (the rank bound's count)."""
        return self.size

    @functools.cached_property
    def positions(self) -> np.ndarray:
        """Each candidate's place on the grid's finest steps: here, its index."""
        return np.arange(self.size, dtype=np.int64)

    def ends(self) -> tuple[Any, Any]:
        """The domain's first and last values, as released values are typed."""
        return self._typed(self.lower), self._typed(self.upper)

    def indexes(self, buckets: np.ndarray) -> np.ndarray:
        """The candidate of each bucket the database returned."""
        return buckets

    def prior(self, q: Fraction, epsilon: Fraction, sensitivity: int) -> tuple[Fraction, ...]:
        """The base measure: uniform."""
        return ()

    def bucket(self, column: exp.Column, table: Table) -> exp.Expression:
        """The SQL of a row's bucket."""
        return _bucket(column, table, self)

    def describe(self) -> str:
        unit = {"date": " days", "timestamp": " seconds"}.get(self.kind, "")
        first = self.lower if self.kind == "float" else self._typed(self.lower)
        return f"{self.size} buckets of width {self.width:g}{unit} from {first}"


@dataclass(frozen=True)
class Lattice:
    """Fine buckets of `fine`, in groups of `factor`: the groups are the first stage's
    candidates (`coarse`), and `refined` the second stage's."""

    fine: Grid
    factor: int

    @property
    def coarse(self) -> Grid:
        fine, width = self.fine, self.fine.width * self.factor
        return Grid(fine.lower, width, -(-fine.size // self.factor), fine.kind, fine.upper)

    def refined(self, picks: set[int], windows: int) -> Refined:
        """The second stage's candidates around the first stage's `picks` (coarse
        buckets); `windows`: the most picks the query can have (its rank bound's)."""
        last, split = self.coarse.size - 1, {}
        for pick in picks:
            for radius, divisor in RINGS:
                parts = self.factor // divisor
                for group in range(max(0, pick - radius), min(last, pick + radius) + 1):
                    if parts >= 2 and split.get(group, 1) < parts:
                        split[group] = parts
        return Refined(self, tuple(sorted(split.items())), self.coarse.size + windows * self._extra)

    @property
    def _extra(self) -> int:
        """The most candidates one pick adds: each ring's groups (past the inner rings')
        in their parts, less the group each part of replaces."""
        return sum(
            groups * (max(1, self.factor // divisor) - 1) for groups, divisor in _ring_groups()
        )

    def rings(self) -> str:
        """How the second stage splits the groups around a pick, for EXPLAIN."""
        width, unit = self.fine.width, {"date": " days", "timestamp": " seconds"}
        parts = [
            f"within {radius} in {self.factor // divisor} of width {width * divisor:g}"
            f"{unit.get(self.fine.kind, '')}"
            for radius, divisor in RINGS
            if self.factor // divisor >= 2
        ]
        return ", ".join(parts)


def lattice(domain: tuple[float, float, str], epsilon: Fraction, windows: int) -> Lattice | None:
    """The lattice for a quantile at `epsilon` whose first stage has at most `windows`
    picks (groups times quantiles); None where refining adds nothing: a grid of one
    value a bucket, or too many windows for FINE_CANDIDATES."""
    grid = uniform_grid(domain, epsilon)
    # a power of two: each ring's factor / divisor divides it (its buckets nest)
    factor = _power_of_two_below(min(MAX_FACTOR, int(FINE_CANDIDATES / (windows * PICK_UNITS))))
    if grid.kind in ("float", "timestamp"):
        if factor < 2:
            return None
        fine = Grid(grid.lower, grid.width / factor, grid.size * factor, grid.kind, grid.upper)
        return Lattice(fine, factor)
    width = int(grid.width)
    factor = _power_of_two_below(min(factor, width))
    if factor < 2:
        return None
    step = -(-width // factor)  # whole values a fine bucket
    values = int(grid.upper) - int(grid.lower) + 1
    fine = Grid(grid.lower, float(step), -(-values // step), grid.kind, grid.upper)
    return Lattice(fine, factor)


def _power_of_two_below(n: int) -> int:
    """The largest power of two at most n (0 for n < 1)."""
    return 1 << (n.bit_length() - 1) if n >= 1 else 0


@dataclass(frozen=True)
class Refined:
    """The second stage's candidates, in order: the groups `split` (each a group and
    how many equal parts, sorted by group) in their parts, and every other group of the
    lattice whole; at most `most` of them."""

    lattice: Lattice
    split: tuple[tuple[int, int], ...]
    most: int

    @property
    def groups(self) -> tuple[int, ...]:
        return tuple(group for group, _ in self.split)

    @functools.cached_property
    def _parts(self) -> np.ndarray:
        """Each group's parts: 1 for a group kept whole."""
        parts = np.ones(self.lattice.coarse.size, dtype=np.int64)
        for group, count in self.split:
            parts[group] = count
        return parts

    @functools.cached_property
    def _keys(self) -> np.ndarray:
        """Each candidate's key, as the SQL returns it: its first fine bucket."""
        factor, size = self.lattice.factor, self.lattice.fine.size
        keys = [np.arange(self.lattice.coarse.size, dtype=np.int64) * factor]
        for group, count in self.split:
            keys.append(group * factor + np.arange(count, dtype=np.int64) * (factor // count))
        found = np.unique(np.concatenate(keys))
        return found[found < size]

    @functools.cached_property
    def _spans(self) -> np.ndarray:
        """Each candidate's width in fine buckets."""
        factor = self.lattice.factor
        return factor // self._parts[self._keys // factor]

    @property
    def size(self) -> int:
        return len(self._keys)

    @property
    def positions(self) -> np.ndarray:
        """Each candidate's first fine bucket."""
        return self._keys

    def ends(self) -> tuple[Any, Any]:
        return self.lattice.fine.ends()

    def indexes(self, buckets: np.ndarray) -> np.ndarray:
        """The candidate of each key the database returned (the keys are sorted; a key
        that is no candidate's would be a bug in `bucket`, so it raises)."""
        found = np.searchsorted(self._keys, buckets)
        if np.any(found >= len(self._keys)) or np.any(self._keys[found] != buckets):
            raise RuntimeError("the histogram returned a bucket of no candidate")
        return found

    def value(self, index: int) -> Any:
        """The candidate's top: its last fine bucket's."""
        fine, key = self.lattice.fine, int(self._keys[index])
        return fine.value(min(key + int(self._spans[index]), fine.size) - 1)

    def prior(self, q: Fraction, epsilon: Fraction, sensitivity: int) -> RatePrior:
        """A measure by width: a part of a group split in k weighs 1 / k of a whole one."""
        logs = np.log(self._spans / self.lattice.factor)
        return lattice_prior(logs, q, epsilon, sensitivity)

    def bucket(self, column: exp.Column, table: Table) -> exp.Expression:
        """The candidate's key: the part in a split group, else the group's first fine
        bucket. A row's group is the first stage's bucket of it, by the same SQL: the
        histogram of the windows' rows and the first stage's of the other groups
        (`in_windows`) add up to this one, row for row."""
        group = _bucket(column, table, self.lattice.coarse)
        whole = exp.Mul(this=group, expression=exp.convert(self.lattice.factor))
        branches = self._part_branches(column, table)
        return exp.Case(ifs=branches, default=whole) if branches else whole

    def window_bucket(self, column: exp.Column, table: Table) -> exp.Expression:
        """The key of a row's part in a split group; NULL for any other row."""
        branches = self._part_branches(column, table)
        return exp.Case(ifs=branches) if branches else exp.null()

    def _part_branches(self, column: exp.Column, table: Table) -> list[exp.If]:
        """For each run of split groups of equal parts: a row in it has its part's key,
        the part clamped into the run (a value at a run's edge may round to the next)."""
        fine, coarse, factor = self.lattice.fine, self.lattice.coarse, self.lattice.factor
        offset, group = _offset(column, table, fine), _bucket(column, table, coarse)
        branches = []
        for first, last, count in _runs(self.split):
            span = factor // count  # fine buckets a part
            top = (min((last + 1) * factor, fine.size) - 1) // span
            part = _index(offset, fine.width * span, first * count, top)
            branches.append(
                exp.If(
                    this=exp.Between(
                        this=group.copy(), low=exp.convert(first), high=exp.convert(last)
                    ),
                    true=exp.Mul(this=part, expression=exp.convert(span)) if span > 1 else part,
                )
            )
        return branches

    def in_windows(self, column: exp.Column, table: Table) -> exp.Expression:
        """Whether a row is in a kept group, by the first stage's own bucket SQL: a row
        the first stage counted in a group the second splits is counted here, and no
        other (sql/quantiles.py adds the first stage's counts of the other groups).
        Each run's test comes after a comparison of the stored value alone (`_near`),
        which holds for every row of the run and lets the database skip the others
        before any arithmetic."""
        coarse = self.lattice.coarse
        group = _bucket(column, table, coarse)
        runs = []
        for first, last, _ in _runs(tuple((g, 1) for g in self.groups)):
            exact = exp.Between(this=group.copy(), low=exp.convert(first), high=exp.convert(last))
            near = _near(column, table, coarse, first, last)
            runs.append(exact if near is None else exp.and_(near, exact, copy=False))
        return exp.or_(*runs, copy=False) if runs else exp.false()

    @functools.cached_property
    def whole_groups(self) -> tuple[np.ndarray, np.ndarray]:
        """The groups kept whole, and each one's candidate."""
        whole = np.flatnonzero(self._parts == 1)
        return whole, self.indexes(whole * self.lattice.factor)

    def describe(self) -> str:
        fine = self.lattice.fine
        unit = {"date": " days", "timestamp": " seconds"}.get(fine.kind, "")
        return (
            f"{self.lattice.coarse.describe()}, {len(self.groups)} of them split around the "
            f"first stage's picks (the nearest in {self.lattice.factor} of width "
            f"{fine.width:g}{unit})"
        )


def _runs(split: tuple[tuple[int, int], ...]) -> list[tuple[int, int, int]]:
    """Sorted (group, parts) as runs of consecutive groups of equal parts: (first, last,
    parts) each."""
    runs: list[tuple[int, int, int]] = []
    for group, parts in split:
        if runs and runs[-1][1] == group - 1 and runs[-1][2] == parts:
            runs[-1] = (runs[-1][0], group, parts)
        else:
            runs.append((group, group, parts))
    return runs


def declared_domain(column: exp.Column, table: Table) -> tuple[float, float, str]:
    """The column's declared domain, as numbers (dates: days since 1970-01-01;
    timestamps: seconds since 1970-01-01 00:00, as written, without a time zone)."""
    declared = table.column(column.name)
    if declared is None or declared.type not in ("int", "float", "date", "timestamp"):
        kind = declared.type if declared is not None else "unknown"
        raise QueryRefused(
            f"a quantile of {column.name}",
            f"it is a {kind} column; quantiles need a bounded number, date or timestamp",
            "take quantiles of a numeric, date or timestamp column with lower/upper in the policy",
        )
    if not declared.bounded:
        raise QueryRefused(
            f"a quantile of {column.name}",
            "the policy declares no lower/upper for it, and the histogram needs a domain",
            f"ask the data owner to declare lower and upper for {column.name}",
        )
    if declared.type == "date":
        lower, upper = (_days(v) for v in (declared.lower, declared.upper))
    elif declared.type == "timestamp":
        lower, upper = (_seconds(v) for v in (declared.lower, declared.upper))
    else:
        lower, upper = float(declared.lower), float(declared.upper)
    return lower, upper, declared.type


def _days(value: Any) -> int:
    if isinstance(value, str):
        value = dt.date.fromisoformat(value[:10])
    if isinstance(value, dt.datetime):
        value = value.date()
    return (value - _EPOCH).days


def _seconds(value: Any) -> float:
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if not isinstance(value, dt.datetime):  # a date bound: its midnight
        value = dt.datetime.combine(value, dt.time())
    return (value.replace(tzinfo=None) - _MIDNIGHT).total_seconds()


def uniform_grid(domain: tuple[float, float, str], epsilon: Fraction) -> Grid:
    """Buckets for a quantile at `epsilon`: more at larger epsilons, whose rank error is
    smaller (docs/mechanisms.md, "bucket choice")."""
    lower, upper, kind = domain
    wanted = 2 ** round(math.log2(max(1.0, BUCKETS_PER_EPSILON * float(epsilon))))
    size = min(MAX_BUCKETS, max(MIN_BUCKETS, wanted))
    if kind in ("float", "timestamp"):
        return Grid(lower, (upper - lower) / size if upper > lower else 1.0, size, kind, upper)
    values = int(upper) - int(lower) + 1
    width = max(1, math.ceil(values / size))
    return Grid(float(int(lower)), float(width), math.ceil(values / width), kind, float(upper))


def _bucket(column: exp.Column, table: Table, grid: Grid) -> exp.Expression:
    """The bucket of a row's value, clamped into [0, size - 1]; NULL for NULL. NaN and
    infinities compare as the databases order them (NaN above every number) and land in
    an end bucket: no value makes the query fail."""
    return _index(_offset(column, table, grid), grid.width, 0, grid.size - 1)


def _near(
    column: exp.Column, table: Table, grid: Grid, first: int, last: int
) -> exp.Expression | None:
    """A test of the stored value alone that every row of buckets first..last passes
    (a superset: the exact test follows it), None where it would test nothing.

    Its edges lie a bucket outside the run's, and further by a relative 1e-9 of the
    domain's magnitude: the bucket SQL's own float rounding (a few units in the last
    place) cannot put a value it passes over. An end bucket also holds every value
    beyond the domain (NaN and infinities too), so the run's side at an end of the
    grid has no edge. Timestamps' edges are two days further: a time zone's offset
    may differ between an edge and the grid's first value by daylight saving."""
    if grid.kind == "timestamp":
        slack = grid.width + 2 * 86400
    else:
        slack = grid.width + 1e-9 * max(abs(grid.lower), abs(grid.upper), 1.0)
    value = exp.column(table.column(column.name).name, quoted=True)
    below = _edge(math.floor, grid.lower + first * grid.width - slack, grid.kind)
    above = _edge(math.ceil, grid.lower + (last + 1) * grid.width + slack, grid.kind)
    tests = []
    if first > 0 and below is not None:
        tests.append(exp.GTE(this=value.copy(), expression=below))
    if last < grid.size - 1 and above is not None:
        tests.append(exp.LTE(this=value.copy(), expression=above))
    return exp.and_(*tests, copy=False) if tests else None


def _edge(rounded: Any, offset: float, kind: str) -> exp.Expression | None:
    """A literal of the column's type at `offset` (days, seconds), `rounded` outwards to
    a whole value for integers and dates, to the microsecond for timestamps; None past
    the calendar's years 1-9999."""
    try:
        if kind == "date":
            day = _EPOCH + dt.timedelta(days=rounded(offset))
            return exp.cast(exp.convert(day.isoformat()), "DATE")
        if kind == "timestamp":
            moment = _MIDNIGHT + dt.timedelta(microseconds=rounded(offset * 1e6))
            return exp.cast(exp.convert(moment.isoformat(sep=" ")), "TIMESTAMP")
    except OverflowError:
        return None
    return exp.convert(rounded(offset) if kind == "int" else offset)


def _offset(column: exp.Column, table: Table, grid: Grid) -> exp.Expression:
    """A row's value less the grid's first, as a number (dates in days, timestamps in
    seconds, each clamped into the grid's range first)."""
    value: exp.Expression = exp.column(table.column(column.name).name, quoted=True)
    if grid.kind == "date":
        # clamped as dates first: PostgreSQL cannot subtract its infinite dates
        first, last = (
            exp.cast(exp.convert((_EPOCH + dt.timedelta(days=d)).isoformat()), "DATE")
            for d in (int(grid.lower), int(grid.lower + grid.width * grid.size - 1))
        )
        return exp.Sub(this=_between(value, first, last), expression=first.copy())
    if grid.kind == "timestamp":
        # clamped as timestamps first (PostgreSQL's infinite ones); seconds from the first
        # by each dialect's epoch of both, so a session time zone offsets both alike
        first, last = (
            exp.cast(exp.convert(grid.value(index).isoformat(sep=" ")), "TIMESTAMP")
            for index in (-1, grid.size - 1)
        )
        value = _between(value, first, last)
        return exp.Sub(
            this=exp.TimeToUnix(this=value), expression=exp.TimeToUnix(this=first.copy())
        )
    return exp.Sub(this=value, expression=exp.convert(grid.lower))


def _index(offset: exp.Expression, width: float, first: int, last: int) -> exp.Expression:
    """floor(offset / width), clamped into [first, last], as a BIGINT."""
    scaled = exp.Floor(
        this=exp.Div(
            this=exp.cast(offset.copy(), "DOUBLE"), expression=exp.convert(width), typed=False
        )
    )
    return exp.cast(clamp(scaled, Interval(first, last, True)), "BIGINT")


def _between(value: exp.Expression, first: exp.Expression, last: exp.Expression) -> exp.Case:
    """`value` clamped into [first, last] by comparisons alone (no arithmetic to fail)."""
    return exp.Case(
        ifs=[
            exp.If(this=exp.LT(this=value.copy(), expression=first), true=first.copy()),
            exp.If(this=exp.GT(this=value.copy(), expression=last), true=last.copy()),
        ],
        default=value,
    )
