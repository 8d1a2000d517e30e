"""The ledger's queries, shared by its two stores (SQLite and PostgreSQL).

Its one job is reading and appending the two tables every store keeps:

* ``charges``: the append-only log. Each row carries the charge in integer
  quanta (epsilon, delta, rho) and the analyst's running totals after it, with
  a per-analyst sequence number ``seq``. The store's insert trigger refuses a
  row whose ``seq`` and totals do not continue the analyst's previous row, and
  ``UNIQUE (analyst, seq)`` refuses a second row with the same number, so two
  writers that read the same totals cannot both append, whatever the locking.
  The amount spent is the last row's totals: one index lookup, however long
  the log (a ``SUM`` over the log took 12 ms at 10^5 charges in SQLite).
* ``releases``: the cache of noisy releases and the state stateful plans keep,
  keyed by (analyst, fingerprint); the first writer wins.

A store subclass opens connections, creates its schema, and supplies the
transaction (with the write lock or per-analyst lock it needs) and its
parameter style. The SQL here is the subset SQLite and PostgreSQL share.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, NamedTuple

from dpsql.errors import InterfaceError, OperationalError
from dpsql.ledger.claims import Claims


class Units(NamedTuple):
    """Amounts in the stored integer quanta."""

    epsilon: int = 0
    delta: int = 0
    rho: int = 0

    def plus(self, other: Units) -> Units:
        return Units(*(a + b for a, b in zip(self, other, strict=True)))


#: Connections left behind by a fork (see Store._connection).
_INHERITED_CONNECTIONS: list[Any] = []

_LAST = (
    "SELECT seq, total_epsilon_units, total_delta_units, total_rho_units FROM charges "
    "WHERE analyst = ? ORDER BY seq DESC LIMIT 1"
)
_APPEND = (
    "INSERT INTO charges (analyst, charged_at, fingerprint, epsilon_units, delta_units, "
    "rho_units, seq, total_epsilon_units, total_delta_units, total_rho_units) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_LOG = (
    "SELECT id, analyst, charged_at, fingerprint, epsilon_units, delta_units, rho_units "
    "FROM charges"
)
_RELEASE = "SELECT payload FROM releases WHERE analyst = ? AND fingerprint = ?"


class Store(ABC):
    """One connection, guarded by a lock, serving every thread of a process.

    A store call is a few statements; the database's lock serialises charges
    anyway, so per-thread connections would only let reads overlap (and would
    give each thread its own ``:memory:`` SQLite database). A connection never
    crosses fork(): a child opens its own. Not fork-safe while another thread
    is inside a call.
    """

    #: Where the store lives, safe to show (no password).
    location: str
    #: The driver's base exception, reported as dpsql's OperationalError.
    _driver_error: type[Exception]
    #: Whether a charge's commit can return before the disk has it (`append(sync=False)`).
    _defers_sync = False

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._conn: Any = None
        self._pid = os.getpid()
        self._closed = False

    # -- what a store supplies ----------------------------------------------------

    @abstractmethod
    def _open(self) -> Any:
        """A new connection, with the schema created or checked."""

    @abstractmethod
    def _transaction(self, conn: Any, durable: bool) -> AbstractContextManager[None]:
        """A write transaction; `durable=False` may skip waiting for the disk."""

    @abstractmethod
    def _lock_analyst(self, conn: Any, analyst: str) -> None:
        """Inside a write transaction: serialise check-and-append for `analyst`."""

    def _usable(self, conn: Any) -> bool:
        return True

    def _sync_later(self) -> None:
        """Just after a commit that skipped the disk, under the lock: start making it
        durable without waiting for it (see wait_durable)."""
        raise NotImplementedError(f"{type(self).__name__} commits charges durably")

    def wait_durable(self) -> None:
        """Wait until every charge appended with `sync=False` is on disk."""
        return  # a store that cannot defer the sync made every charge durable at commit

    def _execute(self, conn: Any, sql: str, params: tuple[object, ...] = ()) -> Any:
        return conn.execute(sql, params)

    def claims(self) -> Claims:
        """Claims on statements among everyone sharing this store (see dpsql.ledger.claims)."""
        return Claims()

    # -- connection ----------------------------------------------------------------

    def _connection(self) -> Any:
        if self._closed:
            raise InterfaceError(f"the ledger {self.location} is closed")
        # A forked child must not reuse the parent's connection (SQLite's locks
        # are per process; a PostgreSQL socket would carry two conversations).
        # Keep the inherited one referenced, so garbage collection does not
        # close it (checkpoint, or send Terminate) from the child.
        if self._conn is not None and self._pid != os.getpid():
            keep_inherited(self._conn)
            self._conn = None
        if self._conn is not None and not self._usable(self._conn):
            self._conn = None  # a broken connection: reconnect
        if self._conn is None:
            self._pid = os.getpid()
            self._conn = self._open()
        return self._conn

    @contextmanager
    def _driver_errors(self) -> Iterator[None]:
        # PEP 249 front ends expect dpsql's exceptions, whichever store failed.
        try:
            yield
        except self._driver_error as exc:
            raise OperationalError(f"ledger {self.location}: {exc}") from exc

    @contextmanager
    def _write(self, durable: bool = True) -> Iterator[Any]:
        with self._lock, self._driver_errors():
            conn = self._connection()
            with self._transaction(conn, durable):
                yield conn

    def _read(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple]:
        # One statement outside a transaction reads one consistent snapshot.
        with self._lock, self._driver_errors():
            conn = self._connection()
            return self._execute(conn, sql, params).fetchall()

    def _last(self, conn: Any, analyst: str) -> tuple[int, Units]:
        row = self._execute(conn, _LAST, (analyst,)).fetchone()
        return (0, Units()) if row is None else (row[0], Units(*row[1:]))

    # -- the log -------------------------------------------------------------------

    def spent(self, analyst: str) -> Units:
        with self._lock, self._driver_errors():
            return self._last(self._connection(), analyst)[1]

    def append(
        self,
        accounts: Sequence[tuple[str, str, Callable[[Units], None]]],
        charged_at: str,
        units: Units,
        *,
        sync: bool = True,
    ) -> list[Units]:
        """Charge `units` to every (account, fingerprint, admit) if no `admit(spent)` raises.

        Return each account's new totals. The reads of the totals and the
        appends are one transaction under the store's lock for each account,
        taken in the order given (callers give the analyst before the shared
        dataset account, so two charges never wait for each other in a cycle);
        no other charge to these accounts can come in between, and either every
        account is charged or none is. The charge is committed on return, and
        durable too unless `sync=False` and the store can defer that.
        """
        with self._lock:
            deferred = not sync and self._defers_sync
            with self._write(durable=not deferred) as conn:
                lasts = []
                for account, _, admit in accounts:
                    self._lock_analyst(conn, account)
                    seq, spent = self._last(conn, account)
                    admit(spent)
                    lasts.append((seq, spent.plus(units)))
                for (account, fingerprint, _), (seq, totals) in zip(accounts, lasts, strict=True):
                    self._execute(
                        conn, _APPEND, (account, charged_at, fingerprint, *units, seq + 1, *totals)
                    )
            if deferred:
                self._sync_later()
        return [totals for _, totals in lasts]

    def charges(self, analyst: str | None) -> list[tuple]:
        """Rows (id, analyst, charged_at, fingerprint, epsilon, delta, rho), oldest first."""
        if analyst is None:
            return self._read(_LOG + " ORDER BY id")
        return self._read(_LOG + " WHERE analyst = ? ORDER BY id", (analyst,))

    # -- releases ------------------------------------------------------------------

    def cached_release(self, analyst: str, fingerprint: str) -> str | None:
        rows = self._read(_RELEASE, (analyst, fingerprint))
        return rows[0][0] if rows else None

    def store_release(
        self, analyst: str, fingerprint: str, payload: str, created_at: str, durable: bool
    ) -> str:
        with self._write(durable) as conn:
            inserted = self._execute(
                conn,
                "INSERT INTO releases (analyst, fingerprint, payload, created_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (analyst, fingerprint) DO NOTHING",
                (analyst, fingerprint, payload, created_at),
            ).rowcount
            if inserted == 1:  # the first writer: the stored payload is this one
                return payload
            return self._execute(conn, _RELEASE, (analyst, fingerprint)).fetchone()[0]

    def stored_releases(self, analyst: str, prefix: str, after: str) -> dict[str, str]:
        rows = self._read(
            "SELECT fingerprint, payload FROM releases WHERE analyst = ? "
            "AND fingerprint LIKE ? ESCAPE '!' AND fingerprint > ? ORDER BY fingerprint",
            (analyst, _starting(prefix), after),
        )
        return dict(rows)

    def forget_release(self, analyst: str, fingerprint: str) -> bool:
        with self._write() as conn:
            cursor = self._execute(
                conn,
                "DELETE FROM releases WHERE analyst = ? AND fingerprint = ?",
                (analyst, fingerprint),
            )
            return bool(cursor.rowcount)

    def release_counts(
        self, analyst: str | None, prefix: str, excluding: Sequence[str]
    ) -> list[tuple[str, int, str]]:
        """(analyst, count, newest created_at) of the matching stored releases, per analyst."""
        where, params = _release_filter(analyst, prefix, excluding)
        return self._read(
            f"SELECT analyst, COUNT(*), MAX(created_at) FROM releases{where} "
            "GROUP BY analyst ORDER BY analyst",
            params,
        )

    def clear_cache(self, analyst: str | None, prefix: str, excluding: Sequence[str]) -> int:
        where, params = _release_filter(analyst, prefix, excluding)
        with self._write() as conn:
            return self._execute(conn, f"DELETE FROM releases{where}", params).rowcount

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
            self._closed = True


def keep_inherited(connection: Any) -> None:
    """Keep a connection a forked child inherited referenced for the child's life, so that
    garbage collection does not close it (checkpoint, or send Terminate) from the child."""
    _INHERITED_CONNECTIONS.append(connection)


def _starting(prefix: str) -> str:
    """A LIKE pattern (ESCAPE '!') for the strings that start with `prefix`."""
    return prefix.replace("!", "!!").replace("%", "!%").replace("_", "!_") + "%"


def _release_filter(
    analyst: str | None, prefix: str, excluding: Sequence[str]
) -> tuple[str, tuple[str, ...]]:
    """WHERE (or nothing) and its parameters for the releases of `analyst` (None: every
    analyst's) whose fingerprint starts with `prefix` and with none of `excluding`."""
    conditions = [] if analyst is None else ["analyst = ?"]
    params = [] if analyst is None else [analyst]
    if prefix:
        conditions.append("fingerprint LIKE ? ESCAPE '!'")
        params.append(_starting(prefix))
    for other in excluding:
        conditions.append("fingerprint NOT LIKE ? ESCAPE '!'")
        params.append(_starting(other))
    return (" WHERE " + " AND ".join(conditions) if conditions else ""), tuple(params)


def check_meta(location: str, found: dict[str, str], expected: dict[str, str]) -> None:
    """Refuse a ledger written with another schema version or other quanta."""
    for key, value in expected.items():
        if found.get(key) != value:
            raise OperationalError(
                f"ledger {location} has {key}={found.get(key)!r}, but this version of dpsql "
                f"understands only {value}. Use the dpsql version that wrote it, or point the "
                "policy at a new ledger."
            )
