"""The ledger's PostgreSQL store (psycopg 3): one schema that several proxies share.

``postgresql://user@host/db?schema=name`` keeps the tables in schema ``name``
(``dpsql`` by default), created on first use.

* **Atomic check-and-append: an advisory lock per analyst.** A charge runs in
  a READ COMMITTED transaction that first takes
  ``pg_advisory_xact_lock(hash(schema, analyst))``, then reads the analyst's
  running totals and appends. In READ COMMITTED every statement takes a fresh
  snapshot, so the read after the lock sees every charge committed by the
  previous holder (PostgreSQL marks a transaction committed before it releases
  its locks). Chosen over SERIALIZABLE with retries because charges for one
  analyst from many proxies then queue instead of failing and retrying in a
  loop, charges of different analysts do not wait for each other, and no
  serialization-failure handling is needed. A hash collision between two
  analysts only makes them queue together. The lock is not the only guard:
  ``UNIQUE (analyst, seq)`` and the insert trigger refuse any append that
  does not continue the totals it read, so even a writer that skipped the
  lock could not overspend.
* **Durable charges, cheap cache.** Charges commit with the server's
  ``synchronous_commit`` (on by default: the WAL is flushed before COMMIT
  returns). A release stored with ``durable=False`` commits with
  ``SET LOCAL synchronous_commit TO off``: a server crash may drop it (budget
  lost, never privacy); the next flushed commit makes it durable too.
* **Append-only.** Triggers refuse UPDATE, DELETE and TRUNCATE on
  ``charges``, and an insert that does not continue the running totals.
* Waiting for the analyst's lock is bounded by ``lock_timeout`` (the ledger's
  timeout, 60 s by default).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from dpsql.errors import OperationalError
from dpsql.ledger.claims import OwnHandleClaims
from dpsql.ledger.store import Store, check_meta, keep_inherited

DEFAULT_SCHEMA = "dpsql"
CLAIM_POLL = 0.005  # seconds between tries of a claim's advisory lock (see PostgresClaims)

_DDL = (
    "CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL)",
    """CREATE TABLE {s}.charges (
        id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        analyst             text   NOT NULL,
        charged_at          text   NOT NULL,
        fingerprint         text   NOT NULL,
        epsilon_units       bigint NOT NULL CHECK (epsilon_units >= 0),
        delta_units         bigint NOT NULL CHECK (delta_units >= 0),
        rho_units           bigint NOT NULL CHECK (rho_units >= 0),
        seq                 bigint NOT NULL,
        total_epsilon_units bigint NOT NULL,
        total_delta_units   bigint NOT NULL,
        total_rho_units     bigint NOT NULL,
        UNIQUE (analyst, seq)
    )""",
    """CREATE TABLE {s}.releases (
        analyst     text NOT NULL,
        fingerprint text NOT NULL,
        payload     text NOT NULL,
        created_at  text NOT NULL,
        PRIMARY KEY (analyst, fingerprint)
    )""",
    """CREATE FUNCTION {s}.charges_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'the charges log is append-only'; END $$""",
    """CREATE TRIGGER charges_no_change BEFORE UPDATE OR DELETE ON {s}.charges
        FOR EACH ROW EXECUTE FUNCTION {s}.charges_append_only()""",
    """CREATE TRIGGER charges_no_truncate BEFORE TRUNCATE ON {s}.charges
        FOR EACH STATEMENT EXECUTE FUNCTION {s}.charges_append_only()""",
    """CREATE FUNCTION {s}.charges_chain() RETURNS trigger LANGUAGE plpgsql
        SET search_path = {s} AS $$
        DECLARE
            last_seq bigint; last_eps bigint; last_delta bigint; last_rho bigint;
        BEGIN
            SELECT seq, total_epsilon_units, total_delta_units, total_rho_units
              INTO last_seq, last_eps, last_delta, last_rho
              FROM charges WHERE analyst = NEW.analyst ORDER BY seq DESC LIMIT 1;
            IF NOT FOUND THEN
                last_seq := 0; last_eps := 0; last_delta := 0; last_rho := 0;
            END IF;
            IF (NEW.seq, NEW.total_epsilon_units, NEW.total_delta_units, NEW.total_rho_units)
               IS DISTINCT FROM (last_seq + 1, last_eps + NEW.epsilon_units,
                                 last_delta + NEW.delta_units, last_rho + NEW.rho_units) THEN
                RAISE EXCEPTION
                    'a charge must continue its analyst''s sequence and running totals';
            END IF;
            RETURN NEW;
        END $$""",
    """CREATE TRIGGER charges_chain BEFORE INSERT ON {s}.charges
        FOR EACH ROW EXECUTE FUNCTION {s}.charges_chain()""",
)


def split_location(url: str) -> tuple[str, str, str]:
    """(connection URL for psycopg, schema, URL safe to show) from a ledger location."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for key, value in query if key == "schema"]
    schema = schemas[-1] if schemas else DEFAULT_SCHEMA
    if not schema:
        raise ValueError(f"ledger location {url!r} has an empty ?schema=; name a schema")
    rest = urlencode([(key, value) for key, value in query if key != "schema"])
    conninfo = urlunsplit(parts._replace(query=rest))
    shown = parts.netloc
    if parts.password is not None:
        shown = shown.replace(f":{parts.password}@", ":***@", 1)
    return conninfo, schema, urlunsplit(parts._replace(netloc=shown))


class PostgresStore(Store):
    """The ledger's tables in one schema of a PostgreSQL database."""

    _driver_error = psycopg.Error

    def __init__(self, url: str, meta: dict[str, str], timeout: float):
        super().__init__()
        self._conninfo, self._schema, self.location = split_location(url)
        self._meta = meta
        self._timeout = timeout
        with self._lock:
            self._connection()

    def _open(self) -> psycopg.Connection:
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise OperationalError(
                f"cannot connect to the ledger at {self.location}: {exc}".strip()
                + ". Check the ledger URL in the policy (ledger: postgresql://user@host/db)."
            ) from exc
        try:
            # Explicit, whatever default_transaction_isolation says: the lock
            # protocol above relies on a fresh snapshot per statement.
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            conn.execute(sql.SQL("SET lock_timeout = {}").format(int(self._timeout * 1000)))
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self._schema)))
            self._create_schema(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _create_schema(self, conn: psycopg.Connection) -> None:
        schema = sql.Identifier(self._schema)
        with conn.transaction():
            # Serialise proxies creating one schema at once (CREATE ... IF NOT
            # EXISTS still races on the catalog's unique indexes).
            self._advisory_lock(conn, "schema")
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
            exists = conn.execute(
                "SELECT to_regclass(format('%%I.meta', %s::text))", (self._schema,)
            ).fetchone()[0]
            if exists is not None:
                found = dict(conn.execute(sql.SQL("SELECT key, value FROM {}.meta").format(schema)))
                check_meta(self.location, found, self._meta)
                return
            for statement in _DDL:
                conn.execute(sql.SQL(statement).format(s=schema))
            with conn.cursor() as cursor:
                cursor.executemany(
                    sql.SQL("INSERT INTO {}.meta (key, value) VALUES (%s, %s)").format(schema),
                    list(self._meta.items()),
                )

    def _advisory_lock(self, conn: psycopg.Connection, name: str) -> None:
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"dpsql.ledger:{self._schema}:{name}",),
        )

    def claims(self) -> PostgresClaims:
        return PostgresClaims(self._conninfo, self._schema, self.location)

    def _lock_analyst(self, conn: psycopg.Connection, analyst: str) -> None:
        self._advisory_lock(conn, f"analyst:{analyst}")

    def _usable(self, conn: psycopg.Connection) -> bool:
        return not conn.closed and not conn.broken

    def _execute(self, conn: psycopg.Connection, query: str, params: tuple = ()) -> psycopg.Cursor:
        return conn.execute(query.replace("?", "%s"), params)

    @contextmanager
    def _transaction(self, conn: psycopg.Connection, durable: bool) -> Iterator[None]:
        try:
            with conn.transaction():
                if not durable:
                    conn.execute("SET LOCAL synchronous_commit TO off")
                yield
        except psycopg.errors.LockNotAvailable as exc:
            raise OperationalError(
                f"ledger {self.location}: waited more than {self._timeout:g} s for another "
                "proxy's charge to finish; try again, or look for a stuck session in "
                "pg_stat_activity"
            ) from exc


class PostgresClaims(OwnHandleClaims):
    """Claims as session advisory locks of PostgreSQL, on a connection of their own."""

    def __init__(self, conninfo: str, schema: str, location: str) -> None:
        super().__init__()
        self._conninfo, self._schema, self._location = conninfo, schema, location

    def _open(self) -> psycopg.Connection:
        try:
            return psycopg.connect(self._conninfo, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise _claim_failed(self._location, exc) from exc

    def _usable(self, handle: psycopg.Connection) -> bool:
        return not handle.broken

    def _inherited(self, handle: psycopg.Connection) -> None:
        keep_inherited(handle)  # the parent's session: not ours to end

    def _close(self, handle: psycopg.Connection) -> None:
        handle.close()

    @contextmanager
    def _across_processes(self, slot: int) -> Iterator[None]:
        name = f"dpsql.claim:{self._schema}:{slot}"
        conn = self._own()
        try:
            while not conn.execute(
                "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (name,)
            ).fetchone()[0]:
                time.sleep(CLAIM_POLL)
        except psycopg.Error as exc:
            raise _claim_failed(self._location, exc) from exc
        try:
            yield
        finally:
            # a broken session holds no lock any more: the next claim reconnects
            with suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (name,))


def _claim_failed(location: str, exc: psycopg.Error) -> OperationalError:
    return OperationalError(
        f"ledger {location}: could not claim the statement (so that a retry is not charged "
        f"twice): {exc}. Nothing was charged; check that PostgreSQL answers at the ledger URL "
        "and send the statement again"
    )
