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
are). k quantiles in one query split epsilon evenly (basic composition).

A released quantile is a bucket of the grid, fixed by the policy and epsilon before the
data are read: PERCENTILE_DISC (and quantile_disc) releases the bucket's lowest value,
PERCENTILE_CONT (quantile_cont, MEDIAN) its midpoint. MIN and MAX are the quantiles
MIN_Q and 1 - MIN_Q (docs/mechanisms.md says why a DP MIN is not the data's minimum).
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.accounting import Cost, split_epsilon
from dpsql.errors import QueryRefused
from dpsql.mechanisms.quantiles import exponential_quantile, rank_error_bound
from dpsql.policy import Table
from dpsql.results import Accuracy, Release
from dpsql.sql.analysis import KEY_PREFIX, Analysis
from dpsql.sql.analyze import analyze
from dpsql.sql.check import ORDER_STATISTICS
from dpsql.sql.clamps import clamp
from dpsql.sql.intervals import Interval
from dpsql.sql.keys import canonical_keys, key_kinds
from dpsql.sql.plan import _check_domain_size, _keys_passing_where, key_order
from dpsql.sql.resolve import output_name
from dpsql.sql.rewrite import rewrite

MIN_Q = Fraction(1, 100)  # MIN and MAX are the 1st and 99th percentiles
# Buckets: about BUCKETS_PER_EPSILON per unit of a quantile's epsilon (a power of two),
# within [MIN_BUCKETS, MAX_BUCKETS]; an integer or date domain never has more buckets
# than values. The cap is the sampler's: it decides every candidate exactly
# (mechanisms/quantiles.py: about 0.6 s for 1024), so time grows with the buckets.
BUCKETS_PER_EPSILON = 256
MIN_BUCKETS, MAX_BUCKETS = 32, 1024
_EPOCH = dt.date(1970, 1, 1)


@dataclass(frozen=True)
class Quantile:
    """One released quantile (or list of them) of the select list."""

    qs: tuple[Fraction, ...]
    discrete: bool
    listed: bool  # written as a list: released as a list
    name: str  # as written, for EXPLAIN and refusals


@dataclass(frozen=True)
class Grid:
    """The histogram's buckets: bucket i holds [lower + i width, lower + (i + 1) width)."""

    lower: float
    width: float
    size: int
    kind: str  # the column's policy type: int, float or date

    def value(self, index: int, discrete: bool) -> Any:
        low = self.lower + index * self.width
        if self.kind == "float":
            return low if discrete else low + self.width / 2
        offset = int(low) if discrete else int(low + (self.width - 1) // 2)
        return _EPOCH + dt.timedelta(days=offset) if self.kind == "date" else offset

    def describe(self) -> str:
        unit = " days" if self.kind == "date" else ""
        return f"{self.size} buckets of width {self.width:g}{unit} from {self._shown(0)}"

    def _shown(self, index: int) -> str:
        return str(self.value(index, discrete=True))


def plan_quantiles(select: exp.Select, table: Table, context: Any) -> QuantilePlan | None:
    """The plan of a query releasing order statistics; None for any other query."""
    if select.find(*ORDER_STATISTICS) is None:
        return None
    from dpsql.sql import bounded_table  # the package imports this module's planner

    column, specs, counted = _specs(select)
    analysis = analyze(counted, bounded_table(table, context))
    names = [output_name(item) for item in select.expressions]
    return QuantilePlan(analysis, column, specs, context, names)


def _specs(select: exp.Select) -> tuple[exp.Column, dict[int, Quantile], exp.Select]:
    """The one column the quantiles read, each quantile item by its select-list position,
    and the query with each quantile written COUNT(col) (for analyze to resolve)."""
    counted = select.copy()
    specs: dict[int, Quantile] = {}
    columns: set[str] = set()
    column: exp.Column | None = None
    for position, item in enumerate(counted.expressions):
        node = item.this if isinstance(item, exp.Alias) else item
        if not isinstance(node, ORDER_STATISTICS):
            if node.find(*ORDER_STATISTICS) is not None:
                raise _refuse(
                    node,
                    "a quantile inside an expression is not supported yet",
                    "select the quantile alone and compute with it afterwards",
                )
            continue
        argument, spec = _quantile(node)
        columns.add(argument.name.lower())
        column = argument
        specs[position] = spec
        node.replace(exp.Count(this=argument.copy()))
    for clause in ("having", "order", "where"):
        part = counted.args.get(clause)
        if part is not None and part.find(*ORDER_STATISTICS) is not None:
            raise _refuse(
                part,
                f"a quantile in {clause.upper()} is not supported",
                "select the quantile and filter or sort its released value afterwards",
            )
    if any(isinstance(n, exp.Count | exp.Sum | exp.Avg) for n in select.find_all(exp.AggFunc)):
        raise QueryRefused(
            "a quantile beside COUNT, SUM or AVG",
            "a query releases either order statistics or noisy counts and sums, for now",
            "run the quantiles and the counts as two queries",
        )
    if len(columns) > 1:
        raise QueryRefused(
            f"quantiles of several columns ({', '.join(sorted(columns))})",
            "one query builds one histogram, of one column",
            "query each column's quantiles separately",
        )
    assert column is not None
    return column, specs, counted


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
        discrete = isinstance(inner, exp.PercentileDisc)
    elif isinstance(node, exp.PercentileCont | exp.PercentileDisc):
        argument, fraction = node.this, node.expression
        discrete = isinstance(node, exp.PercentileDisc)
    else:
        argument, discrete = node.this, isinstance(node, exp.Min | exp.Max)
        q = {exp.Min: MIN_Q, exp.Max: 1 - MIN_Q}.get(type(node), Fraction(1, 2))
        fraction = exp.Literal.number(str(q.numerator / q.denominator))
    if not isinstance(argument, exp.Column):
        raise _refuse(node, "a quantile reads one bounded column", "write e.g. MEDIAN(income)")
    listed = isinstance(fraction, exp.Array)
    values = fraction.expressions if listed else [fraction]
    qs = tuple(_fraction(value, name) for value in values)
    if isinstance(node, exp.Min | exp.Max):
        qs = (MIN_Q if isinstance(node, exp.Min) else 1 - MIN_Q,)
    return argument, Quantile(qs, discrete, listed, name)


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
    mechanism per group and quantile (pure epsilon, split evenly over the quantiles)."""

    analysis: Analysis
    column: exp.Column
    specs: dict[int, Quantile]
    context: Any
    names: list[str]  # the select list's names as written (analyze saw COUNTs)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        analysis, table = self.analysis, self.analysis.table
        if analysis.grouped and not analysis.public_keys:
            raise QueryRefused(
                "a quantile per group of keys without a public domain",
                "partition selection of quantile groups is not supported yet",
                "group by columns with a public domain in the policy, or run without GROUP BY",
            )
        if not analysis.is_plain_projection:
            raise QueryRefused(
                "HAVING, ORDER BY or LIMIT with a quantile",
                "order statistics are released as plain columns for now",
                "select the keys and quantiles alone and sort the released rows afterwards",
            )
        self.kinds = key_kinds(analysis)
        self.keys: list[tuple] = [()]
        if analysis.grouped:
            _check_domain_size(analysis)
            domains = [key.domain for key in analysis.keys]
            keys = _keys_passing_where(analysis, list(itertools.product(*domains)))
            self.keys = [keys[i] for i in key_order(keys)]
        parts = sum(len(spec.qs) for spec in self.specs.values())
        options = self.context.options
        # the mechanism reads its share in binary: within the charged decimal too
        self.share = split_epsilon(options.epsilon, parts, binary_too=True)
        rows = table.max_rows_per_unit if table.privacy_unit else 1
        groups = table.max_groups_per_unit if analysis.grouped and table.privacy_unit else 1
        self.sensitivity = rows * groups
        self.grid = _grid(_declared(self.column, table), Fraction(self.share))
        self.cost = Cost.of(options.epsilon, 0)
        self.sql = rewrite(
            analysis,
            {},
            self.context.dialect,
            self.context.seed,
            with_units=False,
            bucket=_bucket(self.column, table, self.grid),
        )

    @property
    def known_groups(self) -> int:
        return len(self.keys)

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

    def release(self, columns: list[str], rows: list[tuple], rng: np.random.Generator) -> Release:
        histograms = self.histograms(rows)
        epsilon = Fraction(self.share)
        out_rows = []
        for key in self.keys:
            counts = histograms[key]
            row = []
            for position, output in enumerate(self.analysis.outputs):
                spec = self.specs.get(position)
                if spec is None:
                    row.append(key[int(output.expression.name[len(KEY_PREFIX) :])])
                    continue
                values = [
                    self.grid.value(
                        exponential_quantile(counts, q, epsilon, rng, (), self.sensitivity),
                        spec.discrete,
                    )
                    for q in spec.qs
                ]
                row.append(values if spec.listed else values[0])
            out_rows.append(tuple(row))
        names = self.names
        accuracy = {names[p]: self._accuracy() for p in self.specs}
        return Release(names, out_rows, accuracy=accuracy, notes=[self._note()])

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
        return [
            ("sql", self.sql),
            ("cost", f"epsilon {self.context.options.epsilon:g} (pure)"),
            ("mechanism", "exponential mechanism over a bounded histogram, sampled exactly"),
            ("buckets", self.grid.describe()),
            ("rank sensitivity", str(self.sensitivity)),
            ("epsilon per quantile", f"{self.share:g}"),
            ("95% rank error", f"within {bound:.0f} ranks of the best bucket's"),
            *(("note", note) for note in self.notes),
        ]


def _declared(column: exp.Column, table: Table) -> tuple[float, float, str]:
    """The column's declared domain, as numbers (dates: days since 1970-01-01)."""
    declared = table.column(column.name)
    if declared is None or declared.type not in ("int", "float", "date"):
        kind = declared.type if declared is not None else "unknown"
        raise QueryRefused(
            f"a quantile of {column.name}",
            f"it is a {kind} column; quantiles need a bounded number or date column",
            "take quantiles of a numeric or date column with lower/upper in the policy",
        )
    if not declared.bounded:
        raise QueryRefused(
            f"a quantile of {column.name}",
            "the policy declares no lower/upper for it, and the histogram needs a domain",
            f"ask the data owner to declare lower and upper for {column.name}",
        )
    if declared.type == "date":
        lower, upper = (_days(v) for v in (declared.lower, declared.upper))
    else:
        lower, upper = float(declared.lower), float(declared.upper)
    return lower, upper, declared.type


def _days(value: Any) -> int:
    if isinstance(value, str):
        value = dt.date.fromisoformat(value[:10])
    if isinstance(value, dt.datetime):
        value = value.date()
    return (value - _EPOCH).days


def _grid(domain: tuple[float, float, str], epsilon: Fraction) -> Grid:
    """Buckets for a quantile at `epsilon`: more at larger epsilons, whose rank error is
    smaller (docs/mechanisms.md, "bucket choice")."""
    lower, upper, kind = domain
    wanted = 2 ** round(math.log2(max(1.0, BUCKETS_PER_EPSILON * float(epsilon))))
    size = min(MAX_BUCKETS, max(MIN_BUCKETS, wanted))
    if kind == "float":
        return Grid(lower, (upper - lower) / size if upper > lower else 1.0, size, kind)
    values = int(upper) - int(lower) + 1
    width = max(1, math.ceil(values / size))
    return Grid(float(int(lower)), float(width), math.ceil(values / width), kind)


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
        value = exp.Case(
            ifs=[
                exp.If(this=exp.LT(this=value.copy(), expression=first), true=first.copy()),
                exp.If(this=exp.GT(this=value.copy(), expression=last), true=last.copy()),
            ],
            default=value,
        )
        offset: exp.Expression = exp.Sub(this=value, expression=first.copy())
    else:
        offset = exp.Sub(this=value, expression=exp.convert(grid.lower))
    scaled = exp.Floor(
        this=exp.Div(
            this=exp.cast(offset, "DOUBLE"), expression=exp.convert(grid.width), typed=False
        )
    )
    return exp.cast(clamp(scaled, Interval(0, grid.size - 1, True)), "BIGINT")
