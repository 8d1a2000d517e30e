"""Function arguments a database checks only once a row reaches them: DATE_TRUNC
and EXTRACT units, LIKE patterns and ESCAPE characters, SUBSTRING positions,
optional arguments not every backend takes, and INTERVAL lengths. Each must be a
constant every backend accepts.
"""

from __future__ import annotations

import re

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.policy import Table
from dpsql.sql.guards import partial_refusal
from dpsql.sql.kinds import is_string_literal, value_kind
from dpsql.sql.numbers import number_value, written_whole

# Optional arguments sqlglot reads for allowed functions that a backend checks only
# once a row reaches them (PostgreSQL's LENGTH(text, encoding) and DATE_TRUNC's time
# zone name) or that not every backend has (FLOOR(x, 2), CAST ... FORMAT).
_OPTIONS_REFUSED: dict[type[exp.Expression], tuple[str, ...]] = {
    exp.Length: ("binary", "encoding"),
    exp.DateTrunc: ("zone",),
    exp.TimestampTrunc: ("zone",),
    exp.Cast: ("format", "default", "action"),
    exp.TryCast: ("format", "default", "action"),
    exp.Floor: ("decimals", "to"),
    exp.Ceil: ("decimals", "to"),
    exp.Round: ("truncate",),
    exp.Trim: ("collation",),
}


def require_plain_call(node: exp.Expression, clause: str) -> None:
    if isinstance(node, exp.Greatest | exp.Least) and not node.expressions:
        raise QueryRefused(
            f"{node.sql()[:60]} in {clause}",
            "it has one argument, which Spark refuses (after the charge)",
            "write the value itself, or compare two or more",
        )
    for option in _OPTIONS_REFUSED.get(type(node), ()):
        if node.args.get(option) not in (None, False):
            raise QueryRefused(
                f"{node.sql()[:60]} in {clause}",
                f"its {option} argument is checked by some databases only once a row "
                "reaches it, or not understood by every backend",
                f"call {node.key.upper()} with its plain arguments",
            )


def require_fixed_operands(node: exp.Expression, clause: str) -> None:
    """LIKE patterns, ESCAPE characters and SUBSTRING positions are constants every
    backend accepts: PostgreSQL fails a negative SUBSTRING length, and DuckDB an
    ESCAPE of two characters, only once a row reaches them."""
    operands = [node.args.get(k) for k in ("expression", "start", "length")]
    operands = [o for o in operands if isinstance(o, exp.Expression)]
    if any(True for operand in operands for _ in operand.find_all(exp.Column)):
        raise partial_refusal(
            node, clause, "its pattern or positions come from the data", _FIXED_HINT
        )
    if isinstance(node, exp.Escape):
        escape = node.expression
        if not (is_string_literal(escape) and len(escape.this) == 1):
            raise partial_refusal(node, clause, "its ESCAPE is not one character", _FIXED_HINT)
    if isinstance(node, exp.Like | exp.ILike) and not _escapes_well(node):
        raise partial_refusal(
            node,
            clause,
            "its pattern ends with its escape character, or escapes a character other than "
            "%, _ or itself (PostgreSQL and Spark escape with \\ unless ESCAPE says "
            "otherwise), which the database refuses only once a row reaches it",
            _FIXED_HINT,
        )
    for position in operands if isinstance(node, exp.Substring) else []:
        value = number_value(position)
        lowest = 0 if position is node.args.get("length") else -_MAX_POSITION
        if value is None or not written_whole(position) or not lowest <= value <= _MAX_POSITION:
            why = f"its positions are not whole numbers from {lowest}"
            raise partial_refusal(node, clause, why, _FIXED_HINT)


_MAX_POSITION = 2**31 - 1
# Units DuckDB and PostgreSQL both accept in DATE_TRUNC, and also in EXTRACT/DATE_PART;
# PostgreSQL checks the unit only once a row reaches it.
_TRUNC_UNITS = frozenset(("microsecond", "microseconds", "millisecond", "milliseconds",
    "second", "minute", "hour", "day", "week", "month", "quarter", "year", "decade",
    "century", "millennium"))  # fmt: skip
_PART_UNITS = _TRUNC_UNITS | {"dow", "doy", "isodow", "isoyear", "epoch"}
# PostgreSQL refuses these in EXTRACT from a DATE (FeatureNotSupported), row by row.
_TIME_UNITS = frozenset(("hour", "minute", "second", "millisecond", "milliseconds",
                         "microsecond", "microseconds"))  # fmt: skip


def require_known_unit(node: exp.Expression, table: Table, clause: str) -> None:
    extract = isinstance(node, exp.Extract)
    unit = node.this if extract else node.args.get("unit")
    known = _PART_UNITS if extract else _TRUNC_UNITS
    if extract and value_kind(node.expression, table) == "date":
        known -= _TIME_UNITS
    if not isinstance(unit, exp.Var | exp.Literal) or unit.name.lower() not in known:
        raise QueryRefused(
            f"{node.sql()[:60]} in {clause}",
            "its unit is not one every backend knows, and PostgreSQL checks it only once a "
            "row reaches it: the error would reveal without noise that some row did",
            f"use one of: {', '.join(sorted(known))}",
        )


# Years in one of a unit: an interval of more than _MAX_INTERVAL_YEARS is refused, as
# psycopg cannot load one of over 999,999,999 days (INTERVAL '999999' CENTURY as a group
# key failed after the charge exactly when some row took its CASE branch).
_YEARS_PER_UNIT = {"MILLENNIUM": 1000, "MILLENNIUMS": 1000, "MILLENNIA": 1000, "CENTURY": 100,
                   "CENTURIES": 100, "DECADE": 10, "DECADES": 10}  # fmt: skip
_MAX_INTERVAL_YEARS = 100_000


def is_length(interval: exp.Interval) -> bool:
    """INTERVAL '3' DAY or INTERVAL 3 DAY: a plain number and a unit, of at most
    _MAX_INTERVAL_YEARS."""
    length, unit = interval.this, interval.args.get("unit")
    if not (
        isinstance(length, exp.Literal)
        and unit is not None
        and re.fullmatch(r"\d{1,6}", length.this) is not None
    ):
        return False
    return int(length.this) * _YEARS_PER_UNIT.get(unit.name.upper(), 1) <= _MAX_INTERVAL_YEARS


def _escapes_well(node: exp.Like | exp.ILike) -> bool:
    """Whether a LIKE pattern is a text constant whose escape character (its ESCAPE's, or
    the backslash PostgreSQL and Spark default to; DuckDB has none, but the same rule
    holds there) only ever escapes %, _ or itself."""
    pattern = node.expression
    if not is_string_literal(pattern):
        return False
    escape = node.parent.expression.this if isinstance(node.parent, exp.Escape) else "\\"
    characters = iter(pattern.this)
    for character in characters:
        if character == escape and next(characters, None) not in ("%", "_", escape):
            return False
    return True


_FIXED_HINT = (
    "write the pattern as a constant with a one-character ESCAPE ('C!%' ESCAPE '!'), "
    "and SUBSTRING positions as whole numbers, its length 0 or more"
)
