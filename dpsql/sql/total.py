"""Totality: refuse a row expression that could raise an error for some row
(require_total), walking every node of it through the guards (guards.py), the
conversion checks (conversions.py) and the argument checks (arguments.py).
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.policy import Table
from dpsql.sql.arguments import (
    is_length,
    require_fixed_operands,
    require_known_unit,
    require_plain_call,
)
from dpsql.sql.conversions import (
    require_argument_kind,
    require_comparable,
    require_safe_cast,
    require_truth,
    text_allowed_in,
    truth_operands,
)
from dpsql.sql.guards import (
    COMPUTATIONS,
    CONCATENATIONS,
    partial_refusal,
    require_bounded,
    require_clear_of_zero,
    require_short_concatenation,
    require_short_fraction,
)
from dpsql.sql.kinds import CHOICES, COMPARISONS, compared_operands, is_text, values_of
from dpsql.sql.numbers import number_value


def require_total(
    node: exp.Expression, table: Table, clause: str, *, condition: bool = False
) -> None:
    """Refuse a row expression that could raise an error for some row.

    A database error is an answer without noise: `WHERE educ = 16 AND race = 6 AND
    1 / (age - 40) > 0` would fail in PostgreSQL exactly when that person is 40.
    So every computation on column values must be provably error-free: its
    interval, derived from the declared bounds (the rewrite clamps every column
    to them before anything else reads it), stays within MAX_ROW_MAGNITUDE and
    inside the domain of SQRT, LN, LOG and division; casts go only to text, to
    BIGINT/DOUBLE from a bounded number, or between dates and times; LIKE
    patterns and SUBSTRING positions are constants.
    """
    if condition:
        if is_text(node, table):
            raise partial_refusal(node, clause, "it reads text from the data as a truth value")
        require_truth(node, table, clause)
    # Constants are checked as rows are: the database may compute `CAST('x' AS INT)` or
    # `LN(-1)` only once a row reaches it, so it fails just when some row does.
    for sub in node.walk():
        if number_value(sub) is not None:
            require_short_fraction(sub, clause)
            require_clear_of_zero(sub, clause)
            continue  # a number written down, such as -1e308, is not computed
        require_argument_kind(sub, table, clause)
        require_plain_call(sub, clause)
        if isinstance(sub, CONCATENATIONS) and not isinstance(sub.parent, CONCATENATIONS):
            require_short_concatenation(sub, table, clause)
        if isinstance(sub, exp.Cast | exp.TryCast):
            require_safe_cast(sub, table, clause)
        elif isinstance(sub, COMPUTATIONS):
            require_bounded(sub, table, clause)
        elif isinstance(sub, exp.Like | exp.ILike | exp.Escape | exp.Substring):
            require_fixed_operands(sub, clause)
        elif isinstance(sub, exp.DateTrunc | exp.TimestampTrunc | exp.Extract):
            require_known_unit(sub, table, clause)
        elif isinstance(sub, COMPARISONS):
            require_comparable(sub, compared_operands(sub), table, clause)
        elif isinstance(sub, CHOICES) and not isinstance(sub, exp.Paren):
            require_comparable(sub, values_of(sub), table, clause)
        elif isinstance(sub, exp.Interval) and not is_length(sub):
            raise QueryRefused(
                f"{sub.sql()[:60]} in {clause}",
                "its length may not read as a number (the database reads it only once a row "
                "reaches it), or is over 100,000 years, which a client cannot load",
                "write a whole number and a unit, at most 100,000 years: INTERVAL '3' DAY",
            )
        if isinstance(sub, exp.Connector | exp.Not | exp.If):
            for operand in truth_operands(sub):
                require_truth(operand, table, clause)
        if sub is not node and is_text(sub, table) and not text_allowed_in(sub, table):
            raise partial_refusal(
                sub.parent,
                clause,
                "it converts text from the data to a number or a truth value, which fails "
                "for text that does not read as one",
            )
