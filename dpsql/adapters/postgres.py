"""PostgreSQL adapter: runs rewritten queries on a PostgreSQL server through a pool.

Why psycopg 3: it is the maintained PostgreSQL driver (libpq underneath, so
every conninfo and URL option, TLS and `.pgpass` work as in psql), it speaks
the extended protocol, and its companion psycopg_pool gives a thread-safe
pool, which the wire server needs to share one adapter across many sessions
and threads.

Every statement runs in a READ ONLY transaction that is rolled back, under a
statement timeout, one statement per call (the extended protocol), so even a
statement that slipped past the SQL gate could neither change data nor hold
the server. Server messages can quote stored
values (a failed cast, say): only the SQLSTATE and the kind of error leave
the adapter.

Rewritten queries are streamed in libpq's chunked-rows mode (libpq 17 and
later; single rows before): one round trip like a plain query, and a result
of millions of groups never sits in memory whole. A running statement is
stopped with libpq's cancel request. The pool checks each
connection before lending it, so after the server restarts, dead connections
are replaced rather than handed out: queries resume without restarting dpsql.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from dpsql.adapters.base import BATCH_ROWS, INTERRUPTED, Batches, Running, ValueFacts
from dpsql.errors import BackendError

_QUERY_CANCELED = "57014"
# The server went away: class 08 (connection exception) and the shutdown codes a
# backend sends its clients when the server stops or restarts.
_CONNECTION_LOST = ("08", "57P01", "57P02", "57P03")

# Columns of a table, view or materialised view; `to_regclass` resolves the name
# by PostgreSQL's rules: search_path, schema qualification, unquoted names folded.
_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
  AND c.relkind IN ('r', 'v', 'm', 'p', 'f')
"""

# Single-column unique indexes (PRIMARY KEY and UNIQUE constraints create one)
# over all rows: a partial or expression index does not make the column unique.
# One-column unique indexes PostgreSQL enforces on every row the table's name reads:
# valid ones (a failed CREATE UNIQUE INDEX CONCURRENTLY leaves an invalid one behind,
# over duplicates), neither partial nor on an expression, and on a table without
# inheritance children (a parent's key does not cover its children's rows, which a
# plain FROM reads; a partitioned table's unique index does cover its partitions).
UNIQUE_COLUMNS = """
SELECT a.attname FROM pg_index i
JOIN pg_class c ON c.oid = i.indrelid
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indnkeyatts = 1
  AND i.indisvalid AND i.indisready AND i.indislive
  AND i.indpred IS NULL AND i.indexprs IS NULL
  AND (c.relkind = 'p' OR NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhparent = c.oid))
  AND a.attname = lower(a.attname) -- the names the rewrite reads (table_columns)
"""

# CHECK constraints PostgreSQL enforces on every row the table's name reads: validated
# ones (NOT VALID ones skip the rows already there), of a table or partitioned table (a
# foreign table's constraints are only assumed), inherited by its children unless it has
# none (a NO INHERIT one does not cover the children's rows, which a plain FROM reads).
CHECKS = """
SELECT k.conname, pg_get_expr(k.conbin, k.conrelid) FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid
WHERE k.conrelid = to_regclass(%s) AND k.contype = 'c' AND k.convalidated
  AND c.relkind IN ('r', 'p')
  AND (NOT k.connoinherit OR NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhparent = c.oid))
"""


# A relation's name as a policy writes it: bare where the search path reads it so, else
# schema-qualified. Names needing quotes (mixed case) are left out: the rewrite never reads them.
_SPELLED = """CASE WHEN to_regclass(quote_ident({c}.relname)) = {c}.oid THEN {c}.relname
  ELSE {n}.nspname || '.' || {c}.relname END"""
# Every table and view (not a partition) of the schemas users create, that the role may read.
TABLE_NAMES = f"""
SELECT {_SPELLED.format(c="c", n="n")} FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'v', 'm', 'p', 'f') AND NOT c.relispartition
  AND n.nspname <> 'information_schema' AND left(n.nspname, 3) <> 'pg_'
  AND c.relname = lower(c.relname) AND n.nspname = lower(n.nspname)
  AND has_table_privilege(c.oid, 'SELECT')
ORDER BY 1
"""
# The single-column foreign keys of the table a name reads, with the table each references.
FOREIGN_KEYS = f"""
SELECT a.attname, {_SPELLED.format(c="r", n="rn")}, ra.attname FROM pg_constraint k
JOIN pg_class r ON r.oid = k.confrelid JOIN pg_namespace rn ON rn.oid = r.relnamespace
JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = k.conkey[1]
JOIN pg_attribute ra ON ra.attrelid = k.confrelid AND ra.attnum = k.confkey[1]
WHERE k.contype = 'f' AND k.conrelid = to_regclass(%s) AND cardinality(k.conkey) = 1
"""
# The relation a name reads (to_regclass follows the search path): its schema and name.
_RELATION = """
SELECT n.nspname, c.relname, current_database() FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)
"""


# Which database: the cluster's system identifier (set at initdb, the same however the
# server is reached) and the database's name; where the role may not read the cluster's
# control data, the address and port the server listens at. (A cluster copied from one
# data directory, a restored backup or a promoted replica, keeps its identifier: such
# copies are one database to dpsql, as they are meant to hold the same data.)
IDENTITY = """
SELECT current_database(),
  has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE'),
  coalesce(host(inet_server_addr()), 'local') || ':' || current_setting('port')
"""
_SYSTEM_IDENTIFIER = "SELECT system_identifier::text FROM pg_catalog.pg_control_system()"


def postgres_identity(run: Callable[[str], list[tuple]]) -> str:
    """The identity of the PostgreSQL database that `run` (a query's rows) reaches. Two
    queries: PostgreSQL checks the right to call a function in a CASE branch it skips."""
    database, readable, address = run(IDENTITY)[0]
    cluster = run(_SYSTEM_IDENTIFIER)[0][0] if readable else address
    return f"postgres:{cluster}:{database}"


class PostgresAdapter:
    """A PostgreSQL database, named by a `postgresql://` URL or a libpq conninfo string."""

    dialect = "postgres"

    def __init__(
        self,
        conninfo: str,
        *,
        pool_size: int = 4,
        statement_timeout: float = 300.0,
        connect_timeout: float = 10.0,
    ):
        self._where = _describe(conninfo)
        self._timeout = statement_timeout
        self._running = Running()
        self._local = threading.local()  # the connection a snapshot holds, per thread
        self._pool = ConnectionPool(
            make_conninfo(conninfo, connect_timeout=max(1, int(connect_timeout))),
            min_size=1,
            max_size=pool_size,
            configure=self._configure,
            check=ConnectionPool.check_connection,
            name="dpsql",
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout)
        except PoolTimeout:
            self._pool.close()
            raise BackendError(
                f"cannot connect to PostgreSQL at {self._where} within {connect_timeout:g} s; "
                "check the URL, that the server runs, and the credentials"
            ) from None

    def _configure(self, connection: psycopg.Connection) -> None:
        connection.autocommit = True
        connection.execute(
            "SELECT set_config('statement_timeout', %s, false)",
            [f"{int(self._timeout * 1000)}ms"],
        )
        connection.autocommit = False
        connection.read_only = True  # every transaction starts BEGIN READ ONLY

    @contextmanager
    def snapshot(self) -> Iterator[bool]:
        """One pooled connection held for the context, in one REPEATABLE READ (and read
        only) transaction: its statements read the snapshot its first one took."""
        if getattr(self._local, "held", None) is not None:
            yield True
            return
        with self._connection() as connection:
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            self._local.held = connection
            try:
                yield True
            finally:
                self._local.held = None

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection, rolled back after use (the snapshot's, while one is held:
        rolled back when it ends); errors come out sanitised."""
        held = getattr(self._local, "held", None)
        if held is not None:
            try:
                yield held
            except psycopg.Error as exc:
                raise self._sanitised(exc) from None
            return
        try:
            with self._pool.connection() as connection:
                try:
                    yield connection
                finally:
                    connection.rollback()  # nothing a statement did may stay
        except PoolTimeout:
            raise BackendError(
                f"no PostgreSQL connection to {self._where} came free in time; the server "
                "may be down or every pooled connection busy: retry, or raise pool_size"
            ) from None
        except psycopg.Error as exc:
            raise self._sanitised(exc) from None

    def _run(self, sql: str, parameters: list | None = None) -> tuple[list[str], list[tuple]]:
        with self._connection() as connection:
            # Binary results make psycopg use the extended protocol, which runs
            # one statement per call: "SET TRANSACTION READ WRITE; DELETE ..."
            # cannot get out of the read-only transaction.
            cursor = connection.execute(sql, parameters, prepare=False, binary=True)
            rows = cursor.fetchall() if cursor.description else []
            return [d.name for d in cursor.description or []], rows

    def execute(self, sql: str) -> tuple[list[str], list[tuple]]:
        return self._run(sql)

    @contextmanager
    def stream(self, sql: str, batch_rows: int = BATCH_ROWS) -> Iterator[tuple[list[str], Batches]]:
        with (
            self._connection() as connection,
            self._running.statement(connection),
            connection.cursor(binary=True) as cursor,
        ):
            # the extended protocol, as in _run: one statement per call
            rows = cursor.stream(sql, size=batch_rows)
            try:
                first = list(itertools.islice(rows, batch_rows))  # runs it: columns known
            except psycopg.Error as exc:
                raise self._sanitised(exc) from None
            columns = [d.name for d in cursor.description or []]
            try:
                yield columns, self._batches(first, rows, batch_rows)
            finally:
                rows.close()  # an unread rest is cancelled and discarded

    def _batches(self, first: list[tuple], rows: Iterator[tuple], batch_rows: int) -> Batches:
        batch = first
        try:
            while batch:
                yield batch
                batch = list(itertools.islice(rows, batch_rows))
        except psycopg.Error as exc:
            raise self._sanitised(exc) from None

    def interrupt(self, thread: int) -> None:
        self._running.interrupt(thread, lambda connection: connection.cancel_safe(timeout=5))

    def table_columns(self, name: str) -> dict[str, str] | None:
        """Only the columns named in lower case: the rewrite folds policy names as
        PostgreSQL folds unquoted ones, so it never reads "Income" or "PID"; and a table
        may hold both "PID" and pid (folded as one, a key on "PID" made pid, with
        duplicates, a unique unit: read without bounding; found by an audit)."""
        try:
            _, rows = self._run(_COLUMNS, [name])
        except BackendError:
            return None  # not a name PostgreSQL can parse, e.g. too many dots
        if not rows:
            return None
        return {column: kind for column, kind in rows if column == column.lower()}

    @functools.cached_property
    def identity(self) -> str:
        return postgres_identity(lambda sql: self._run(sql)[1])

    def table_identities(self, name: str) -> set[tuple]:
        """The table `name` reads (its oid), as the search path resolves it."""
        try:
            _, rows = self._run("SELECT to_regclass(%s)::oid", [name])
        except BackendError:
            return set()
        return {(row[0],) for row in rows if row[0] is not None}

    def table_spellings(self, name: str) -> set[str]:
        """The other names (table, schema.table, database.schema.table) that resolve,
        through the search path, to the table `name` reads: a query's `FROM orders`
        reads the policy's `sales.orders` when sales is on the search path. Names
        needing quotes (mixed case) are left out: the rewrite never reads them."""
        read = self.table_identities(name)
        try:
            _, rows = self._run(_RELATION, [name])
        except BackendError:
            return set()
        if not read or not rows or any(part != part.lower() for part in rows[0]):
            return set()
        schema, table, database = rows[0]
        spellings = {
            ".".join(parts)
            for parts in ([table], [schema, table], [database, schema, table])
            if self.table_identities(".".join(_quoted(part) for part in parts)) == read
        }
        return spellings - {name.lower()}

    def unique_columns(self, name: str) -> set[str]:
        try:
            _, rows = self._run(UNIQUE_COLUMNS, [name])
        except BackendError:
            return set()
        return {row[0] for row in rows}

    def value_facts(self, name: str, statistics: bool = False) -> ValueFacts:
        """The table's enforced CHECK constraints (CHECKS). No statistics: other sessions
        write while dpsql reads, and pg_statistic samples the rows anyway."""
        try:
            _, rows = self._run(CHECKS, [name])
        except BackendError:
            return ValueFacts()
        return ValueFacts(tuple((str(n), str(e)) for n, e in rows))

    def table_names(self) -> list[str]:
        return [row[0] for row in self._run(TABLE_NAMES)[1]]

    def foreign_keys(self, name: str) -> dict[str, tuple[str, str]]:
        try:
            _, rows = self._run(FOREIGN_KEYS, [name])
        except BackendError:
            return {}
        return {column: (table, key) for column, table, key in rows}

    def close(self) -> None:
        self._pool.close()

    def _sanitised(self, exc: psycopg.Error) -> BackendError:
        state = exc.sqlstate or "none"
        if state == _QUERY_CANCELED and self._running.was_interrupted():
            return BackendError(f"PostgreSQL stopped: {INTERRUPTED}")
        if state == _QUERY_CANCELED:
            return BackendError(
                f"PostgreSQL cancelled the rewritten query after the statement timeout of "
                f"{self._timeout:g} s; narrow the query (fewer groups, a WHERE) or raise "
                "statement_timeout"
            )
        if state.startswith(_CONNECTION_LOST) or (
            isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None
        ):
            return BackendError(
                f"the connection to PostgreSQL at {self._where} was lost while running the "
                "query (the server restarted, stopped or is unreachable); retry: dpsql "
                "reconnects by itself once the server is back"
            )
        return BackendError(
            f"PostgreSQL could not run the rewritten query (SQLSTATE {state}, "
            f"{type(exc).__name__}); check the types of literals and columns in the query"
        )


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _describe(conninfo: str) -> str:
    """host:port/dbname of a conninfo, never its password."""
    try:
        parts = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        raise BackendError(
            "not a valid PostgreSQL URL or conninfo; write e.g. postgresql://user@host:5432/dbname"
        ) from None
    host = parts.get("host") or "localhost"
    return f"{host}:{parts.get('port') or 5432}/{parts.get('dbname') or parts.get('user') or ''}"
