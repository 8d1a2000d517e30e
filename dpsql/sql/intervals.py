"""Interval arithmetic over row expressions: sound bounds of the values an expression
takes, from the policy's declared bounds (tightened by WHERE ranges when given),
rounded outward as the databases compute, with how near zero a value other than
zero can come. None where no finite bound is derivable.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.policy import NEAR_ZERO, NUMERIC_TYPES, Column, Table
from dpsql.sql.kinds import is_day_count, is_temporal
from dpsql.sql.numbers import (
    exact_value,
    float_above,
    float_below,
    last_place,
    number_value,
    written_whole,
)

# Row-level arithmetic must stay provably this small: far below where int64 or
# float8 arithmetic overflows (an overflow is an error, and an error is a leak).
MAX_ROW_MAGNITUDE = 2.0**53
# ... and every nonzero value provably this far from zero: PostgreSQL fails a product or
# quotient of nonzero doubles that rounds to zero ("value out of range: underflow"), and
# a numeric that does as a double, only for the rows that reach it. Doubles end at
# 4.9e-324; the margin covers what the interval arithmetic below rounds (a numeric
# quotient's last digit, the rounding of a product).
MIN_NONZERO = 1e-300
# A difference of two doubles, if not zero, is at least this times the smaller one's
# least nonzero magnitude (a multiple of the finer of their units in the last place).
_DIFFERENCE_FACTOR = 2.0**-53


# Every date the backends accept (PostgreSQL's reach to 5874897 AD) lies within these,
# in seconds and in days from 1970: epochs and date differences are bounded numbers.
_EPOCH_SECONDS = 2.0**48
_EPOCH_DAYS = 2.0**32


@dataclass(frozen=True)
class Interval:
    """A closed interval of numbers, with whether every value in it is an integer, and
    whether PostgreSQL computes it as an integer type (`int_typed`; by default, when
    every value is an integer): there `/` of two integers truncates, as DuckDB's does
    not, so a quotient of integer types may be nearer zero than real division says.

    `tiny` is how near zero a value other than zero can be (0: unknown), which
    keeps products and quotients clear of PostgreSQL's underflow (MIN_NONZERO)."""

    lower: float
    upper: float
    integer: bool = False
    int_typed: bool | None = None
    tiny: float = 0.0

    @property
    def integer_typed(self) -> bool:
        return self.integer if self.int_typed is None else self.int_typed

    @property
    def least_nonzero(self) -> float:
        """No value in the interval but zero is nearer zero than this."""
        return max(self.tiny, 1.0) if self.integer else self.tiny

    @property
    def zero_only(self) -> bool:
        return self.lower == self.upper == 0

    def hull(self, other: Interval) -> Interval:
        return Interval(
            min(self.lower, other.lower),
            max(self.upper, other.upper),
            self.integer and other.integer,
            self.integer_typed and other.integer_typed,
            min(self.least_nonzero, other.least_nonzero),
        )

    @property
    def magnitude(self) -> float:
        return max(abs(self.lower), abs(self.upper))


def column_interval(column: Column) -> Interval | None:
    """Declared bounds, or the range of a numeric public domain; None if unbounded.

    A float column's values other than 0 are at least NEAR_ZERO from it: the
    rewrite clamps a column to these bounds before computing with it and, on
    PostgreSQL, reads a value nearer zero than that as 0 (rewrite.near_zero)."""
    if column.type not in NUMERIC_TYPES:
        return None
    if column.bounded:
        lower, upper = float(column.lower), float(column.upper)
    elif column.values and all(isinstance(v, int | float) for v in column.values):
        lower, upper = float(min(column.values)), float(max(column.values))
    else:
        return None
    tiny = NEAR_ZERO if lower <= 0 <= upper else min(abs(lower), abs(upper))
    return Interval(lower, upper, column.type == "int", tiny=tiny)


def interval_of(node: exp.Expression, table: Table) -> Interval | None:
    """Sound bounds of a row expression from the policy alone (no WHERE ranges)."""
    return interval_with(node, table, {})


def interval_with(
    node: exp.Expression, table: Table, ranges: dict[str, Interval]
) -> Interval | None:
    """Sound bounds of a row expression by interval arithmetic, or None if underivable."""
    found = _interval_of(node, table, ranges)
    if found is None or not (math.isfinite(found.lower) and math.isfinite(found.upper)):
        return None  # e.g. 1e308 + 1e308: no finite bound, nothing to clamp to
    return found


def _interval_of(
    node: exp.Expression, table: Table, ranges: dict[str, Interval]
) -> Interval | None:
    if isinstance(node, exp.Column):
        column = table.column(node.name)
        if column is None:
            return None
        return ranges.get(column.name.lower()) or column_interval(column)
    value = number_value(node)
    if value is not None:
        # the constant itself, not the float nearest it: the bounds hold its double and
        # its exact value (PostgreSQL's numeric, where it is computed without a column)
        written = [literal.this for literal in node.find_all(exp.Literal)]
        exact = exact_value(node)
        integer = exact.denominator == 1 and "." not in "".join(written)
        return Interval(float_below(exact), float_above(exact), integer, tiny=last_place(node))
    if isinstance(node, exp.Paren | exp.Cast | exp.TryCast):
        inner = interval_with(node.this, table, ranges)
        if inner is not None and isinstance(node, exp.Cast | exp.TryCast):
            if node.to.is_type(exp.DataType.Type.BIGINT):
                return _whole(inner)  # rounded (DuckDB, PostgreSQL) or truncated (Spark)
            return inner if node.to.is_type(*exp.DataType.NUMERIC_TYPES) else None
        return inner
    if isinstance(node, exp.Neg):
        inner = interval_with(node.this, table, ranges)
        return replace(inner, lower=-inner.upper, upper=-inner.lower) if inner else None
    if isinstance(node, exp.TimeToUnix) and is_temporal(node.this, table):
        return Interval(-_EPOCH_SECONDS, _EPOCH_SECONDS, tiny=1e-6)  # whole microseconds
    if is_day_count(node, table):
        return Interval(-_EPOCH_DAYS, _EPOCH_DAYS, True)
    if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div):
        return _arithmetic(node, table, ranges)
    if isinstance(node, exp.Case | exp.If | exp.Coalesce | exp.Greatest | exp.Least):
        return _branches(node, table, ranges)
    if isinstance(node, exp.Abs):
        inner = interval_with(node.this, table, ranges)
        if inner is None:
            return None
        low = 0.0 if inner.lower <= 0 <= inner.upper else min(abs(inner.lower), abs(inner.upper))
        return replace(inner, lower=low, upper=inner.magnitude)
    if isinstance(node, exp.Floor | exp.Ceil | exp.Round | exp.Sign | exp.Mod | exp.IntDiv):
        return _rounding(node, table, ranges)
    if isinstance(node, exp.Sqrt | exp.Ln | exp.Log | exp.Exp):
        return _monotone(node, table, ranges)
    return None


def _rounding(node: exp.Expression, table: Table, ranges: dict[str, Interval]) -> Interval | None:
    """FLOOR/CEIL/ROUND (to whole numbers or a literal number of decimals), SIGN, %, //."""
    if isinstance(node, exp.Sign):
        return Interval(-1.0, 1.0, True) if interval_with(node.this, table, ranges) else None
    if isinstance(node, exp.Mod | exp.IntDiv):
        left = interval_with(node.this, table, ranges)
        right = interval_with(node.expression, table, ranges)
        if left is None or right is None or right.lower <= 0 <= right.upper:
            return None  # a zero divisor is an error in PostgreSQL
        if isinstance(node, exp.IntDiv):
            pairs = [(a, b) for a in (left.lower, left.upper) for b in (right.lower, right.upper)]
            quotients = _outward(pairs, operator.truediv)
            return _whole(Interval(*quotients)) if quotients is not None else None
        if not (left.integer and right.integer):
            return None  # PostgreSQL has no % of double precision (an error after the charge)
        # |a % b| < |b| and <= |a|, with the sign of a
        size = min(left.magnitude, right.magnitude)
        return Interval(-size if left.lower < 0 else 0.0, size if left.upper > 0 else 0.0, True)
    inner = interval_with(node.this, table, ranges)
    decimals = node.args.get("decimals")
    if inner is None or decimals is None:
        return _whole(inner) if inner is not None else None
    places = number_value(decimals)
    if places is None or not -30 <= places <= 30 or not written_whole(decimals):
        return None  # places are a whole number written as one (no ROUND(x, 2.0) anywhere)
    pad = 10.0 ** -math.floor(places)  # rounding moves a value by less than one unit of it
    return Interval(inner.lower - pad, inner.upper + pad, tiny=pad / 2)  # whole units


def _whole(inner: Interval) -> Interval:
    return Interval(math.floor(inner.lower), math.ceil(inner.upper), True)


def _monotone(node: exp.Expression, table: Table, ranges: dict[str, Interval]) -> Interval | None:
    """SQRT, LN, one-argument LOG (base 10) and EXP on the part of their domain that is
    error-free in every backend; None outside it (PostgreSQL raises there)."""
    if isinstance(node, exp.Log) and node.expression is not None:
        return None
    inner = interval_with(node.this, table, ranges)
    if inner is None:
        return None
    if isinstance(node, exp.Exp):
        # PostgreSQL's exp fails beyond about 709 (overflow) and below -745 (underflow)
        if not (inner.lower >= -700 and inner.upper <= 700):
            return None
        low = math.exp(inner.lower)
        return Interval(*_widened(low, math.exp(inner.upper)), tiny=low / 2)
    if isinstance(node, exp.Sqrt):
        if inner.lower < 0:
            return None
        tiny = math.sqrt(inner.least_nonzero) / 2
        return Interval(*_widened(math.sqrt(inner.lower), math.sqrt(inner.upper)), tiny=tiny)
    if inner.lower <= 0:
        return None
    log = math.log if isinstance(node, exp.Ln) else math.log10
    # log x is 0 only at 1; elsewhere at least about |x - 1| / 2.3 (near 1), and x is a
    # double (the next one to 1 is 2^-53 away) or a numeric no finer than its least_nonzero
    tiny = min(inner.least_nonzero, 2.0**-54) / 10
    return Interval(*_widened(log(inner.lower), log(inner.upper)), tiny=tiny)


def _widened(lower: float, upper: float) -> tuple[float, float]:
    """Bounds computed by a math function, widened by a few units in the last place: the
    databases' EXP, LN and SQRT (PostgreSQL's in numeric, for a numeric argument) may
    round otherwise. Zero stays zero: SQRT(0) and LN(1) are exact everywhere."""
    return lower - abs(lower) * 2.0**-50, upper + abs(upper) * 2.0**-50


def _arithmetic(node: exp.Expression, table: Table, ranges: dict[str, Interval]) -> Interval | None:
    left = interval_with(node.this, table, ranges)
    right = interval_with(node.expression, table, ranges)
    if left is None or right is None:
        return None
    typed = left.integer_typed and right.integer_typed
    if isinstance(node, exp.Add | exp.Sub):
        ends = (
            (right.lower, right.upper) if isinstance(node, exp.Add) else (right.upper, right.lower)
        )
        pairs = list(zip((left.lower, left.upper), ends, strict=True))
        bounds = _outward(pairs, _OPERATIONS[type(node)])
        if bounds is None:
            return None
        integer = left.integer and right.integer
        return Interval(*bounds, integer, typed, _sum_tiny(left, right))
    if isinstance(node, exp.Div):
        if right.lower <= 0 <= right.upper:
            return None
        # halved: for the rounding of the result (and PostgreSQL's integer truncation,
        # which keeps a quotient of 1 or more at least half of it)
        tiny = left.least_nonzero / right.magnitude / 2
    else:
        tiny = left.least_nonzero * right.least_nonzero / 2
    pairs = [(a, b) for a in (left.lower, left.upper) for b in (right.lower, right.upper)]
    bounds = _outward(pairs, _OPERATIONS[type(node)])
    if bounds is None:
        return None
    lower, upper = bounds
    if isinstance(node, exp.Div) and typed:
        # PostgreSQL truncates toward zero: (CASE ... 1 ELSE 2 END) / 2 is 0 there, and a
        # divisor or LN argument proven nonzero by real division failed only for that row
        lower, upper = min(lower, math.trunc(lower)), max(upper, math.trunc(upper))
    return Interval(
        lower, upper, isinstance(node, exp.Mul) and left.integer and right.integer, typed, tiny
    )


_OPERATIONS = {exp.Add: operator.add, exp.Sub: operator.sub, exp.Mul: operator.mul,
               exp.Div: operator.truediv}  # fmt: skip


def _outward(
    pairs: list[tuple[float, float]], operation: Callable[[Any, Any], Any]
) -> tuple[float, float] | None:
    """The least and greatest of `operation` over the pairs, rounded outward to floats
    (None if one is not finite).

    A database computes exactly where it can (integers; PostgreSQL's numeric and
    DuckDB's DECIMAL, before constants with a decimal point went to them as
    doubles) and rounds doubles: both results must lie within the bounds, or a
    divisor proven nonzero by rounded arithmetic (0.1 + 0.2 - 0.3 is 5.6e-17 in
    floats, 0 exactly) is 0 in the database, for the rows that reach it. Whole
    operands whose results are whole and below 2^53 are exact in floats already
    (the common case, kept cheap)."""
    results = [operation(a, b) for a, b in pairs]
    if not all(math.isfinite(r) for r in results):
        return None
    if all(
        float(a).is_integer()
        and float(b).is_integer()
        and float(r).is_integer()
        and abs(r) < MAX_ROW_MAGNITUDE
        and (operation is not operator.truediv or r * b == a)
        for (a, b), r in zip(pairs, results, strict=True)
    ):
        return min(results), max(results)
    exact = [operation(Fraction(a), Fraction(b)) for a, b in pairs]
    return float_below(min(exact)), float_above(max(exact))


def _sum_tiny(left: Interval, right: Interval) -> float:
    """How near zero a sum or difference other than zero can be."""
    if left.zero_only or right.zero_only:
        return right.least_nonzero if left.zero_only else left.least_nonzero
    return _DIFFERENCE_FACTOR * min(left.least_nonzero, right.least_nonzero)


def _branches(node: exp.Expression, table: Table, ranges: dict[str, Interval]) -> Interval | None:
    if isinstance(node, exp.Case):
        branches = [ifs.args["true"] for ifs in node.args.get("ifs", [])]
        branches.append(node.args.get("default"))
    elif isinstance(node, exp.If):
        branches = [node.args.get("true"), node.args.get("false")]
    else:
        branches = [node.this, *node.expressions]
    result = None
    for branch in branches:
        if branch is None or isinstance(branch, exp.Null):
            continue  # NULL is skipped by SUM and AVG
        interval = interval_with(branch, table, ranges)
        if interval is None:
            return None
        result = interval if result is None else result.hull(interval)
    return result
