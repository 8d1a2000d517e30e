"""What the gate promises for one statement, checked from the outside.

`check_outcome` runs a statement through a Session whose adapter records
every SQL text it is sent and decides, from what happened, whether the
promise held: refused before the database, or answered with only noisy or
public columns by a rewritten query that carries the contribution bound,
the clamps and the unit NULL filter (checked structurally with sqlglot).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp

import dpsql
from dpsql.sql.analysis import KEY_PREFIX, VALUE_PREFIX
from dpsql.sql.parse import parse_statement
from dpsql.sql.plan import ConstantPlan, DirectPlan, DomainPlan
from dpsql.sql.quantiles import QuantilePlan, QuantileStages, RefinedQuantiles


@dataclass
class Outcome:
    kind: str  # "refused", "post-processing error", "backend error" or "answered"
    error: Exception | None = None


def check_outcome(session: Any, adapter: Any, empty: Any, sql: str, params: Any) -> Outcome:
    """Run `sql` and assert the gate's promise; `empty` runs SQL on empty copies of the tables."""
    adapter.statements.clear()
    cursor = dpsql.Connection(session).cursor()
    try:
        cursor.execute(sql, params)
    except dpsql.Error as error:
        message = str(error)
        assert len(message) > 30, f"unhelpful message {message!r} for {sql!r}"
        if isinstance(error, dpsql.BackendError):
            _assert_data_independent(adapter.statements, empty, sql)
            return Outcome("backend error", error)
        if isinstance(error, dpsql.DataError):  # post-processing of noisy values
            assert adapter.statements, sql
            return Outcome("post-processing error", error)
        assert adapter.statements == [], f"refused after reaching the database: {sql!r}"
        if isinstance(error, dpsql.QueryRefused):
            assert error.construct and error.reason and error.hint, sql
        return Outcome("refused", error)
    statement = parse_statement(sql, adapter.dialect, params)
    if statement.kind in ("explain", "set", "show"):
        assert adapter.statements == [], f"{statement.kind} reached the database: {sql!r}"
        return Outcome("answered")
    plan = session.plan(statement.tree)
    if isinstance(plan, ConstantPlan):
        assert not any(True for _ in statement.tree.find_all(exp.Table)), sql
        return Outcome("answered")
    if isinstance(plan, DomainPlan):  # the policy's domain itself: nothing read, nothing spent
        assert adapter.statements == [] and plan.cost.epsilon == 0, sql
        keys = plan.analysis.keys
        domains = [  # each output that is a key: the domain its values must come from
            {_comparable(v) for v in keys[int(out.expression.name.removeprefix(KEY_PREFIX))].domain}
            if isinstance(out.expression, exp.Column) and out.expression.name.startswith(KEY_PREFIX)
            else None
            for out in plan.analysis.outputs
        ]
        for row in cursor.fetchall():
            for value, domain in zip(row, domains, strict=True):
                assert domain is None or _comparable(value) in domain, sql
        return Outcome("answered")
    if isinstance(plan, QuantileStages):
        _assert_staged(plan, adapter.statements, adapter.dialect)
        return Outcome("answered")
    if isinstance(plan, QuantilePlan | RefinedQuantiles):  # one histogram, or two
        for text in adapter.statements:
            _assert_reads_bounded(text, plan.analysis, adapter.dialect)
        return Outcome("answered")
    assert isinstance(plan, DirectPlan), f"unexpected plan {type(plan).__name__} for {sql!r}"
    _assert_outputs_protected(plan, cursor, sql)
    for text in adapter.statements:  # empty when the release came from the cache
        assert_rewritten_is_bounded(text, plan, adapter.dialect)
    return Outcome("answered")


def _comparable(value: Any) -> Any:
    return float(value) if isinstance(value, int | float) else value


def _assert_data_independent(statements: list[str], empty: Any, sql: str) -> None:
    """A database error is only allowed when it does not depend on the rows: the same SQL
    fails on empty tables too (a type error in a literal, not a value of some row)."""
    assert statements, f"a backend error without a statement: {sql!r}"
    try:
        empty.rows(statements[-1])
    except Exception:
        return
    raise AssertionError(f"data-dependent database error (a noiseless leak) for {sql!r}")


def _assert_outputs_protected(plan: DirectPlan, cursor: Any, sql: str) -> None:
    analysis = plan.analysis
    for output in analysis.outputs:
        for column in output.expression.find_all(exp.Column):
            name = column.name
            assert name.startswith((KEY_PREFIX, VALUE_PREFIX)), (sql, output)
            if name.startswith(KEY_PREFIX):
                key = analysis.keys[int(name.removeprefix(KEY_PREFIX))]
                assert key.domain is not None or plan.selection is not None, (sql, output)
        if isinstance(output.expression, exp.Column) and output.expression.name.startswith(
            VALUE_PREFIX
        ):
            assert output.name in cursor.accuracy, (sql, output.name, cursor.accuracy)
    if analysis.grouped and analysis.public_keys:
        names = [d[0] for d in cursor.description]
        for index, key in enumerate(analysis.keys):
            shown = [out.name for out in analysis.outputs
                     if out.expression == exp.column(f"{KEY_PREFIX}{index}")]  # fmt: skip
            for name in shown:
                position = names.index(name)
                domain = {float(v) for v in key.domain}
                assert all(float(row[position]) in domain for row in cursor.fetchall()), sql


def assert_rewritten_is_bounded(text: str, plan: DirectPlan, dialect: str) -> None:
    """The SQL sent reads only the policy's table and its declared columns, through the
    clamped source (or as stored,
    when no column needs clamping or widening), with the
    unit NULL filter and rank windows over the unit, and every SUM clamped to its bounds."""
    tree = _assert_reads_bounded(text, plan.analysis, dialect)
    _assert_items_aggregated(tree, len(plan.analysis.keys), text)
    if any(True for _ in tree.find_all(exp.CTE)):
        # aggregated per unit and group first: the clamps are there, on both sides
        union = _rows_union(tree)
        for side in (_cte(tree, "__dpsql_per_group"), union.expression):
            _assert_sums_clamped(side, plan, text, scope=tree)
    else:
        _assert_sums_clamped(tree, plan, text)


def _assert_staged(plan: Any, statements: list[str], dialect: str) -> None:
    """A quantile query beside other aggregates (sql/quantiles.py): its first release's
    SQL is a direct plan's, its histogram's reads the rows as bounded as any."""
    (first,) = plan.parts
    if statements:  # none when the release came from the cache
        assert_rewritten_is_bounded(statements[0], first, dialect)
    for text in statements[1:]:
        _assert_reads_bounded(text, plan.outer.analysis, dialect)


def _assert_reads_bounded(text: str, analysis: Any, dialect: str) -> exp.Select:
    """The reading half of assert_rewritten_is_bounded: the policy's table and its
    declared columns through the clamped source, the unit NULL filter and the rank
    windows over the unit. Returns the parsed SQL."""
    tree = sqlglot.parse_one(text, read=dialect)
    table = analysis.table
    ctes = {cte.alias.lower() for cte in tree.find_all(exp.CTE)}
    assert ctes <= {
        "__dpsql_filtered", "__dpsql_per_group", "__dpsql_units_over", "__dpsql_groups"
    }, text  # fmt: skip
    assert {t.name.lower() for t in tree.find_all(exp.Table)} - ctes == {
        table.name.split(".")[-1].lower()
    }, text
    # the clamped source, or the table itself when every column it reads is read as stored
    sources = [s for s in tree.find_all(exp.Subquery, exp.Table) if s.alias == "__dpsql_source"]
    assert len(sources) == 1, text
    declared = {column.name.lower() for column in table.columns.values()}
    for column in tree.find_all(exp.Column):
        name = column.name.lower()
        assert name in declared or name.startswith("__dpsql_"), f"reads {name}: {text}"
    unit = table.privacy_unit
    if unit is None:
        return tree
    assert any(
        isinstance(n.this, exp.Is) and isinstance(n.this.this, exp.Column)
        and n.this.this.name.lower() == unit for n in tree.find_all(exp.Not)
    ), f"no unit NULL filter: {text}"  # fmt: skip
    if table.unique_unit:
        return tree
    if ctes:
        _assert_bounded_per_group(tree, analysis, text)
        return tree
    ranks = {_window_kind(w): w for w in tree.find_all(exp.Window)}
    assert _partitioned_by_unit(ranks.get("row_number"), unit), text
    limits = _rank_limits(tree)
    assert limits.get("__dpsql_row_rank") == table.max_rows_per_unit, text
    if table.max_rows_per_unit == table.max_groups_per_unit == 1:
        # one window over the unit alone keeps one row of each unit: one group too
        partition = ranks["row_number"].args["partition_by"]
        assert [p.name.lower() for p in partition] == [unit], text
        return tree
    if analysis.keys:
        assert _partitioned_by_unit(ranks.get("dense_rank"), unit), text
        assert limits.get("__dpsql_group_rank") == table.max_groups_per_unit, text
    return tree


def _cte(tree: exp.Expression, name: str) -> exp.Select:
    return next(cte.this for cte in tree.find_all(exp.CTE) if cte.alias.lower() == name)


def _assert_bounded_per_group(tree: exp.Select, analysis: Any, text: str) -> None:
    """rewrite._per_group_query's shape: the rows aggregated per unit and group, then per
    unit (its largest group's rows, its groups; without keys, the per-group rows); a unit
    with a group of more than max_rows_per_unit rows on one side (its rows ranked by a row
    window over the unit and keys, at most max_rows_per_unit kept), every other unit on
    the other (`NOT unit IN` the same units); then at most max_groups_per_unit groups per
    unit, ranked over the unit, for the units with more groups."""
    table, keys = analysis.table, analysis.keys
    unit, rows, groups = table.privacy_unit, table.max_rows_per_unit, table.max_groups_per_unit
    per_group = _cte(tree, "__dpsql_per_group")
    assert per_group.args["group"].expressions[0].name.lower() == unit, text
    assert len(per_group.args["group"].expressions) == 1 + len(keys), text
    within, _ = _sides(_rows_union(tree), unit, text)
    if not keys:  # one row per unit already
        _assert_units_over(within, "__dpsql_per_group", "__dpsql_rows", rows, text)
    else:
        units = _cte(tree, "__dpsql_units_over")
        assert [g.name for g in units.args["group"].expressions] == ["__dpsql_unit"], text
        assert units.args["from_"].this.name == "__dpsql_per_group", text
        per_unit = {item.alias: item.this for item in units.expressions}
        most = per_unit["__dpsql_most_rows"]
        assert isinstance(most, exp.Max) and most.this.name == "__dpsql_rows", text
        assert isinstance(per_unit["__dpsql_group_count"], exp.Count), text
        _assert_units_over(within, "__dpsql_units_over", "__dpsql_most_rows", rows, text)
    windows = {w.parent.alias: w for w in tree.find_all(exp.Window)}
    row_rank = windows["__dpsql_row_rank"]
    assert _partitioned_by_unit(row_rank, unit), text
    assert len(row_rank.args["partition_by"]) == 1 + len(keys), text
    assert _rank_limits(_rows_union(tree).expression) == {"__dpsql_row_rank": rows}, text
    if keys:
        group_rank = windows["__dpsql_group_rank"]
        assert _partitioned_by_unit(group_rank, "__dpsql_unit"), text
        groups_union = next(u for u in tree.find_all(exp.Union) if u is not _rows_union(tree))
        few, _ = _sides(groups_union, "__dpsql_unit", text)
        _assert_units_over(few, "__dpsql_units_over", "__dpsql_group_count", groups, text)
        assert _rank_limits(groups_union.expression) == {"__dpsql_group_rank": groups}, text


def _assert_units_over(side: exp.In, table: str, column: str, bound: int, text: str) -> None:
    """`side` chooses the units of `table` whose `column` is over `bound`."""
    chosen = side.args["query"].this
    assert chosen.args["from_"].this.name == table, text
    condition = chosen.args["where"].this
    assert isinstance(condition, exp.GT) and condition.this.name == column, text
    assert int(condition.expression.this) == bound, text


def _rows_union(tree: exp.Select) -> exp.Union:
    """The union of the units within max_rows_per_unit and those ranked by the row window."""
    if any(cte.alias == "__dpsql_groups" for cte in tree.find_all(exp.CTE)):
        return _cte(tree, "__dpsql_groups")
    return tree.find(exp.Union)


def _sides(union: exp.Union, unit: str, text: str) -> tuple[exp.In, exp.In]:
    """A union's two sides' conditions: `NOT unit IN (q)` on the first, and on the rows
    ranked in the second's FROM `unit IN (q)`, the same q: each unit on one side."""
    first = union.this.args["where"].this
    assert isinstance(first, exp.Not) and isinstance(first.this, exp.In), text
    second = union.expression.args["from_"].this.this.args["where"].this
    assert isinstance(second, exp.In) and second.this.name.lower() == unit, text
    assert second.args["query"] == first.this.args["query"], text
    return first.this, second


def _assert_items_aggregated(tree: exp.Select, keys: int, text: str) -> None:
    """Besides the keys, the outer query returns only aggregates: no raw value gets out."""
    for item in tree.expressions[keys:]:
        assert item.find(exp.AggFunc) is not None, f"raw item {item.sql()} in {text}"


def _assert_sums_clamped(
    tree: exp.Select, plan: DirectPlan, text: str, scope: exp.Expression | None = None
) -> None:
    """Every SUM is clamped to its bounds, but for a side that a condition every
    summed row passes (a top-level conjunct of a WHERE in `scope`, by default `tree`)
    already keeps its bare column on."""
    measured = {item.alias: item.this for item in tree.expressions}
    wheres = (scope or tree).find_all(exp.Where)
    conditions = [c for where in wheres for c in conjuncts(where.this)]
    for index, measurement in enumerate(plan.analysis.measurements):
        if measurement.kind != "sum":
            continue
        total = measured[f"__dpsql_m{index}"].find(exp.Sum)
        column, offset = _centred(measurement.argument)
        clamp, shift = total.find(exp.Case), 0.0
        if clamp is None and column is not measurement.argument and measurement.within:
            # a bare column's centred values: its clamp is the source's, less the centre
            clamp, shift = _source_clamp(scope or tree, column), offset
        sides = {}
        for branch in clamp.args["ifs"] if clamp is not None else []:
            side = {exp.LT: "lower", exp.GT: "upper"}.get(type(branch.this))
            value = written_number(branch.args["true"])
            if side is not None and value is not None:
                sides[side] = value - shift
        bounds = measurement.bounds
        assert sides.get("lower", bounds.lower) == bounds.lower, text
        assert sides.get("upper", bounds.upper) == bounds.upper, text
        for side in {"lower", "upper"} - set(sides):
            assert isinstance(column, exp.Column), f"unclamped SUM in {text}"
            limit = getattr(bounds, side) + offset
            assert any(
                _keeps(condition, column.name, side, limit, bounds.integer)
                for condition in conditions
            ), f"SUM without its {side} clamp, which no WHERE implies, in {text}"


def _centred(argument: exp.Expression) -> tuple[exp.Expression, float]:
    """(x, m) for a SUM of x - m (an AVG's or a STDDEV's centred values); (argument, 0)
    otherwise."""
    if isinstance(argument, exp.Sub):
        centre = written_number(argument.expression)
        if centre is not None:
            return argument.this.unnest(), centre
    return argument, 0.0


def _source_clamp(tree: exp.Select, column: exp.Expression) -> exp.Case | None:
    """The CASE that clamps `column` where the clamped source computes it, if any."""
    if not isinstance(column, exp.Column):
        return None
    for source in tree.find_all(exp.Subquery):
        if source.alias == "__dpsql_source":
            for item in source.this.expressions:
                if item.alias_or_name.lower() == column.name.lower():
                    return item.find(exp.Case)
    return None


def conjuncts(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.Paren):
        return conjuncts(node.this)
    if isinstance(node, exp.And):
        return conjuncts(node.this) + conjuncts(node.expression)
    return [node]


def written_number(node: exp.Expression) -> float | None:
    """A number written in the SQL sent: a literal, negated, or cast to DOUBLE (as DuckDB
    and Spark are sent constants with a decimal point)."""
    if isinstance(node, exp.Neg):
        inner = written_number(node.this)
        return -inner if inner is not None else None
    if isinstance(node, exp.Cast) and node.to.is_type("double"):
        node = node.this
    return float(node.this) if isinstance(node, exp.Literal) and not node.is_string else None


def _keeps(condition: exp.Expression, name: str, side: str, limit: float, whole: bool) -> bool:
    """Whether every row passing `condition` has `name` on the inner side of `limit`
    (NULL and NaN pass no comparison with a number, NaN comparing above all)."""

    def is_column(node: exp.Expression) -> bool:
        return isinstance(node, exp.Column) and node.name.lower() == name.lower()

    if isinstance(condition, exp.Between) and is_column(condition.this):
        low, high = written_number(condition.args["low"]), written_number(condition.args["high"])
        if low is None or high is None:
            return False
        low, high = min(low, high), max(low, high)  # also right for BETWEEN SYMMETRIC
        return low >= limit if side == "lower" else high <= limit
    if isinstance(condition, exp.In) and is_column(condition.this):
        values = [written_number(v) for v in condition.expressions]
        if not values or None in values:
            return False
        return min(values) >= limit if side == "lower" else max(values) <= limit
    if not isinstance(condition, exp.EQ | exp.GT | exp.GTE | exp.LT | exp.LTE):
        return False
    left, right = condition.this, condition.expression
    kind = type(condition)
    if is_column(right):
        left, right = right, left
        kind = {exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE}.get(kind, kind)
    value = written_number(right)
    if not is_column(left) or value is None:
        return False
    if side == "lower" and kind in (exp.EQ, exp.GTE, exp.GT):
        if kind is exp.GT:  # values above `value`: from its next float, or next integer
            value = math.floor(value) + 1 if whole else math.nextafter(value, math.inf)
        return value >= limit
    if side == "upper" and kind in (exp.EQ, exp.LTE, exp.LT):
        if kind is exp.LT:
            value = math.ceil(value) - 1 if whole else math.nextafter(value, -math.inf)
        return value <= limit
    return False


def _window_kind(window: exp.Window) -> str:
    return window.this.sql().split("(")[0].lower()


def _partitioned_by_unit(window: exp.Window | None, unit: str) -> bool:
    if window is None:
        return False
    partition = window.args.get("partition_by") or []
    return bool(partition) and partition[0].name.lower() == unit


def _rank_limits(tree: exp.Select) -> dict[str, int]:
    where = tree.args.get("where")
    limits = {}
    for condition in where.find_all(exp.LTE) if where is not None else []:
        if isinstance(condition.this, exp.Column) and condition.expression.is_int:
            limits[condition.this.name.lower()] = int(condition.expression.this)
    return limits
