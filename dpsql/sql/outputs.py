"""The release side of a query: the select list, HAVING and ORDER BY as expressions
over released values, each aggregate decomposed into measurements (a COUNT, a
clamped SUM with its bounds), and LIMIT and OFFSET as counts.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.policy import NUMERIC_TYPES
from dpsql.sql.analysis import (
    KEY_PREFIX,
    RESERVED_PREFIX,
    VALUE_PREFIX,
    Aggregate,
    Analysis,
    Measurement,
)
from dpsql.sql.check import AGGREGATES, ORDER_STATISTICS
from dpsql.sql.clamps import clamp_columns
from dpsql.sql.dispersion import DISPERSION, centre, centred_sums, decompose, refuse_text, unbounded
from dpsql.sql.intervals import Interval, interval_with
from dpsql.sql.ranges import non_null_columns
from dpsql.sql.resolve import Resolver, resolve_reference
from dpsql.sql.total import require_total

MAX_ROWS = 2**62  # LIMIT and OFFSET beyond this are the same as this (int64 for DuckDB)


class Builder:
    """Turns select items, HAVING and ORDER BY into expressions over released values."""

    def __init__(
        self,
        analysis: Analysis,
        resolver: Resolver,
        ranges: dict[str, Interval],
        summed: frozenset[exp.Expression] = frozenset(),
        *,
        quantiles: bool = False,
    ):
        self.analysis = analysis
        self.summed = summed  # arguments the query SUMs: an AVG of one shares that SUM
        self.quantiles = quantiles
        self.resolver = resolver
        self.ranges = ranges
        # Expressions are matched by sqlglot's structural equality (hashed once per
        # node), not by their generated SQL: generating SQL for every node of
        # every output was most of the cost of planning a query.
        self.key_index = {key.expression: i for i, key in enumerate(analysis.keys)}
        self.aggregate_index: dict[exp.Expression, int] = {}
        self.non_null = non_null_columns(analysis.where)

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
            if self.quantiles and isinstance(sub, ORDER_STATISTICS):
                return exp.column(f"{VALUE_PREFIX}{self.quantile(sub)}")
            return sub  # a window's own function (check.over_the_release) runs on released values

        # In place: `node` belongs to analyze's own copy of the query and is read no
        # more (a group key that is this node is replaced whole, so it stays intact).
        result = node.transform(replace, copy=False)
        for column in result.find_all(exp.Column):
            if not column.name.startswith(RESERVED_PREFIX):
                raise QueryRefused(
                    f"the column {column.name} in {clause}",
                    "it is neither grouped nor aggregated, so it would release raw values",
                    self._ungrouped_hint(column.name),
                )
        return result

    def _ungrouped_hint(self, name: str) -> str:
        """What to write instead of a bare column: a private column can be neither grouped
        nor aggregated, so its hint names what is accepted (counting the units)."""
        table = self.resolver.table
        spec = table.column(name)
        if spec is None or not spec.private:
            return f"add {name} to GROUP BY, or wrap it in COUNT/SUM/AVG"
        if name.lower() == table.privacy_unit:
            return f"count people with SELECT COUNT(DISTINCT {name}) FROM {table.name}"
        return f"{name} is private and never released: select a non-private column of {table.name}"

    def aggregate(self, node: exp.Expression) -> int:
        if (
            any(True for _ in node.this.find_all(*AGGREGATES, *ORDER_STATISTICS))
            if node.this
            else False
        ):
            raise QueryRefused(
                "a nested aggregate",
                "an aggregate of an aggregate is not supported",
                "compute it from the released values afterwards",
            )
        if node not in self.aggregate_index:
            self.aggregate_index[node] = len(self.analysis.aggregates)
            self.analysis.aggregates.append(self._decompose(node))
        return self.aggregate_index[node]

    def quantile(self, node: exp.Expression) -> int:
        """An order statistic's aggregate: its column is checked here (public, no
        aggregate inside), its histogram is sql/quantiles.py's to measure."""
        if node not in self.aggregate_index:
            self.resolver.require_public(node, f"the aggregate {node.sql()[:60]}")
            if node.find(*AGGREGATES) is not None:
                raise QueryRefused(
                    "a nested aggregate",
                    "an aggregate of an aggregate is not supported",
                    "compute it from the released values afterwards",
                )
            self.aggregate_index[node] = len(self.analysis.aggregates)
            self.analysis.aggregates.append(Aggregate("quantile", (), node=node))
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
        if isinstance(node, DISPERSION):
            return self._dispersion(node, argument)
        bounds, note = self._bounds(argument)
        if isinstance(node, exp.Avg) and argument not in self.summed and centre(bounds):
            centred = self._centred_avg(argument, bounds, note)
            if centred is not None:
                return centred
        clamped = clamp_columns(argument, self.resolver.table, self.ranges)
        total = self._measure(Measurement("sum", argument, bounds, clamped, note))
        if isinstance(node, exp.Sum):
            return Aggregate("sum", (total,))
        count = self._measure(self._counted(argument))
        return Aggregate("avg", (total, count), bounds)

    def _centred_avg(
        self, argument: exp.Expression, bounds: Interval, note: str
    ) -> Aggregate | None:
        """AVG as centre + SUM(x - centre) / COUNT: the centred SUM moves by at most
        half the bounds' width per row, not their largest magnitude, and the mean's error
        (SUM's noise + (mean - centre) times the COUNT's, over the count) is never larger
        for any data (docs/mechanisms.md). None where the centred values cannot be
        computed safely: the plain SUM then serves."""
        table = self.resolver.table
        try:
            (total,) = centred_sums(
                argument,
                bounds,
                note,
                lambda value: clamp_columns(value, table, self.ranges),
                lambda value: interval_with(value, table, self.ranges),
                lambda value: require_total(value, table, "AVG"),
                squares=False,
            )
        except QueryRefused:
            return None
        measured = self._measure(total), self._measure(self._counted(argument))
        return Aggregate("avg", measured, bounds, centre(bounds))

    def _dispersion(self, node: exp.Expression, argument: exp.Expression) -> Aggregate:
        """VAR/STDDEV from three measurements (sql/dispersion.py)."""
        table = self.resolver.table
        if isinstance(argument, exp.Column) and interval_with(argument, table, {}) is None:
            column = table.column(argument.name)
            if column is not None and column.type not in NUMERIC_TYPES:
                raise refuse_text(node, argument)
        if interval_with(argument, table, self.ranges) is None:
            raise unbounded(node, argument)
        bounds, note = self._bounds(argument)
        return decompose(
            node,
            argument,
            bounds,
            note,
            self._measure,
            self._counted,
            lambda value: clamp_columns(value, table, self.ranges),
            lambda value: interval_with(value, table, self.ranges),
            lambda value: require_total(value, table, node.sql_name()),
        )

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
            if len(inner) != 1:
                raise QueryRefused(
                    f"COUNT(DISTINCT {', '.join(e.sql() for e in inner)})",
                    "dpsql counts the distinct values of one expression at a time",
                    "count one: COUNT(DISTINCT a), or GROUP BY the others",
                )
            self._require_safe(inner[0], "COUNT(DISTINCT ...)")
            return Measurement("count_distinct", inner[0])
        self._require_safe(argument, "COUNT")
        return self._counted(argument)

    def _counted(self, argument: exp.Expression) -> Measurement:
        """The count of rows where `argument` is not NULL: COUNT(*) itself when it is a
        column that cannot be NULL (declared `nullable: false`, or tested by WHERE), so
        one measurement serves COUNT(*), COUNT(col) and AVG(col), and the query's epsilon
        is split over fewer measurements."""
        column = argument.unnest()
        if isinstance(column, exp.Column):
            spec = self.resolver.table.column(column.name)
            if column.name.lower() in self.non_null or (spec is not None and not spec.nullable):
                return Measurement("count")
        return Measurement("count", argument)

    def _measure(self, measurement: Measurement) -> int:
        for index, existing in enumerate(self.analysis.measurements):
            if (existing.kind, existing.argument) == (measurement.kind, measurement.argument):
                return index
        self.analysis.measurements.append(measurement)
        return len(self.analysis.measurements) - 1

    def _bounds(self, argument: exp.Expression) -> tuple[Interval, str]:
        interval = interval_with(argument, self.resolver.table, self.ranges)
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


def order_by(
    select: exp.Select, items: list[tuple[str, exp.Expression]], builder: Builder
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
            resolve_reference(node, items, {}, builder.resolver, "ORDER BY")
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


def count_literal(node: exp.Expression | None, clause: str) -> int | None:
    if node is None:
        return None
    value = node.expression if isinstance(node, exp.Limit | exp.Offset) else node
    if isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit():
        return min(int(value.this), MAX_ROWS)  # the release never has more rows than this
    raise QueryRefused(
        f"{clause} {value.sql()}", f"{clause} must be a whole number", f"write {clause} 10"
    )
