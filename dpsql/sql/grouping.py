"""Group keys: a query's GROUP BY keys (with their public domains), and the refusal of
a query without aggregates unless all it returns is the policy's public keys.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.sql.analysis import Analysis, GroupKey
from dpsql.sql.check import AGGREGATES
from dpsql.sql.resolve import Resolver, resolve_reference
from dpsql.sql.total import require_total


def _as_written(key: exp.Expression) -> str:
    """A group key as a message names it: a column by its name, without the quotes the
    resolver added."""
    return key.name if isinstance(key, exp.Column) else key.sql()[:60]


def require_public_release(analysis: Analysis) -> None:
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


def group_keys(
    select: exp.Select, items: list[tuple[str, exp.Expression]], resolver: Resolver
) -> list[GroupKey]:
    group = select.args.get("group")
    if group is None:
        return []
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
        expression = resolve_reference(node, items, aliases, resolver, "GROUP BY")
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
