"""The small Adapter protocol every backend implements.

An adapter runs one rewritten, bounded SQL statement and returns its column
names and rows; it also tells which columns a table has, so a policy can be
checked against the database. It knows nothing of privacy.
"""

from __future__ import annotations

from typing import Protocol


class Adapter(Protocol):
    dialect: str  # the sqlglot dialect the rewritten SQL is generated in

    def execute(self, sql: str) -> tuple[list[str], list[tuple]]:
        """Run one statement; return (column names, rows)."""

    def table_columns(self, name: str) -> set[str] | None:
        """Lower-case column names of table `name` (possibly schema-qualified), or None."""

    def unique_columns(self, name: str) -> set[str]:
        """Lower-case columns of table `name` that the database itself keeps unique
        (a single-column PRIMARY KEY or UNIQUE constraint)."""

    def close(self) -> None: ...
