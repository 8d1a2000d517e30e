"""Dates and timestamps a backend stores that it cannot compute with, or Python cannot hold.

Infinities (PostgreSQL fails a date difference or a cast of EXTRACT's result to
BIGINT on them, DuckDB a cast to TIME) and, on PostgreSQL, years before 1 or
after 9999, which psycopg cannot load as a group key, made a query fail once
such a row was read: a failure that reveals the row, without noise. Where a
query computes with such a column or groups by it, the rewrite's source reads
it through `temporal_or_null` (Spark, which stores years from -290308 to 294247
though it has no infinities, returned them to PySpark, which failed to make
Python dates of them after the charge; DuckDB's dates past its timestamps' year
294247 failed a cast or comparison to a TIMESTAMP). Two
things keep that guard from costing more than it must: the
comparisons of a guarded column with constants are made again on the stored
value (`prefilter`), and a column read bare only that WHERE holds between two
dates Python holds needs no guard (`held_by`).
"""

from __future__ import annotations

import datetime as dt

from sqlglot import exp

from dpsql.policy import Table
from dpsql.sql.kinds import dates_only
from dpsql.sql.ranges import conjuncts

YEARS_PYTHON_HOLDS = {
    "date": ("0001-01-01", "9999-12-31"),
    "timestamp": ("0001-01-01 00:00:00", "9999-12-31 23:59:59.999999"),
}


def temporal_or_null(value: exp.Expression, kind: str) -> exp.Expression:
    """`value` (a date or timestamp), or NULL where it is infinite or outside the years 1
    to 9999. DuckDB too: its dates reach the year 5881580 but its timestamps 294247,
    so a date cast or compared to a TIMESTAMP failed past that, and DATE_TRUNC of a
    TIMESTAMPTZ near either end of its range (found by an audit)."""
    low, high = (exp.cast(exp.Literal.string(end), kind) for end in YEARS_PYTHON_HOLDS[kind])
    keep = exp.Between(this=value.copy(), low=low, high=high)
    return exp.Case(ifs=[exp.If(this=keep, true=value)])


_CONSTANT_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Between, exp.In)


def prefilter(
    where: exp.Expression | None, guarded: dict[str, str], table: Table
) -> list[exp.Expression]:
    """The conjuncts of `where` that compare one `guarded` column (name to its type) as
    stored with constants of its own kind, to be made again on the stored values,
    inside the source.

    A guarded column reads as NULL where it is infinite or out of range, and a
    filter on that reading is not pushed into the scan: every row is read and
    guarded first. The same comparison on the stored value keeps no row the outer
    WHERE would drop: a row passing it on the guarded value is finite and in
    range, so the stored value is that value. A comparison cannot fail, whatever
    the value (the analysis made sure its sides are of one kind), but a date's with a
    timestamp: DuckDB converts the date to a TIMESTAMP, which fails past the year
    294247 (DuckDB's dates reach 5881580), so that one stays outside.
    """
    if not guarded:
        return []
    return [
        condition.copy()
        for condition in conjuncts(where)
        if _compares_bare(condition, guarded, table)
    ]


def _compared(condition: exp.Expression) -> tuple[exp.Column, list, bool, bool] | None:
    """A comparison of a bare column with other operands, read as (the column, the other
    operands, whether it bounds the column from below, from above); None for any other
    condition (or one comparing two columns)."""
    if isinstance(condition, exp.Between | exp.In):
        subject = condition.this
        others = [condition.args.get("low"), condition.args.get("high"), *condition.expressions]
        below = above = True
    elif isinstance(condition, _CONSTANT_COMPARISONS):
        subject, other = condition.this, condition.expression
        below = isinstance(condition, exp.EQ | exp.GT | exp.GTE)
        above = isinstance(condition, exp.EQ | exp.LT | exp.LTE)
        if isinstance(other, exp.Column) and not isinstance(subject, exp.Column):
            subject, other, below, above = other, subject, above, below
        others = [other]
    else:
        return None
    if not isinstance(subject, exp.Column):
        return None
    return subject, [o for o in others if o is not None], below, above


def _compares_bare(condition: exp.Expression, kinds: dict[str, str], table: Table) -> bool:
    """Whether `condition` compares one of the columns `kinds` names, as stored (no
    arithmetic or function on it: `(day - DATE '0001-01-01') * 2 > 0` fails on an
    infinite day), with constants, and a date with dates only (kinds.dates_only)."""
    compared = _compared(condition)
    if compared is None or compared[0].name.lower() not in kinds:
        return False
    column, others = compared[0], compared[1]
    if any(True for other in others for _ in other.find_all(exp.Column)):
        return False
    return kinds[column.name.lower()] != "date" or dates_only(others, table)


def held_by(where: exp.Expression | None, name: str) -> bool:
    """Whether the top-level conjuncts of `where` keep column `name` between two dates or
    timestamps that Python holds, by comparisons with constants (so no infinity, and no
    year psycopg cannot load, passes them).

    The column is read bare only: the only value Python then loads is a group key,
    from a row that passed all of WHERE. A tick of a running count groups by its
    day within its window: the guard's CASE cost DuckDB its hash aggregation on the
    stored column (2.3x the raw incremental query, against 1.4x before the guard).
    """
    below = above = False
    for condition in conjuncts(where):
        low, high = _date_bounds(condition, name)
        below, above = below or low, above or high
    return below and above


def _date_bounds(condition: exp.Expression, name: str) -> tuple[bool, bool]:
    """Whether `condition` bounds column `name` from below and from above by constants
    Python reads as dates or timestamps of the years 2 to 9998 (a margin for zones)."""
    compared = _compared(condition)
    if compared is None or compared[0].name.lower() != name:
        return False, False
    _, others, below, above = compared
    held = bool(others) and all(_held_date(other) for other in others)
    return below and held, above and held


def _held_date(node: exp.Expression | None) -> bool:
    if isinstance(node, exp.Cast):
        node = node.this
    return isinstance(node, exp.Literal) and node.is_string and holds_date(node.this)


def holds_date(text: str) -> bool:
    """Whether `text` reads as a date or timestamp of the years 2 to 9998 (a margin: a
    zone could move a time of the year 1 or 9999 out of what Python holds)."""
    try:
        year = dt.datetime.fromisoformat(text).year
    except ValueError:
        return False
    return 2 <= year <= 9998
