"""The columns a query will release, from its text, the policy and its plan: no data.

A client may ask for a statement's columns before running it (the wire
protocol's Describe: pgJDBC's getMetaData, asyncpg's prepare, a BI tool's
"validate"). Nothing may run or be charged for that, so the names and types
come from planning: each output's name as the release will name it, and a
type read off the select list: a COUNT is an integer, any other aggregate (or
an expression over one) a floating-point number, a plain column its policy
type, and anything else unknown (""), which a front end reads as text.
"""

from __future__ import annotations

from typing import Any

from sqlglot import exp

from dpsql.policy import Policy
from dpsql.sql.analyze import output_name


def described_columns(select: exp.Expression, plan: Any) -> list[str]:
    """The names the release of `plan` (planned from `select`) will give its columns."""
    analysis = getattr(plan, "analysis", None)
    if analysis is not None:
        return [output.name for output in analysis.outputs]
    return [output_name(item) for item in select.selects] if isinstance(select, exp.Select) else []


def column_types(select: exp.Expression | None, policy: Policy) -> list[str] | None:
    """The type of each column a SELECT releases ("int", "float", a policy column type, or
    "" when it is only known from the values), inferred before it runs; None for a
    statement that is not a SELECT."""
    if not isinstance(select, exp.Select):
        return None
    types = []
    for selected in select.selects:
        inner = selected.this if isinstance(selected, exp.Alias) else selected
        counted = inner.this if isinstance(inner, exp.Filter) else inner  # COUNT(*) FILTER (...)
        if isinstance(counted, exp.Count | exp.Grouping):  # GROUPING(...): a bit mask
            types.append("int")
        elif isinstance(inner, exp.Column):
            types.append(_policy_type(inner.name, policy))
        elif isinstance(inner, _ORDER_STATISTICS) and len(columns := _columns(inner)) == 1:
            types.append(_policy_type(columns[0].name, policy))  # a value of the column
        elif inner.find(exp.AggFunc) is not None:
            types.append("float")
        else:
            types.append("")
    return types


# aggregates that release a value of their column, in its type
_ORDER_STATISTICS = (
    exp.Min, exp.Max, exp.Median, exp.Quantile, exp.PercentileCont, exp.PercentileDisc,
    exp.WithinGroup,
)  # fmt: skip


def _columns(node: exp.Expression) -> list[exp.Column]:
    return list(node.find_all(exp.Column))


def _policy_type(name: str, policy: Policy) -> str:
    for table in policy.tables.values():
        column = table.column(name)
        if column is not None:
            return column.type
    return ""


__all__ = ["column_types", "described_columns"]
