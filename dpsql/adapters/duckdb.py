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

from dpsql.adapters.base import BATCH_ROWS, Batches, Running, ValueFacts, fetch_all
from dpsql.errors import BackendError

# Column types whose statistics are numbers (DECIMAL(p, s) too)
_NUMBERS = (
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
    "UINTEGER", "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE",
)  # fmt: skip

# DuckDB shares one instance per file within a process, and every connection to
# it must ask for the same configuration: open files only with this one.
LOCKED = {"enable_external_access": False, "lock_configuration": True}


def _open_error(database: str, exc: duckdb.Error) -> BackendError:
    """Why `database` did not open, saying what to do where DuckDB's message does not."""
    if isinstance(exc, duckdb.ConnectionException) and "different configuration" in str(exc):
        # DuckDB shares one instance per file within a process, and that instance keeps
        # the configuration of whoever opened it first: dpsql's (read-only, no file
        # access, locked) cannot be another's.
        return BackendError(
            f"cannot open DuckDB database {database!r}: this process already has it open "
            "with another configuration (DuckDB opens a file once per process, and dpsql "
            "opens it read-only with file access disabled). Pass the open connection "
            "instead, dpsql.connect(con, policy=...), or close it before connecting"
        )
    return BackendError(f"cannot open DuckDB database {database!r}: {exc}")


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
                raise _open_error(database, exc) from None
        self._local = threading.local()
        self._running = Running()
        # A file dpsql opened read-only cannot change while open, its schema included
        # (nothing can be attached either): what value_facts reads of it is read once.
        self._frozen = self._owned and database != ":memory:"
        self._facts: dict[tuple[str, bool], ValueFacts] = {}

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

    @contextmanager
    def snapshot(self) -> Iterator[bool]:
        """One transaction on this thread's cursor (DuckDB's MVCC: its statements read the
        database as it was when it began), rolled back at the end: it writes nothing."""
        if getattr(self._local, "snapshot", False):
            yield True
            return
        cursor = self._cursor()
        try:
            cursor.execute("BEGIN TRANSACTION")
        except duckdb.Error as exc:
            raise self._error(exc) from None
        self._local.snapshot = True
        try:
            yield True
        finally:
            self._local.snapshot = False
            with suppress(duckdb.Error):  # a failed statement already ended it
                cursor.execute("ROLLBACK")

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
        """The columns of the table or view `name` reads, as DuckDB resolves the name
        (table_identities); where it cannot tell which of several it reads, the columns
        all of them have alike. Merged across same-named tables, a DECIMAL column of the
        one read could be typed as another's DOUBLE and read as stored."""
        found: dict[str, str] | None = None
        for database, schema, table in self.table_identities(name):
            rows = self._cursor().execute(
                "SELECT lower(column_name), data_type FROM information_schema.columns "
                "WHERE table_catalog = ? AND table_schema = ? AND lower(table_name) = ?",
                [database, schema, table],
            )
            columns = dict(rows.fetchall())
            found = (
                columns
                if found is None
                else {column: kind for column, kind in found.items() if columns.get(column) == kind}
            )
        return found or None

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
        """The table or view `name` reads, as (database, schema, lower-case name), as
        DuckDB resolves it (its search path: temporary objects, then the current
        schema; `a.t` is database a's default schema if a database a exists, else
        schema a); empty when it reads none.

        DuckDB is asked, not imitated: of the relations the name could mean (those
        of its table name, in any schema or database), the ones whose plan for
        `SELECT * FROM` is the name's own plan. A plan names each table it scans in
        full, so this is one relation, except views of identical plans, which are
        all kept: they read the same rows.
        """
        plan = self._plan(name.split("."))
        if plan is None:
            return set()
        return {
            relation
            for relation in self._candidates(name)
            if self._plan([relation[0], relation[1], relation[2]]) == plan
        }

    def table_spellings(self, name: str) -> set[str]:
        """The other names (lower case; table, schema.table, database.table and
        database.schema.table) that DuckDB resolves to the relation `name` reads: a
        query's `FROM pums` reads the policy's `main.pums`."""
        identity = self.table_identities(name)
        if len(identity) != 1:
            return set()  # which one the name reads is not clear: only its own spelling
        database, schema, table = next(iter(identity))
        spellings = {
            ".".join(parts).lower()
            for parts in ([table], [schema, table], [database, table], [database, schema, table])
            if self.table_identities(".".join(parts)) == identity and "." not in "".join(parts)
        }
        return spellings - {name.lower()}

    def _plan(self, parts: list[str]) -> str | None:
        """DuckDB's plan of reading every column of the relation named by `parts`."""
        quoted = ".".join(_quoted(part) for part in parts)
        try:
            rows = self._cursor().execute(f"EXPLAIN (FORMAT JSON) SELECT * FROM {quoted}")
            return str(rows.fetchall())
        except duckdb.Error:
            return None

    def _candidates(self, name: str) -> list[tuple]:
        """Every table and view whose name is `name`'s last part, in any schema or
        database, that its other parts could name."""
        *qualifiers, table = [part.lower() for part in name.split(".")]
        rows = (
            self._cursor()
            .execute(
                "SELECT database_name, schema_name, lower(table_name) FROM duckdb_tables() "
                "WHERE lower(table_name) = ? UNION ALL "
                "SELECT database_name, schema_name, lower(view_name) FROM duckdb_views() "
                "WHERE NOT internal AND lower(view_name) = ?",
                [table, table],
            )
            .fetchall()
        )
        return [
            tuple(row)
            for row in rows
            if not qualifiers
            or qualifiers == [row[0].lower(), row[1].lower()]
            or (len(qualifiers) == 1 and qualifiers[0] in (row[0].lower(), row[1].lower()))
        ]

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

    def value_facts(self, name: str, statistics: bool = False) -> ValueFacts:
        """The CHECK constraints of the one table `name` reads (none for a view) and,
        with `statistics`, where dpsql opened the file read-only itself, its numeric
        columns' statistics.

        DuckDB checks a CHECK constraint on every row written, and has none that a
        table's old rows may break. Its statistics (min and max, what its optimizer
        relies on) are conservative: a DELETE or UPDATE leaves the old range. They
        hold for every row read only while no one can write the file: a file opened
        read-only by dpsql (no writer, this process included, can open it meanwhile;
        its configuration is locked, so nothing can be attached over it). A connection
        the caller passed in stays theirs to write to or to attach other files to:
        its statistics prove nothing. Read once from a file dpsql opened read-only.
        """
        if not self._frozen:
            return self._value_facts(name, statistics)
        if (name, statistics) not in self._facts:
            self._facts[name, statistics] = self._value_facts(name, statistics)
        return self._facts[name, statistics]

    def _value_facts(self, name: str, statistics: bool) -> ValueFacts:
        tables, _ = self._relations(name)
        identity = self.table_identities(name)
        if len(identity) != 1 or next(iter(identity)) not in tables:
            return ValueFacts()
        database, schema, table = next(iter(identity))
        checks = self._cursor().execute(
            "SELECT constraint_name, expression FROM duckdb_constraints() "
            "WHERE constraint_type = 'CHECK' AND database_name = ? AND schema_name = ? "
            "AND lower(table_name) = ?",
            [database, schema, table],
        )
        facts = tuple((str(n), str(e)) for n, e in checks.fetchall())
        stored = self._statistics(database, schema, table) if statistics else {}
        return ValueFacts(facts, stored)

    def _statistics(self, database: str, schema: str, table: str) -> dict[str, tuple]:
        """(min, max) of each numeric column of a table of a file dpsql opened read-only
        (value_facts); {} elsewhere."""
        cursor = self._cursor()
        readonly = cursor.execute(
            "SELECT readonly FROM duckdb_databases() WHERE database_name = ?", [database]
        ).fetchall()
        if not self._owned or readonly != [(True,)]:
            return {}
        columns = [
            column
            for column, kind in cursor.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_catalog = ? AND table_schema = ? AND lower(table_name) = ?",
                [database, schema, table],
            ).fetchall()
            if kind in _NUMBERS or kind.startswith("DECIMAL(")
        ]
        if not columns:
            return {}
        quoted = [_quoted(column) for column in columns]
        rows = cursor.execute(
            f"SELECT {', '.join(f'stats({c})' for c in quoted)} "
            f"FROM {'.'.join(_quoted(part) for part in (database, schema, table))} LIMIT 1"
        ).fetchall()
        if not rows:
            return {}  # no rows: nothing to prove
        return {
            column.lower(): (stats.get("min"), stats.get("max"))
            for column, stats in zip(columns, rows[0], strict=True)
            if isinstance(stats, dict)
        }

    def table_names(self) -> list[str]:
        """The tables and views of the current database (attached ones are left out: a
        policy names them database-qualified, which the owner writes)."""
        rows = self._cursor().execute(
            "SELECT schema_name, lower(table_name), schema_name = current_schema() "
            "FROM duckdb_tables() WHERE NOT internal AND database_name = current_database() "
            "UNION ALL SELECT schema_name, lower(view_name), schema_name = current_schema() "
            "FROM duckdb_views() WHERE NOT internal AND database_name = current_database() "
            "ORDER BY 1, 2"
        )
        return [
            table if current else f"{schema}.{table}" for schema, table, current in rows.fetchall()
        ]

    def foreign_keys(self, name: str) -> dict[str, tuple[str, str]]:
        """DuckDB keeps a table's foreign keys to tables of its own schema."""
        identity = self.table_identities(name)
        if len(identity) != 1:
            return {}
        database, schema, table = next(iter(identity))
        rows = self._cursor().execute(
            "SELECT constraint_column_names[1], referenced_table, referenced_column_names[1], "
            "schema_name = current_schema() FROM duckdb_constraints() "
            "WHERE constraint_type = 'FOREIGN KEY' AND len(constraint_column_names) = 1 "
            "AND database_name = ? AND schema_name = ? AND lower(table_name) = ?",
            [database, schema, table],
        )
        return {
            column.lower(): (
                target.lower() if current else f"{schema}.{target}".lower(),
                key.lower(),
            )
            for column, target, key, current in rows.fetchall()
        }

    def close(self) -> None:
        if self._owned:
            self._connection.close()


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
