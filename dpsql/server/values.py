"""Values between PostgreSQL's wire types and dpsql: parameters in, released columns out.

Parameters arrive as text (pg-mimic turns binary ones into their text form)
and become the Python values the Session binds as literals. Released columns
get the PostgreSQL type their values have (int8, float8, numeric, text, bool,
date, timestamp). When a client asks for a statement's columns before it has
bound parameters (asyncpg's prepare), nothing may run yet, so the columns are
inferred from the SELECT list and the policy, and the released values are
later converted to what was announced.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pg_mimic import (
    BOOL,
    DATE,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    NUMERIC,
    TEXT,
    TIMESTAMP,
    ResultColumn,
)
from pg_mimic.errors import PgError
from sqlglot import exp

from dpsql.results import Release

if TYPE_CHECKING:
    from dpsql.policy import Policy  # the Session's policy: its columns' types

INVALID_TEXT_REPRESENTATION = "22P02"

# the policy's column types, as PostgreSQL types
_POLICY_OIDS = {
    "int": INT8, "float": FLOAT8, "string": TEXT, "date": DATE, "bool": BOOL, "timestamp": TIMESTAMP
}  # fmt: skip
_INTEGER_OIDS = {INT2, INT4, INT8}
_PLACEHOLDER = re.compile(r"\$(\d+)")


def python_value(oid: int | None, text: str | None) -> Any:
    """A parameter's text form as the Python value of its declared type (str if untyped)."""
    if text is None:
        return None
    try:
        if oid in _INTEGER_OIDS:
            return int(text)
        if oid in (FLOAT4, FLOAT8):
            return float(text)
        if oid == NUMERIC:
            return decimal.Decimal(text)
        if oid == BOOL:
            return text.strip().lower() in ("t", "true", "1", "on", "yes", "y")
        if oid == DATE:
            return dt.date.fromisoformat(text)
        if oid == TIMESTAMP:
            return dt.datetime.fromisoformat(text)
    except (ValueError, decimal.InvalidOperation):
        raise PgError(
            INVALID_TEXT_REPRESENTATION,
            f"invalid parameter value {text[:40]!r} for type oid {oid}; send a value of the "
            "parameter's type",
        ) from None
    return text


def column_oid(values: Sequence[Any]) -> int:
    """The PostgreSQL type of one released column, from its values (text when all are NULL)."""
    kinds = {type(value) for value in values if value is not None}
    if not kinds:
        return TEXT
    if kinds <= {bool}:
        return BOOL
    if kinds <= {int}:
        return INT8
    if kinds <= {int, float}:
        return FLOAT8
    if kinds <= {int, decimal.Decimal}:
        return NUMERIC
    if kinds <= {dt.datetime}:
        return TIMESTAMP
    if kinds <= {dt.date}:
        return DATE
    return TEXT


def released_columns(names: Sequence[str], rows: Sequence[tuple]) -> list[ResultColumn]:
    """RowDescription columns for a release."""
    return [
        ResultColumn(name, column_oid([row[i] for row in rows])) for i, name in enumerate(names)
    ]


def convert(value: Any, oid: int) -> Any:
    """A released value as the type a column was announced with before it ran."""
    if value is None:
        return None
    if oid == INT8 and isinstance(value, float | decimal.Decimal) and value == int(value):
        return int(value)
    if oid == FLOAT8 and isinstance(value, int | float | decimal.Decimal):
        return float(value)
    if oid == TEXT and not isinstance(value, str):
        return str(value)
    if oid == INT8 and not isinstance(value, int):
        raise PgError(
            "22003",
            f"a released value ({type(value).__name__}) does not fit the announced type int8; "
            "cast the expression to double precision",
        )
    return value


def parameter_count(sql: str) -> int:
    """How many `$n` parameters a statement names (clients may send Parse without types)."""
    return max((int(n) for n in _PLACEHOLDER.findall(sql)), default=0)


def parameter_oids(tree: exp.Expression | None, policy: Policy, declared: Sequence[int]) -> list:
    """Declared parameter types, and for untyped ones the type of the column compared with.

    `WHERE age > $1` makes $1 the type of `age` in the policy; a parameter
    that meets no column is text, as PostgreSQL's `unknown` reads.
    """
    count = max(len(declared), _count(tree))
    oids: list[int | None] = [oid or None for oid in declared] + [None] * (count - len(declared))
    if tree is None:
        return [oid or TEXT for oid in oids]
    for node, number in _placeholders(tree):
        if number <= count and oids[number - 1] is None:
            oids[number - 1] = _compared_column_oid(node, policy)
    return [oid or TEXT for oid in oids]


def _placeholders(tree: exp.Expression) -> list[tuple[exp.Expression, int]]:
    """`$n` nodes and their n: sqlglot reads them as Placeholder or, in PostgreSQL, Parameter."""
    found = []
    for node in tree.find_all(exp.Placeholder, exp.Parameter):
        text = node.this.name if isinstance(node.this, exp.Expression) else str(node.this or "")
        if text.isdigit():
            found.append((node, int(text)))
    return found


def _count(tree: exp.Expression | None) -> int:
    return 0 if tree is None else max((n for _, n in _placeholders(tree)), default=0)


def _compared_column_oid(node: exp.Expression, policy: Policy) -> int | None:
    parent = node.parent
    while isinstance(parent, exp.Tuple | exp.Paren | exp.Neg):
        parent = parent.parent
    if isinstance(parent, exp.Cast):
        return _cast_oid(parent)
    if not isinstance(parent, exp.Binary | exp.Between | exp.In):
        return None
    column = parent.this if isinstance(parent.this, exp.Column) else parent.args.get("expression")
    if not isinstance(column, exp.Column):
        return None
    return _policy_column_oid(column.name, policy)


def _cast_oid(cast: exp.Cast) -> int | None:
    kind = cast.to.this if cast.to else None
    if kind in exp.DataType.INTEGER_TYPES:
        return INT8
    if kind in exp.DataType.REAL_TYPES:
        return FLOAT8
    return {exp.DataType.Type.DATE: DATE, exp.DataType.Type.TIMESTAMP: TIMESTAMP}.get(kind, TEXT)


def _policy_column_oid(name: str, policy: Policy) -> int | None:
    for table in policy.tables.values():
        column = table.column(name)
        if column is not None:
            return _POLICY_OIDS.get(column.type, TEXT)
    return None


def announced_columns(
    tree: exp.Expression | None, types: list[str] | None
) -> list[ResultColumn] | None:
    """The columns a SELECT will release, inferred before it runs from the `types`
    Session.column_types reads off it (a type only the values would tell is text)."""
    if types is None:
        return None
    columns = []
    for selected, kind in zip(tree.selects, types, strict=True):
        inner = selected.this if isinstance(selected, exp.Alias) else selected
        if isinstance(selected, exp.Alias | exp.Column):
            name = selected.alias_or_name
        else:
            name = inner.key if isinstance(inner, exp.Func) else "?column?"
        columns.append(ResultColumn(name, _POLICY_OIDS.get(kind, TEXT)))
    return columns


def described_columns(release: Release) -> list[ResultColumn] | None:
    """RowDescription columns for what Session.describe returned: from its types, or from
    its rows when it ran (a statement that reads no private table, or a repeat)."""
    if not release.columns:
        return None
    if release.rows or not release.types:
        return released_columns(release.columns, release.rows)
    return [
        ResultColumn(name, _POLICY_OIDS.get(kind, TEXT))
        for name, kind in zip(release.columns, release.types, strict=True)
    ]
