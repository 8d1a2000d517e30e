"""Canonical group keys: a released key is a function of its group alone.

GROUP BY merges values that compare equal, and the database outputs as the
group's key the representation of the first row it aggregated. Where values
that compare equal can be told apart once released, that representation says
which member of the group the database met first: on a user-level table the
smallest unit passing WHERE, which no noise covers. The hazards, and the rule
that closes each (docs/security-sql.md, "Group keys"):

- Text under a case-insensitive or nondeterministic collation ('Smith' and
  'smith'), and PostgreSQL's CHAR, whose trailing spaces do not count when
  compared but are output: text keys are grouped as `CAST(key AS TEXT)` under
  the backend's byte-wise collation, everywhere the key is used (bounding
  windows, the group-ranking hash, GROUP BY, the public-domain filter). Two
  values are then in one group only if their bytes are equal, so the group has
  one representation. A backend whose byte-wise collation dpsql does not know is
  refused text keys.
- Numbers: -0.0 and 0.0, NaNs with different signs or payloads, 1 and 1.0 in
  SQLite (whose values carry their own types), 1.0 and 1.00 in a NUMERIC: each
  key is converted in Python to one type chosen from the query alone (int for
  an integer-typed key, else float), with -0.0 read as 0.0 and every NaN as one
  NaN. Values that compare equal are equal numbers, so they convert to one value.
- Intervals ('1 day' and '24 hours' compare equal in PostgreSQL and DuckDB) have
  no representation that is a function of their class: refused as keys, unless
  constant.
- Booleans, dates, timestamps (with a time zone: one instant, output in the
  session's zone) and times have one representation per value.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.policy import Table
from dpsql.sql.analysis import Analysis
from dpsql.sql.intervals import interval_of
from dpsql.sql.kinds import value_kind

# The byte-wise collation of each backend whose one dpsql knows: under it two
# strings are equal only if their bytes are. A Var, not an identifier: the
# rewrite folds identifiers' case, and PostgreSQL's "C" is not "c".
_BYTEWISE = {
    "duckdb": '"binary"',
    "postgres": '"C"',
    "spark": "UTF8_BINARY",
    "sqlite": "BINARY",
}
_TEXT = exp.DataType.build("TEXT")


def key_kinds(analysis: Analysis) -> list[str]:
    """Each group key's kind: int, float, string, bool, date, timestamp, time or null."""
    return [key_kind(key.expression, analysis.table) for key in analysis.keys]


def key_kind(expression: exp.Expression, table: Table) -> str:
    """The kind of a group key, refusing one whose equal values have several spellings."""
    kind = value_kind(expression, table)
    # a constant interval is one value in every row, spelled as the query writes it
    if kind == "interval" and expression.find(exp.Column) is not None:
        raise QueryRefused(
            f"GROUP BY {expression.sql()[:60]}",
            "intervals that compare equal are written differently ('1 day' and '24 hours'), "
            "and which one the database returns would depend on the first row it met",
            "group by a number instead: for dates, d2 - d1 is a number of days",
        )
    if kind == "number":
        interval = interval_of(expression, table)
        column = table.column(expression.name) if isinstance(expression, exp.Column) else None
        integer = (interval is not None and interval.integer_typed) or (
            column is not None and column.type == "int"
        )
        return "int" if integer else "float"
    return kind or "null"


def canonical_sql(expression: exp.Expression, kind: str, dialect: str) -> exp.Expression:
    """`expression` as the rewrite groups it: text under the backend's byte-wise collation."""
    if kind not in ("string", "date", "timestamp"):
        return expression
    if kind != "string" and dialect != "sqlite":
        return expression  # typed dates and timestamps have one representation each
    collation = _BYTEWISE.get(dialect)
    if collation is None:
        raise QueryRefused(
            f"GROUP BY {expression.sql()[:60]}",
            f"dpsql does not know how the {dialect} backend compares text byte by byte, and "
            "under a case-insensitive collation the key it returns for a group would depend "
            "on the first row it met",
            "group by a number or date, or use DuckDB, PostgreSQL, SQLite or Spark",
        )
    # SQLite's dates are text (or numbers, which a collation leaves alone): no cast
    text = expression.copy() if kind != "string" else exp.Cast(this=expression.copy(), to=_TEXT)
    return exp.Collate(this=text, expression=exp.Var(this=collation))


def canonical_value(value: Any, kind: str) -> Any:
    """The released form of a key value the database returned, the same for every value
    its group could have been represented by."""
    if value is None or kind not in ("int", "float", "bool"):
        return value
    if kind == "bool":
        return bool(value)
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        return value  # not a number after all: left as the database typed it
    if kind == "int" and _whole(value):
        return int(value)
    number = float(value)
    if number == 0:
        return 0.0  # -0.0 compares equal to 0.0
    if math.isnan(number):
        return math.nan  # one NaN: GROUP BY puts every NaN in one group
    return number


def canonical_keys(keys: list[tuple], kinds: list[str]) -> list[tuple]:
    """`canonical_value` of every value of every key."""
    if all(kind not in ("int", "float", "bool") for kind in kinds):
        return keys
    return [
        tuple(canonical_value(v, kind) for v, kind in zip(key, kinds, strict=True)) for key in keys
    ]


def _whole(value: int | float | Decimal) -> bool:
    if isinstance(value, int):
        return True
    return math.isfinite(value) and value == int(value)
