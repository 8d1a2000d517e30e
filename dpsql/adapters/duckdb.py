"""DuckDB adapter: the embedded default backend.

Database files are opened read-only and with file-system access disabled, so
even a statement that slipped past the SQL gate could neither change data nor
read a file. Each thread gets its own cursor: DuckDB connections are not
thread-safe, their cursors are.
"""

from __future__ import annotations

import threading

import duckdb

from dpsql.errors import BackendError

# DuckDB shares one instance per file within a process, and every connection to
# it must ask for the same configuration: open files only with this one.
LOCKED = {"enable_external_access": False, "lock_configuration": True}


class DuckDBAdapter:
    dialect = "duckdb"

    def __init__(self, database: str | duckdb.DuckDBPyConnection = ":memory:"):
        if isinstance(database, duckdb.DuckDBPyConnection):
            self._connection = database
        else:
            read_only = database != ":memory:"
            try:
                self._connection = duckdb.connect(database, read_only=read_only, config=LOCKED)
            except duckdb.Error as exc:
                raise BackendError(f"cannot open DuckDB database {database!r}: {exc}") from None
        self._local = threading.local()

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        return self._connection

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        cursor = getattr(self._local, "cursor", None)
        if cursor is None:
            cursor = self._local.cursor = self._connection.cursor()
        return cursor

    def execute(self, sql: str) -> tuple[list[str], list[tuple]]:
        cursor = self._cursor()
        try:
            cursor.execute(sql)
            rows = cursor.fetchall()
        except duckdb.Error as exc:
            # DuckDB's message can quote a stored value (a failed conversion, say):
            # only the kind of error leaves the adapter.
            raise BackendError(
                f"DuckDB could not run the rewritten query ({type(exc).__name__}); check "
                "the types of literals and columns in the query"
            ) from None
        return [d[0] for d in cursor.description or []], rows

    def _catalog(self, select: str, name: str, levels: tuple[str, ...]) -> list[tuple]:
        """Rows of a catalog query about table `name` (optionally schema/catalog-qualified).

        `levels` names the catalog's table, schema and catalog columns, in that order.
        """
        parts = list(reversed(name.split(".")))[: len(levels)]
        conditions = [f"lower({level}) = lower(?)" for level in levels[: len(parts)]]
        return self._cursor().execute(f"{select} AND {' AND '.join(conditions)}", parts).fetchall()

    def table_columns(self, name: str) -> set[str] | None:
        rows = self._catalog(
            "SELECT lower(column_name) FROM information_schema.columns WHERE true",
            name,
            ("table_name", "table_schema", "table_catalog"),
        )
        return {row[0] for row in rows} or None

    def unique_columns(self, name: str) -> set[str]:
        rows = self._catalog(
            "SELECT constraint_column_names FROM duckdb_constraints() WHERE constraint_type IN "
            "('PRIMARY KEY', 'UNIQUE') AND len(constraint_column_names) = 1",
            name,
            ("table_name", "schema_name", "database_name"),
        )
        return {row[0][0].lower() for row in rows}

    def close(self) -> None:
        self._connection.close()
