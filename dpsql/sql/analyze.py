"""Semantic analysis: what a checked query measures, and how sensitive each measurement is.

Given a SELECT that passed `check`, this pass resolves every column against the
policy (refusing unknown and private ones), finds the group keys and the
aggregates, derives clamp bounds for summed expressions by interval
arithmetic (tightened by range predicates in WHERE, DESIGN section 3), and
turns the select list, HAVING and ORDER BY into post-processing expressions
over the released values. It knows nothing of databases or noise.

`analyze` is the ordered list of its passes, each a module of its own: names
(resolve.py), WHERE proven error-free (total.py) and its ranges (ranges.py),
group keys (grouping.py), then outputs and measurements (outputs.py), into the
record of analysis.py.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.policy import Table
from dpsql.sql.analysis import RESERVED_PREFIX, Analysis, Output
from dpsql.sql.grouping import group_keys, require_public_release
from dpsql.sql.outputs import Builder, count_literal, order_by
from dpsql.sql.ranges import where_ranges
from dpsql.sql.resolve import Resolver, expand_aliases, output_name, unalias
from dpsql.sql.total import require_total


def analyze(select: exp.Select, table: Table, *, quantiles: bool = False) -> Analysis:
    """Resolve, bound and decompose a checked SELECT over `table`.

    `quantiles`: order statistics become aggregates of their own ("quantile", measured
    by sql/quantiles.py, not here); without it they are left to be refused.

    When the database guarantees that the privacy unit is unique (one row per
    unit), pass a `table` whose bounds are 1: see `unique_unit_table`.
    """
    resolver = Resolver(select, table)
    select = resolver.canonical(select)
    where = select.args.get("where")
    where = where.this if where is not None else None
    if where is not None:
        resolver.refuse_aggregates(where, "WHERE", "move conditions on aggregates to HAVING")
        resolver.require_public(where, "filtering (WHERE)")
        require_total(where, table, "WHERE", condition=True)
    ranges = where_ranges(where, table)
    items = [(output_name(item), unalias(item)) for item in select.expressions]
    analysis = Analysis(
        table=table,
        where=where,
        keys=group_keys(select, items, resolver),
        outputs=[],
    )
    summed = frozenset(node.this for node in select.find_all(exp.Sum))
    builder = Builder(analysis, resolver, ranges, summed, quantiles=quantiles)
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
        condition = expand_aliases(having.this, items, resolver)
        analysis.having = builder.post_expression(condition, "HAVING")
    analysis.order = order_by(select, items, builder)
    analysis.limit = count_literal(select.args.get("limit"), "LIMIT")
    analysis.offset = count_literal(select.args.get("offset"), "OFFSET")
    if not analysis.aggregates:
        require_public_release(analysis)
    return analysis
