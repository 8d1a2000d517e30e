"""Rewrite spellings dpsql accepts into the equivalent forms its checker and analysis know.

Each pass is a small pure function over a parsed SELECT, as in sqlglot's
optimizer; the result goes through the whole gate like any query written that
way, so a pass never decides what is safe.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.sql.check import AGGREGATES


def aggregate_filters(select: exp.Select) -> exp.Select:
    """`COUNT(*) FILTER (WHERE c)`, `COUNT(x)`, `SUM(x)` and `AVG(x) FILTER (WHERE c)` as
    the same aggregate of `CASE WHEN c THEN x END` (1 for `*`): the rows where `c` is
    not true give NULL, which the aggregate skips, as FILTER skips them.

    `COUNT(DISTINCT ...) FILTER` is left as it is, for the checker to refuse: the
    count of distinct units takes the bare unit only. A copy is made only when the
    query has a FILTER.
    """
    if select.find(exp.Filter) is None:
        return select

    def rewrite(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Filter) or not isinstance(node.this, AGGREGATES):
            return node
        aggregate, argument = node.this, node.this.this
        if isinstance(argument, exp.Distinct):
            return node
        value = exp.Literal.number(1) if isinstance(argument, exp.Star) else argument
        case = exp.Case(ifs=[exp.If(this=node.expression.this, true=value)])
        return aggregate.__class__(this=case)

    return select.transform(rewrite)
