"""DuckDB adapter: the embedded default backend.

Database files are opened read-only and with file-system access disabled, so
even a statement that slipped past the SQL gate could neither change data nor
read a file. Each thread gets its own cursor: DuckDB connections are not
thread-safe, their cursors are. Results are fetched in batches (DuckDB streams
a result to `fetchmany` rather than materialising it), and a thread's running
statement is stopped with its cursor's `interrupt()`.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import duckdb

from dpsql.adapters.base import BATCH_ROWS, Batches, Running, fetch_all
from dpsql.errors import BackendError

# DuckDB shares one instance per file within a process, and every connection to
# it must ask for the same configuration: open files only with this one.
LOCKED = {"enable_external_access": False, "lock_configuration": True}


class DuckDBAdapter:
    dialect = "duckdb"

    def __init__(self, database: str | duckdb.DuckDBPyConnection = ":memory:"):
        # A connection the caller opened stays theirs: closing dpsql leaves it open
        # (as pandas and SQLAlchemy leave a connection they were handed).
        self._owned = not isinstance(database, duckdb.DuckDBPyConnection)
        if not self._owned:
            self._connection = database
        else:
            read_only = database != ":memory:"
            try:
                self._connection = duckdb.connect(database, read_only=read_only, config=LOCKED)
            except duckdb.Error as exc:
                raise BackendError(f"cannot open DuckDB database {database!r}: {exc}") from None
        self._local = threading.local()
        self._running = Running()

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        return self._connection

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        cursor = getattr(self._local, "cursor", None)
        if cursor is None:
            cursor = self._local.cursor = self._connection.cursor()
        return cursor

    def execute(self, sql: str) -> tuple[list[str], list[tuple]]:
        return fetch_all(self, sql)

    @contextmanager
    def stream(self, sql: str, batch_rows: int = BATCH_ROWS) -> Iterator[tuple[list[str], Batches]]:
        cursor = self._cursor()
        with self._running.statement(cursor):
            try:
                cursor.execute(sql)
            except duckdb.Error as exc:
                raise self._error(exc) from None
            ended = []  # set once the last batch was fetched
            try:
                yield (
                    [d[0] for d in cursor.description or []],
                    self._batches(cursor, batch_rows, ended),
                )
            finally:
                if not ended:
                    with suppress(duckdb.Error):  # the statement's own error is what matters
                        cursor.execute("SELECT 1")  # drops the rest of an unread result

    def _batches(self, cursor: duckdb.DuckDBPyConnection, batch_rows: int, ended: list) -> Batches:
        while True:
            try:
                batch = cursor.fetchmany(batch_rows)
            except duckdb.Error as exc:
                raise self._error(exc) from None
            if not batch:
                ended.append(True)
                return
            yield batch

    def _error(self, exc: duckdb.Error) -> BackendError:
        return self._running.failure("DuckDB", type(exc).__name__)

    def interrupt(self, thread: int) -> None:
        self._running.interrupt(thread, lambda cursor: cursor.interrupt())

    @functools.cached_property
    def identity(self) -> str:
        """The database file itself (its real path, whatever name opened it), with every
        database file attached to it; an in-memory database is named by those alone (the
        demo's, built alike at every run, keeps its answers across runs). Read once: a
        connection dpsql opens can attach nothing later."""
        rows = (
            self._cursor()
            .execute(
                "SELECT path, database_name = current_database() FROM duckdb_databases() "
                "WHERE NOT internal"
            )
            .fetchall()
        )
        main = [os.path.realpath(path) if path else "memory" for path, is_main in rows if is_main]
        attached = sorted(os.path.realpath(path) for path, is_main in rows if path and not is_main)
        return "duckdb:" + "|".join(main + attached)

    def _catalog(self, select: str, name: str, levels: tuple[str, ...]) -> list[tuple]:
        """Rows of a catalog query about table `name` (optionally schema/catalog-qualified).

        `levels` names the catalog's table, schema and catalog columns, in that order.
        """
        parts = list(reversed(name.split(".")))[: len(levels)]
        conditions = [f"lower({level}) = lower(?)" for level in levels[: len(parts)]]
        return self._cursor().execute(f"{select} AND {' AND '.join(conditions)}", parts).fetchall()

    def table_columns(self, name: str) -> dict[str, str] | None:
        rows = self._catalog(
            "SELECT lower(column_name), data_type FROM information_schema.columns WHERE true",
            name,
            ("table_name", "table_schema", "table_catalog"),
        )
        return dict(rows) or None

    def _relations(self, name: str) -> tuple[list[tuple], list[tuple]]:
        """(database, schema, name) of every table and every view `name` could mean, in
        any schema or attached database."""
        levels = ("table_name", "schema_name", "database_name")
        tables = self._catalog(
            "SELECT database_name, schema_name, lower(table_name) FROM duckdb_tables() WHERE true",
            name,
            levels,
        )
        views = self._catalog(
            "SELECT database_name, schema_name, lower(view_name) FROM duckdb_views() "
            "WHERE NOT internal",
            name,
            ("view_name", *levels[1:]),
        )
        return [tuple(row) for row in tables], [tuple(row) for row in views]

    def table_identities(self, name: str) -> set[tuple]:
        """Every table or view `name` could mean, in any schema or attached database."""
        tables, views = self._relations(name)
        return set(tables + views)

    def unique_columns(self, name: str) -> set[str]:
        """Columns DuckDB keeps unique in what `name` reads: only if every table or view
        the name could mean (in any schema or attached database) is a table with that
        PRIMARY KEY or UNIQUE constraint. A key on a same-named table elsewhere made
        a unit "unique" whose own table had duplicates."""
        tables, views = self._relations(name)
        if views or not tables:
            return set()
        keyed: dict[tuple[str, str], set[str]] = {}
        for database, schema, columns in self._catalog(
            "SELECT database_name, schema_name, constraint_column_names FROM duckdb_constraints() "
            "WHERE constraint_type IN ('PRIMARY KEY', 'UNIQUE') "
            "AND len(constraint_column_names) = 1",
            name,
            ("table_name", "schema_name", "database_name"),
        ):
            keyed.setdefault((database, schema), set()).add(columns[0].lower())
        return set.intersection(*(keyed.get(table[:2], set()) for table in tables))

    def close(self) -> None:
        if self._owned:
            self._connection.close()
