"""Kinds of value of a row expression (number, string, date, timestamp, time, bool,
interval), as far as comparing and converting go: what a cast yields, which
expressions are text, which operands a comparison or a choice puts side by side,
and which quoted constants read as a kind.
"""

from __future__ import annotations

import datetime as dt
import re

from sqlglot import exp

from dpsql.policy import ISO_TEXT, Table

TEMPORAL_TYPES = ("date", "timestamp")


def is_temporal(node: exp.Expression, table: Table, *, dates_only: bool = False) -> bool:
    """A date or timestamp column, or a cast of a constant to one (only dates if asked)."""
    policy_types, cast_types = (
        (("date",), ("date",)) if dates_only else (TEMPORAL_TYPES, exp.DataType.TEMPORAL_TYPES)
    )
    if isinstance(node, exp.Column):
        column = table.column(node.name)
        return column is not None and column.type in policy_types
    return (
        isinstance(node, exp.Cast)
        and node.to.is_type(*cast_types)
        and not any(True for _ in node.find_all(exp.Column))
    )


def is_day_count(node: exp.Expression, table: Table) -> bool:
    """Whether `node` is a date minus a date: a whole number of days. With a timestamp
    on either side it is an INTERVAL, on which arithmetic can overflow row by row."""
    return (
        isinstance(node, exp.Sub)
        and is_temporal(node.this, table, dates_only=True)
        and is_temporal(node.expression, table, dates_only=True)
    )


_TEXT_FUNCTIONS = (exp.Lower, exp.Upper, exp.Trim, exp.Concat, exp.DPipe, exp.Substring)


COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ,
                exp.NullSafeNEQ, exp.In, exp.Between)  # fmt: skip
CHOICES = (exp.Case, exp.If, exp.Coalesce, exp.Nullif, exp.Greatest, exp.Least, exp.Paren)


def is_text(node: exp.Expression, table: Table) -> bool:
    """Whether a row expression is text (a string column, a cast to text, a text function)."""
    if isinstance(node, exp.Column):
        column = table.column(node.name)
        return column is not None and column.type == "string"
    if isinstance(node, exp.Cast | exp.TryCast):
        return node.to.is_type(*exp.DataType.TEXT_TYPES)
    if isinstance(node, _TEXT_FUNCTIONS):
        return True
    if isinstance(node, CHOICES):
        return any(is_text(value, table) for value in values_of(node))
    return False


def values_of(node: exp.Expression) -> list[exp.Expression]:
    """The operands whose value a CASE, IF, COALESCE, ... can return (not its conditions)."""
    if isinstance(node, exp.Case):
        return [i.args["true"] for i in node.args.get("ifs", [])] + [
            v for v in [node.args.get("default")] if v is not None
        ]
    if isinstance(node, exp.If):
        return [v for v in (node.args.get("true"), node.args.get("false")) if v is not None]
    if isinstance(node, exp.Nullif):  # compared with its second operand, as = would
        return [node.this, node.expression]
    return [node.this, *node.expressions]


def dates_only(operands: list[exp.Expression], table: Table) -> bool:
    """Whether values compared with a date are dates too (or text or NULL), none of them
    truncated: DuckDB converts a date compared with a TIMESTAMP to one, which fails for
    dates past its timestamps' year 294247 (its dates reach 5881580)."""
    return all(
        value_kind(operand, table) in (None, "date", "string")
        and operand.find(exp.DateTrunc, exp.TimestampTrunc) is None
        for operand in operands
    )


def compared_operands(comparison: exp.Expression) -> list[exp.Expression]:
    """The values a comparison (=, IN, BETWEEN, IS, ...) compares, as one flat list."""
    operands = [v for k, v in comparison.args.items() if k in ("this", "expression",
                "expressions", "low", "high") and v is not None]  # fmt: skip
    return [o for v in operands for o in (v if isinstance(v, list) else [v])]


# String literals the database reads as a value of each type without failing, whatever
# the column's storage type: DuckDB converts the literal to the column's type only when
# a row reaches the comparison, so `WHERE age > 95 AND age = 'x'` failed exactly when
# someone is over 95. Numbers are never accepted quoted where they meet the data:
# '99999' does not fit a SMALLINT column. Patterns are anchored; a date must also exist.
_READABLE = {
    **ISO_TEXT,
    "bool": re.compile(r"(?i)true|false"),
    # only in CAST('NaN' AS DOUBLE), whose type is the literal's own
    "float": re.compile(r"(?i)[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?|nan|[+-]?infinity"),
}


_PREDICATES = (exp.Predicate, exp.Connector, exp.Not, exp.Escape, exp.StartsWith)


def is_string_literal(node: exp.Expression) -> bool:
    return isinstance(node, exp.Literal) and node.is_string


def value_kind(node: exp.Expression, table: Table) -> str | None:
    """The kind of value an expression has (number, string, date, timestamp, bool,
    interval), as far as comparing it goes; None for NULL, which compares with any."""
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Literal):
        return "string" if node.is_string else "number"
    if isinstance(node, (exp.Boolean, *_PREDICATES)):
        return "bool"
    if isinstance(node, exp.Interval):
        return "interval"
    if is_text(node, table):
        return "string"
    if isinstance(node, exp.Paren):
        return value_kind(node.this, table)
    if isinstance(node, CHOICES):  # the kind of its values: require_comparable checks them
        kinds = [value_kind(v, table) for v in values_of(node)]
        typed = [k for k in kinds if k not in (None, "string")]
        return typed[0] if typed else ("string" if "string" in kinds else None)
    if isinstance(node, exp.Column):
        column = table.column(node.name)
        if column is not None and column.type in (*TEMPORAL_TYPES, "bool"):
            return column.type
    if isinstance(node, exp.Cast | exp.TryCast):
        return cast_kind(node.to)
    if isinstance(node, exp.DateTrunc | exp.TimestampTrunc):  # of an INTERVAL: an interval
        if value_kind(node.this, table) == "interval":
            return "interval"
        return "date"  # DATE or TIMESTAMP, by backend: only a plain date reads as both
    if isinstance(node, exp.CurrentDate):
        return "date"
    if isinstance(node, exp.CurrentTimestamp):
        return "timestamp"
    if isinstance(node, exp.Add | exp.Sub):
        return _arithmetic_kind(node, table)
    return "number"


def cast_kind(target: exp.DataType) -> str:
    if target.is_type("date"):
        return "date"
    if target.is_type("time", "timetz"):
        return "time"
    if target.is_type(*exp.DataType.TEMPORAL_TYPES):
        return "timestamp"
    if target.is_type("boolean"):
        return "bool"
    if target.is_type("interval"):
        return "interval"
    return "number"


def _arithmetic_kind(node: exp.Add | exp.Sub, table: Table) -> str:
    """date + 1 is a date, date - date a number of days, timestamp - timestamp an interval."""
    if is_day_count(node, table):
        return "number"
    kinds = [value_kind(node.this, table), value_kind(node.expression, table)]
    temporal = [k for k in kinds if k in TEMPORAL_TYPES]
    if len(temporal) == 2:
        return "interval"
    if temporal:
        return temporal[0]
    return "interval" if "interval" in kinds else "number"


def readable(text: str, kind: str) -> bool:
    pattern = _READABLE.get(kind)
    if pattern is None or not pattern.fullmatch(text):
        return False
    if kind == "float" and text.lower().lstrip("+-") not in ("nan", "infinity"):
        # PostgreSQL refuses '1e999' and '1e-400' as DOUBLE: out of range either way
        mantissa = text.lower().partition("e")[0]
        zero = not any(digit in mantissa for digit in "123456789")
        return zero or 1e-300 <= abs(float(text)) <= 1e300
    if kind in TEMPORAL_TYPES:
        try:
            dt.datetime.fromisoformat(text)
        except ValueError:
            return False
    return True
