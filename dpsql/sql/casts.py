"""Casts of constants, decided while planning: whether the database can convert the value.

A cast of a column can fail for some row, and a failure would be an answer
without noise, so analyze.py admits few of them. A cast of a constant (a
literal, a bound parameter: SQLAlchemy's `$1::INTEGER`) is the same value for
every row: here it is converted in Python, as PostgreSQL and DuckDB would,
and accepted only when the conversion surely succeeds in both. The decision
reads the statement alone, never the data, so a refusal says nothing of it.
Where the engines differ (an integer written as text with a fraction, a
DECIMAL without precision), the stricter reading wins.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re

from sqlglot import exp

_Type = exp.DataType.Type
# The integer types' ranges (PostgreSQL's int2, int4, int8; DuckDB's the same).
_INTEGER_RANGES = {
    _Type.TINYINT: (-(2**7), 2**7 - 1),  # DuckDB's TINYINT; PostgreSQL has none
    _Type.SMALLINT: (-(2**15), 2**15 - 1),
    _Type.INT: (-(2**31), 2**31 - 1),
    _Type.BIGINT: (-(2**63), 2**63 - 1),
}
# Finite magnitudes every engine converts without an overflow or underflow error.
_FLOAT_RANGES = {_Type.FLOAT: (1e-37, 1e38), _Type.DOUBLE: (1e-300, 1e300)}
# A DECIMAL without a precision, as the strictest engine reads it: Spark's DECIMAL(10, 0),
# which fails (in ANSI mode) on more whole digits. PostgreSQL's NUMERIC has no limit, and
# DuckDB's tree already says DECIMAL(18, 3).
_DEFAULT_DECIMAL = (10, 0)
_INTEGER_TEXT = re.compile(r"\s*[+-]?\d{1,30}\s*")
_NUMBER_TEXT = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d{1,3})?\s*")
_DATE_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIMESTAMP_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,6})?")


def constant_cast_converts(cast: exp.Cast | exp.TryCast) -> bool:
    """Whether `cast` converts a constant that the database surely converts to its target
    type (an integer, floating-point, DECIMAL, DATE or TIMESTAMP type). False for a cast of
    anything that is not a constant, or to another type: the caller decides those."""
    value = constant(cast.this)
    return value is not None and _converts(value, cast.to)


def constant(node: exp.Expression) -> decimal.Decimal | str | dt.date | None:
    """The value of a constant as written (a number as its exact Decimal, a string, a date
    or timestamp from a cast that converts), or None if `node` is not one."""
    if isinstance(node, exp.Paren):
        return constant(node.this)
    if isinstance(node, exp.Neg):
        inner = constant(node.this)
        return -inner if isinstance(inner, decimal.Decimal) else None
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        try:
            number = decimal.Decimal(node.this)
        except decimal.InvalidOperation:
            return None
        return number if number.is_finite() else None
    if isinstance(node, exp.Cast | exp.TryCast) and constant_cast_converts(node):
        # a cast that converts (e.g. a date parameter's own): its value, as the outer sees it
        return _converted(constant(node.this), node.to)
    return None


def _converts(value: decimal.Decimal | str | dt.date, target: exp.DataType) -> bool:
    return _converted(value, target) is not None


def _converted(
    value: decimal.Decimal | str | dt.date | None, target: exp.DataType
) -> decimal.Decimal | dt.date | None:
    """`value` as `target` holds it, or None when the conversion could fail."""
    if isinstance(value, str):
        value = _read_text(value, target)
    if value is None:
        return None
    kind = target.this
    if isinstance(value, dt.date):
        if kind == _Type.DATE:
            return value.date() if isinstance(value, dt.datetime) else value
        if kind in (_Type.TIMESTAMP, _Type.DATETIME, _Type.TIMESTAMPNTZ) and not target.expressions:
            return value if isinstance(value, dt.datetime) else dt.datetime(*value.timetuple()[:3])
        return None
    if kind in _INTEGER_RANGES:
        lower, upper = _INTEGER_RANGES[kind]
        whole = value.to_integral_value(decimal.ROUND_HALF_UP)  # PostgreSQL and DuckDB round
        return whole if lower <= whole <= upper else None
    if kind in _FLOAT_RANGES:
        smallest, largest = _FLOAT_RANGES[kind]
        return value if value == 0 or smallest <= abs(value) <= largest else None
    if kind == _Type.DECIMAL:
        return _as_decimal(value, target)
    return None


def _read_text(text: str, target: exp.DataType) -> decimal.Decimal | dt.date | None:
    """A string's value as the target type reads it, if every engine reads it so."""
    kind = target.this
    if kind in _INTEGER_RANGES:
        # PostgreSQL reads '40' as an integer but not '40.5', '4e1' or ' 4 0'
        return decimal.Decimal(text) if _INTEGER_TEXT.fullmatch(text) else None
    if kind in _FLOAT_RANGES or kind == _Type.DECIMAL:
        return decimal.Decimal(text) if _NUMBER_TEXT.fullmatch(text) else None
    try:
        if kind == _Type.DATE and _DATE_TEXT.fullmatch(text):
            return dt.date.fromisoformat(text)
        timestamp = kind in (_Type.TIMESTAMP, _Type.DATETIME, _Type.TIMESTAMPNTZ)
        if timestamp and (_DATE_TEXT.fullmatch(text) or _TIMESTAMP_TEXT.fullmatch(text)):
            return dt.datetime.fromisoformat(text)
    except ValueError:  # '2020-02-30': a date no calendar has
        return None
    return None


def _as_decimal(value: decimal.Decimal, target: exp.DataType) -> decimal.Decimal | None:
    """`value` rounded to the DECIMAL's scale, if its precision holds it."""
    sizes = [param.this.name for param in target.expressions]
    if not sizes:
        precision, scale = _DEFAULT_DECIMAL
    elif not all(size.isdigit() for size in sizes):
        return None
    else:
        precision, scale = int(sizes[0]), int(sizes[1]) if len(sizes) > 1 else 0
    if not 0 <= scale <= precision:
        return None
    try:
        rounded = value.quantize(decimal.Decimal(1).scaleb(-scale), decimal.ROUND_HALF_UP)
    except decimal.InvalidOperation:  # more digits than Python's context holds: far too many
        return None
    _, digits, exponent = rounded.as_tuple()
    return rounded if len(digits) + exponent <= precision - scale else None


__all__ = ["constant", "constant_cast_converts"]
