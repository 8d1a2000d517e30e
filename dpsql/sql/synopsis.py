"""Range counts from a column's synopsis: recognise them, build the synopsis once, answer free.

A column whose policy declares `synopsis: {bin, epsilon, branching}` gets a
noisy hierarchical histogram over its bins (dpsql.mechanisms.tree): discrete
Laplace noise for pure epsilon, or with `mechanism: gaussian` discrete
Gaussian noise calibrated in zCDP to the declared (epsilon, delta). This
module is the SQL side: the planner recognises COUNT(*) / COUNT(col) with
range predicates on the column (BETWEEN, <, <=, >, >=, =, open ends,
conjunctions) and histograms whose buckets are unions of bins
(FLOOR(col / d), col // d, the column itself, date_trunc). The first such
query gets `BuildSynopsisPlan`: charged the synopsis's cost, it runs the
per-bin GROUP BY (bounding each unit's contribution in one window pass, see
`_histogram_sql`), builds the noisy tree, hands it to the Session to persist,
and answers from it. Every later one gets `StoredSynopsisPlan`, which is
free. A query on the column that the synopsis cannot answer exactly gets the
direct plan, with a note saying why (EXPLAIN shows it).

Values are clamped to the column's [lower, upper] before binning; rows where
the column is NULL are in no bin.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlglot import exp

from dpsql.accounting import Cost, zcdp_rho
from dpsql.errors import ProgrammingError, QueryRefused
from dpsql.lru import WeightedLru
from dpsql.mechanisms.base import NoiseMechanism, OutOfRange
from dpsql.mechanisms.gaussian import DiscreteGaussian
from dpsql.mechanisms.tree import (
    HierarchicalHistogram,
    TreeShape,
    gaussian_node_noise,
    l2_sensitivity,
    laplace_node_noise,
)
from dpsql.policy import Column, Policy, Table
from dpsql.results import Accuracy, Release
from dpsql.sql.analysis import VALUE_PREFIX, Analysis
from dpsql.sql.analyze import analyze
from dpsql.sql.clamps import clamp
from dpsql.sql.intervals import Interval
from dpsql.sql.plan import DirectPlan, beyond_the_sampler
from dpsql.sql.postprocess import project
from dpsql.sql.ranges import conjuncts
from dpsql.sql.rewrite import in_dialect, keyed_hash, near_zero, read_double

if TYPE_CHECKING:
    from dpsql.sql import PlanContext

PREFIX = "synopsis:"
MAX_BUCKETS = 1_000_000
_EPOCH = dt.datetime(1970, 1, 1)
_DAY = 86_400
_TRUNC_UNITS = ("hour", "day", "week", "month", "quarter", "year")


class _Decline(Exception):
    """The query touches a synopsis column, but the synopsis cannot answer it exactly."""


# -- the column's bins --------------------------------------------------------


@dataclass(frozen=True)
class Domain:
    """A synopsis column's bins in a numeric coordinate (seconds for dates and timestamps).

    Bin i holds the (clamped) values in [lower + i*width, lower + (i+1)*width).
    `step` is the spacing of the values themselves: 1 for int, a day for date,
    None for float and timestamp (continuous). `data_version` is the policy's and
    `database` the adapter's identity: a synopsis of other data is another synopsis.
    """

    table: Table
    column: Column
    lower: Fraction
    upper: Fraction
    width: Fraction
    step: Fraction | None
    data_version: str = ""
    database: str = ""

    @classmethod
    def of(cls, table: Table, column: Column, data_version: str = "", database: str = "") -> Domain:
        spec = column.synopsis
        timed = column.type in ("date", "timestamp")
        width = Fraction(int(spec.bin.total_seconds())) if timed else _fraction(spec.bin)
        step = {"int": Fraction(1), "date": Fraction(_DAY)}.get(column.type)
        lower, upper = _coordinate(column.lower), _coordinate(column.upper)
        return cls(table, column, lower, upper, width, step, data_version, database)

    @functools.cached_property
    def bins(self) -> int:
        return math.floor((self.upper - self.lower) / self.width) + 1

    @property
    def timed(self) -> bool:
        return self.column.type in ("date", "timestamp")

    @property
    def contributions(self) -> int:
        """Rows one unit can add to the histogram after bounding (bins are its groups)."""
        table = self.table
        if not table.privacy_unit or table.unique_unit:
            return 1
        return table.max_groups_per_unit * table.max_rows_per_unit

    @property
    def gaussian(self) -> bool:
        return self.column.synopsis.mechanism == "gaussian"

    @functools.cached_property
    def shape(self) -> TreeShape:
        return TreeShape(self.bins, self.column.synopsis.branching)

    @functools.cached_property
    def rho(self) -> float:
        """The Gaussian variant's zCDP rho: the largest within the declared (epsilon, delta)."""
        spec = self.column.synopsis
        return zcdp_rho(spec.epsilon, spec.delta)

    @property
    def cost(self) -> Cost:
        """What building the synopsis is charged: epsilon, or the Gaussian variant's rho
        (the ledger composes rho and converts it with the analyst's delta)."""
        if self.gaussian:
            return Cost.of(rho=self.rho)
        return Cost.of(self.column.synopsis.epsilon)

    def noise(self) -> NoiseMechanism:
        """The declared mechanism's noise on each node, its sampler built: refused (before
        the charge) where the declared epsilon puts it beyond what the sampler draws."""
        spec = self.column.synopsis
        try:
            if self.gaussian:
                if not self.rho:
                    raise OutOfRange(f"no zCDP rho converts to within delta {spec.delta:g}")
                noise = self._gaussian_noise()
            else:
                noise = laplace_node_noise(self.shape, spec.epsilon, self.contributions)
            noise.prepare()
        except OutOfRange as exc:
            where = f"{self.table.name}.{self.column.name}"
            larger = f"declare a larger synopsis epsilon for {where} in the policy"
            raise beyond_the_sampler(spec.mechanism, spec.epsilon, exc, larger) from None
        return noise

    def _gaussian_noise(self) -> DiscreteGaussian:
        """The Gaussian variant's node noise; its sampler's refusal of a sigma above 2^40
        (a tiny epsilon and delta) said to use GridGaussian, which no policy can."""
        try:
            return gaussian_node_noise(self.shape, self.rho, self.contributions)
        except OutOfRange:
            sensitivity = float(l2_sensitivity(self.shape.levels, self.contributions))
            sigma = sensitivity / math.sqrt(2 * self.rho)
            raise OutOfRange(
                f"discrete Gaussian noise of sigma {sigma:.4g} cannot be drawn exactly "
                "(its sampler draws sigmas up to 2^40)"
            ) from None

    def noise_text(self) -> str:
        """The noise per node, for EXPLAIN."""
        spec, levels, rows = self.column.synopsis, self.shape.levels, self.contributions
        if not self.gaussian:
            return (
                f"discrete Laplace per node, sensitivity {levels * rows} ({levels} levels x "
                f"{rows} rows per unit), scale {levels * rows / spec.epsilon:.6g}"
            )
        sensitivity = float(l2_sensitivity(levels, rows))
        return (
            f"discrete Gaussian per node, L2 sensitivity {sensitivity:.6g} (sqrt({levels} "
            f"levels) x {rows} rows per unit), sigma {sensitivity / math.sqrt(2 * self.rho):.6g}"
            f"; rho {self.rho:.6g} (zCDP within epsilon {spec.epsilon:g}, delta {spec.delta:g})"
        )

    @property
    def key(self) -> str:
        """Ledger key: changes whenever anything the synopsis depends on changes."""
        return f"{PREFIX}{self.table.name}.{self.column.name}:{self.digest}"

    @functools.cached_property
    def digest(self) -> str:
        spec = self.column.synopsis
        parts = [self.column.type, str(self.lower), str(self.upper), str(self.width),
                 spec.branching, str(spec.epsilon), spec.mechanism, str(spec.delta),
                 self.table.privacy_unit, self.contributions]  # fmt: skip
        if self.data_version:  # only when set: keys of policies without one stay as they were
            parts.append(self.data_version)
        parts.append(self.database)
        return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]

    @property
    def bin_text(self) -> str:
        """The bin width as the policy writes it: 1000, 1 day, 6 hours."""
        width = self.column.synopsis.bin
        if not isinstance(width, dt.timedelta):
            return f"{width:g}"
        hours = int(width.total_seconds()) // 3600
        count, unit = (hours // 24, "day") if hours % 24 == 0 else (hours, "hour")
        return f"{count} {unit}{'s' if count != 1 else ''}"

    def describe(self) -> str:
        spec = self.column.synopsis
        return (
            f"{self.bins} bins of {self.bin_text} over [{self.column.lower}, {self.column.upper}], "
            f"branching {spec.branching}, {self.shape.levels} levels"
            + (", Gaussian" if self.gaussian else "")
        )

    def bin_sql(self, dialect: str) -> exp.Expression:
        """The bin of a row: FLOOR((clamped coordinate - lower) / width), as SQL in `dialect`
        (a float near zero read as 0 where the division could underflow: near_zero).

        Clamped once. On an int column with whole bins it is integer arithmetic
        (the clamped value minus lower is >= 0, so integer division floors):
        about a third cheaper than the double-precision FLOOR.
        """
        column = exp.column(self.column.name, quoted=True)
        bigint = exp.DataType.build("BIGINT")
        if self.column.type == "int" and self.lower.denominator == self.width.denominator == 1:
            edges = Interval(int(self.lower), int(self.upper), True)
            offset: exp.Expression = exp.Cast(this=clamp(column, edges), to=bigint)
            if self.lower:
                offset = exp.Sub(this=offset, expression=_literal(self.lower))
            if self.width == 1:
                return offset
            return exp.IntDiv(this=exp.paren(offset), expression=_literal(self.width))
        if self.timed:
            value: exp.Expression = exp.TimeToUnix(this=column)
        elif self.column.read_as_double:
            value = read_double(column, dialect)
        else:
            value = exp.Cast(this=column, to=exp.DataType.build("DOUBLE"))
        edges = Interval(float(self.lower), float(self.upper))
        zero_below = near_zero(edges, dialect) if self.column.type == "float" else None
        clamped = clamp(value, edges, zero_below=zero_below)
        offset = exp.Sub(this=clamped, expression=_literal(self.lower))
        scaled = exp.Div(this=exp.paren(offset), expression=_literal(self.width))
        return exp.Cast(this=exp.Floor(this=scaled), to=bigint)

    def grid_at_or_above(self, value: Fraction) -> Fraction:
        """The smallest possible column value >= `value` (itself when continuous)."""
        if self.step is None:
            return value
        return self.lower + math.ceil((value - self.lower) / self.step) * self.step

    def grid_above(self, value: Fraction) -> Fraction | None:
        """The smallest possible value > `value`; None when continuous and inside the domain."""
        if self.step is not None:
            return self.lower + (math.floor((value - self.lower) / self.step) + 1) * self.step
        if value >= self.upper:
            return self.upper + self.width  # beyond every value
        return self.lower if value < self.lower else None

    def bin_edge(self, boundary: Fraction | float) -> int | None:
        """The bin starting at `boundary`: 0 below the domain, `bins` above, None inside a bin."""
        if boundary <= self.lower:
            return 0
        if boundary > self.upper:
            return self.bins
        index = (boundary - self.lower) / self.width
        return int(index) if index.denominator == 1 else None

    def value(self, coordinate: Fraction) -> Any:
        """A coordinate back as a column value (a bucket key)."""
        if not self.timed:
            return int(coordinate) if self.column.type == "int" else float(coordinate)
        moment = _EPOCH + dt.timedelta(seconds=float(coordinate))
        return moment.date() if self.column.type == "date" else moment


def _fraction(value: Any) -> Fraction:
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def _coordinate(value: Any) -> Fraction:
    if isinstance(value, dt.datetime):
        delta = value.replace(tzinfo=None) - _EPOCH
        return Fraction(delta.days * _DAY * 10**6 + delta.seconds * 10**6 + delta.microseconds,
                        10**6)  # fmt: skip
    if isinstance(value, dt.date):
        return Fraction((value - _EPOCH.date()).days * _DAY)
    return _fraction(value)


def _literal(value: Fraction) -> exp.Expression:
    if value.denominator == 1:
        return exp.convert(int(value))
    return exp.convert(float(value))


# -- what the query asks ------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """Counts over runs of bins: one run per released row, with its group key (if any)."""

    domain: Domain
    keys: list[tuple]
    starts: np.ndarray
    stops: np.ndarray
    summary: str


def _match(analysis: Analysis, table: Table, context: Any) -> Request | None:
    """The request the synopsis answers; None if the query does not touch a synopsis column.

    Raises _Decline with the reason when it touches one but cannot be answered exactly.
    """
    touched = _synopsis_columns(analysis, table)
    if not touched:
        return None
    if len(touched) > 1:
        raise _Decline(f"it involves several synopsis columns ({', '.join(touched)})")
    column = table.column(touched[0])
    domain = Domain.of(table, column, context.policy.data_version, context.database)
    _check_measurement(analysis, column)
    start, stop, constrained = _where_bins(analysis.where, domain)
    if not analysis.keys:
        if not constrained and analysis.measurements[0].argument is None:
            raise _Decline(
                f"COUNT(*) without a range on {column.name} also counts rows where it is NULL, "
                f"which the synopsis does not hold; write COUNT({column.name}) or add a range"
            )
        return Request(domain, [()], np.array([start]), np.array([stop]),
                       f"bins [{start}, {stop}) of {domain.bins}")  # fmt: skip
    if len(analysis.keys) > 1:
        raise _Decline("it groups by more than one key")
    keys, starts, stops = _buckets(analysis.keys[0].expression, domain, start, stop)
    return Request(
        domain, keys, starts, stops, f"{len(keys)} buckets within bins [{start}, {stop})"
    )


def _synopsis_columns(analysis: Analysis, table: Table) -> list[str]:
    nodes = [analysis.where] if analysis.where is not None else []
    nodes += [key.expression for key in analysis.keys]
    nodes += [m.argument for m in analysis.measurements if m.argument is not None]
    names = {c.name.lower() for node in nodes for c in node.find_all(exp.Column)}
    return sorted(name for name in names if (col := table.column(name)) and col.synopsis)


def _check_measurement(analysis: Analysis, column: Column) -> None:
    counts = [m for m in analysis.measurements if m.kind == "count"]
    if len(analysis.measurements) != 1 or len(counts) != 1:
        raise _Decline("the synopsis answers one COUNT(*) or COUNT(col), not SUM, AVG or several")
    argument = counts[0].argument
    if argument is not None and not (
        isinstance(argument, exp.Column) and argument.name.lower() == column.name.lower()
    ):
        raise _Decline(f"it counts {argument.sql()}, not * or {column.name}")


def _where_bins(where: exp.Expression | None, domain: Domain) -> tuple[int, int, bool]:
    """The run of bins the WHERE selects, and whether it constrains the column at all."""
    low, high = Fraction(-1) + domain.lower, domain.upper + domain.width
    for condition in conjuncts(where):
        for is_low, boundary in _bounds(condition, domain):
            low, high = (max(low, boundary), high) if is_low else (low, min(high, boundary))
    start, stop = domain.bin_edge(low), domain.bin_edge(high)
    if start is None or stop is None:
        raise _Decline(
            f"the range does not start and end on bin edges (bins of {domain.bin_text} "
            f"from {domain.column.lower})"
        )
    return start, max(start, stop), where is not None


_FLIP = {exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.EQ: exp.EQ}


def _bounds(condition: exp.Expression, domain: Domain) -> list[tuple[bool, Fraction]]:
    """(is lower bound, boundary) pairs of a half-open range [low, high) the condition means."""
    if isinstance(condition, exp.Between) and _is_column(condition.this, domain):
        if condition.args.get("symmetric"):  # its bounds in either order: the data's plan
            raise _Decline(
                f"the condition {condition.sql()} is BETWEEN SYMMETRIC; write BETWEEN low "
                "AND high to answer it from the synopsis"
            )
        low = exp.GTE(this=condition.this, expression=condition.args["low"])
        high = exp.LTE(this=condition.this, expression=condition.args["high"])
        return _bounds(low, domain) + _bounds(high, domain)
    kind = type(condition)
    if kind not in _FLIP:
        raise _Decline(f"the condition {condition.sql()} is not a range on {domain.column.name}")
    left, right = condition.this, condition.expression
    if _is_column(right, domain):
        left, right, kind = right, left, _FLIP[kind]
    value = _constant(right, domain) if _is_column(left, domain) else None
    if value is None:
        raise _Decline(
            f"the condition {condition.sql()} is not a range on {domain.column.name} with a "
            "constant"
        )
    if kind in (exp.GTE, exp.LT):
        return [(kind is exp.GTE, domain.grid_at_or_above(value))]
    if kind in (exp.GT, exp.LTE):
        above = domain.grid_above(value)
        if above is None:
            op = ">" if kind is exp.GT else "<="
            raise _Decline(
                f"{domain.column.name} {op} {right.sql()} includes the bin that starts at that "
                f"value (a continuous column); write {'>=' if op == '>' else '<'} a bin edge "
                "instead"
            )
        return [(kind is exp.GT, above)]
    if domain.step is None or domain.grid_at_or_above(value) != value:
        raise _Decline(f"equality on {domain.column.name} needs a value of a discrete column")
    return [(True, value), (False, value + domain.step)]


def _is_column(node: exp.Expression, domain: Domain) -> bool:
    return isinstance(node, exp.Column) and node.name.lower() == domain.column.name.lower()


def _constant(node: exp.Expression, domain: Domain) -> Fraction | None:
    """A literal as a coordinate: numbers for numeric columns, date/time strings for timed."""
    if isinstance(node, exp.Paren):
        return _constant(node.this, domain)
    if isinstance(node, exp.Neg):
        inner = _constant(node.this, domain)
        return -inner if inner is not None and not domain.timed else None
    if isinstance(node, exp.Cast) and domain.timed:
        return _constant(node.this, domain)
    if not isinstance(node, exp.Literal):
        return None
    try:
        if domain.timed and node.is_string:
            return _coordinate(dt.datetime.fromisoformat(node.this))
        if not domain.timed and not node.is_string:
            value = Fraction(node.this)
            return value
    except ValueError:
        return None
    return None


def _buckets(
    key: exp.Expression, domain: Domain, start: int, stop: int
) -> tuple[list[tuple], np.ndarray, np.ndarray]:
    """Group keys and their runs of bins, for buckets that are unions of whole bins."""
    edges, labels = _bucket_edges(key, domain)
    if len(labels) > MAX_BUCKETS:
        raise _Decline(f"it has {len(labels):,} buckets (at most {MAX_BUCKETS:,})")
    bins = []
    for edge in edges:
        index = domain.bin_edge(domain.grid_at_or_above(edge))
        if index is None:
            raise _Decline(
                f"the buckets of {key.sql()} do not align with the bins of "
                f"{domain.bin_text} from {domain.column.lower}"
            )
        bins.append(index)
    bins[0], bins[-1] = 0, domain.bins
    runs = [(label, max(a, start), min(b, stop)) for label, a, b in
            zip(labels, bins[:-1], bins[1:], strict=True)]  # fmt: skip
    runs = [run for run in runs if run[1] < run[2]]
    return (
        [(label,) for label, _, _ in runs],
        np.array([a for _, a, _ in runs], dtype=np.int64),
        np.array([b for _, _, b in runs], dtype=np.int64),
    )


def _bucket_edges(key: exp.Expression, domain: Domain) -> tuple[list[Fraction], list[Any]]:
    """Edges e_0 < ... < e_k covering the domain, and the key of each bucket [e_i, e_(i+1))."""
    if _is_column(key, domain) and domain.step is not None:
        return _arithmetic_edges(domain, Fraction(0), domain.step, lambda c: domain.value(c))
    if isinstance(key, exp.Floor | exp.IntDiv) and not domain.timed:
        found = _floor_division(key, domain)
        if found is not None:
            offset, divisor = found
            label = float if isinstance(key, exp.Floor) else int
            return _arithmetic_edges(
                domain, offset, divisor, lambda c: label((c - offset) / divisor)
            )
    if isinstance(key, exp.TimestampTrunc | exp.DateTrunc) and domain.timed:
        unit = key.args.get("unit")
        name = (unit.name if unit is not None else "").lower()
        if name in _TRUNC_UNITS and _is_column(key.this, domain):
            return _calendar_edges(domain, name)
    raise _Decline(
        f"GROUP BY {key.sql()} is not a bucket of {domain.column.name} the synopsis knows "
        f"(FLOOR({domain.column.name} / d), {domain.column.name} // d, the column itself, "
        "or date_trunc)"
    )


def _floor_division(key: exp.Expression, domain: Domain) -> tuple[Fraction, Fraction] | None:
    """(c, d) for FLOOR(col / d), FLOOR((col - c) / d) and col // d with d > 0."""
    division = key.this if isinstance(key, exp.Floor) else key
    if isinstance(key, exp.Floor) and (
        key.args.get("decimals") or not isinstance(division, exp.Div)
    ):
        return None
    if isinstance(key, exp.IntDiv) and domain.lower < 0:
        return None  # // truncates towards zero, not down
    numerator = division.this.this if isinstance(division.this, exp.Paren) else division.this
    divisor = _constant(division.expression, domain)
    offset: Fraction | None = Fraction(0)
    if isinstance(numerator, exp.Sub) and _is_column(numerator.this, domain):
        offset = _constant(numerator.expression, domain)
    elif not _is_column(numerator, domain):
        return None
    if divisor is None or divisor <= 0 or offset is None:
        return None
    return offset, divisor


def _arithmetic_edges(domain: Domain, offset: Fraction, size: Fraction, label) -> tuple:
    first = offset + math.floor((domain.lower - offset) / size) * size
    count = math.floor((domain.upper - first) / size) + 1
    if count > MAX_BUCKETS:
        raise _Decline(f"it has {count:,} buckets (at most {MAX_BUCKETS:,})")
    edges = [first + i * size for i in range(count + 1)]
    return edges, [label(edge) for edge in edges[:-1]]


def _calendar_edges(domain: Domain, unit: str) -> tuple[list[Fraction], list[Any]]:
    start = _EPOCH + dt.timedelta(seconds=float(domain.lower))
    moment = _truncate(start, unit)
    end = _EPOCH + dt.timedelta(seconds=float(domain.upper))
    moments = [moment]
    while moments[-1] <= end:
        moments.append(_following(moments[-1], unit))
        if len(moments) > MAX_BUCKETS:
            raise _Decline(f"it has more than {MAX_BUCKETS:,} buckets")
    return [_coordinate(m) for m in moments], moments[:-1]


def _truncate(moment: dt.datetime, unit: str) -> dt.datetime:
    if unit == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if unit == "day":
        return day
    if unit == "week":
        return day - dt.timedelta(days=day.weekday())  # ISO weeks start on Monday
    month = {"month": day.month, "quarter": 3 * ((day.month - 1) // 3) + 1, "year": 1}[unit]
    return day.replace(month=month, day=1)


def _following(moment: dt.datetime, unit: str) -> dt.datetime:
    if unit in ("hour", "day", "week"):
        return moment + {"hour": dt.timedelta(hours=1), "day": dt.timedelta(days=1),
                         "week": dt.timedelta(days=7)}[unit]  # fmt: skip
    months = {"month": 1, "quarter": 3, "year": 12}[unit]
    index = moment.year * 12 + moment.month - 1 + months
    return moment.replace(year=index // 12, month=index % 12 + 1)


# -- the planner ----------------------------------------------------------------


def plan_synopsis(select: exp.Select, table: Table, context: PlanContext) -> Any:
    """A synopsis plan for a checked range count or aligned histogram; None for a table
    without synopses.

    Any other query of a table with synopses gets the direct plan (analysed once,
    here), carrying the reason as a note when it touches a synopsis column but
    cannot be answered from it exactly.
    """
    from dpsql.sql import bounded_table  # the package imports this module: import late

    if not any(c.synopsis for c in table.columns.values()):
        return None
    analysis = analyze(select, bounded_table(table, context))
    try:
        request = _match(analysis, analysis.table, context)
    except _Decline as reason:
        return _direct_with_note(analysis, context, str(reason))
    if request is None:  # not a synopsis query: answered directly, from this analysis
        return DirectPlan(analysis, context.options, context.dialect, context.seed)
    stored = context.stored.get(request.domain.key)
    if stored is not None:
        return StoredSynopsisPlan(request, analysis, stored)
    if request.domain.gaussian and context.budget is not None and not context.budget.delta:
        # zCDP is converted to (epsilon, delta) with the analyst's delta: with none, the
        # build could never be charged, and the session's mechanism setting cannot change
        # noise the policy fixes for the synopsis.
        return _direct_with_note(
            analysis,
            context,
            f"the synopsis on {request.domain.column.name} adds Gaussian noise, which needs a "
            "delta budget, and yours has none; ask the data owner for a delta budget or for "
            "'mechanism: laplace' in the synopsis",
        )
    return BuildSynopsisPlan(request, analysis, context.dialect, context.seed)


def _direct_with_note(analysis: Analysis, context: PlanContext, reason: str) -> DirectPlan:
    note = f"answered directly, not from the synopsis: {reason}"
    try:
        plan = DirectPlan(analysis, context.options, context.dialect, context.seed)
    except QueryRefused as refusal:
        raise QueryRefused(refusal.construct, f"{refusal.reason} ({note})", refusal.hint) from None
    plan.notes.append(note)
    return plan


def declared(policy: Policy) -> list[tuple[str, str]]:
    """(table, column) of every synopsis the policy declares."""
    return [(table.name, column.name) for table in policy.tables.values()
            for column in table.columns.values() if column.synopsis]  # fmt: skip


def count_query(policy: Policy, table: str, column: str) -> exp.Select:
    """SELECT COUNT(column) FROM table: the query whose plan builds or reads a synopsis."""
    found = policy.table(table)
    spec = found.column(column) if found is not None else None
    if spec is None or spec.synopsis is None:
        names = ", ".join(f"{t}.{c}" for t, c in declared(policy)) or "none"
        raise ProgrammingError(
            f"the policy declares no synopsis on {table}.{column}; declared: {names}"
        )
    return exp.select(exp.Count(this=exp.column(spec.name, quoted=True))).from_(
        exp.to_table(found.name)
    )


@dataclass(frozen=True)
class SynopsisStatus:
    """A declared synopsis as `dpsql synopsis list` shows it."""

    name: str  # table.column
    key: str  # where the ledger keeps it
    shape: str
    cost: Cost
    built: str | None  # ISO time it was built, None when not built


class _SynopsisAnswer:
    """What both synopsis plans share: answering a request from a tree."""

    request: Request
    analysis: Analysis

    def _answer(self, tree: HierarchicalHistogram, built: str) -> Release:
        values, variances, halfwidths = tree.answers(self.request.starts, self.request.stops)
        counts = np.rint(values).astype(np.int64)  # an integer count: post-processing
        keys = self.request.keys
        columns, rows = project(self.analysis, keys, [counts] * len(self.analysis.aggregates))
        # the true count is an integer: a rounded answer within t + 1/2 is within floor(t + 1/2)
        interval = math.floor(float(halfwidths.max(initial=0.0)) + 0.5)
        accuracy = Accuracy(
            f"discrete_{tree.mechanism} tree (consistent)",
            math.sqrt(float(variances.max(initial=0.0))),
            float(interval),
            float(tree.noise.sensitivity),
            "from the synopsis on "
            f"{self.request.domain.column.name}; scale is the largest standard deviation and the "
            "95% interval a guaranteed (conservative) bound, the widest over the rows",
        )
        named = {
            output.name: accuracy
            for output in self.analysis.outputs
            if isinstance(output.expression, exp.Column)
            and output.expression.name.startswith(VALUE_PREFIX)
        }
        note = f"answered from the synopsis on {self.request.domain.column.name} built {built}"
        return Release(columns, rows, named, [note])

    def status(self, built: str | None = None) -> SynopsisStatus:
        domain = self.request.domain
        name = f"{domain.table.name}.{domain.column.name}"
        return SynopsisStatus(name, domain.key, domain.describe(), domain.cost, built)

    def _lines(self, path: str, cost: str) -> list[tuple[str, str]]:
        domain = self.request.domain
        return [
            ("path", path),
            ("cost", cost),
            ("synopsis", f"{domain.table.name}.{domain.column.name}: {domain.describe()}"),
            ("noise", domain.noise_text()),
            ("query", self.request.summary),
        ]


class BuildSynopsisPlan(_SynopsisAnswer):
    """Charges the synopsis's cost, measures the per-bin counts, builds and stores the tree."""

    # Not kept in the release cache: a repeat is answered from the stored synopsis
    # (the same answer, free) while it exists, and once it is dropped or cleared
    # the next range query, this one included, builds a new one, as documented;
    # a cached copy would answer it from the synopsis that is gone.
    cacheable = False

    def __init__(self, request: Request, analysis: Analysis, dialect: str, seed: int):
        self.request = request
        self.analysis = analysis
        domain = request.domain
        # built (and refused, if it cannot be drawn) before the charge; drawn at release
        self.noise = domain.noise()
        self.cost = domain.cost
        self.sql = _histogram_sql(domain, dialect, seed)

    def release(self, columns: list[str], rows: list[tuple], rng: np.random.Generator) -> Release:
        domain = self.request.domain
        found = np.array([(int(r[0]), int(r[1] or 0)) for r in rows if r[0] is not None],
                         dtype=np.int64).reshape(-1, 2)  # fmt: skip
        counts = np.zeros(domain.bins, dtype=np.int64)
        np.add.at(counts, np.clip(found[:, 0], 0, domain.bins - 1), found[:, 1])
        tree = HierarchicalHistogram.measure(counts, domain.shape, self.noise, rng)
        spec = domain.column.synopsis
        built = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        payload = json.dumps(
            {"table": domain.table.name, "column": domain.column.name, "epsilon": spec.epsilon,
             "delta": spec.delta, "mechanism": spec.mechanism, "built": built,
             "tree": tree.to_json()}
        )  # fmt: skip
        release = self._answer(tree, "now, by this query")
        release.state = {domain.key: payload}
        return release

    def explain(self) -> list[tuple[str, str]]:
        return [
            *self._lines(
                "builds the synopsis (first range query on this column): later range counts and "
                "aligned histograms on it are answered from it for free",
                f"{self.cost} once, for the synopsis",
            ),
            ("sql", self.sql),
        ]


class StoredSynopsisPlan(_SynopsisAnswer):
    """Answers from a synopsis stored by an earlier release: no database, no charge."""

    sql = None

    def __init__(self, request: Request, analysis: Analysis, payload: str):
        self.request = request
        self.analysis = analysis
        self.payload = payload
        self.cost = Cost()

    def release(self, columns: list[str], rows: list[tuple], rng: np.random.Generator) -> Release:
        built, tree = load(self.request.domain.key, self.payload)
        return self._answer(tree, built)

    def status(self, built: str | None = None) -> SynopsisStatus:
        return super().status(load(self.request.domain.key, self.payload)[0])

    def explain(self) -> list[tuple[str, str]]:
        built, _ = load(self.request.domain.key, self.payload)
        return self._lines(
            f"answered from the stored synopsis (built {built}); the database is not read",
            "none: post-processing of the stored synopsis",
        )


# Decoded synopses, shared by the sessions of a process (the wire server runs them in
# threads), weighed in bytes: a payload with its tree and prefix sums is about 28 bytes
# per bin (1.9 MB at 65,536 bins).
_LOADED_BYTES = 1 << 28
_SAMPLED_CHARACTERS = 256
_loaded = WeightedLru(_LOADED_BYTES)


def load(key: str, payload: str) -> tuple[str, HierarchicalHistogram]:
    """(when it was built, the tree) from the payload stored under ledger `key`; decoded
    once per process.

    Each query reads the payload from the ledger, and the decoded tree is a function of
    it alone: a kept tree is used only when its payload equals the one just read (a
    memory comparison), so a dropped, rebuilt, cleared or another analyst's synopsis
    is never answered from a stale tree. The lookup key samples the payload (its
    noisy nodes differ between builds) instead of hashing it: a new string of a
    65,536-bin synopsis is 0.7 MB, which hashing would read whole at every query.
    """
    sample = payload[:: max(1, len(payload) // _SAMPLED_CHARACTERS)]
    kept = _loaded.get((key, len(payload), sample))
    if kept is not None and kept[0] == payload:
        return kept[1], kept[2]
    data = json.loads(payload)
    tree = HierarchicalHistogram.from_json(data["tree"])
    for array in (tree.prefix, *tree.noisy):  # consistency computed now, once; then shared
        array.flags.writeable = False
    weight = len(payload) + tree.prefix.nbytes + sum(level.nbytes for level in tree.noisy)
    _loaded.put((key, len(payload), sample), (payload, data["built"], tree), weight)
    return data["built"], tree


def _histogram_sql(domain: Domain, dialect: str, seed: int) -> str:
    """Exact per-bin counts; each unit keeps at most max_groups_per_unit bins (the first by
    a keyed hash of the bin) and max_rows_per_unit rows in each.

    Written here rather than by the general rewrite (dpsql.sql.rewrite): a
    histogram's one group key is the bin and its one measurement a count, so
    the bounding needs a single window over each unit's rows ordered by (hash
    of the bin, bin), one sort instead of the rewrite's two windows, with the
    same result for a count (see `_bounding`). The bin is computed once, below
    the window.
    """
    table = domain.table
    column = exp.column(domain.column.name, quoted=True)
    unit = (
        exp.column(table.column(table.privacy_unit).name, quoted=True)
        if table.privacy_unit
        else None
    )
    # a row without a unit belongs to nobody we can bound: it is left out
    present = [exp.Not(this=exp.Is(this=c.copy(), expression=exp.Null()))
               for c in (column, unit) if c is not None]  # fmt: skip
    bounded = unit is not None and not table.unique_unit
    rows = (
        exp.select(domain.bin_sql(dialect).as_(_BIN), *([unit] if bounded else []))
        .from_(exp.to_table(table.name))
        .where(exp.and_(*present))
    )
    if bounded:
        ranks, kept = _bounding(table.max_groups_per_unit, table.max_rows_per_unit)
        order = exp.Order(expressions=[
            exp.Ordered(this=keyed_hash(dialect, seed, [exp.column(_BIN)])),
            exp.Ordered(this=exp.column(_BIN)),
        ])  # fmt: skip
        windows = [exp.Window(this=exp.Anonymous(this=function), partition_by=[unit.copy()],
                              order=order.copy()).as_(name)
                   for name, function in ranks.items()]  # fmt: skip
        ranked = exp.select(exp.column(_BIN), *windows).from_(rows.subquery("__dpsql_rows"))
        rows = exp.select(exp.column(_BIN)).from_(ranked.subquery("__dpsql_ranked")).where(kept)
    histogram = (
        exp.select(exp.column(_BIN), exp.Count(this=exp.Star()))
        .from_(rows.subquery("__dpsql_bins"))
        .group_by(exp.column(_BIN))
    )
    return in_dialect(histogram, dialect)


_BIN = "__dpsql_bin"


def _bounding(groups: int, rows: int) -> tuple[dict[str, str], exp.Expression]:
    """The window functions over a unit's rows, ordered by (hash of bin, bin), and the
    condition that keeps at most `rows` rows in each of the unit's first `groups` bins.

    ROW_NUMBER is a row's place in the unit, RANK the place where its bin's rows
    start, DENSE_RANK its bin's place among the unit's bins. With one bin per
    unit, the kept rows are the first `rows` and RANK = 1 (ROW_NUMBER <= 1 alone
    when one row): fewer functions over the same sort are measurably cheaper.
    """
    row, start, group = (exp.column(n) for n in ("__dpsql_row", "__dpsql_start", "__dpsql_group"))
    first_rows = exp.LTE(this=row, expression=exp.convert(rows))
    if groups == 1 and rows == 1:
        return {row.name: "ROW_NUMBER"}, first_rows
    if groups == 1:
        first_bin = exp.EQ(this=start, expression=exp.convert(1))
        return {row.name: "ROW_NUMBER", start.name: "RANK"}, exp.and_(first_bin, first_rows)
    kept = exp.and_(
        exp.LTE(this=group, expression=exp.convert(groups)),
        exp.LT(this=exp.Sub(this=row, expression=start), expression=exp.convert(rows)),
    )
    return {row.name: "ROW_NUMBER", start.name: "RANK", group.name: "DENSE_RANK"}, kept
