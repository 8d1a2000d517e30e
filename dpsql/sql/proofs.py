"""Value ranges the database proves: a policy column's values read from the CHECK
constraints it enforces and from the statistics it keeps, where they hold for every row
a query reads (the adapters say which: ValueFacts). The rewrite leaves out the clamps
they make redundant (clamps.needed_sides); nothing here changes a bound or a
sensitivity, which come from the policy alone.

A constraint proves only what can be read from it for sure: the conditions of its
top-level AND of the forms `col >= c`, `col <= c`, `col > c`, `col < c`, `col = c`,
`col BETWEEN a AND b` and `col IN (...)`, with number constants (or casts of them that
change no value); anything else, an OR say, proves nothing. Each end is a float on the
safe side of the constant. NULL passes a CHECK, and a clamp keeps NULL anyway. NaN
fails `col <= c` (it compares above every number), so a finite upper end excludes it;
a NaN statistic proves nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from decimal import Context, Decimal, InvalidOperation, localcontext
from fractions import Fraction
from typing import Any

import sqlglot
from sqlglot import exp

from dpsql.policy import Proven, Table
from dpsql.sql.analysis import Analysis
from dpsql.sql.clamps import needed_sides
from dpsql.sql.intervals import column_interval
from dpsql.sql.numbers import exact_value, float_above, float_below
from dpsql.sql.parse import sqlglot_dialect
from dpsql.sql.ranges import conjuncts, range_of
from dpsql.sql.rewrite import columns_read

_INTEGERS = (exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT,
             exp.DataType.Type.BIGINT)  # fmt: skip
_DIGITS = 1100
STATISTICS = (
    "DuckDB's column statistics of a file dpsql opened read-only, which show only that "
    "the values lie within the declared bounds"
)


def proven_ranges(
    checks: Iterable[tuple[str, str]],
    statistics: Mapping[str, tuple[Any, Any]],
    table: Table,
    dialect: str,
) -> tuple[Proven, ...]:
    """What `checks` ((name, condition SQL) of enforced CHECK constraints) and trusted
    `statistics` (lower-case column to (min, max)) prove of `table`'s clamped columns:
    its bounded numeric columns other than the privacy unit. Both hold for every row, so
    each side is the tightest any of them proves. A constraint is the schema's, whatever
    the rows; statistics are the data's: they prove at most the declared bounds, so that
    what a proof shows of them is one bit per side (all values within it, or not)."""
    found: dict[str, list[tuple[float, float, str]]] = {}
    for name, condition in checks:
        for column, low, high in _check_ranges(condition, dialect):
            found.setdefault(column, []).append((low, high, f"CHECK constraint {name}"))
    for name, (low, high) in statistics.items():
        column = table.column(name)
        interval = column_interval(column) if column is not None else None
        if interval is not None:
            # Only whether each side lies within the declared bounds: the statistics are
            # the data's, and EXPLAIN shows the proofs (a maximum is one person's value).
            lower = interval.lower if _end(low, False) >= interval.lower else -math.inf
            upper = interval.upper if _end(high, True) <= interval.upper else math.inf
            found.setdefault(name, []).append((lower, upper, STATISTICS))
    proofs = []
    for name, ranges in sorted(found.items()):
        column = table.column(name)
        if column is None or name == table.privacy_unit or column_interval(column) is None:
            continue
        lower, upper = max(r[0] for r in ranges), min(r[1] for r in ranges)
        if lower == -math.inf and upper == math.inf:
            continue
        by = sorted({r[2] for r in ranges if r[0] == lower > -math.inf or r[1] == upper < math.inf})
        proofs.append(Proven(name, lower, upper, ", ".join(by)))
    return tuple(proofs)


def _check_ranges(condition: str, dialect: str) -> list[tuple[str, float, float]]:
    """(lower-case column, lower, upper) of each condition of a CHECK's top-level AND
    that bounds a column by constants; [] where the condition does not parse."""
    try:
        tree = sqlglot.parse_one(condition, read=sqlglot_dialect(dialect))
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError):
        return []
    if tree is None:
        return []
    if dialect == "postgres" and any(c.name != c.name.lower() for c in tree.find_all(exp.Column)):
        # a quoted mixed-case name is another column than the folded one a policy reads
        return []
    tree = tree.transform(_exact_constant)
    ranges = []
    for part in conjuncts(tree):
        found = range_of(part)
        if found is not None:
            column, low, high = found
            ranges.append((column.lower(), low, high))
    return ranges


def _exact_constant(node: exp.Expression) -> exp.Expression:
    """A cast of a number constant that keeps its value exactly, as the constant it
    compares as: PostgreSQL writes `f >= (0)::double precision`, `n >= '-1.5'::numeric`.
    A cast to DOUBLE compares as the double nearest the constant; other casts (REAL,
    NUMERIC(p, s), an integer type of a fraction) are left, and prove nothing."""
    if not isinstance(node, exp.Cast):
        return node
    inner = node.this
    while isinstance(inner, exp.Paren):
        inner = inner.this
    value = _text_number(inner) if isinstance(inner, exp.Literal) and inner.is_string else None
    if value is None:
        value = exact_value(inner)
    if value is None:
        return node
    to = node.to
    if to.is_type(exp.DataType.Type.DOUBLE):
        value = Fraction(float(value))
    elif to.is_type(exp.DataType.Type.DECIMAL) and not to.expressions:
        pass
    elif not (to.is_type(*_INTEGERS) and value.denominator == 1):
        return node
    with localcontext(Context(prec=_DIGITS)):  # exact: a double has at most 767 digits
        written = Decimal(abs(value.numerator)) / Decimal(value.denominator)
    if Fraction(written) != abs(value):
        return node
    literal = exp.Literal.number(str(written))
    return exp.Neg(this=literal) if value < 0 else literal


def _text_number(literal: exp.Literal) -> Fraction | None:
    try:
        value = Decimal(literal.this)
    except InvalidOperation:
        return None
    return Fraction(value) if value.is_finite() else None


def _end(value: Any, upper: bool) -> float:
    """A statistic as a float on its safe side; infinite (nothing proven) where it is
    unknown (NULL), NaN or not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        return math.inf if upper else -math.inf
    if isinstance(value, float | Decimal) and not math.isfinite(value):
        return math.inf if upper else -math.inf
    exact = Fraction(value)
    return float_above(exact) if upper else float_below(exact)


def explanations(analysis: Analysis) -> list[str]:
    """For EXPLAIN: each proof of a column whose clamps the rewrite emits, and which
    sides of them it leaves out: the clamp to the column's declared bounds as the table
    is read (a column the query computes with), and a SUM's clamp of the bare column."""
    table = analysis.table
    _, computed, _ = columns_read(analysis)
    lines = []
    for proof in table.proven:
        clamps = []
        if proof.column in computed:
            interval = column_interval(table.column(proof.column))
            clamps.append((f"its clamp to [{interval.lower:g}, {interval.upper:g}] as the "
                           "table is read", interval))  # fmt: skip
        for m in analysis.measurements:
            bare = isinstance(m.clamped, exp.Column) and m.clamped.name.lower()
            if m.kind == "sum" and bare == proof.column:
                bounds = m.bounds
                clamps.append((f"the clamp of {m.key} to [{bounds.lower:g}, "
                               f"{bounds.upper:g}]", bounds))  # fmt: skip
        if not clamps:
            continue
        sides = {(False, False): "left out", (False, True): "lower side left out",
                 (True, False): "upper side left out", (True, True): "kept"}  # fmt: skip
        said = "; ".join(
            f"{what}: {sides[needed_sides(table, proof.column, interval)]}"
            for what, interval in clamps
        )
        lines.append(
            f"{proof.column}: the database proves every value within [{proof.lower:g}, "
            f"{proof.upper:g}] ({proof.by}); {said}. A side left out would change no value; "
            "the sensitivity still comes from the policy's bounds"
        )
    return lines
