"""The schema a draft is made from, read through an adapter: tables, types, keys, references.

Only the catalog is read (no row of data): each table's columns and stored types,
the columns the database keeps unique, and its single-column foreign keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dpsql.adapters.base import Adapter
from dpsql.errors import NotSupportedError, ProgrammingError


@dataclass(frozen=True)
class TableSchema:
    """One table as the database declares it."""

    name: str  # as a policy names it: lower case, schema-qualified where needed
    columns: dict[str, str]  # lower-case column to its stored type, in the table's order
    unique: frozenset[str] = frozenset()  # single-column PRIMARY KEY / UNIQUE columns
    # column -> (referenced table, referenced column): single-column foreign keys
    references: dict[str, tuple[str, str]] = field(default_factory=dict)


def read_schema(adapter: Adapter, only: Sequence[str] = ()) -> list[TableSchema]:
    """The tables `only` names (every table and view of the database if none), as the
    adapter reads their catalog; refuses a name the database does not have."""
    reader = getattr(adapter, "table_names", None)
    if reader is None:
        raise NotSupportedError(
            f"dpsql policy init cannot list the tables of a {adapter.dialect} database; "
            "write the policy by hand (see docs/policy.md)"
        )
    names = [name.lower() for name in only] or reader()
    tables = []
    for name in dict.fromkeys(names):
        columns = adapter.table_columns(name)
        if columns is None:
            known = ", ".join(reader()) or "none"
            raise ProgrammingError(
                f"table '{name}' is not in the database (its tables: {known}); name one of "
                "them with --table, or leave --table out to draft every table"
            )
        tables.append(
            TableSchema(
                name=name,
                columns=columns,
                unique=frozenset(adapter.unique_columns(name)),
                references=adapter.foreign_keys(name),
            )
        )
    if not tables:
        raise ProgrammingError(
            "the database has no tables to draft a policy for; create them first, or "
            "name the database that holds them with --database"
        )
    return tables
