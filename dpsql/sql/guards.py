"""The overflow and near-zero guards: refuse a computation on row values, or a
constant, that could overflow (past MAX_ROW_MAGNITUDE, or 32-bit integers),
underflow to zero (nearer it than MIN_NONZERO) or grow text past a database's
limit, for some row; and the refusal message every totality check shares
(partial_refusal).
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.policy import NEAR_ZERO, Table
from dpsql.sql.intervals import MAX_ROW_MAGNITUDE, MIN_NONZERO, Interval, interval_with
from dpsql.sql.kinds import COMPARISONS, is_text
from dpsql.sql.numbers import last_place, literal_of, number_value

_INT32 = (-(2**31), 2**31 - 1)
_BINARY_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod)
_ONE_VALUE = (exp.Paren, exp.Neg, exp.Abs, exp.Sign, exp.Floor, exp.Ceil, exp.Round, exp.Nullif)
_MAX_FRACTION_DIGITS = 18
_MAX_DIGITS = 38


def require_bounded(node: exp.Expression, table: Table, clause: str) -> None:
    """Refuse a computation (COMPUTATIONS) whose values could pass MAX_ROW_MAGNITUDE,
    whose product or quotient could underflow to zero, or whose integers, all
    constants, could overflow 32 bits."""
    interval = interval_with(node, table, {})
    if interval is None or not interval.magnitude <= MAX_ROW_MAGNITUDE:
        raise partial_refusal(node, clause, why_partial(interval))
    if isinstance(node, exp.Mul | exp.Div) and interval.least_nonzero < MIN_NONZERO:
        raise partial_refusal(
            node,
            clause,
            "its values other than zero can be as small as "
            f"{interval.least_nonzero:.3g}, and PostgreSQL fails a product or "
            "quotient that underflows to zero (a float column's values count "
            f"from {NEAR_ZERO:g}, a constant's from the place of its last digit)",
            f"keep products and quotients above {MIN_NONZERO:g}: scale by "
            "fewer or larger factors (income / 1000, not income * 1e-200 / 1e200)",
        )
    if not _INT32[0] <= interval.lower <= interval.upper <= _INT32[1] and _int32(node):
        raise partial_refusal(
            node,
            clause,
            "its integers are all constants, which DuckDB, PostgreSQL and Spark "
            "compute in 32 bits: past 2147483647 they overflow, and in a CASE "
            "branch only once a row reaches it",
            "write one of its constants with a decimal point (2147483647.0) or "
            "as CAST(2147483647 AS BIGINT)",
        )


def _int32(node: exp.Expression) -> bool:
    """Whether the databases compute `node` in 32-bit integers: every value it can take
    comes from integer constants within 32 bits (a column is read as BIGINT or DOUBLE
    by the rewrite, and a larger constant is a BIGINT), e.g. `CASE WHEN state = 'ZZ'
    THEN 2147483647 ELSE 0 END + 1`, which Spark failed only when that row was there."""
    if isinstance(node, exp.Literal):
        return not node.is_string and node.this.isdigit() and int(node.this) <= _INT32[1]
    if isinstance(node, exp.Null):
        return True  # takes the type of the values beside it
    if isinstance(node, _ONE_VALUE):
        return _int32(node.this)
    if isinstance(node, _BINARY_ARITHMETIC):
        return _int32(node.this) and _int32(node.expression)
    if isinstance(node, exp.Case):
        values = [branch.args["true"] for branch in node.args.get("ifs") or []]
        return all(_int32(value) for value in [*values, node.args.get("default") or exp.Null()])
    if isinstance(node, exp.If):
        return _int32(node.args["true"]) and _int32(node.args.get("false") or exp.Null())
    if isinstance(node, exp.Coalesce | exp.Greatest | exp.Least):
        return all(_int32(value) for value in [node.this, *node.expressions])
    return False


def require_short_fraction(node: exp.Expression, clause: str) -> None:
    """Refuse a decimal constant with more than 18 digits after its point: DuckDB reads
    it as a DECIMAL of 38 digits with that many after the point, into which a value
    beside it with too many before it fails to convert, once a row reaches it
    (`age = 0.0000000000000000000000000000000000001` failed for every age of 10 or more).
    And one of more than 38 digits without an exponent, which Spark cannot read as any
    DECIMAL (an error after the charge)."""
    text = literal_of(node).this.lower()
    fraction = text.partition(".")[2]
    digits = sum(character.isdigit() for character in text.lstrip("0."))
    if "e" not in text and digits > _MAX_DIGITS:
        raise partial_refusal(
            node,
            clause,
            f"it has {digits} digits, more than the {_MAX_DIGITS} of the widest DECIMAL, "
            "which Spark fails to read",
            "write it with fewer digits, or with an exponent (1.2345e40)",
        )
    if "e" not in text and len(fraction) > _MAX_FRACTION_DIGITS:
        raise partial_refusal(
            node,
            clause,
            f"it has {len(fraction)} digits after its decimal point, which DuckDB reads as a "
            "DECIMAL too narrow for the values beside it",
            f"write at most {_MAX_FRACTION_DIGITS} digits after the point, or use an "
            "exponent (1e-37)",
        )


def compared_as_written(node: exp.Expression) -> bool:
    """Whether a constant (perhaps negated or in parentheses) is an operand of a
    comparison: the database converts it once for the comparison, not per row."""
    holder = node.parent
    while isinstance(holder, exp.Neg | exp.Paren):
        holder = holder.parent
    return isinstance(holder, COMPARISONS)


def require_clear_of_zero(node: exp.Expression, clause: str) -> None:
    """Refuse a constant whose last digit lies below MIN_NONZERO: PostgreSQL reads it as
    numeric, exactly, and fails to convert it (or what it adds up to) to a double. One
    compared as it is (`income < 1e-320`) is converted once, not per row, and fails
    only where no double is that near zero (refused too, to save the charge); so is one
    negated or in parentheses (`income < -(1e-320)`)."""
    place = last_place(node)
    compared = compared_as_written(node) and number_value(node) != 0
    if place < MIN_NONZERO and not compared:
        raise partial_refusal(
            node,
            clause,
            f"its last digit lies at {place:.3g}, below the {MIN_NONZERO:g} that double "
            "precision keeps clear of underflow",
            f"write constants whose last digit lies at {MIN_NONZERO:g} or above (1.5e-299, "
            "not 1.5e-301), or 0",
        )


COMPUTATIONS = (
    exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Neg, exp.Abs, exp.Sign,
    exp.Floor, exp.Ceil, exp.Round, exp.Sqrt, exp.Ln, exp.Log, exp.Exp, exp.Pow,
)  # fmt: skip


def why_partial(interval: Interval | None) -> str:
    if interval is None:
        return (
            "dpsql cannot prove it error-free for every row (a column without bounds, a "
            "divisor or logarithm argument that can be zero or negative, EXP of more than "
            "700, % of a value that is not whole, or POWER)"
        )
    return f"its values can reach {interval.magnitude:.3g}, where arithmetic may overflow"


_COMPUTE_HINT = (
    "compute on bounded columns with moderate constants, keep divisors away from zero "
    "(e.g. income / (age + 1)), or compare the column itself (age >= 40)"
)


def partial_refusal(
    node: exp.Expression, clause: str, why: str, hint: str = _COMPUTE_HINT
) -> QueryRefused:
    return QueryRefused(
        f"{node.sql()[:60]} in {clause}",
        f"{why}; a database error for one row would reveal that row without noise",
        hint,
    )


CONCATENATIONS = (exp.Concat, exp.DPipe)
# How many column values one concatenation may join: text grows with each, and a
# database fails past its limit (PostgreSQL 1 GB, DuckDB 4 GB, where the failure also
# invalidated the database) only for rows long enough: nested CONCATs of one text
# column 10,000 times failed for a row of 108 kB (found by an audit).
MAX_CONCATENATED = 8


def require_short_concatenation(node: exp.Expression, table: Table, clause: str) -> None:
    """Counted: text columns (a number cast to text is short, whatever it is)."""
    columns = sum(1 for column in node.find_all(exp.Column) if is_text(column, table))
    if columns > MAX_CONCATENATED:
        raise partial_refusal(
            node,
            clause,
            f"it joins {columns} text column values into one text, which fails in the database "
            "once a row's text is long enough",
            f"join at most {MAX_CONCATENATED} text column values in one concatenation",
        )
