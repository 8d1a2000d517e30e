"""Semantic analysis: what a checked query measures, and how sensitive each measurement is.

Given a SELECT that passed `check`, this pass resolves every column against the
policy (refusing unknown and private ones), finds the group keys and the
aggregates, derives clamp bounds for summed expressions by interval
arithmetic (tightened by range predicates in WHERE, DESIGN section 3), and
turns the select list, HAVING and ORDER BY into post-processing expressions
over the released values. It knows nothing of databases or noise.
"""

from __future__ import annotations

import datetime as dt
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.policy import ISO_TEXT, NEAR_ZERO, NUMERIC_TYPES, Column, Table
from dpsql.sql.casts import constant_cast_converts
from dpsql.sql.check import AGGREGATES

KEY_PREFIX = "__dpsql_k"
VALUE_PREFIX = "__dpsql_a"
RESERVED_PREFIX = "__dpsql"
# Row-level arithmetic must stay provably this small: far below where int64 or
# float8 arithmetic overflows (an overflow is an error, and an error is a leak).
MAX_ROW_MAGNITUDE = 2.0**53
# ... and every nonzero value provably this far from zero: PostgreSQL fails a product or
# quotient of nonzero doubles that rounds to zero ("value out of range: underflow"), and
# a numeric that does as a double, only for the rows that reach it. Doubles end at
# 4.9e-324; the margin covers what the interval arithmetic below rounds (a numeric
# quotient's last digit, the rounding of a product).
MIN_NONZERO = 1e-300
# A difference of two doubles, if not zero, is at least this times the smaller one's
# least nonzero magnitude (a multiple of the finer of their units in the last place).
_DIFFERENCE_FACTOR = 2.0**-53
MAX_ROWS = 2**62  # LIMIT and OFFSET beyond this are the same as this (int64 for DuckDB)
# Numeric casts that cannot fail or overflow on a value within MAX_ROW_MAGNITUDE
# (narrower integer and fixed-point types could, further down the expression, and
# PostgreSQL's REAL underflows as near zero as 1e-45, in its casts and its arithmetic).
_SAFE_NUMERIC_CASTS = (exp.DataType.Type.BIGINT, exp.DataType.Type.DOUBLE)
_TEMPORAL_TYPES = ("date", "timestamp")
# Every date the backends accept (PostgreSQL's reach to 5874897 AD) lies within these,
# in seconds and in days from 1970: epochs and date differences are bounded numbers.
_EPOCH_SECONDS = 2.0**48
_EPOCH_DAYS = 2.0**32


@dataclass(frozen=True)
class Interval:
    """A closed interval of numbers, with whether every value in it is an integer, and
    whether PostgreSQL computes it as an integer type (`int_typed`; by default, when
    every value is an integer): there `/` of two integers truncates, as DuckDB's does
    not, so a quotient of integer types may be nearer zero than real division says.

    `tiny` is how near zero a value other than zero can be (0: unknown), which
    keeps products and quotients clear of PostgreSQL's underflow (MIN_NONZERO)."""

    lower: float
    upper: float
    integer: bool = False
    int_typed: bool | None = None
    tiny: float = 0.0

    @property
    def integer_typed(self) -> bool:
        return self.integer if self.int_typed is None else self.int_typed

    @property
    def least_nonzero(self) -> float:
        """No value in the interval but zero is nearer zero than this."""
        return max(self.tiny, 1.0) if self.integer else self.tiny

    @property
    def zero_only(self) -> bool:
        return self.lower == self.upper == 0

    def hull(self, other: Interval) -> Interval:
        return Interval(
            min(self.lower, other.lower),
            max(self.upper, other.upper),
            self.integer and other.integer,
            self.integer_typed and other.integer_typed,
            min(self.least_nonzero, other.least_nonzero),
        )

    @property
    def magnitude(self) -> float:
        return max(abs(self.lower), abs(self.upper))


@dataclass(frozen=True)
class Measurement:
    """One exact aggregate to measure with noise: a COUNT or a clamped SUM."""

    kind: str  # "count", "count_units" or "sum"
    argument: exp.Expression | None = None  # row expression as written; None for COUNT(*)
    bounds: Interval | None = None  # clamp interval of a SUM's argument
    clamped: exp.Expression | None = None  # a SUM's argument with its columns clamped
    note: str = ""  # how the bounds were obtained, for EXPLAIN

    @property
    def key(self) -> str:
        argument = self.argument.sql() if self.argument is not None else "*"
        return f"{self.kind}({argument})"


@dataclass(frozen=True)
class Aggregate:
    """An aggregate the query releases: COUNT/SUM straight from a measurement, AVG from two."""

    function: str  # "count", "sum", "avg"
    measurements: tuple[int, ...]  # indexes into Analysis.measurements (avg: sum, count)
    bounds: Interval | None = None  # AVG is clamped to these after division


@dataclass(frozen=True)
class GroupKey:
    expression: exp.Expression
    domain: tuple[Any, ...] | None  # every key, when the policy makes them public


@dataclass(frozen=True)
class Output:
    name: str
    expression: exp.Expression  # over __dpsql_k<i> / __dpsql_a<j> columns and literals


@dataclass
class Analysis:
    """Everything the rewrite and the release need to know about one query."""

    table: Table
    where: exp.Expression | None
    keys: list[GroupKey]
    outputs: list[Output]
    measurements: list[Measurement] = field(default_factory=list)
    aggregates: list[Aggregate] = field(default_factory=list)
    having: exp.Expression | None = None
    order: list[exp.Ordered] = field(default_factory=list)
    limit: int | None = None
    offset: int | None = None

    @property
    def grouped(self) -> bool:
        return bool(self.keys)

    @property
    def public_keys(self) -> bool:
        """Whether the released keys come from the policy rather than the data."""
        return all(key.domain is not None for key in self.keys)

    @property
    def is_plain_projection(self) -> bool:
        """Outputs are bare released columns, with nothing to evaluate afterwards."""
        return (
            all(isinstance(out.expression, exp.Column) for out in self.outputs)
            and self.having is None
            and not self.order
            and self.limit is None
            and self.offset is None
        )


def analyze(select: exp.Select, table: Table) -> Analysis:
    """Resolve, bound and decompose a checked SELECT over `table`.

    When the database guarantees that the privacy unit is unique (one row per
    unit), pass a `table` whose bounds are 1: see `unique_unit_table`.
    """
    resolver = _Resolver(select, table)
    select = resolver.canonical(select)
    where = select.args.get("where")
    where = where.this if where is not None else None
    if where is not None:
        resolver.refuse_aggregates(where, "WHERE", "move conditions on aggregates to HAVING")
        resolver.require_public(where, "filtering (WHERE)")
        require_total(where, table, "WHERE", condition=True)
    ranges = _ranges(where, table)
    items = [(output_name(item), _unalias(item)) for item in select.expressions]
    analysis = Analysis(
        table=table,
        where=where,
        keys=_group_keys(select, items, resolver),
        outputs=[],
    )
    builder = _Builder(analysis, resolver, ranges)
    for name, item in items:
        if name.lower().startswith(RESERVED_PREFIX):
            raise QueryRefused(
                f"the alias {name}",
                f"names starting with {RESERVED_PREFIX} are reserved",
                "choose another alias",
            )
        analysis.outputs.append(
            Output(name, builder.post_expression(item, "the select list", windows=True))
        )
    having = select.args.get("having")
    if having is not None:
        condition = _expand_aliases(having.this, items, resolver)
        analysis.having = builder.post_expression(condition, "HAVING")
    analysis.order = _order(select, items, builder)
    analysis.limit = _count_literal(select.args.get("limit"), "LIMIT")
    analysis.offset = _count_literal(select.args.get("offset"), "OFFSET")
    if not analysis.measurements:
        _require_public_release(analysis)
    return analysis


def _as_written(key: exp.Expression) -> str:
    """A group key as a message names it: a column by its name, without the quotes the
    resolver added."""
    return key.name if isinstance(key, exp.Column) else key.sql()[:60]


def _require_public_release(analysis: Analysis) -> None:
    """Refuse a query without aggregates unless what it returns is the policy's alone:
    group keys of public domains (SELECT educ FROM t GROUP BY educ, or SELECT DISTINCT
    educ) filtered by conditions on those keys only (plan.DomainPlan answers it free)."""
    table = analysis.table.name
    if not analysis.keys:
        raise QueryRefused(
            "a query without aggregates",
            "it would return raw values",
            f"select an aggregate, e.g. SELECT COUNT(*) FROM {table}",
        )
    for key in analysis.keys:
        if key.domain is None:
            name = _as_written(key.expression)
            raise QueryRefused(
                f"the keys of {name} without an aggregate",
                f"{name} has no public domain in the policy, so its keys would come from "
                "the data, raw",
                f"count them: SELECT {name}, COUNT(*) FROM {table} GROUP BY {name} releases "
                "the keys with enough people, with noise; or ask the data owner to declare "
                "its values public",
            )
    names = ", ".join(_as_written(key.expression) for key in analysis.keys)
    keys = {key.expression.name.lower() for key in analysis.keys}  # public: bare columns
    others = sorted(
        {column.name.lower() for column in analysis.where.find_all(exp.Column)} - keys
        if analysis.where is not None
        else set()
    )
    if others:
        raise QueryRefused(
            f"the public keys of {names} with a WHERE on {', '.join(others)}",
            "the keys alone are the policy's domain, but which of them have rows passing a "
            "condition on other columns depends on the data",
            f"add COUNT(*) to see which groups have rows: SELECT {names}, COUNT(*) FROM "
            f"{table} WHERE ... GROUP BY {names}; or drop the conditions on "
            f"{', '.join(others)} to get the domain",
        )


def _expand_aliases(
    node: exp.Expression, items: list[tuple[str, exp.Expression]], resolver: _Resolver
) -> exp.Expression:
    """`node` with each select alias that names no column of the table replaced by the
    aliased expression, as DuckDB reads HAVING n > 10 for COUNT(*) AS n (PostgreSQL
    would refuse the name): HAVING filters released values, so this adds nothing new."""
    expressions = {name.lower(): item for name, item in items if name.lower() in resolver.aliases}

    def expand(sub: exp.Expression) -> exp.Expression:
        if (
            isinstance(sub, exp.Column)
            and not sub.table
            and sub.name.lower() in expressions
            and resolver.table.column(sub.name) is None
        ):
            return expressions[sub.name.lower()].copy()
        return sub

    return node.transform(expand, copy=False)


def undeclared(name: str, table: Table) -> QueryRefused:
    """The refusal of a name that is not a column the policy declares for `table`."""
    public = ", ".join(c.name for c in table.columns.values() if not c.private)
    return QueryRefused(
        f"the column {name}",
        f"it is not declared in the policy for table {table.name}",
        f"use one of: {public}",
    )


def _unalias(node: exp.Expression) -> exp.Expression:
    return node.this if isinstance(node, exp.Alias) else node


def output_name(item: exp.Expression) -> str:
    if isinstance(item, exp.Alias):
        return item.alias
    inner = item
    if isinstance(inner, exp.Column):
        return inner.name
    if isinstance(inner, AGGREGATES):
        return inner.key.lower()
    return inner.sql()


class _Resolver:
    """Maps column references to policy columns and enforces the private-column rule."""

    def __init__(self, select: exp.Select, table: Table):
        self.table = table
        self.aliases = {
            item.alias.lower() for item in select.expressions if isinstance(item, exp.Alias)
        }
        source = select.args["from_"].this
        alias = source.alias_or_name
        self.qualifiers = {alias.lower(), source.name.lower()}

    def column(self, node: exp.Column) -> Column:
        if node.table and node.table.lower() not in self.qualifiers:
            raise QueryRefused(
                f"the column {node.sql()}",
                f"'{node.table}' is not the queried table",
                f"write {node.name} or {self.table.name}.{node.name}",
            )
        column = self.table.column(node.name)
        if column is None:
            raise undeclared(node.name, self.table)
        return column

    def canonical(self, select: exp.Select) -> exp.Select:
        """The query with every known column unqualified and spelled as in the policy.

        Names that are not columns are left alone: they may be select aliases
        used in GROUP BY, HAVING or ORDER BY, resolved later.
        """
        aliases = self.aliases

        def fix(node: exp.Expression) -> exp.Expression:
            if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
                return node
            if node.table or self.table.column(node.name) is not None:
                return exp.column(self.column(node).name, quoted=True)
            if node.name.lower() in aliases:
                return node
            self.column(node)  # raises: unknown column
            return node

        return select.transform(fix, copy=True)

    def require_public(self, node: exp.Expression, where: str) -> None:
        """Every name in `node`, an expression the database computes (WHERE, a GROUP BY
        key, an aggregate's argument), is a declared, non-private column of the table.

        A select alias is not one: the rewritten SQL would send its name to the
        database, where it reads a column of that name that the policy does not
        declare (or fails to bind)."""
        for column in node.find_all(exp.Column):
            if isinstance(column.this, exp.Star):
                continue
            spec = self.table.column(column.name)
            if spec is None and column.name.lower() in self.aliases:
                raise QueryRefused(
                    f"the alias {column.name} in {where}",
                    "a select alias names a released value, not a column: sent to the "
                    "database, the name would read an undeclared column of that name",
                    "write the aliased expression itself",
                )
            if spec is None:
                raise undeclared(column.name, self.table)
            if spec.private:
                raise QueryRefused(
                    f"{where} on the private column {spec.name}",
                    "private columns identify people and are never released or used to select rows",
                    f"use only non-private columns; count people with COUNT(DISTINCT {spec.name})"
                    if spec.name.lower() == self.table.privacy_unit
                    else "use only non-private columns",
                )

    @staticmethod
    def refuse_aggregates(node: exp.Expression, where: str, hint: str) -> None:
        if any(True for _ in node.find_all(*AGGREGATES)):
            raise QueryRefused(f"an aggregate in {where}", "it is not allowed there", hint)


def _group_keys(
    select: exp.Select, items: list[tuple[str, exp.Expression]], resolver: _Resolver
) -> list[GroupKey]:
    group = select.args.get("group")
    if group is None:
        return []
    if group.args.get("rollup") or group.args.get("cube") or group.args.get("grouping_sets"):
        raise QueryRefused(
            "ROLLUP, CUBE or GROUPING SETS",
            "dpsql releases one grouping per query",
            "run one GROUP BY query per grouping",
        )
    aliases = {name.lower(): item for name, item in items}
    nodes = group.expressions
    if group.args.get("all") and not nodes:
        # DuckDB's GROUP BY ALL: every select item that reads a column and holds no
        # aggregate, by position (constants would add nothing to the grouping)
        nodes = [
            exp.Literal.number(position)
            for position, (_, item) in enumerate(items, start=1)
            if item.find(exp.Column) is not None and item.find(*AGGREGATES) is None
        ]
    keys = []
    for node in nodes:
        expression = _resolve_reference(node, items, aliases, resolver, "GROUP BY")
        resolver.refuse_aggregates(
            expression, "GROUP BY", "group by columns or expressions of them"
        )
        resolver.require_public(expression, "grouping (GROUP BY)")
        require_total(expression, resolver.table, "GROUP BY")
        domain = None
        if isinstance(expression, exp.Column):
            domain = resolver.column(expression).public_domain
        keys.append(GroupKey(expression, domain))
    return keys


def _resolve_reference(
    node: exp.Expression,
    items: list[tuple[str, exp.Expression]],
    aliases: dict[str, exp.Expression],
    resolver: _Resolver,
    clause: str,
) -> exp.Expression:
    """A GROUP BY/ORDER BY item: a select-list position, an alias, or an expression."""
    if isinstance(node, exp.Literal) and not node.is_string:
        if not node.this.isdigit():
            raise QueryRefused(
                f"{clause} {node.this}",
                "a number there is a position in the select list, and positions are whole",
                f"write {clause} 1 for the first item of the select list",
            )
        position = int(node.this)
        if not 1 <= position <= len(items):
            raise QueryRefused(
                f"{clause} {position}",
                f"the select list has {len(items)} items",
                f"use a position between 1 and {len(items)}",
            )
        return items[position - 1][1]
    if (
        isinstance(node, exp.Column)
        and not node.table
        and resolver.table.column(node.name) is None
        and node.name.lower() in aliases
    ):
        return aliases[node.name.lower()]
    return node


class _Builder:
    """Turns select items, HAVING and ORDER BY into expressions over released values."""

    def __init__(self, analysis: Analysis, resolver: _Resolver, ranges: dict[str, Interval]):
        self.analysis = analysis
        self.resolver = resolver
        self.ranges = ranges
        # Expressions are matched by sqlglot's structural equality (hashed once per
        # node), not by their generated SQL: generating SQL for every node of
        # every output was most of the cost of planning a query.
        self.key_index = {key.expression: i for i, key in enumerate(analysis.keys)}
        self.aggregate_index: dict[exp.Expression, int] = {}

    def post_expression(
        self, node: exp.Expression, clause: str, *, windows: bool = False
    ) -> exp.Expression:
        """`node` over released values: keys and aggregates replaced by their columns.

        `windows` allows windows over the release (the select list only: SQL computes
        them after HAVING and before ORDER BY)."""
        if not windows and node.find(exp.Window) is not None:
            raise QueryRefused(
                f"a window function in {clause}",
                "windows over the release are computed in the select list only",
                "compute it in the select list under an alias: ORDER BY the alias sorts by "
                "it, and filtering on it is yours to do on the released rows",
            )

        def replace(sub: exp.Expression) -> exp.Expression:
            if sub in self.key_index:
                return exp.column(f"{KEY_PREFIX}{self.key_index[sub]}")
            if isinstance(sub, AGGREGATES) and not isinstance(sub.parent, exp.Window):
                return exp.column(f"{VALUE_PREFIX}{self.aggregate(sub)}")
            return sub  # a window's own function (check.over_the_release) runs on released values

        # In place: `node` belongs to analyze's own copy of the query and is read no
        # more (a group key that is this node is replaced whole, so it stays intact).
        result = node.transform(replace, copy=False)
        for column in result.find_all(exp.Column):
            if not column.name.startswith(RESERVED_PREFIX):
                raise QueryRefused(
                    f"the column {column.name} in {clause}",
                    "it is neither grouped nor aggregated, so it would release raw values",
                    f"add {column.name} to GROUP BY, or wrap it in COUNT/SUM/AVG",
                )
        return result

    def aggregate(self, node: exp.Expression) -> int:
        if any(True for _ in node.this.find_all(*AGGREGATES)) if node.this else False:
            raise QueryRefused(
                "a nested aggregate",
                "an aggregate of an aggregate is not supported",
                "compute it from the released values afterwards",
            )
        if node not in self.aggregate_index:
            self.aggregate_index[node] = len(self.analysis.aggregates)
            self.analysis.aggregates.append(self._decompose(node))
        return self.aggregate_index[node]

    def _decompose(self, node: exp.Expression) -> Aggregate:
        argument = node.this
        if isinstance(node, exp.Count):
            return Aggregate("count", (self._measure(self._count(argument)),))
        if isinstance(argument, exp.Distinct):
            raise QueryRefused(
                f"{node.key.upper()}(DISTINCT ...)",
                "its sensitivity cannot be bounded here",
                f"write {node.key.upper()}(col) without DISTINCT",
            )
        try:
            self._require_safe(argument, "the aggregate")
        except QueryRefused:
            # Named in full only when refused: generating its SQL for every accepted
            # aggregate was a tenth of analysing a query.
            self._require_safe(argument, f"the aggregate {node.sql()}")
            raise
        bounds, note = self._bounds(argument)
        clamped = _clamped(argument, self.resolver.table, self.ranges)
        total = self._measure(Measurement("sum", argument, bounds, clamped, note))
        if isinstance(node, exp.Sum):
            return Aggregate("sum", (total,))
        count = self._measure(Measurement("count", argument))
        return Aggregate("avg", (total, count), bounds)

    def _require_safe(self, argument: exp.Expression, clause: str) -> None:
        """An aggregate's argument reads only public columns and cannot fail for any row."""
        self.resolver.require_public(argument, clause)
        require_total(argument, self.resolver.table, clause)

    def _count(self, argument: exp.Expression | None) -> Measurement:
        if argument is None or isinstance(argument, exp.Star):
            return Measurement("count")
        if isinstance(argument, exp.Distinct):
            unit = self.resolver.table.privacy_unit
            inner = argument.expressions
            if (
                unit is not None
                and len(inner) == 1
                and isinstance(inner[0], exp.Column)
                and inner[0].name.lower() == unit
            ):
                return Measurement("count_units")
            raise QueryRefused(
                f"COUNT(DISTINCT {', '.join(e.sql() for e in inner)})",
                "only the privacy unit can be counted distinctly (its sensitivity is 1)",
                f"write COUNT(DISTINCT {unit})"
                if unit
                else "write COUNT(*) (each row is a person)",
            )
        self._require_safe(argument, "COUNT")
        return Measurement("count", argument)

    def _measure(self, measurement: Measurement) -> int:
        for index, existing in enumerate(self.analysis.measurements):
            if (existing.kind, existing.argument) == (measurement.kind, measurement.argument):
                return index
        self.analysis.measurements.append(measurement)
        return len(self.analysis.measurements) - 1

    def _bounds(self, argument: exp.Expression) -> tuple[Interval, str]:
        interval = _interval(argument, self.resolver.table, self.ranges)
        if interval is None:
            raise QueryRefused(
                f"SUM/AVG of {argument.sql()}",
                "dpsql cannot derive bounds for it from the policy (every summed column needs "
                "'lower' and 'upper', and only arithmetic with constants, CASE and COALESCE keep "
                "bounds derivable)",
                "sum a bounded column, e.g. SUM(income) or SUM(income / 1000); ask the owner "
                "to declare lower/upper for the column",
            )
        tightened = [
            f"{name} to [{_fmt(r.lower)}, {_fmt(r.upper)}]"
            for name, r in self.ranges.items()
            if any(c.name.lower() == name for c in argument.find_all(exp.Column))
        ]
        note = f"clamped to [{_fmt(interval.lower)}, {_fmt(interval.upper)}]"
        if tightened:
            note += f"; WHERE tightened {', '.join(tightened)}"
        return interval, note


def _fmt(value: float) -> str:
    return f"{value:g}"


def _order(
    select: exp.Select, items: list[tuple[str, exp.Expression]], builder: _Builder
) -> list[exp.Ordered]:
    order = select.args.get("order")
    if order is None:
        return []
    names = {name.lower() for name, _ in items}
    result = []
    for ordered in order.expressions:
        node = ordered.this
        is_position = isinstance(node, exp.Literal) and not node.is_string
        is_alias = isinstance(node, exp.Column) and not node.table and node.name.lower() in names
        if is_position:
            _resolve_reference(node, items, {}, builder.resolver, "ORDER BY")
            target = node
        elif is_alias and builder.resolver.table.column(node.name) is None:
            target = exp.column(node.name, quoted=True)
        else:
            target = builder.post_expression(node, "ORDER BY")
        result.append(
            exp.Ordered(
                this=target,
                desc=ordered.args.get("desc"),
                nulls_first=ordered.args.get("nulls_first"),
            )
        )
    return result


def _count_literal(node: exp.Expression | None, clause: str) -> int | None:
    if node is None:
        return None
    value = node.expression if isinstance(node, exp.Limit | exp.Offset) else node
    if isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit():
        return min(int(value.this), MAX_ROWS)  # the release never has more rows than this
    raise QueryRefused(
        f"{clause} {value.sql()}", f"{clause} must be a whole number", f"write {clause} 10"
    )


def _ranges(where: exp.Expression | None, table: Table) -> dict[str, Interval]:
    """Bounds implied by range predicates in the top-level conjunction of WHERE."""
    ranges: dict[str, Interval] = {}
    for condition in conjuncts(where):
        found = _range_of(condition)
        if found is None:
            continue
        name, lower, upper = found
        column = table.column(name)
        current = ranges.get(column.name.lower()) if column else None
        current = current or (column_interval(column) if column else None)
        if current is None:
            continue
        if column.type == "int":
            lower = math.ceil(lower) if math.isfinite(lower) else lower
            upper = math.floor(upper) if math.isfinite(upper) else upper
        new_lower = min(max(current.lower, lower), current.upper)
        new_upper = max(min(current.upper, upper), current.lower)
        ranges[column.name.lower()] = replace(
            current, lower=min(new_lower, new_upper), upper=max(new_lower, new_upper)
        )
    return ranges


def where_range(where: exp.Expression | None, column: Column) -> tuple[float, float]:
    """The range in which `column` lies in every row that passes `where`, read from
    its top-level conjunction (infinite where that says nothing).

    A row whose value is NULL or NaN fails each condition read here (NaN
    compares above every number), so it is outside the range too; an integer
    column's bounds are whole, since the rewrite reads it as BIGINT.
    """
    lower, upper = -math.inf, math.inf
    for condition in conjuncts(where):
        found = _range_of(condition)
        if found is None or found[0].lower() != column.name.lower():
            continue
        _, low, high = found
        if column.type == "int":
            low = math.ceil(low) if math.isfinite(low) else low
            high = math.floor(high) if math.isfinite(high) else high
        lower, upper = max(lower, low), min(upper, high)
    return lower, upper


def conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    """The conditions of a top-level AND (parentheses removed); [] for no condition."""
    if node is None:
        return []
    if isinstance(node, exp.Paren):
        return conjuncts(node.this)
    if isinstance(node, exp.And):
        return conjuncts(node.this) + conjuncts(node.expression)
    return [node]


def _number(node: exp.Expression) -> float | None:
    if isinstance(node, exp.Neg):
        inner = _number(node.this)
        return -inner if inner is not None else None
    if isinstance(node, exp.Paren):
        return _number(node.this)
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            value = float(node.this)
        except ValueError:
            return None
        return value if math.isfinite(value) else None
    return None


def _range_of(condition: exp.Expression) -> tuple[str, float, float] | None:
    """(column, lower, upper) for `col op literal`, BETWEEN, IN and =; None otherwise.

    The bounds are floats on the safe side of the literals as written: the databases
    compare `x < 2.000000000000000001` exactly, so a bound read as the nearest float
    (2.0) would leave out rows of 2, whose clamp the rewrite then drops.
    """
    inf = math.inf
    if isinstance(condition, exp.Between) and isinstance(condition.this, exp.Column):
        low, high = _exact(condition.args["low"]), _exact(condition.args["high"])
        if low is not None and high is not None:
            if condition.args.get("symmetric"):  # BETWEEN SYMMETRIC 10 AND 0 is [0, 10]
                low, high = min(low, high), max(low, high)
            return condition.this.name, _float_below(low), _float_above(high)
        return None
    if isinstance(condition, exp.In) and isinstance(condition.this, exp.Column):
        values = [_exact(v) for v in condition.expressions]
        if values and all(v is not None for v in values) and not condition.args.get("query"):
            return condition.this.name, _float_below(min(values)), _float_above(max(values))
        return None
    comparisons = {exp.GT: (1, 0), exp.GTE: (1, None), exp.LT: (0, 1), exp.LTE: (0, None),
                   exp.EQ: (2, None)}  # fmt: skip
    kind = type(condition)
    if kind not in comparisons:
        return None
    left, right = condition.this, condition.expression
    if isinstance(right, exp.Column) and _exact(left) is not None:
        flipped = {
            exp.GT: exp.LT,
            exp.GTE: exp.LTE,
            exp.LT: exp.GT,
            exp.LTE: exp.GTE,
            exp.EQ: exp.EQ,
        }
        left, right, kind = right, left, flipped[kind]
    value = _exact(right)
    if not isinstance(left, exp.Column) or value is None:
        return None
    if kind is exp.EQ:
        return left.name, _float_below(value), _float_above(value)
    if kind in (exp.GT, exp.GTE):
        lower = _float_below(value)
        return left.name, (math.nextafter(lower, inf) if kind is exp.GT else lower), inf
    upper = _float_above(value)
    return left.name, -inf, (math.nextafter(upper, -inf) if kind is exp.LT else upper)


def _exact(node: exp.Expression) -> Fraction | None:
    """The exact value of a finite number written down (a literal, negated or in
    parentheses), or None."""
    if _number(node) is None:
        return None  # not a number, or not a finite one
    if isinstance(node, exp.Neg):
        return -_exact(node.this)
    if isinstance(node, exp.Paren):
        return _exact(node.this)
    return Fraction(Decimal(node.this))


def _float_below(value: Fraction) -> float:
    """The largest float at most `value`."""
    nearest = float(value)
    return math.nextafter(nearest, -math.inf) if Fraction(nearest) > value else nearest


def _float_above(value: Fraction) -> float:
    """The smallest float at least `value`."""
    nearest = float(value)
    return math.nextafter(nearest, math.inf) if Fraction(nearest) < value else nearest


def column_interval(column: Column) -> Interval | None:
    """Declared bounds, or the range of a numeric public domain; None if unbounded.

    A float column's values other than 0 are at least NEAR_ZERO from it: the
    rewrite clamps a column to these bounds before computing with it and, on
    PostgreSQL, reads a value nearer zero than that as 0 (rewrite.near_zero)."""
    if column.type not in NUMERIC_TYPES:
        return None
    if column.bounded:
        lower, upper = float(column.lower), float(column.upper)
    elif column.values and all(isinstance(v, int | float) for v in column.values):
        lower, upper = float(min(column.values)), float(max(column.values))
    else:
        return None
    tiny = NEAR_ZERO if lower <= 0 <= upper else min(abs(lower), abs(upper))
    return Interval(lower, upper, column.type == "int", tiny=tiny)


def interval_of(node: exp.Expression, table: Table) -> Interval | None:
    """Sound bounds of a row expression from the policy alone (no WHERE ranges)."""
    return _interval(node, table, {})


def _interval(node: exp.Expression, table: Table, ranges: dict[str, Interval]) -> Interval | None:
    """Sound bounds of a row expression by interval arithmetic, or None if underivable."""
    found = _interval_of(node, table, ranges)
    if found is None or not (math.isfinite(found.lower) and math.isfinite(found.upper)):
        return None  # e.g. 1e308 + 1e308: no finite bound, nothing to clamp to
    return found


def _interval_of(
    node: exp.Expression, table: Table, ranges: dict[str, Interval]
) -> Interval | None:
    if isinstance(node, exp.Column):
        column = table.column(node.name)
        if column is None:
            return None
        return ranges.get(column.name.lower()) or column_interval(column)
    value = _number(node)
    if value is not None:
        # the constant itself, not the float nearest it: the bounds hold its double and
        # its exact value (PostgreSQL's numeric, where it is computed without a column)
        written = [literal.this for literal in node.find_all(exp.Literal)]
        exact = _exact(node)
        integer = exact.denominator == 1 and "." not in "".join(written)
        return Interval(_float_below(exact), _float_above(exact), integer, tiny=_last_place(node))
    if isinstance(node, exp.Paren | exp.Cast | exp.TryCast):
        inner = _interval(node.this, table, ranges)
        if inner is not None and isinstance(node, exp.Cast | exp.TryCast):
            if node.to.is_type(exp.DataType.Type.BIGINT):
                return _whole(inner)  # rounded (DuckDB, PostgreSQL) or truncated (Spark)
            return inner if node.to.is_type(*exp.DataType.NUMERIC_TYPES) else None
        return inner
    if isinstance(node, exp.Neg):
        inner = _interval(node.this, table, ranges)
        return replace(inner, lower=-inner.upper, upper=-inner.lower) if inner else None
    if isinstance(node, exp.TimeToUnix) and _temporal(node.this, table):
        return Interval(-_EPOCH_SECONDS, _EPOCH_SECONDS, tiny=1e-6)  # whole microseconds
    if is_day_count(node, table):
        return Interval(-_EPOCH_DAYS, _EPOCH_DAYS, True)
    if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div):
        return _arithmetic(node, table, ranges)
    if isinstance(node, exp.Case | exp.If | exp.Coalesce | exp.Greatest | exp.Least):
        return _branches(node, table, ranges)
    if isinstance(node, exp.Abs):
        inner = _interval(node.this, table, ranges)
        if inner is None:
            return None
        low = 0.0 if inner.lower <= 0 <= inner.upper else min(abs(inner.lower), abs(inner.upper))
        return replace(inner, lower=low, upper=inner.magnitude)
    if isinstance(node, exp.Floor | exp.Ceil | exp.Round | exp.Sign | exp.Mod | exp.IntDiv):
        return _rounding(node, table, ranges)
    if isinstance(node, exp.Sqrt | exp.Ln | exp.Log | exp.Exp):
        return _monotone(node, table, ranges)
    return None


def _temporal(node: exp.Expression, table: Table, *, dates_only: bool = False) -> bool:
    """A date or timestamp column, or a cast of a constant to one (only dates if asked)."""
    policy_types, cast_types = (
        (("date",), ("date",)) if dates_only else (_TEMPORAL_TYPES, exp.DataType.TEMPORAL_TYPES)
    )
    if isinstance(node, exp.Column):
        column = table.column(node.name)
        return column is not None and column.type in policy_types
    return (
        isinstance(node, exp.Cast)
        and node.to.is_type(*cast_types)
        and not any(True for _ in node.find_all(exp.Column))
    )


def is_day_count(node: exp.Expression, table: Table) -> bool:
    """Whether `node` is a date minus a date: a whole number of days. With a timestamp
    on either side it is an INTERVAL, on which arithmetic can overflow row by row."""
    return (
        isinstance(node, exp.Sub)
        and _temporal(node.this, table, dates_only=True)
        and _temporal(node.expression, table, dates_only=True)
    )


def _rounding(node: exp.Expression, table: Table, ranges: dict[str, Interval]) -> Interval | None:
    """FLOOR/CEIL/ROUND (to whole numbers or a literal number of decimals), SIGN, %, //."""
    if isinstance(node, exp.Sign):
        return Interval(-1.0, 1.0, True) if _interval(node.this, table, ranges) else None
    if isinstance(node, exp.Mod | exp.IntDiv):
        left = _interval(node.this, table, ranges)
        right = _interval(node.expression, table, ranges)
        if left is None or right is None or right.lower <= 0 <= right.upper:
            return None  # a zero divisor is an error in PostgreSQL
        if isinstance(node, exp.IntDiv):
            pairs = [(a, b) for a in (left.lower, left.upper) for b in (right.lower, right.upper)]
            quotients = _outward(pairs, operator.truediv)
            return _whole(Interval(*quotients)) if quotients is not None else None
        if not (left.integer and right.integer):
            return None  # PostgreSQL has no % of double precision (an error after the charge)
        # |a % b| < |b| and <= |a|, with the sign of a
        size = min(left.magnitude, right.magnitude)
        return Interval(-size if left.lower < 0 else 0.0, size if left.upper > 0 else 0.0, True)
    inner = _interval(node.this, table, ranges)
    decimals = node.args.get("decimals")
    if inner is None or decimals is None:
        return _whole(inner) if inner is not None else None
    places = _number(decimals)
    if places is None or not -30 <= places <= 30 or not _written_whole(decimals):
        return None  # places are a whole number written as one (no ROUND(x, 2.0) anywhere)
    pad = 10.0 ** -math.floor(places)  # rounding moves a value by less than one unit of it
    return Interval(inner.lower - pad, inner.upper + pad, tiny=pad / 2)  # whole units


def _whole(inner: Interval) -> Interval:
    return Interval(math.floor(inner.lower), math.ceil(inner.upper), True)


def _monotone(node: exp.Expression, table: Table, ranges: dict[str, Interval]) -> Interval | None:
    """SQRT, LN, one-argument LOG (base 10) and EXP on the part of their domain that is
    error-free in every backend; None outside it (PostgreSQL raises there)."""
    if isinstance(node, exp.Log) and node.expression is not None:
        return None
    inner = _interval(node.this, table, ranges)
    if inner is None:
        return None
    if isinstance(node, exp.Exp):
        # PostgreSQL's exp fails beyond about 709 (overflow) and below -745 (underflow)
        if not (inner.lower >= -700 and inner.upper <= 700):
            return None
        low = math.exp(inner.lower)
        return Interval(*_widened(low, math.exp(inner.upper)), tiny=low / 2)
    if isinstance(node, exp.Sqrt):
        if inner.lower < 0:
            return None
        tiny = math.sqrt(inner.least_nonzero) / 2
        return Interval(*_widened(math.sqrt(inner.lower), math.sqrt(inner.upper)), tiny=tiny)
    if inner.lower <= 0:
        return None
    log = math.log if isinstance(node, exp.Ln) else math.log10
    # log x is 0 only at 1; elsewhere at least about |x - 1| / 2.3 (near 1), and x is a
    # double (the next one to 1 is 2^-53 away) or a numeric no finer than its least_nonzero
    tiny = min(inner.least_nonzero, 2.0**-54) / 10
    return Interval(*_widened(log(inner.lower), log(inner.upper)), tiny=tiny)


def _widened(lower: float, upper: float) -> tuple[float, float]:
    """Bounds computed by a math function, widened by a few units in the last place: the
    databases' EXP, LN and SQRT (PostgreSQL's in numeric, for a numeric argument) may
    round otherwise. Zero stays zero: SQRT(0) and LN(1) are exact everywhere."""
    return lower - abs(lower) * 2.0**-50, upper + abs(upper) * 2.0**-50


def _arithmetic(node: exp.Expression, table: Table, ranges: dict[str, Interval]) -> Interval | None:
    left = _interval(node.this, table, ranges)
    right = _interval(node.expression, table, ranges)
    if left is None or right is None:
        return None
    typed = left.integer_typed and right.integer_typed
    if isinstance(node, exp.Add | exp.Sub):
        ends = (
            (right.lower, right.upper) if isinstance(node, exp.Add) else (right.upper, right.lower)
        )
        pairs = list(zip((left.lower, left.upper), ends, strict=True))
        bounds = _outward(pairs, _OPERATIONS[type(node)])
        if bounds is None:
            return None
        integer = left.integer and right.integer
        return Interval(*bounds, integer, typed, _sum_tiny(left, right))
    if isinstance(node, exp.Div):
        if right.lower <= 0 <= right.upper:
            return None
        # halved: for the rounding of the result (and PostgreSQL's integer truncation,
        # which keeps a quotient of 1 or more at least half of it)
        tiny = left.least_nonzero / right.magnitude / 2
    else:
        tiny = left.least_nonzero * right.least_nonzero / 2
    pairs = [(a, b) for a in (left.lower, left.upper) for b in (right.lower, right.upper)]
    bounds = _outward(pairs, _OPERATIONS[type(node)])
    if bounds is None:
        return None
    lower, upper = bounds
    if isinstance(node, exp.Div) and typed:
        # PostgreSQL truncates toward zero: (CASE ... 1 ELSE 2 END) / 2 is 0 there, and a
        # divisor or LN argument proven nonzero by real division failed only for that row
        lower, upper = min(lower, math.trunc(lower)), max(upper, math.trunc(upper))
    return Interval(
        lower, upper, isinstance(node, exp.Mul) and left.integer and right.integer, typed, tiny
    )


_OPERATIONS = {exp.Add: operator.add, exp.Sub: operator.sub, exp.Mul: operator.mul,
               exp.Div: operator.truediv}  # fmt: skip


def _outward(
    pairs: list[tuple[float, float]], operation: Callable[[Any, Any], Any]
) -> tuple[float, float] | None:
    """The least and greatest of `operation` over the pairs, rounded outward to floats
    (None if one is not finite).

    A database computes exactly where it can (integers; PostgreSQL's numeric and
    DuckDB's DECIMAL, before constants with a decimal point went to them as
    doubles) and rounds doubles: both results must lie within the bounds, or a
    divisor proven nonzero by rounded arithmetic (0.1 + 0.2 - 0.3 is 5.6e-17 in
    floats, 0 exactly) is 0 in the database, for the rows that reach it. Whole
    operands whose results are whole and below 2^53 are exact in floats already
    (the common case, kept cheap)."""
    results = [operation(a, b) for a, b in pairs]
    if not all(math.isfinite(r) for r in results):
        return None
    if all(
        float(a).is_integer()
        and float(b).is_integer()
        and float(r).is_integer()
        and abs(r) < MAX_ROW_MAGNITUDE
        and (operation is not operator.truediv or r * b == a)
        for (a, b), r in zip(pairs, results, strict=True)
    ):
        return min(results), max(results)
    exact = [operation(Fraction(a), Fraction(b)) for a, b in pairs]
    return _float_below(min(exact)), _float_above(max(exact))


def _sum_tiny(left: Interval, right: Interval) -> float:
    """How near zero a sum or difference other than zero can be."""
    if left.zero_only or right.zero_only:
        return right.least_nonzero if left.zero_only else left.least_nonzero
    return _DIFFERENCE_FACTOR * min(left.least_nonzero, right.least_nonzero)


def _last_place(number: exp.Expression) -> float:
    """The place of a number constant's last digit (0.25 -> 0.01, 3e-5 -> 1e-5): no value
    other than zero that sums and products of such constants take is nearer zero than
    their places allow, computed exactly or in doubles. 1 for zero."""
    value = Decimal(_written(number).this)
    if value == 0:
        return 1.0
    exponent = value.as_tuple().exponent  # rounded down: 1e-5's double is above 10^-5
    return _float_below(Fraction(10) ** exponent)


def _branches(node: exp.Expression, table: Table, ranges: dict[str, Interval]) -> Interval | None:
    if isinstance(node, exp.Case):
        branches = [ifs.args["true"] for ifs in node.args.get("ifs", [])]
        branches.append(node.args.get("default"))
    elif isinstance(node, exp.If):
        branches = [node.args.get("true"), node.args.get("false")]
    else:
        branches = [node.this, *node.expressions]
    result = None
    for branch in branches:
        if branch is None or isinstance(branch, exp.Null):
            continue  # NULL is skipped by SUM and AVG
        interval = _interval(branch, table, ranges)
        if interval is None:
            return None
        result = interval if result is None else result.hull(interval)
    return result


def require_total(
    node: exp.Expression, table: Table, clause: str, *, condition: bool = False
) -> None:
    """Refuse a row expression that could raise an error for some row.

    A database error is an answer without noise: `WHERE educ = 16 AND race = 6 AND
    1 / (age - 40) > 0` would fail in PostgreSQL exactly when that person is 40.
    So every computation on column values must be provably error-free: its
    interval, derived from the declared bounds (the rewrite clamps every column
    to them before anything else reads it), stays within MAX_ROW_MAGNITUDE and
    inside the domain of SQRT, LN, LOG and division; casts go only to text, to
    BIGINT/DOUBLE from a bounded number, or between dates and times; LIKE
    patterns and SUBSTRING positions are constants.
    """
    if condition:
        if _is_text(node, table):
            raise _partial(node, clause, "it reads text from the data as a truth value")
        _require_truth(node, table, clause)
    # Constants are checked as rows are: the database may compute `CAST('x' AS INT)` or
    # `LN(-1)` only once a row reaches it, so it fails just when some row does.
    for sub in node.walk():
        if _number(sub) is not None:
            _require_short_fraction(sub, clause)
            _require_clear_of_zero(sub, clause)
            continue  # a number written down, such as -1e308, is not computed
        _require_argument_kind(sub, table, clause)
        _require_plain_call(sub, clause)
        if isinstance(sub, _CONCATENATIONS) and not isinstance(sub.parent, _CONCATENATIONS):
            _require_short_concatenation(sub, table, clause)
        if isinstance(sub, exp.Cast | exp.TryCast):
            _require_safe_cast(sub, table, clause)
        elif isinstance(sub, _COMPUTATIONS):
            interval = _interval(sub, table, {})
            if interval is None or not interval.magnitude <= MAX_ROW_MAGNITUDE:
                raise _partial(sub, clause, _why_partial(interval))
            if isinstance(sub, exp.Mul | exp.Div) and interval.least_nonzero < MIN_NONZERO:
                raise _partial(
                    sub,
                    clause,
                    "its values other than zero can be as small as "
                    f"{interval.least_nonzero:.3g}, and PostgreSQL fails a product or "
                    "quotient that underflows to zero (a float column's values count "
                    f"from {NEAR_ZERO:g}, a constant's from the place of its last digit)",
                    f"keep products and quotients above {MIN_NONZERO:g}: scale by "
                    "fewer or larger factors (income / 1000, not income * 1e-200 / 1e200)",
                )
            if not _INT32[0] <= interval.lower <= interval.upper <= _INT32[1] and _int32(sub):
                raise _partial(
                    sub,
                    clause,
                    "its integers are all constants, which DuckDB, PostgreSQL and Spark "
                    "compute in 32 bits: past 2147483647 they overflow, and in a CASE "
                    "branch only once a row reaches it",
                    "write one of its constants with a decimal point (2147483647.0) or "
                    "as CAST(2147483647 AS BIGINT)",
                )
        elif isinstance(sub, exp.Like | exp.ILike | exp.Escape | exp.Substring):
            _require_fixed_operands(sub, clause)
        elif isinstance(sub, exp.DateTrunc | exp.TimestampTrunc | exp.Extract):
            _require_known_unit(sub, table, clause)
        elif isinstance(sub, _COMPARISONS):
            _require_comparable(sub, compared_operands(sub), table, clause)
        elif isinstance(sub, _CHOICES) and not isinstance(sub, exp.Paren):
            _require_comparable(sub, _values_of(sub), table, clause)
        elif isinstance(sub, exp.Interval) and not _is_length(sub):
            raise QueryRefused(
                f"{sub.sql()[:60]} in {clause}",
                "its length may not read as a number (the database reads it only once a row "
                "reaches it), or is over 100,000 years, which a client cannot load",
                "write a whole number and a unit, at most 100,000 years: INTERVAL '3' DAY",
            )
        if isinstance(sub, exp.Connector | exp.Not | exp.If):
            for operand in _truth_operands(sub):
                _require_truth(operand, table, clause)
        if sub is not node and _is_text(sub, table) and not _text_allowed_in(sub, table):
            raise _partial(
                sub.parent,
                clause,
                "it converts text from the data to a number or a truth value, which fails "
                "for text that does not read as one",
            )


_INT32 = (-(2**31), 2**31 - 1)
_BINARY_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod)
_ONE_VALUE = (exp.Paren, exp.Neg, exp.Abs, exp.Sign, exp.Floor, exp.Ceil, exp.Round, exp.Nullif)
_MAX_FRACTION_DIGITS = 18
_MAX_DIGITS = 38


def _int32(node: exp.Expression) -> bool:
    """Whether the databases compute `node` in 32-bit integers: every value it can take
    comes from integer constants within 32 bits (a column is read as BIGINT or DOUBLE
    by the rewrite, and a larger constant is a BIGINT), e.g. `CASE WHEN state = 'ZZ'
    THEN 2147483647 ELSE 0 END + 1`, which Spark failed only when that row was there."""
    if isinstance(node, exp.Literal):
        return not node.is_string and node.this.isdigit() and int(node.this) <= _INT32[1]
    if isinstance(node, exp.Null):
        return True  # takes the type of the values beside it
    if isinstance(node, _ONE_VALUE):
        return _int32(node.this)
    if isinstance(node, _BINARY_ARITHMETIC):
        return _int32(node.this) and _int32(node.expression)
    if isinstance(node, exp.Case):
        values = [branch.args["true"] for branch in node.args.get("ifs") or []]
        return all(_int32(value) for value in [*values, node.args.get("default") or exp.Null()])
    if isinstance(node, exp.If):
        return _int32(node.args["true"]) and _int32(node.args.get("false") or exp.Null())
    if isinstance(node, exp.Coalesce | exp.Greatest | exp.Least):
        return all(_int32(value) for value in [node.this, *node.expressions])
    return False


def _require_short_fraction(node: exp.Expression, clause: str) -> None:
    """Refuse a decimal constant with more than 18 digits after its point: DuckDB reads
    it as a DECIMAL of 38 digits with that many after the point, into which a value
    beside it with too many before it fails to convert, once a row reaches it
    (`age = 0.0000000000000000000000000000000000001` failed for every age of 10 or more).
    And one of more than 38 digits without an exponent, which Spark cannot read as any
    DECIMAL (an error after the charge)."""
    text = _written(node).this.lower()
    fraction = text.partition(".")[2]
    digits = sum(character.isdigit() for character in text.lstrip("0."))
    if "e" not in text and digits > _MAX_DIGITS:
        raise _partial(
            node,
            clause,
            f"it has {digits} digits, more than the {_MAX_DIGITS} of the widest DECIMAL, "
            "which Spark fails to read",
            "write it with fewer digits, or with an exponent (1.2345e40)",
        )
    if "e" not in text and len(fraction) > _MAX_FRACTION_DIGITS:
        raise _partial(
            node,
            clause,
            f"it has {len(fraction)} digits after its decimal point, which DuckDB reads as a "
            "DECIMAL too narrow for the values beside it",
            f"write at most {_MAX_FRACTION_DIGITS} digits after the point, or use an "
            "exponent (1e-37)",
        )


def _written(number: exp.Expression) -> exp.Literal:
    """The literal of a number constant, under its minus signs and parentheses."""
    while isinstance(number, exp.Neg | exp.Paren):
        number = number.this
    return number


def compared_as_written(node: exp.Expression) -> bool:
    """Whether a constant (perhaps negated or in parentheses) is an operand of a
    comparison: the database converts it once for the comparison, not per row."""
    holder = node.parent
    while isinstance(holder, exp.Neg | exp.Paren):
        holder = holder.parent
    return isinstance(holder, _COMPARISONS)


def _require_clear_of_zero(node: exp.Expression, clause: str) -> None:
    """Refuse a constant whose last digit lies below MIN_NONZERO: PostgreSQL reads it as
    numeric, exactly, and fails to convert it (or what it adds up to) to a double. One
    compared as it is (`income < 1e-320`) is converted once, not per row, and fails
    only where no double is that near zero (refused too, to save the charge); so is one
    negated or in parentheses (`income < -(1e-320)`)."""
    place = _last_place(node)
    compared = compared_as_written(node) and _number(node) != 0
    if place < MIN_NONZERO and not compared:
        raise _partial(
            node,
            clause,
            f"its last digit lies at {place:.3g}, below the {MIN_NONZERO:g} that double "
            "precision keeps clear of underflow",
            f"write constants whose last digit lies at {MIN_NONZERO:g} or above (1.5e-299, "
            "not 1.5e-301), or 0",
        )


def _truth_operands(node: exp.Connector | exp.Not | exp.If) -> list[exp.Expression]:
    """The operands read as truth values: of AND/OR/NOT, and a CASE WHEN's or IF's test."""
    if isinstance(node, exp.Connector):
        return [node.this, node.expression]
    return [node.this]


def _require_truth(node: exp.Expression, table: Table, clause: str) -> None:
    """Refuse anything but a truth value where one is read (WHERE, AND/OR/NOT, CASE WHEN).

    DuckDB converts a date or text row by row and fails on some rows (`WHERE age > 95
    AND day` failed exactly when someone was over 95); a number converts, but
    PostgreSQL and Spark refuse it, after the charge. 'true' and 'false' read as
    truth values everywhere; text from the data has its own refusal (_text_allowed_in).
    """
    kind = value_kind(node, table)
    if kind in (None, "bool") or _is_text(node, table):
        return
    if _is_string_literal(node) and _readable(node.this, "bool"):
        return
    raise QueryRefused(
        f"{node.sql()[:60]} in {clause}",
        f"it reads {kind} values as truth values, which the database converts only once "
        "a row reaches them (a failure would reveal that some row did) or refuses",
        "compare them, e.g. age <> 0, day IS NOT NULL, state = 'CA'",
    )


# Functions and the kinds of value their (first) argument must have. A type error is
# found by the database before any row is read, so it leaks nothing, but it comes after
# the charge: refusing it first saves the analyst's budget.
_TEMPORAL_ARGUMENTS = ("date", "timestamp", "interval")
_ARGUMENT_KINDS: dict[type[exp.Expression], tuple[str, ...]] = {
    **dict.fromkeys((exp.Year, exp.Month, exp.Day, exp.Quarter, exp.DayOfWeek,
                     exp.DayOfYear), ("date", "timestamp")),
    **dict.fromkeys((exp.DateTrunc, exp.TimestampTrunc), _TEMPORAL_ARGUMENTS),
    **dict.fromkeys((exp.Lower, exp.Upper, exp.Trim, exp.Length, exp.StartsWith, exp.Like,
                     exp.ILike, exp.Substring), ("string",)),
    **dict.fromkeys((exp.Abs, exp.Floor, exp.Ceil, exp.Round, exp.Sign, exp.Sqrt, exp.Ln,
                     exp.Exp), ("number",)),
}  # fmt: skip


def _require_argument_kind(node: exp.Expression, table: Table, clause: str) -> None:
    if isinstance(node, exp.Extract):
        argument, kinds = node.expression, _TEMPORAL_ARGUMENTS
    else:
        kinds = _ARGUMENT_KINDS.get(type(node), ())
        argument = node.this
    if not kinds or not isinstance(argument, exp.Expression):
        return
    kind = value_kind(argument, table)
    if kind is not None and kind not in kinds:
        raise QueryRefused(
            f"{node.sql()[:60]} in {clause}",
            f"it applies to {' or '.join(kinds)} values, and {argument.sql()[:40]} has "
            f"{kind} values (refused before the charge: the database would fail on it)",
            f"apply it to {' or '.join(kinds)} values, or cast: CAST(... AS TEXT) gives text",
        )


# Optional arguments sqlglot reads for allowed functions that a backend checks only
# once a row reaches them (PostgreSQL's LENGTH(text, encoding) and DATE_TRUNC's time
# zone name) or that not every backend has (FLOOR(x, 2), CAST ... FORMAT).
_OPTIONS_REFUSED: dict[type[exp.Expression], tuple[str, ...]] = {
    exp.Length: ("binary", "encoding"),
    exp.DateTrunc: ("zone",),
    exp.TimestampTrunc: ("zone",),
    exp.Cast: ("format", "default", "action"),
    exp.TryCast: ("format", "default", "action"),
    exp.Floor: ("decimals", "to"),
    exp.Ceil: ("decimals", "to"),
    exp.Round: ("truncate",),
    exp.Trim: ("collation",),
}


def _require_plain_call(node: exp.Expression, clause: str) -> None:
    if isinstance(node, exp.Greatest | exp.Least) and not node.expressions:
        raise QueryRefused(
            f"{node.sql()[:60]} in {clause}",
            "it has one argument, which Spark refuses (after the charge)",
            "write the value itself, or compare two or more",
        )
    for option in _OPTIONS_REFUSED.get(type(node), ()):
        if node.args.get(option) not in (None, False):
            raise QueryRefused(
                f"{node.sql()[:60]} in {clause}",
                f"its {option} argument is checked by some databases only once a row "
                "reaches it, or not understood by every backend",
                f"call {node.key.upper()} with its plain arguments",
            )


def _written_whole(number: exp.Expression) -> bool:
    """Whether a number constant is written as a whole number (no point, no exponent):
    SUBSTRING's positions and ROUND's places take no DOUBLE or NUMERIC anywhere, so
    `ROUND(x, 2.0)` and `SUBSTRING(s, 1e0, 2)` failed for every row, after the charge."""
    text = number.sql().lower()
    return "." not in text and "e" not in text


def _require_fixed_operands(node: exp.Expression, clause: str) -> None:
    """LIKE patterns, ESCAPE characters and SUBSTRING positions are constants every
    backend accepts: PostgreSQL fails a negative SUBSTRING length, and DuckDB an
    ESCAPE of two characters, only once a row reaches them."""
    operands = [node.args.get(k) for k in ("expression", "start", "length")]
    operands = [o for o in operands if isinstance(o, exp.Expression)]
    if any(True for operand in operands for _ in operand.find_all(exp.Column)):
        raise _partial(node, clause, "its pattern or positions come from the data", _FIXED_HINT)
    if isinstance(node, exp.Escape):
        escape = node.expression
        if not (_is_string_literal(escape) and len(escape.this) == 1):
            raise _partial(node, clause, "its ESCAPE is not one character", _FIXED_HINT)
    if isinstance(node, exp.Like | exp.ILike) and not _escapes_well(node):
        raise _partial(
            node,
            clause,
            "its pattern ends with its escape character, or escapes a character other than "
            "%, _ or itself (PostgreSQL and Spark escape with \\ unless ESCAPE says "
            "otherwise), which the database refuses only once a row reaches it",
            _FIXED_HINT,
        )
    for position in operands if isinstance(node, exp.Substring) else []:
        value = _number(position)
        lowest = 0 if position is node.args.get("length") else -_MAX_POSITION
        if value is None or not _written_whole(position) or not lowest <= value <= _MAX_POSITION:
            why = f"its positions are not whole numbers from {lowest}"
            raise _partial(node, clause, why, _FIXED_HINT)


_MAX_POSITION = 2**31 - 1
# Units DuckDB and PostgreSQL both accept in DATE_TRUNC, and also in EXTRACT/DATE_PART;
# PostgreSQL checks the unit only once a row reaches it.
_TRUNC_UNITS = frozenset(("microsecond", "microseconds", "millisecond", "milliseconds",
    "second", "minute", "hour", "day", "week", "month", "quarter", "year", "decade",
    "century", "millennium"))  # fmt: skip
_PART_UNITS = _TRUNC_UNITS | {"dow", "doy", "isodow", "isoyear", "epoch"}
# PostgreSQL refuses these in EXTRACT from a DATE (FeatureNotSupported), row by row.
_TIME_UNITS = frozenset(("hour", "minute", "second", "millisecond", "milliseconds",
                         "microsecond", "microseconds"))  # fmt: skip


def _require_known_unit(node: exp.Expression, table: Table, clause: str) -> None:
    extract = isinstance(node, exp.Extract)
    unit = node.this if extract else node.args.get("unit")
    known = _PART_UNITS if extract else _TRUNC_UNITS
    if extract and value_kind(node.expression, table) == "date":
        known -= _TIME_UNITS
    if not isinstance(unit, exp.Var | exp.Literal) or unit.name.lower() not in known:
        raise QueryRefused(
            f"{node.sql()[:60]} in {clause}",
            "its unit is not one every backend knows, and PostgreSQL checks it only once a "
            "row reaches it: the error would reveal without noise that some row did",
            f"use one of: {', '.join(sorted(known))}",
        )


_TEXT_FUNCTIONS = (exp.Lower, exp.Upper, exp.Trim, exp.Concat, exp.DPipe, exp.Substring)
_TEXT_CONSUMERS = (exp.Lower, exp.Upper, exp.Trim, exp.Length, exp.Concat, exp.DPipe,
                   exp.Substring, exp.Like, exp.ILike, exp.StartsWith)  # fmt: skip
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ,
                exp.NullSafeNEQ, exp.In, exp.Between)  # fmt: skip
_CHOICES = (exp.Case, exp.If, exp.Coalesce, exp.Nullif, exp.Greatest, exp.Least, exp.Paren)


def _is_text(node: exp.Expression, table: Table) -> bool:
    """Whether a row expression is text (a string column, a cast to text, a text function)."""
    if isinstance(node, exp.Column):
        column = table.column(node.name)
        return column is not None and column.type == "string"
    if isinstance(node, exp.Cast | exp.TryCast):
        return node.to.is_type(*exp.DataType.TEXT_TYPES)
    if isinstance(node, _TEXT_FUNCTIONS):
        return True
    if isinstance(node, _CHOICES):
        return any(_is_text(value, table) for value in _values_of(node))
    return False


def _values_of(node: exp.Expression) -> list[exp.Expression]:
    """The operands whose value a CASE, IF, COALESCE, ... can return (not its conditions)."""
    if isinstance(node, exp.Case):
        return [i.args["true"] for i in node.args.get("ifs", [])] + [
            v for v in [node.args.get("default")] if v is not None
        ]
    if isinstance(node, exp.If):
        return [v for v in (node.args.get("true"), node.args.get("false")) if v is not None]
    if isinstance(node, exp.Nullif):  # compared with its second operand, as = would
        return [node.this, node.expression]
    return [node.this, *node.expressions]


def _text_allowed_in(node: exp.Expression, table: Table) -> bool:
    """DuckDB casts text to the other side's type row by row (and to BOOLEAN in a
    condition): text from the data may meet only text, text functions and NULL."""
    parent = node.parent
    if isinstance(node, exp.If) and isinstance(parent, exp.Case):
        return True  # a WHEN branch: the CASE is checked as a whole
    if isinstance(parent, exp.If) and isinstance(parent.parent, exp.Case):
        parent = parent.parent
    if parent is None or isinstance(parent, exp.Count | exp.Group | exp.Alias):
        return True
    if isinstance(parent, _TEXT_CONSUMERS) or (
        isinstance(parent, exp.Cast | exp.TryCast) and parent.to.is_type(*exp.DataType.TEXT_TYPES)
    ):
        return True
    if isinstance(parent, _CHOICES) and any(node is v for v in _values_of(parent)):
        return all(_text_like(v, table) for v in _values_of(parent))
    if isinstance(parent, _COMPARISONS) or (
        isinstance(parent, exp.Is) and isinstance(parent.expression, exp.Null)
    ):
        return all(_text_like(o, table) for o in compared_operands(parent))
    return False


def dates_only(operands: list[exp.Expression], table: Table) -> bool:
    """Whether values compared with a date are dates too (or text or NULL), none of them
    truncated: DuckDB converts a date compared with a TIMESTAMP to one, which fails for
    dates past its timestamps' year 294247 (its dates reach 5881580)."""
    return all(
        value_kind(operand, table) in (None, "date", "string")
        and operand.find(exp.DateTrunc, exp.TimestampTrunc) is None
        for operand in operands
    )


def compared_operands(comparison: exp.Expression) -> list[exp.Expression]:
    """The values a comparison (=, IN, BETWEEN, IS, ...) compares, as one flat list."""
    operands = [v for k, v in comparison.args.items() if k in ("this", "expression",
                "expressions", "low", "high") and v is not None]  # fmt: skip
    return [o for v in operands for o in (v if isinstance(v, list) else [v])]


# String literals the database reads as a value of each type without failing, whatever
# the column's storage type: DuckDB converts the literal to the column's type only when
# a row reaches the comparison, so `WHERE age > 95 AND age = 'x'` failed exactly when
# someone is over 95. Numbers are never accepted quoted where they meet the data:
# '99999' does not fit a SMALLINT column. Patterns are anchored; a date must also exist.
_READABLE = {
    **ISO_TEXT,
    "bool": re.compile(r"(?i)true|false"),
    # only in CAST('NaN' AS DOUBLE), whose type is the literal's own
    "float": re.compile(r"(?i)[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?|nan|[+-]?infinity"),
}
# Kinds of value the database compares without converting one to the other row by row
# (a DATE beside a TIMESTAMP widens to TIMESTAMP, which cannot fail).
_COMPARABLE = {"number": "number", "bool": "bool", "interval": "interval",
               "date": "day and time", "timestamp": "day and time", "time": "time"}  # fmt: skip
_PREDICATES = (exp.Predicate, exp.Connector, exp.Not, exp.Escape, exp.StartsWith)


def _require_comparable(
    node: exp.Expression, operands: list[exp.Expression], table: Table, clause: str
) -> None:
    """Refuse a comparison, or a choice (CASE, COALESCE, GREATEST, ...), whose operands
    are of kinds the database converts into each other value by value: `age = day` or
    `age = 'x'` fails only once a row reaches it, so the error would reveal without
    noise that some row did. A quoted constant must read as every other kind present
    (see _READABLE); text from the data is checked by require_total."""
    quoted = [o for o in operands if _is_string_literal(o)]
    kinds = {value_kind(o, table) for o in operands if o not in quoted} - {None, "string"}
    if len({_COMPARABLE[kind] for kind in kinds}) > 1:
        raise _incomparable(node, clause, f"it compares {' with '.join(sorted(kinds))} values")
    unreadable = [o for o in quoted for kind in kinds if not _readable(o.this, kind)]
    constant_text = [
        o
        for o in operands
        if kinds and _is_text(o, table) and not any(True for _ in o.find_all(exp.Column))
    ]
    if unreadable or constant_text:
        text = (unreadable + constant_text)[0].sql()[:40]
        beside = f"it puts {'/'.join(sorted(kinds))} values beside the text {text}"
        raise _incomparable(node, clause, beside)
    if quoted and kinds and isinstance(node, exp.Greatest | exp.Least):
        raise QueryRefused(
            f"{node.sql()[:60]} in {clause}",
            f"Spark does not read a quoted constant as the {'/'.join(sorted(kinds))} values "
            f"beside it in {node.key.upper()} (an error after the charge)",
            "write the constant typed: DATE '2020-01-01', TIMESTAMP '2020-01-01 00:00:00', "
            "or a number without quotes",
        )


def _incomparable(node: exp.Expression, clause: str, what: str) -> QueryRefused:
    return QueryRefused(
        f"{node.sql()[:60]} in {clause}",
        f"{what}, which the database converts only once a row reaches them; a conversion "
        "error would reveal without noise that some row did",
        "compare values of one type: write numbers without quotes (age = 30), dates as "
        "'YYYY-MM-DD', timestamps as 'YYYY-MM-DD HH:MM:SS' and truth values as true or false",
    )


def _is_string_literal(node: exp.Expression) -> bool:
    return isinstance(node, exp.Literal) and node.is_string


def value_kind(node: exp.Expression, table: Table) -> str | None:
    """The kind of value an expression has (number, string, date, timestamp, bool,
    interval), as far as comparing it goes; None for NULL, which compares with any."""
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Literal):
        return "string" if node.is_string else "number"
    if isinstance(node, (exp.Boolean, *_PREDICATES)):
        return "bool"
    if isinstance(node, exp.Interval):
        return "interval"
    if _is_text(node, table):
        return "string"
    if isinstance(node, exp.Paren):
        return value_kind(node.this, table)
    if isinstance(node, _CHOICES):  # the kind of its values: _require_comparable checks them
        kinds = [value_kind(v, table) for v in _values_of(node)]
        typed = [k for k in kinds if k not in (None, "string")]
        return typed[0] if typed else ("string" if "string" in kinds else None)
    if isinstance(node, exp.Column):
        column = table.column(node.name)
        if column is not None and column.type in (*_TEMPORAL_TYPES, "bool"):
            return column.type
    if isinstance(node, exp.Cast | exp.TryCast):
        return _cast_kind(node.to)
    if isinstance(node, exp.DateTrunc | exp.TimestampTrunc):  # of an INTERVAL: an interval
        if value_kind(node.this, table) == "interval":
            return "interval"
        return "date"  # DATE or TIMESTAMP, by backend: only a plain date reads as both
    if isinstance(node, exp.CurrentDate):
        return "date"
    if isinstance(node, exp.CurrentTimestamp):
        return "timestamp"
    if isinstance(node, exp.Add | exp.Sub):
        return _arithmetic_kind(node, table)
    return "number"


def _cast_kind(target: exp.DataType) -> str:
    if target.is_type("date"):
        return "date"
    if target.is_type("time", "timetz"):
        return "time"
    if target.is_type(*exp.DataType.TEMPORAL_TYPES):
        return "timestamp"
    if target.is_type("boolean"):
        return "bool"
    if target.is_type("interval"):
        return "interval"
    return "number"


def _arithmetic_kind(node: exp.Add | exp.Sub, table: Table) -> str:
    """date + 1 is a date, date - date a number of days, timestamp - timestamp an interval."""
    if is_day_count(node, table):
        return "number"
    kinds = [value_kind(node.this, table), value_kind(node.expression, table)]
    temporal = [k for k in kinds if k in _TEMPORAL_TYPES]
    if len(temporal) == 2:
        return "interval"
    if temporal:
        return temporal[0]
    return "interval" if "interval" in kinds else "number"


# Years in one of a unit: an interval of more than _MAX_INTERVAL_YEARS is refused, as
# psycopg cannot load one of over 999,999,999 days (INTERVAL '999999' CENTURY as a group
# key failed after the charge exactly when some row took its CASE branch).
_YEARS_PER_UNIT = {"MILLENNIUM": 1000, "MILLENNIUMS": 1000, "MILLENNIA": 1000, "CENTURY": 100,
                   "CENTURIES": 100, "DECADE": 10, "DECADES": 10}  # fmt: skip
_MAX_INTERVAL_YEARS = 100_000


def _is_length(interval: exp.Interval) -> bool:
    """INTERVAL '3' DAY or INTERVAL 3 DAY: a plain number and a unit, of at most
    _MAX_INTERVAL_YEARS."""
    length, unit = interval.this, interval.args.get("unit")
    if not (
        isinstance(length, exp.Literal)
        and unit is not None
        and re.fullmatch(r"\d{1,6}", length.this) is not None
    ):
        return False
    return int(length.this) * _YEARS_PER_UNIT.get(unit.name.upper(), 1) <= _MAX_INTERVAL_YEARS


def _readable(text: str, kind: str) -> bool:
    pattern = _READABLE.get(kind)
    if pattern is None or not pattern.fullmatch(text):
        return False
    if kind == "float" and text.lower().lstrip("+-") not in ("nan", "infinity"):
        # PostgreSQL refuses '1e999' and '1e-400' as DOUBLE: out of range either way
        mantissa = text.lower().partition("e")[0]
        zero = not any(digit in mantissa for digit in "123456789")
        return zero or 1e-300 <= abs(float(text)) <= 1e300
    if kind in _TEMPORAL_TYPES:
        try:
            dt.datetime.fromisoformat(text)
        except ValueError:
            return False
    return True


def _text_like(node: exp.Expression, table: Table) -> bool:
    return isinstance(node, exp.Null) or _is_string_literal(node) or _is_text(node, table)


_COMPUTATIONS = (
    exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Neg, exp.Abs, exp.Sign,
    exp.Floor, exp.Ceil, exp.Round, exp.Sqrt, exp.Ln, exp.Log, exp.Exp, exp.Pow,
)  # fmt: skip


def _why_partial(interval: Interval | None) -> str:
    if interval is None:
        return (
            "dpsql cannot prove it error-free for every row (a column without bounds, a "
            "divisor or logarithm argument that can be zero or negative, EXP of more than "
            "700, % of a value that is not whole, or POWER)"
        )
    return f"its values can reach {interval.magnitude:.3g}, where arithmetic may overflow"


_COMPUTE_HINT = (
    "compute on bounded columns with moderate constants, keep divisors away from zero "
    "(e.g. income / (age + 1)), or compare the column itself (age >= 40)"
)


def _escapes_well(node: exp.Like | exp.ILike) -> bool:
    """Whether a LIKE pattern is a text constant whose escape character (its ESCAPE's, or
    the backslash PostgreSQL and Spark default to; DuckDB has none, but the same rule
    holds there) only ever escapes %, _ or itself."""
    pattern = node.expression
    if not _is_string_literal(pattern):
        return False
    escape = node.parent.expression.this if isinstance(node.parent, exp.Escape) else "\\"
    characters = iter(pattern.this)
    for character in characters:
        if character == escape and next(characters, None) not in ("%", "_", escape):
            return False
    return True


_FIXED_HINT = (
    "write the pattern as a constant with a one-character ESCAPE ('C!%' ESCAPE '!'), "
    "and SUBSTRING positions as whole numbers, its length 0 or more"
)


def _partial(
    node: exp.Expression, clause: str, why: str, hint: str = _COMPUTE_HINT
) -> QueryRefused:
    return QueryRefused(
        f"{node.sql()[:60]} in {clause}",
        f"{why}; a database error for one row would reveal that row without noise",
        hint,
    )


_CONCATENATIONS = (exp.Concat, exp.DPipe)
# How many column values one concatenation may join: text grows with each, and a
# database fails past its limit (PostgreSQL 1 GB, DuckDB 4 GB, where the failure also
# invalidated the database) only for rows long enough: nested CONCATs of one text
# column 10,000 times failed for a row of 108 kB (found by an audit).
MAX_CONCATENATED = 8


def _require_short_concatenation(node: exp.Expression, table: Table, clause: str) -> None:
    """Counted: text columns (a number cast to text is short, whatever it is)."""
    columns = sum(1 for column in node.find_all(exp.Column) if _is_text(column, table))
    if columns > MAX_CONCATENATED:
        raise _partial(
            node,
            clause,
            f"it joins {columns} text column values into one text, which fails in the database "
            "once a row's text is long enough",
            f"join at most {MAX_CONCATENATED} text column values in one concatenation",
        )


# Casts between dates and times: to these only. TIMESTAMP_NS holds the years 1677-2262
# (DuckDB failed the rest), and a precision rounds (PostgreSQL's TIME(0) made 23:59:59.5
# the 24:00:00 no driver reads, TIMESTAMP(0) the year 9999's last second the year 10000).
_TEMPORAL_CAST_TARGETS = (
    exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPNTZ,
    exp.DataType.Type.DATETIME, exp.DataType.Type.TIMESTAMPTZ, exp.DataType.Type.TIME,
)  # fmt: skip


def _plain_temporal(target: exp.DataType) -> bool:
    return target.is_type(*_TEMPORAL_CAST_TARGETS) and not target.expressions


def _require_safe_cast(node: exp.Cast | exp.TryCast, table: Table, clause: str) -> None:
    target = node.to
    if target.is_type(*exp.DataType.TEXT_TYPES) or isinstance(node.this, exp.Null):
        return
    if constant_cast_converts(node):  # the same value for every row: converted in casts.py
        return
    if _is_string_literal(node.this):  # DATE '2020-01-01', CAST('NaN' AS DOUBLE)
        kind = "float" if target.is_type("double", "float") else _cast_kind(target)
        if _readable(node.this.this, kind):
            return
        raise _incomparable(
            node, clause, f"it reads the text {node.this.sql()[:40]} as {target.sql()}"
        )
    if target.is_type(*_SAFE_NUMERIC_CASTS):
        interval = _interval(node.this, table, {})
        if interval is not None and interval.magnitude <= MAX_ROW_MAGNITUDE:
            return
        raise _partial(node, clause, _why_partial(interval))
    inner = node.this
    column = table.column(inner.name) if isinstance(inner, exp.Column) else None
    if column is not None and column.type == "date" and target.is_type(exp.DataType.Type.TIME):
        raise _partial(  # it failed for every row, after the charge
            node,
            clause,
            "a date has no time of day, so the database fails the cast",
            f"cast {inner.sql()} to TIMESTAMP, or read the time of day of a timestamp column",
        )
    if column is not None and column.type in _TEMPORAL_TYPES and _plain_temporal(target):
        return
    raise _partial(
        node,
        clause,
        f"a cast to {target.sql()} can fail or overflow for some values (only casts to text, "
        "to BIGINT or DOUBLE from a bounded number, and between dates and times (DATE, "
        "TIMESTAMP, TIMESTAMPTZ, TIME, without a precision) are safe)",
        "cast to DATE, TIMESTAMP, TIMESTAMPTZ or TIME without a precision; truncate with "
        "DATE_TRUNC('second', ...)",
    )


def clamp(
    value: exp.Expression,
    interval: Interval,
    *,
    lower: bool = True,
    upper: bool = True,
    zero_below: float | None = None,
) -> exp.Expression:
    """CASE that clamps `value` to `interval` and keeps NULL (GREATEST/LEAST differ on NULL).

    `lower=False` or `upper=False` leaves out that side, for a value already known
    to lie on its right side of it (NaN compares above every number, so only the
    upper side's test catches it). `zero_below` also reads a value nearer zero
    than that as 0 (see rewrite.near_zero).
    """

    def bound(value: float) -> exp.Expression:
        # Integer bounds as integer literals: a literal like 0.0 is a DECIMAL in
        # DuckDB, and a CASE mixing it with an integer column is computed in
        # DECIMAL, many times slower than in BIGINT.
        integral = interval.integer and float(value).is_integer()
        return exp.convert(int(value) if integral else value)

    def low() -> exp.Expression:
        return bound(interval.lower)

    def high() -> exp.Expression:
        return bound(interval.upper)

    ifs = [
        *([exp.If(this=exp.LT(this=value.copy(), expression=low()), true=low())] if lower else []),
        *(
            [exp.If(this=exp.GT(this=value.copy(), expression=high()), true=high())]
            if upper
            else []
        ),
    ]
    if zero_below is not None:
        near = exp.Between(
            this=value.copy(), low=exp.convert(-zero_below), high=exp.convert(zero_below)
        )
        ifs.append(exp.If(this=near, true=exp.convert(0)))
    return exp.Case(ifs=ifs, default=value.copy()) if ifs else value.copy()


def _clamped(argument: exp.Expression, table: Table, ranges: dict[str, Interval]) -> exp.Expression:
    """The argument with every column in a value position clamped to its (tightened) bounds.

    Columns in CASE/IF conditions are left alone: they choose a branch and add
    nothing to the sum. A bare column is left as it is: the rewrite clamps the
    whole argument anyway.
    """
    if isinstance(argument, exp.Column):
        return argument.copy()
    result = argument.copy()
    for node in list(result.find_all(exp.Column)):
        if not _in_condition(node, result):
            column = table.column(node.name)
            interval = ranges.get(column.name.lower()) or column_interval(column)
            if interval is not None:  # a date has none: the argument's own clamp bounds it
                node.replace(clamp(node.copy(), interval))
    return result


def _in_condition(node: exp.Expression, root: exp.Expression) -> bool:
    while node is not root:
        if isinstance(node.parent, exp.If) and node.arg_key == "this":
            return True
        node = node.parent
    return False
