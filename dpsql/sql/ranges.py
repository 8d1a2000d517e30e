"""Ranges from WHERE: the bounds on a column implied by the range predicates in the
top-level conjunction of WHERE, read from the literals as written.
"""

from __future__ import annotations

import math
from dataclasses import replace

from sqlglot import exp

from dpsql.policy import Column, Table
from dpsql.sql.intervals import Interval, column_interval
from dpsql.sql.numbers import exact_value, float_above, float_below


def where_ranges(where: exp.Expression | None, table: Table) -> dict[str, Interval]:
    """Bounds implied by range predicates in the top-level conjunction of WHERE."""
    ranges: dict[str, Interval] = {}
    for condition in conjuncts(where):
        found = range_of(condition)
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
        found = range_of(condition)
        if found is None or found[0].lower() != column.name.lower():
            continue
        _, low, high = found
        if column.type == "int":
            low = math.ceil(low) if math.isfinite(low) else low
            high = math.floor(high) if math.isfinite(high) else high
        lower, upper = max(lower, low), min(upper, high)
    return lower, upper


def non_null_columns(where: exp.Expression | None) -> set[str]:
    """Columns (lower case) that no row passing `where` holds NULL in: those the
    top-level conjunction tests with IS NOT NULL or compares with a literal (a NULL
    fails such a comparison)."""
    found = set()
    for condition in conjuncts(where):
        if (
            isinstance(condition, exp.Not)
            and isinstance(condition.this, exp.Is)
            and isinstance(condition.this.this, exp.Column)
            and isinstance(condition.this.expression, exp.Null)
        ):
            found.add(condition.this.this.name.lower())
        elif (ranged := range_of(condition)) is not None:
            found.add(ranged[0].lower())
    return found


def conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    """The conditions of a top-level AND (parentheses removed); [] for no condition."""
    if node is None:
        return []
    if isinstance(node, exp.Paren):
        return conjuncts(node.this)
    if isinstance(node, exp.And):
        return conjuncts(node.this) + conjuncts(node.expression)
    return [node]


def range_of(condition: exp.Expression) -> tuple[str, float, float] | None:
    """(column, lower, upper) for `col op literal`, BETWEEN, IN and =; None otherwise.

    The bounds are floats on the safe side of the literals as written: the databases
    compare `x < 2.000000000000000001` exactly, so a bound read as the nearest float
    (2.0) would leave out rows of 2, whose clamp the rewrite then drops.
    """
    inf = math.inf
    if isinstance(condition, exp.Between) and isinstance(condition.this, exp.Column):
        low, high = exact_value(condition.args["low"]), exact_value(condition.args["high"])
        if low is not None and high is not None:
            if condition.args.get("symmetric"):  # BETWEEN SYMMETRIC 10 AND 0 is [0, 10]
                low, high = min(low, high), max(low, high)
            return condition.this.name, float_below(low), float_above(high)
        return None
    if isinstance(condition, exp.In) and isinstance(condition.this, exp.Column):
        values = [exact_value(v) for v in condition.expressions]
        if values and all(v is not None for v in values) and not condition.args.get("query"):
            return condition.this.name, float_below(min(values)), float_above(max(values))
        return None
    comparisons = {exp.GT: (1, 0), exp.GTE: (1, None), exp.LT: (0, 1), exp.LTE: (0, None),
                   exp.EQ: (2, None)}  # fmt: skip
    kind = type(condition)
    if kind not in comparisons:
        return None
    left, right = condition.this, condition.expression
    if isinstance(right, exp.Column) and exact_value(left) is not None:
        flipped = {
            exp.GT: exp.LT,
            exp.GTE: exp.LTE,
            exp.LT: exp.GT,
            exp.LTE: exp.GTE,
            exp.EQ: exp.EQ,
        }
        left, right, kind = right, left, flipped[kind]
    value = exact_value(right)
    if not isinstance(left, exp.Column) or value is None:
        return None
    if kind is exp.EQ:
        return left.name, float_below(value), float_above(value)
    if kind in (exp.GT, exp.GTE):
        lower = float_below(value)
        return left.name, (math.nextafter(lower, inf) if kind is exp.GT else lower), inf
    upper = float_above(value)
    return left.name, -inf, (math.nextafter(upper, -inf) if kind is exp.LT else upper)
