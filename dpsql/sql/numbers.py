"""Number constants as written in a query: their exact values, the floats on either
side of them, and the place of their last digit.

The databases read a constant exactly (PostgreSQL's numeric, DuckDB's DECIMAL)
where Python reads the float nearest it, so every bound derived from a constant
starts from these.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from sqlglot import exp


def number_value(node: exp.Expression) -> float | None:
    if isinstance(node, exp.Neg):
        inner = number_value(node.this)
        return -inner if inner is not None else None
    if isinstance(node, exp.Paren):
        return number_value(node.this)
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            value = float(node.this)
        except ValueError:
            return None
        return value if math.isfinite(value) else None
    return None


def exact_value(node: exp.Expression) -> Fraction | None:
    """The exact value of a finite number written down (a literal, negated or in
    parentheses), or None."""
    if number_value(node) is None:
        return None  # not a number, or not a finite one
    if isinstance(node, exp.Neg):
        return -exact_value(node.this)
    if isinstance(node, exp.Paren):
        return exact_value(node.this)
    return Fraction(Decimal(node.this))


def float_below(value: Fraction) -> float:
    """The largest float at most `value`."""
    nearest = float(value)
    return math.nextafter(nearest, -math.inf) if Fraction(nearest) > value else nearest


def float_above(value: Fraction) -> float:
    """The smallest float at least `value`."""
    nearest = float(value)
    return math.nextafter(nearest, math.inf) if Fraction(nearest) < value else nearest


def last_place(number: exp.Expression) -> float:
    """The place of a number constant's last digit (0.25 -> 0.01, 3e-5 -> 1e-5): no value
    other than zero that sums and products of such constants take is nearer zero than
    their places allow, computed exactly or in doubles. 1 for zero."""
    value = Decimal(literal_of(number).this)
    if value == 0:
        return 1.0
    exponent = value.as_tuple().exponent  # rounded down: 1e-5's double is above 10^-5
    return float_below(Fraction(10) ** exponent)


def literal_of(number: exp.Expression) -> exp.Literal:
    """The literal of a number constant, under its minus signs and parentheses."""
    while isinstance(number, exp.Neg | exp.Paren):
        number = number.this
    return number


def written_whole(number: exp.Expression) -> bool:
    """Whether a number constant is written as a whole number (no point, no exponent):
    SUBSTRING's positions and ROUND's places take no DOUBLE or NUMERIC anywhere, so
    `ROUND(x, 2.0)` and `SUBSTRING(s, 1e0, 2)` failed for every row, after the charge."""
    text = number.sql().lower()
    return "." not in text and "e" not in text
