"""Rewrite spellings dpsql accepts into the equivalent forms its checker and analysis know.

Each pass is a small pure function over a parsed SELECT, as in sqlglot's
optimizer; the result goes through the whole gate like any query written that
way, so a pass never decides what is safe.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.sql.check import AGGREGATES
from dpsql.sql.dispersion import is_var_spelling, var_spellings


def aggregate_filters(select: exp.Select) -> exp.Select:
    """`COUNT(*) FILTER (WHERE c)`, `COUNT(x)`, `SUM(x)` and `AVG(x) FILTER (WHERE c)` as
    the same aggregate of `CASE WHEN c THEN x END` (1 for `*`): the rows where `c` is
    not true give NULL, which the aggregate skips, as FILTER skips them.

    `COUNT(DISTINCT ...) FILTER` is left as it is, for the checker to refuse: the
    count of distinct units takes the bare unit only.
    """

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


# DuckDB's names for EXTRACT with the unit as a string; sqlglot reads them as
# unknown functions there (PostgreSQL's DATE_PART it reads as EXTRACT already).
_DATE_PART_NAMES = frozenset({"DATE_PART", "DATEPART"})


def _is_date_part(node: exp.Expression) -> bool:
    return (
        isinstance(node, exp.Anonymous)
        and node.name.upper() in _DATE_PART_NAMES
        and len(node.expressions) == 2
        and isinstance(node.expressions[0], exp.Literal)
        and node.expressions[0].is_string
    )


def date_parts(select: exp.Select) -> exp.Select:
    """`DATE_PART('year', x)` as `EXTRACT(year FROM x)`, when the unit is a quoted constant.

    The unit then goes through EXTRACT's list of units every backend knows; any
    other form (a list of units, a unit from a column) stays an unknown function,
    which the checker refuses.
    """

    def rewrite(node: exp.Expression) -> exp.Expression:
        if not _is_date_part(node):
            return node
        unit, value = node.expressions
        return exp.Extract(this=exp.var(unit.name.upper()), expression=value)

    return select.transform(rewrite)


# Date parts whose argument sqlglot's Spark reader wraps in TS_OR_DS_TO_DATE.
_DATE_PART_FUNCTIONS = (exp.Year, exp.Month, exp.Day, exp.DayOfWeek, exp.DayOfYear)


def _is_implicit_date(node: exp.Expression) -> bool:
    return (
        isinstance(node, exp.TsOrDsToDate)
        and isinstance(node.parent, _DATE_PART_FUNCTIONS)
        and set(node.args) - {"this"} == set()  # not TO_DATE(x[, format]): that is "safe"
    )


def implicit_dates(select: exp.Select) -> exp.Select:
    """Spark's `YEAR(d)`, `MONTH(d)`, `DAY(d)`, `DAYOFWEEK(d)` and `DAYOFYEAR(d)` as the
    same call on `d` itself.

    sqlglot reads Spark's conversion of the argument to a date as a TS_OR_DS_TO_DATE
    around it, which the checker does not know (and writes it back as the bare call).
    Without it the analysis sees the column: a date or timestamp passes, a string
    (which Spark would convert row by row, failing on some rows only) is refused.
    """

    def rewrite(node: exp.Expression) -> exp.Expression:
        return node.this if _is_implicit_date(node) else node

    return select.transform(rewrite)


def _is_plain_distinct(select: exp.Select) -> bool:
    distinct = select.args.get("distinct")
    return (
        isinstance(distinct, exp.Distinct)  # a set operation's is a flag, not a clause
        and not distinct.args.get("on")
        and not select.args.get("group")
        and select.find(*AGGREGATES) is None
        and not any(isinstance(item, exp.Star) for item in select.expressions)
    )


def distinct_keys(select: exp.Select) -> exp.Select:
    """`SELECT DISTINCT a, b FROM t ...` (no aggregate, no GROUP BY) as `SELECT a, b FROM t
    ... GROUP BY 1, 2`: the same rows. What a GROUP BY without aggregates may release is
    the analysis's to decide (the keys of public domains only)."""
    grouped = select.copy()
    grouped.set("distinct", None)
    positions = [exp.Literal.number(i) for i in range(1, len(grouped.expressions) + 1)]
    return grouped.group_by(*positions, copy=False)


def normalize(select: exp.Select) -> exp.Select:
    """`select` after each pass above that applies to it, found in one walk (most queries
    need none, and then this is the query itself, not a copy)."""
    filters = date_part = implicit = var = False
    for node in select.walk():
        if isinstance(node, exp.Filter):
            filters = True
        elif is_var_spelling(node):
            var = True
        elif isinstance(node, exp.Anonymous) and _is_date_part(node):
            date_part = True
        elif _is_implicit_date(node):
            implicit = True
    if var:  # first: a FILTER on VAR(x) is then one on VARIANCE(x)
        select = var_spellings(select)
    if filters:
        select = aggregate_filters(select)
    if date_part:
        select = date_parts(select)
    if implicit:
        select = implicit_dates(select)
    if _is_plain_distinct(select):
        select = distinct_keys(select)
    return select
