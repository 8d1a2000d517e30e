"""Order statistics: MIN, MAX, MEDIAN, PERCENTILE_CONT/DISC and quantile_cont/disc, planned
as a bounded histogram the database computes and an exact exponential mechanism in Python.

The rewrite is the one of COUNT(col) (sql/rewrite.py: the analyst's WHERE, each unit's
rows bounded to max_rows_per_unit per group and max_groups_per_unit groups by the keyed
hash), grouped by one more key: the bucket of the column's value over its declared
domain [lower, upper], clamped into it. One row per group and bucket comes back, never
a row of data; NULLs fall in no bucket (SQL's aggregates ignore them). Each quantile
is then `mechanisms.quantiles.exponential_quantile` over the buckets, with the rank
sensitivity of one unit: max_rows_per_unit values per group, times
max_groups_per_unit groups when the keys are grouped (composition, as the noisy counts
are).

A query with other aggregates (COUNT, SUM, AVG, VAR, STDDEV), or grouped by keys with
no public domain, is two releases (`QuantileStages`): first the direct plan of its
other aggregates, which selects the keys from the data (partition selection) when
they have no public domain, then the histogram of the keys that first release holds.
The query's epsilon is split evenly over every measurement of both (each noisy
measurement, the key selection, each quantile fraction) and charged once, before
either runs; the second release reads the data only through its own mechanism, and
which keys it releases is a post-processing of the first (sequential, adaptive
composition). The select list, HAVING, ORDER BY and LIMIT are then evaluated over the
released values (sql/postprocess.py), so they spend nothing.

A released quantile is a bucket of the grid, fixed by the policy and epsilon before the
data are read, released as its top (the upper edge; for int and date columns the largest
value in it): the point whose rank, the values in it and below, the mechanism scores.
PERCENTILE_CONT and PERCENTILE_DISC release the same (no value is interpolated from the
data). MIN and MAX are the quantiles MIN_Q and 1 - MIN_Q (docs/mechanisms.md says why a
DP MIN is not the data's minimum).
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.accounting import Cost, split_epsilon
from dpsql.errors import QueryRefused
from dpsql.mechanisms.quantiles import exponential_quantile, rank_error_bound
from dpsql.policy import Table
from dpsql.results import Accuracy, Release
from dpsql.sql.analysis import KEY_PREFIX, VALUE_PREFIX, Aggregate, Analysis, Measurement, Output
from dpsql.sql.analyze import analyze
from dpsql.sql.check import ORDER_STATISTICS
from dpsql.sql.clamps import clamp
from dpsql.sql.intervals import Interval
from dpsql.sql.keys import canonical_keys, key_kinds
from dpsql.sql.plan import DirectPlan, Plan, _check_domain_size, _keys_passing_where, key_order
from dpsql.sql.postprocess import project_rows
from dpsql.sql.resolve import output_name
from dpsql.sql.rewrite import rewrite
from dpsql.sql.scalars import StagedPlan

MIN_Q = Fraction(1, 100)  # MIN and MAX are the 1st and 99th percentiles
# Buckets: about BUCKETS_PER_EPSILON per unit of a quantile's epsilon (a power of two),
# within [MIN_BUCKETS, MAX_BUCKETS]; an integer or date domain never has more buckets
# than values. A finer grid shrinks the grid's own error (a bucket's share of the
# ranks) while the mechanism's grows only as ln(buckets); the cap bounds the rows the
# database returns per group and the sampler's time (about 60 ms at 16384 buckets).
BUCKETS_PER_EPSILON = 4096
MIN_BUCKETS, MAX_BUCKETS = 256, 16384
_EPOCH = dt.date(1970, 1, 1)
_MIDNIGHT = dt.datetime(1970, 1, 1)


@dataclass(frozen=True)
class Quantile:
    """One released quantile (or list of them) of the select list."""

    qs: tuple[Fraction, ...]
    listed: bool  # written as a list: released as a list
    name: str  # as written, for EXPLAIN and refusals


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

    def describe(self) -> str:
        unit = {"date": " days", "timestamp": " seconds"}.get(self.kind, "")
        first = self.lower if self.kind == "float" else self._typed(self.lower)
        return f"{self.size} buckets of width {self.width:g}{unit} from {first}"


def plan_quantiles(select: exp.Select, table: Table, context: Any) -> Plan | None:
    """The plan of a query releasing order statistics; None for any other query."""
    if select.find(*ORDER_STATISTICS) is None:
        return None
    from dpsql.sql import bounded_table  # the package imports this module's planner

    for clause in ("where", "group"):
        part = select.args.get(clause)
        if part is not None and part.find(*ORDER_STATISTICS) is not None:
            raise _refuse(
                part,
                f"a quantile in {'GROUP BY' if clause == 'group' else 'WHERE'} is not supported",
                "select the quantile; HAVING and ORDER BY may read it",
            )
    analysis = analyze(select, bounded_table(table, context), quantiles=True)
    names = [output_name(item) for item in select.expressions]
    return quantile_plan(analysis, context, names)


def quantile_plan(analysis: Analysis, context: Any, names: list[str]) -> Plan:
    """The plan of an analysed query with quantile aggregates: one histogram alone when
    nothing else is measured and the keys are public (or absent), else two stages."""
    column, specs = _specs(analysis)
    options = context.options
    quantiles = sum(len(spec.qs) for spec in specs.values())
    direct = _direct_analysis(analysis)
    selection = analysis.grouped and not analysis.public_keys
    if not direct.measurements and not selection:
        return QuantilePlan(analysis, column, specs, context, names, options.epsilon)
    measured = len(direct.measurements) + selection
    # one equal share per measurement of either stage, read in binary by both
    share = split_epsilon(options.epsilon, measured + quantiles, binary_too=True)
    first = DirectPlan(
        direct,
        replace(options, epsilon=_portion(share, measured)),
        context.dialect,
        context.seed,
    )
    second_seed = (context.seed * 1_000_003 + 1) % 2**62  # a secret of its own

    def second(keys: list[tuple] | None) -> QuantilePlan:
        return QuantilePlan(
            analysis,
            column,
            specs,
            replace(context, seed=second_seed),
            names,
            _portion(share, quantiles),
            keys,
        )

    # planned before the first release: its keys are then the policy's, or none yet
    outer = second([] if selection else None)
    return QuantileStages([first], outer, [], lambda _: outer, plan_keys=second)


def _portion(share: float, parts: int) -> float:
    """The largest float within `parts` shares, as the ledger reads decimals: a stage's
    epsilon, which the stage splits again into (at least) `share` each."""
    portion = share * parts
    while Fraction(repr(portion)) > parts * Fraction(repr(share)):
        portion = math.nextafter(portion, 0.0)
    return portion


def _direct_indexes(analysis: Analysis) -> dict[int, int]:
    """Each aggregate that is not a quantile, by its index: its index in the first release."""
    kept = (i for i, agg in enumerate(analysis.aggregates) if agg.function != "quantile")
    return {index: position for position, index in enumerate(kept)}


def _direct_analysis(analysis: Analysis) -> Analysis:
    """The query's other aggregates, released by a DirectPlan as plain columns: each key,
    then each aggregate that is not a quantile (quantiles measure nothing, so the
    measurements are the query's own)."""
    kept = [agg for agg in analysis.aggregates if agg.function != "quantile"]
    outputs = [
        Output(f"{KEY_PREFIX}{i}", exp.column(f"{KEY_PREFIX}{i}"))
        for i in range(len(analysis.keys))
    ] + [Output(f"{VALUE_PREFIX}{j}", exp.column(f"{VALUE_PREFIX}{j}")) for j in range(len(kept))]
    return replace(
        analysis, aggregates=kept, outputs=outputs, having=None, order=[], limit=None, offset=None
    )


def _specs(analysis: Analysis) -> tuple[exp.Column, dict[int, Quantile]]:
    """The one column the quantiles read, and each quantile by its aggregate's index."""
    specs: dict[int, Quantile] = {}
    columns: dict[str, exp.Column] = {}
    for index, aggregate in enumerate(analysis.aggregates):
        if aggregate.function == "quantile":
            column, specs[index] = _quantile(aggregate.node)
            columns[column.name.lower()] = column
    if len(columns) > 1:
        raise QueryRefused(
            f"quantiles of several columns ({', '.join(sorted(columns))})",
            "one query builds one histogram, of one column",
            "query each column's quantiles separately",
        )
    return next(iter(columns.values())), specs


def _quantile(node: exp.Expression) -> tuple[exp.Column, Quantile]:
    """The column and the quantiles of one order-statistic aggregate."""
    name = node.sql()[:60]
    if isinstance(node, exp.WithinGroup):
        inner, order = node.this, node.expression
        if not isinstance(inner, exp.PercentileCont | exp.PercentileDisc):
            raise _refuse(node, "only PERCENTILE_CONT/DISC take WITHIN GROUP", _HINT)
        ordered = order.expressions if isinstance(order, exp.Order) else []
        if len(ordered) != 1 or ordered[0].args.get("desc"):
            raise _refuse(node, "it needs one ascending ORDER BY column", _HINT)
        argument, fraction = ordered[0].this, inner.this
    elif isinstance(node, exp.PercentileCont | exp.PercentileDisc):
        argument, fraction = node.this, node.expression
    else:
        argument = node.this
        q = {exp.Min: MIN_Q, exp.Max: 1 - MIN_Q}.get(type(node), Fraction(1, 2))
        fraction = exp.Literal.number(str(q.numerator / q.denominator))
    if not isinstance(argument, exp.Column):
        raise _refuse(node, "a quantile reads one bounded column", "write e.g. MEDIAN(income)")
    listed = isinstance(fraction, exp.Array)
    values = fraction.expressions if listed else [fraction]
    qs = tuple(_fraction(value, name) for value in values)
    if isinstance(node, exp.Min | exp.Max):
        qs = (MIN_Q if isinstance(node, exp.Min) else 1 - MIN_Q,)
    return argument, Quantile(qs, listed, name)


_HINT = "write PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY col) or quantile_cont(col, 0.5)"


def _fraction(value: exp.Expression, name: str) -> Fraction:
    if not (isinstance(value, exp.Literal) and value.is_number):
        raise QueryRefused(
            f"the quantile {name}",
            f"its fraction {value.sql()[:30]} is not a constant number",
            "write a constant between 0 and 1, e.g. quantile_cont(income, 0.9)",
        )
    q = Fraction(value.this)
    if not 0 < q < 1:
        raise QueryRefused(
            f"the quantile {name}",
            f"its fraction {value.this} is outside (0, 1)",
            "write a fraction strictly between 0 and 1; for the extremes use MIN or MAX",
        )
    return q


def _refuse(node: exp.Expression, reason: str, hint: str) -> QueryRefused:
    return QueryRefused(f"the aggregate {node.sql()[:60]}", reason, hint)


@dataclass
class QuantilePlan:
    """Quantiles of one column, per group: a bounded histogram, then the exponential
    mechanism per group and quantile (pure `epsilon`, split evenly over the quantiles).

    `keys`: the groups to release, from an earlier release (QuantileStages); None: the
    policy's public keys (or the one group of an ungrouped query), and the select list,
    HAVING, ORDER BY and LIMIT are evaluated here. With `keys`, the release holds the
    keys and each quantile aggregate's values, for QuantileStages to combine."""

    analysis: Analysis
    column: exp.Column
    specs: dict[int, Quantile]  # by aggregate index
    context: Any
    names: list[str]  # the select list's names as written
    epsilon: float
    given: list[tuple] | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        analysis, table = self.analysis, self.analysis.table
        self.kinds = key_kinds(analysis)
        self.keys: list[tuple] = [()]
        if self.given is not None:
            self.keys = list(self.given)
        elif analysis.grouped:
            _check_domain_size(analysis)
            domains = [key.domain for key in analysis.keys]
            keys = _keys_passing_where(analysis, list(itertools.product(*domains)))
            self.keys = [keys[i] for i in key_order(keys)]
        parts = sum(len(spec.qs) for spec in self.specs.values())
        # the mechanism reads its share in binary: within the charged decimal too
        self.share = split_epsilon(self.epsilon, parts, binary_too=True)
        rows = table.max_rows_per_unit if table.privacy_unit else 1
        groups = table.max_groups_per_unit if analysis.grouped and table.privacy_unit else 1
        self.sensitivity = rows * groups
        self.grid = _grid(_declared(self.column, table), Fraction(self.share))
        self.cost = Cost.of(self.epsilon, 0)
        counted = replace(
            analysis,
            measurements=[Measurement("count", self.column)],
            aggregates=[],
            outputs=[],
            having=None,
            order=[],
            limit=None,
            offset=None,
        )
        self.sql = rewrite(
            counted,
            {},
            self.context.dialect,
            self.context.seed,
            with_units=False,
            bucket=_bucket(self.column, table, self.grid),
        )

    @property
    def known_groups(self) -> int | None:
        return len(self.keys) if self.given is None or not self.analysis.grouped else None

    def histograms(self, rows: list[tuple]) -> dict[tuple, list[int]]:
        """Each released group's bucket counts, from the database's rows."""
        width = len(self.analysis.keys)
        counts = {key: [0] * self.grid.size for key in self.keys}
        returned = [row[:width] for row in rows]
        keys = canonical_keys(returned, self.kinds) if width else [() for _ in rows]
        for key, row in zip(keys, rows, strict=True):
            bucket, count = row[width], row[width + 1]
            if bucket is not None and key in counts:  # a key outside the domain is not released
                counts[key][int(bucket)] += int(count)
        return counts

    def quantiles(self, rows: list[tuple], rng: np.random.Generator) -> dict[int, list]:
        """Each quantile aggregate's released values, one per group of `self.keys`."""
        histograms = self.histograms(rows)
        epsilon = Fraction(self.share)
        released: dict[int, list] = {index: [] for index in self.specs}
        for key in self.keys:
            counts = histograms[key]
            for index, spec in self.specs.items():
                values = [
                    self.grid.value(
                        exponential_quantile(counts, q, epsilon, rng, (), self.sensitivity)
                    )
                    for q in spec.qs
                ]
                released[index].append(values if spec.listed else values[0])
        return released

    def release(self, columns: list[str], rows: list[tuple], rng: np.random.Generator) -> Release:
        released = self.quantiles(rows, rng)
        if self.given is not None:  # QuantileStages combines it with the first release
            width = len(self.analysis.keys)
            names = [f"{KEY_PREFIX}{i}" for i in range(width)]
            names += [f"{VALUE_PREFIX}{index}" for index in released]
            out = [(*key, *(released[i][g] for i in released)) for g, key in enumerate(self.keys)]
            return Release(names, out, notes=[self._note()])
        values = [_column(released[index]) for index in range(len(self.analysis.aggregates))]
        _, out_rows, _ = project_rows(self.analysis, self.keys, values)
        notes = [self._note(), *self.notes]
        return Release(self.names, out_rows, accuracy=self.accuracy(), notes=notes)

    def accuracy(self) -> dict[str, Accuracy]:
        """The accuracy of each output that is a quantile as such, by its name."""
        return {
            name: self._accuracy()
            for name, (_, aggregate) in zip(self.names, _outputs(self.analysis), strict=True)
            if aggregate is not None and aggregate.function == "quantile"
        }

    def _rank_bound(self) -> float:
        return rank_error_bound(Fraction(self.share), self.sensitivity, self.grid.size, 0.05)

    def _accuracy(self) -> Accuracy:
        bound = self._rank_bound()
        return Accuracy(
            mechanism="exponential",
            scale=2 * self.sensitivity / self.share,
            interval95=None,
            sensitivity=self.sensitivity,
            note=(
                f"95%: the value's rank is within {bound:.0f} of q·n (n: the group's "
                f"non-NULL values), beyond the grid's best bucket; {self.grid.describe()}"
            ),
            rank_interval95=bound,
        )

    def _note(self) -> str:
        return (
            f"quantiles by the exponential mechanism over {self.grid.describe()} "
            f"(rank sensitivity {self.sensitivity}, epsilon {self.share:g} each); a released "
            "value is a bucket of that grid, not a value of the data; an empty group "
            "releases a bucket chosen uniformly at random"
        )

    def explain(self) -> list[tuple[str, str]]:
        bound = self._rank_bound()
        lines = [
            ("sql", self.sql),
            ("cost", f"epsilon {self.epsilon:g} (pure)"),
            ("mechanism", "exponential mechanism over a bounded histogram, sampled exactly"),
            ("buckets", self.grid.describe()),
            ("rank sensitivity", str(self.sensitivity)),
            ("epsilon per quantile", f"{self.share:g}"),
            ("95% rank error", f"within {bound:.0f} ranks of the best bucket's"),
        ]
        for spec in self.specs.values():
            fractions = ", ".join(f"{float(q):g}" for q in spec.qs)
            lines.append((
                f"measure {spec.name}",
                f"exponential, q {fractions}, epsilon {self.share:g} each, rank "
                f"sensitivity {self.sensitivity}",
            ))  # fmt: skip
        if self.analysis.grouped:
            where = "from the first release" if self.given is not None else "public domain"
            lines.append(("group keys", f"{where}: one quantile release per key"))
        return lines + [("note", note) for note in self.notes]


def _outputs(analysis: Analysis) -> list[tuple[Output, Aggregate | None]]:
    """Each output, with the aggregate it is as such (None for a key or an expression)."""
    found = []
    for output in analysis.outputs:
        name = output.expression.name if isinstance(output.expression, exp.Column) else ""
        index = int(name.removeprefix(VALUE_PREFIX)) if name.startswith(VALUE_PREFIX) else None
        found.append((output, None if index is None else analysis.aggregates[index]))
    return found


def _column(values: list) -> np.ndarray:
    """Released values as an array post-processing reads (objects for dates and lists)."""
    if values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return np.asarray(values)
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


@dataclass
class QuantileStages(StagedPlan):
    """Quantiles beside other aggregates, or per group of keys from the data: the direct
    plan of the other aggregates (and the key selection) first, then the quantiles of
    the keys it released, combined and post-processed (the module docstring)."""

    plan_keys: Callable[[list[tuple] | None], QuantilePlan] | None = None
    notes: list[str] = field(default_factory=list)  # as DirectPlan's: how it was read

    def finish(self, releases: Sequence[Release]) -> Plan:
        (first,) = releases
        width = len(self.outer.analysis.keys)
        final = self.plan_keys([tuple(row[:width]) for row in first.rows])
        if final.cost != self.outer.cost:
            raise RuntimeError("the quantiles' cost changed with their keys; nothing more was run")
        return final

    def combine(self, parts: Sequence[Release], outer: Release) -> Release:
        (first,) = parts
        analysis = self.outer.analysis
        width = len(analysis.keys)
        keys = [tuple(row[:width]) for row in first.rows]
        # each aggregate's column in the release holding it: the quantiles' or the first
        others = _direct_indexes(analysis)
        at = {name: i for i, name in enumerate(outer.columns)}
        first_at = {name: i for i, name in enumerate(first.columns)}
        values = []
        for index in range(len(analysis.aggregates)):
            if index in others:
                column = first_at[f"{VALUE_PREFIX}{others[index]}"]
                values.append(np.asarray([row[column] for row in first.rows]))
            else:
                column = at[f"{VALUE_PREFIX}{index}"]
                values.append(_column([row[column] for row in outer.rows]))
        _, rows, groups = project_rows(analysis, keys, values)
        accuracy = self.outer.accuracy()
        for name, (_, aggregate) in zip(self.outer.names, _outputs(analysis), strict=True):
            index = next((i for i, a in enumerate(analysis.aggregates) if a is aggregate), None)
            found = (
                first.accuracy.get(f"{VALUE_PREFIX}{others[index]}") if index in others else None
            )
            if found is not None:
                accuracy[name] = _reindexed(found, groups)
        notes = first.notes + outer.notes + self.notes
        return Release(self.outer.names, rows, accuracy=accuracy, notes=notes)

    def explain(self) -> list[tuple[str, str]]:
        (first,) = self.parts
        rows: list[tuple[str, str]] = [("release 1", "the other aggregates and the group keys")]
        rows.extend((f"  {item}", detail) for item, detail in first.explain())
        rows.append(("release 2", "the quantiles, of the keys release 1 holds"))
        rows.extend((f"  {item}", detail) for item, detail in self.outer.explain())
        rows.append((
            "budget",
            f"epsilon split evenly over every measurement of both releases, charged once "
            f"before either runs: total {self.cost}",
        ))  # fmt: skip
        return rows + [("note", note) for note in self.notes]


def _reindexed(accuracy: Accuracy, groups: list[int]) -> Accuracy:
    """`accuracy` of the first release's rows, for the final rows (each from `groups`)."""
    if accuracy.intervals is None:
        return accuracy
    return replace(accuracy, intervals=tuple(accuracy.intervals[g] for g in groups))


def _declared(column: exp.Column, table: Table) -> tuple[float, float, str]:
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


def _grid(domain: tuple[float, float, str], epsilon: Fraction) -> Grid:
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
    value: exp.Expression = exp.column(table.column(column.name).name, quoted=True)
    if grid.kind == "date":
        # clamped as dates first: PostgreSQL cannot subtract its infinite dates
        first, last = (
            exp.cast(exp.convert((_EPOCH + dt.timedelta(days=d)).isoformat()), "DATE")
            for d in (int(grid.lower), int(grid.lower + grid.width * grid.size - 1))
        )
        value = _between(value, first, last)
        offset: exp.Expression = exp.Sub(this=value, expression=first.copy())
    elif grid.kind == "timestamp":
        # clamped as timestamps first (PostgreSQL's infinite ones); seconds from the first
        # by each dialect's epoch of both, so a session time zone offsets both alike
        first, last = (
            exp.cast(exp.convert(grid.value(index).isoformat(sep=" ")), "TIMESTAMP")
            for index in (-1, grid.size - 1)
        )
        value = _between(value, first, last)
        offset = exp.Sub(
            this=exp.TimeToUnix(this=value), expression=exp.TimeToUnix(this=first.copy())
        )
    else:
        offset = exp.Sub(this=value, expression=exp.convert(grid.lower))
    scaled = exp.Floor(
        this=exp.Div(
            this=exp.cast(offset, "DOUBLE"), expression=exp.convert(grid.width), typed=False
        )
    )
    return exp.cast(clamp(scaled, Interval(0, grid.size - 1, True)), "BIGINT")


def _between(value: exp.Expression, first: exp.Expression, last: exp.Expression) -> exp.Case:
    """`value` clamped into [first, last] by comparisons alone (no arithmetic to fail)."""
    return exp.Case(
        ifs=[
            exp.If(this=exp.LT(this=value.copy(), expression=first), true=first.copy()),
            exp.If(this=exp.GT(this=value.copy(), expression=last), true=last.copy()),
        ],
        default=value,
    )
