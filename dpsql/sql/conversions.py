"""Conversions a database makes value by value: refuse comparisons and choices of
kinds it converts into each other, other values read as truth values, text from
the data beside anything but text, casts that can fail for some values, and
function arguments of the wrong kind. A conversion that fails for one row would
reveal that row without noise (a type error only wastes the charge).
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.policy import Table
from dpsql.sql.casts import constant_cast_converts
from dpsql.sql.guards import partial_refusal, why_partial
from dpsql.sql.intervals import MAX_ROW_MAGNITUDE, interval_with
from dpsql.sql.kinds import (
    CHOICES,
    COMPARISONS,
    TEMPORAL_TYPES,
    cast_kind,
    compared_operands,
    is_string_literal,
    is_text,
    readable,
    value_kind,
    values_of,
)

# Numeric casts that cannot fail or overflow on a value within MAX_ROW_MAGNITUDE
# (narrower integer and fixed-point types could, further down the expression, and
# PostgreSQL's REAL underflows as near zero as 1e-45, in its casts and its arithmetic).
_SAFE_NUMERIC_CASTS = (exp.DataType.Type.BIGINT, exp.DataType.Type.DOUBLE)


def truth_operands(node: exp.Connector | exp.Not | exp.If) -> list[exp.Expression]:
    """The operands read as truth values: of AND/OR/NOT, and a CASE WHEN's or IF's test."""
    if isinstance(node, exp.Connector):
        return [node.this, node.expression]
    return [node.this]


def require_truth(node: exp.Expression, table: Table, clause: str) -> None:
    """Refuse anything but a truth value where one is read (WHERE, AND/OR/NOT, CASE WHEN).

    DuckDB converts a date or text row by row and fails on some rows (`WHERE age > 95
    AND day` failed exactly when someone was over 95); a number converts, but
    PostgreSQL and Spark refuse it, after the charge. 'true' and 'false' read as
    truth values everywhere; text from the data has its own refusal (text_allowed_in).
    """
    kind = value_kind(node, table)
    if kind in (None, "bool") or is_text(node, table):
        return
    if is_string_literal(node) and readable(node.this, "bool"):
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


def require_argument_kind(node: exp.Expression, table: Table, clause: str) -> None:
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


_TEXT_CONSUMERS = (exp.Lower, exp.Upper, exp.Trim, exp.Length, exp.Concat, exp.DPipe,
                   exp.Substring, exp.Like, exp.ILike, exp.StartsWith)  # fmt: skip


def text_allowed_in(node: exp.Expression, table: Table) -> bool:
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
    if isinstance(parent, CHOICES) and any(node is v for v in values_of(parent)):
        return all(_text_like(v, table) for v in values_of(parent))
    if isinstance(parent, COMPARISONS) or (
        isinstance(parent, exp.Is) and isinstance(parent.expression, exp.Null)
    ):
        return all(_text_like(o, table) for o in compared_operands(parent))
    return False


# Kinds of value the database compares without converting one to the other row by row
# (a DATE beside a TIMESTAMP widens to TIMESTAMP, which cannot fail).
_COMPARABLE = {"number": "number", "bool": "bool", "interval": "interval",
               "date": "day and time", "timestamp": "day and time", "time": "time"}  # fmt: skip


def require_comparable(
    node: exp.Expression, operands: list[exp.Expression], table: Table, clause: str
) -> None:
    """Refuse a comparison, or a choice (CASE, COALESCE, GREATEST, ...), whose operands
    are of kinds the database converts into each other value by value: `age = day` or
    `age = 'x'` fails only once a row reaches it, so the error would reveal without
    noise that some row did. A quoted constant must read as every other kind present
    (see _READABLE); text from the data is checked by require_total."""
    quoted = [o for o in operands if is_string_literal(o)]
    kinds = {value_kind(o, table) for o in operands if o not in quoted} - {None, "string"}
    if len({_COMPARABLE[kind] for kind in kinds}) > 1:
        raise _incomparable(node, clause, f"it compares {' with '.join(sorted(kinds))} values")
    unreadable = [o for o in quoted for kind in kinds if not readable(o.this, kind)]
    constant_text = [
        o
        for o in operands
        if kinds and is_text(o, table) and not any(True for _ in o.find_all(exp.Column))
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


def _text_like(node: exp.Expression, table: Table) -> bool:
    return isinstance(node, exp.Null) or is_string_literal(node) or is_text(node, table)


# Casts between dates and times: to these only. TIMESTAMP_NS holds the years 1677-2262
# (DuckDB failed the rest), and a precision rounds (PostgreSQL's TIME(0) made 23:59:59.5
# the 24:00:00 no driver reads, TIMESTAMP(0) the year 9999's last second the year 10000).
_TEMPORAL_CAST_TARGETS = (
    exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPNTZ,
    exp.DataType.Type.DATETIME, exp.DataType.Type.TIMESTAMPTZ, exp.DataType.Type.TIME,
)  # fmt: skip


def _plain_temporal(target: exp.DataType) -> bool:
    return target.is_type(*_TEMPORAL_CAST_TARGETS) and not target.expressions


def require_safe_cast(node: exp.Cast | exp.TryCast, table: Table, clause: str) -> None:
    target = node.to
    if target.is_type(*exp.DataType.TEXT_TYPES) or isinstance(node.this, exp.Null):
        return
    if constant_cast_converts(node):  # the same value for every row: converted in casts.py
        return
    if is_string_literal(node.this):  # DATE '2020-01-01', CAST('NaN' AS DOUBLE)
        kind = "float" if target.is_type("double", "float") else cast_kind(target)
        if readable(node.this.this, kind):
            return
        raise _incomparable(
            node, clause, f"it reads the text {node.this.sql()[:40]} as {target.sql()}"
        )
    if target.is_type(*_SAFE_NUMERIC_CASTS):
        interval = interval_with(node.this, table, {})
        if interval is not None and interval.magnitude <= MAX_ROW_MAGNITUDE:
            return
        raise partial_refusal(node, clause, why_partial(interval))
    inner = node.this
    column = table.column(inner.name) if isinstance(inner, exp.Column) else None
    if column is not None and column.type == "date" and target.is_type(exp.DataType.Type.TIME):
        raise partial_refusal(  # it failed for every row, after the charge
            node,
            clause,
            "a date has no time of day, so the database fails the cast",
            f"cast {inner.sql()} to TIMESTAMP, or read the time of day of a timestamp column",
        )
    if column is not None and column.type in TEMPORAL_TYPES and _plain_temporal(target):
        return
    raise partial_refusal(
        node,
        clause,
        f"a cast to {target.sql()} can fail or overflow for some values (only casts to text, "
        "to BIGINT or DOUBLE from a bounded number, and between dates and times (DATE, "
        "TIMESTAMP, TIMESTAMPTZ, TIME, without a precision) are safe)",
        "cast to DATE, TIMESTAMP, TIMESTAMPTZ or TIME without a precision; truncate with "
        "DATE_TRUNC('second', ...)",
    )
