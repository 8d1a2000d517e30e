"""Clamp expressions: the SQL that holds a value to an interval, a summed argument
with each column in a value position clamped to its bounds, and which sides of a
column's clamp the database's proofs make redundant.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.policy import Table
from dpsql.sql.intervals import Interval, column_interval


def clamp(
    value: exp.Expression,
    interval: Interval,
    *,
    lower: bool = True,
    upper: bool = True,
    zero_below: float | None = None,
) -> exp.Expression:
    """CASE that clamps `value` to `interval` and keeps NULL (GREATEST/LEAST differ on NULL).

    `lower=False` or `upper=False` leaves out that side, for a value already known
    to lie on its right side of it (NaN compares above every number, so only the
    upper side's test catches it). `zero_below` also reads a value nearer zero
    than that as 0 (see rewrite.near_zero).
    """

    def bound(value: float) -> exp.Expression:
        # Integer bounds as integer literals: a literal like 0.0 is a DECIMAL in
        # DuckDB, and a CASE mixing it with an integer column is computed in
        # DECIMAL, many times slower than in BIGINT.
        integral = interval.integer and float(value).is_integer()
        return exp.convert(int(value) if integral else value)

    def low() -> exp.Expression:
        return bound(interval.lower)

    def high() -> exp.Expression:
        return bound(interval.upper)

    ifs = [
        *([exp.If(this=exp.LT(this=value.copy(), expression=low()), true=low())] if lower else []),
        *(
            [exp.If(this=exp.GT(this=value.copy(), expression=high()), true=high())]
            if upper
            else []
        ),
    ]
    if zero_below is not None:
        near = exp.Between(
            this=value.copy(), low=exp.convert(-zero_below), high=exp.convert(zero_below)
        )
        ifs.append(exp.If(this=near, true=exp.convert(0)))
    return exp.Case(ifs=ifs, default=value.copy()) if ifs else value.copy()


def needed_sides(table: Table, name: str, interval: Interval) -> tuple[bool, bool]:
    """Whether a clamp of column `name` to `interval` needs its (lower, upper) side: not
    where the database proves every value of the column lies on that side of it
    (Table.proven), since there the clamp changes no value. NULL stays NULL either way,
    and a NaN fails only the upper side's test, which a proof leaves out only when its
    upper end is finite: then the database holds no NaN."""
    proof = table.proven_range(name)
    if proof is None:
        return True, True
    return proof.lower < interval.lower, proof.upper > interval.upper


def clamp_columns(
    argument: exp.Expression, table: Table, ranges: dict[str, Interval]
) -> exp.Expression:
    """The argument with every column in a value position clamped to its (tightened) bounds.

    Columns in CASE/IF conditions are left alone: they choose a branch and add
    nothing to the sum. A bare column is left as it is: the rewrite clamps the
    whole argument anyway.
    """
    if isinstance(argument, exp.Column):
        return argument.copy()
    result = argument.copy()
    for node in list(result.find_all(exp.Column)):
        if not _in_condition(node, result):
            column = table.column(node.name)
            interval = ranges.get(column.name.lower()) or column_interval(column)
            if interval is not None:  # a date has none: the argument's own clamp bounds it
                node.replace(clamp(node.copy(), interval))
    return result


def _in_condition(node: exp.Expression, root: exp.Expression) -> bool:
    while node is not root:
        if isinstance(node.parent, exp.If) and node.arg_key == "this":
            return True
        node = node.parent
    return False
