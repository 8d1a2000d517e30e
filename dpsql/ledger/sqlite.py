"""The ledger's SQLite store (stdlib ``sqlite3``): one file, the default.

* **Atomic check-and-append.** Every write is one ``BEGIN IMMEDIATE``
  transaction: it takes the file's write lock before its first read, so a
  check and its append cannot interleave with another writer (thread,
  process, or proxy on the same file), and a waiting writer goes through the
  busy handler (60 s by default) instead of failing with "database is
  locked".
* **Durable charges, cheap cache.** ``journal_mode=WAL`` with
  ``synchronous=NORMAL``, and a durable commit fsyncs the WAL file itself
  right after COMMIT: that is what ``synchronous=FULL`` adds to NORMAL, done
  here outside the write lock and, for a charge whose sync is deferred
  (``Store.append(sync=False)``), on a background thread while the caller
  goes on (the database runs the query); `wait_durable` then waits for it
  before anything is released. One fsync covers every commit before it began,
  so concurrent charges share one. A committed charge survives a process
  kill at once (it is in the OS's cache) and an OS crash once synced. A
  release stored with ``durable=False`` is not synced: power loss may drop
  it, and the next identical query is then charged and answered afresh
  (budget lost, never privacy). WAL frames are written in order, so the next
  sync makes it durable too.
* **Append-only.** Triggers refuse UPDATE and DELETE on ``charges``, and an
  insert that does not continue the analyst's running totals.
* **Schema version 2** adds rho and the running totals; a version-1 file is
  migrated in place, in one transaction, when first opened.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dpsql.errors import OperationalError
from dpsql.ledger.claims import Claims, FileClaims
from dpsql.ledger.store import Store, check_meta

_CHAIN_CHECK = """CREATE TRIGGER IF NOT EXISTS charges_chain BEFORE INSERT ON charges
    BEGIN
        SELECT RAISE(ABORT, 'a charge must continue its analyst''s sequence and running totals')
        WHERE (NEW.seq, NEW.total_epsilon_units, NEW.total_delta_units, NEW.total_rho_units)
           IS NOT (SELECT COALESCE(MAX(seq), 0) + 1,
                          COALESCE(SUM(epsilon_units), 0) + NEW.epsilon_units,
                          COALESCE(SUM(delta_units), 0) + NEW.delta_units,
                          COALESCE(SUM(rho_units), 0) + NEW.rho_units
                   FROM (SELECT seq, total_epsilon_units AS epsilon_units,
                                total_delta_units AS delta_units, total_rho_units AS rho_units
                         FROM charges WHERE analyst = NEW.analyst ORDER BY seq DESC LIMIT 1));
    END"""

# One statement per item: trigger bodies contain ";", so no naive splitting.
# Version 2 as a new file gets it; the migration reaches the same columns.
_TABLES = (
    """CREATE TABLE IF NOT EXISTS charges (
        id                  INTEGER PRIMARY KEY AUTOINCREMENT,
        analyst             TEXT    NOT NULL,
        charged_at          TEXT    NOT NULL,
        fingerprint         TEXT    NOT NULL,
        epsilon_units       INTEGER NOT NULL CHECK (epsilon_units >= 0),
        delta_units         INTEGER NOT NULL CHECK (delta_units >= 0),
        rho_units           INTEGER NOT NULL DEFAULT 0 CHECK (rho_units >= 0),
        seq                 INTEGER NOT NULL DEFAULT 0,
        total_epsilon_units INTEGER NOT NULL DEFAULT 0,
        total_delta_units   INTEGER NOT NULL DEFAULT 0,
        total_rho_units     INTEGER NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE IF NOT EXISTS releases (
        analyst     TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        payload     TEXT NOT NULL,
        created_at  TEXT NOT NULL,
        PRIMARY KEY (analyst, fingerprint)
    )""",
)
_INDEX_AND_TRIGGERS = (
    "CREATE UNIQUE INDEX IF NOT EXISTS charges_by_analyst_seq ON charges (analyst, seq)",
    """CREATE TRIGGER IF NOT EXISTS charges_no_update BEFORE UPDATE ON charges
        BEGIN SELECT RAISE(ABORT, 'the charges log is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS charges_no_delete BEFORE DELETE ON charges
        BEGIN SELECT RAISE(ABORT, 'the charges log is append-only'); END""",
    _CHAIN_CHECK,
)

# Version 1 had no rho and no running totals: add them (rho 0), number each
# analyst's charges and sum them in log order. The only UPDATE the log ever
# sees, in the transaction that upgrades it, with its trigger lifted.
_MIGRATE_FROM_1 = (
    "ALTER TABLE charges ADD COLUMN rho_units INTEGER NOT NULL DEFAULT 0 CHECK (rho_units >= 0)",
    "ALTER TABLE charges ADD COLUMN seq INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE charges ADD COLUMN total_epsilon_units INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE charges ADD COLUMN total_delta_units INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE charges ADD COLUMN total_rho_units INTEGER NOT NULL DEFAULT 0",
    "DROP TRIGGER charges_no_update",
    """UPDATE charges SET seq = log.seq, total_epsilon_units = log.eps,
                          total_delta_units = log.delta
       FROM (SELECT id, ROW_NUMBER() OVER w AS seq, SUM(epsilon_units) OVER w AS eps,
                    SUM(delta_units) OVER w AS delta
             FROM charges WINDOW w AS (PARTITION BY analyst ORDER BY id)) AS log
       WHERE charges.id = log.id""",
    "DROP INDEX charges_by_analyst",
)


class SQLiteStore(Store):
    """The ledger's tables in one SQLite file (or ``:memory:``)."""

    _driver_error = sqlite3.Error
    _defers_sync = True

    def __init__(self, path: str, meta: dict[str, str], timeout: float):
        super().__init__()
        self.location = path
        self._meta = meta
        self._timeout = timeout
        self._wal: _WalSync | None = None
        self._pending = 0  # the ticket of the last charge whose sync was deferred
        try:
            if path != ":memory:" and not path.startswith("file:"):
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            with self._lock:
                self._connection()
        except (OSError, sqlite3.Error) as exc:  # a folder it cannot create, not SQLite, ...
            raise OperationalError(
                f"cannot open the ledger {path}: {exc}; give a writable SQLite file path "
                "(--ledger, connect(ledger=...) or 'ledger:' in the policy)"
            ) from exc

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.location,
            timeout=self._timeout,
            isolation_level=None,  # we issue BEGIN/COMMIT ourselves
            check_same_thread=False,  # safe: every use holds self._lock
            uri=self.location.startswith("file:"),
        )
        try:
            self._file = conn.execute("PRAGMA database_list").fetchone()[2]  # '' in memory
            self._identity = self._check_file(None)  # before SQLite opens a log beside it
            # WAL lets readers (spent, cached_release) proceed while a charge
            # commits. The mode is persistent in the file; switching it needs
            # an exclusive lock, and some SQLite versions return "locked"
            # without calling the busy handler, so retry for the timeout.
            mode: list[str] = []
            self._retry_locked(
                lambda: mode.append(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
            )
            path = self._file
            # In WAL mode durable commits sync the WAL themselves; in any other mode
            # (a memory database, or a file system without WAL) SQLite syncs at commit.
            in_wal = bool(path) and mode[-1].lower() == "wal"
            conn.execute(f"PRAGMA synchronous={'NORMAL' if in_wal else 'FULL'}")
            conn.execute(f"PRAGMA busy_timeout={int(self._timeout * 1000)}")
            self._wal, self._pending = _WalSync(path + "-wal" if in_wal else None), 0
            self._retry_locked(lambda: self._create_schema(conn))
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_file(self, identity: tuple[int, int] | None) -> tuple[int, int] | None:
        """The (device, inode) of the ledger's file, which must be the one opened
        (`identity`, if given) and have no second name.

        SQLite keeps the write-ahead log and its lock beside the name a file was
        opened by: through two hard links, two proxies each saw only their own
        charges (and spent the budget twice), and the checkpoint of one later
        erased the other's from the log. A file deleted or replaced while open
        would take the charges made to it out of every later count.
        """
        if not self._file:
            return None  # in memory
        try:
            found = os.stat(self._file)
        except FileNotFoundError:
            found = None
        if found is None or (identity and identity != (found.st_dev, found.st_ino)):
            raise OperationalError(
                f"the ledger {self._file} was deleted or replaced while dpsql had it open: "
                "nothing more is charged to it; restore the file, then restart dpsql"
            )
        if found.st_nlink > 1:
            raise OperationalError(
                f"the ledger {self._file} has {found.st_nlink} names (hard links): SQLite "
                "keeps its log beside each name, so proxies opening it by different names "
                "would each count only their own charges; give every proxy one path (a "
                "symbolic link is fine) and remove the other names"
            )
        return found.st_dev, found.st_ino

    def _retry_locked(self, action: Callable[[], object]) -> None:
        deadline = time.monotonic() + self._timeout
        delay = 0.001
        while True:
            try:
                action()
                return
            except sqlite3.OperationalError as exc:
                message = str(exc)
                if "locked" not in message and "busy" not in message:
                    raise
                if time.monotonic() >= deadline:
                    raise OperationalError(f"ledger {self.location}: {message}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        # Under one write transaction, so several processes opening (or
        # upgrading) one file at once do it exactly once.
        with self._transaction(conn, durable=True):
            conn.execute(
                "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            found = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            version = found.get("schema_version")
            if version not in (None, "1"):
                check_meta(self.location, found, self._meta)
                return
            if version == "1":
                quanta = {key: self._meta[key] for key in ("epsilon_quantum", "delta_quantum")}
                check_meta(self.location, found, quanta)
                for statement in _MIGRATE_FROM_1:
                    conn.execute(statement)
            for statement in _TABLES + _INDEX_AND_TRIGGERS:
                conn.execute(statement)
            conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                self._meta.items(),
            )

    def claims(self) -> Claims:
        with self._lock:
            self._connection()  # knows the file once open
            if not self._file:
                return Claims()
            # with the ledger's own permissions, as SQLite creates its -wal and -shm: every
            # account that may write the ledger may claim statements on it
            mode = stat.S_IMODE(os.stat(self._file).st_mode)
            return FileClaims(self._file + "-claims", mode)

    def _lock_analyst(self, conn: sqlite3.Connection, analyst: str) -> None:
        pass  # BEGIN IMMEDIATE already holds the whole file's write lock

    @contextmanager
    def _transaction(self, conn: sqlite3.Connection, durable: bool) -> Iterator[None]:
        self._check_file(self._identity)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if durable:
            self._wal.wait(self._wal.request())

    def _sync_later(self) -> None:
        self._pending = self._wal.request()

    def wait_durable(self) -> None:
        with self._lock:
            if self._pid != os.getpid():
                return  # a forked child: its parent waits for the parent's own charges
            wal, pending = self._wal, self._pending
        if wal is not None:
            wal.wait(pending)

    def close(self) -> None:
        super().close()
        if self._wal is not None:
            self._wal.close()


class _WalSync:
    """Syncs the WAL file to disk on a thread of its own; a caller asks for a sync after
    its commit and waits for it when it must (group commit).

    Each request gets a ticket; the thread takes every ticket issued so far, fsyncs,
    and marks them done, so a sync always begins after the commits it covers. The
    file is opened once and reopened if the name came to point at another file;
    the folder is synced once, as SQLite does for a WAL file it creates.
    """

    def __init__(self, path: str | None):
        self._path = path
        self._descriptor: int | None = None
        self._changed = threading.Condition()
        self._requested = self._done = 0
        self._error: OSError | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def request(self) -> int:
        if self._path is None:
            return 0  # in memory: nothing to sync
        with self._changed:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="dpsql-wal-sync", daemon=True
                )
                self._thread.start()
            self._requested += 1
            self._changed.notify_all()
            return self._requested

    def wait(self, ticket: int) -> None:
        with self._changed:
            while self._done < ticket and self._error is None:
                self._changed.wait()
            if self._done < ticket:
                raise OperationalError(
                    f"ledger {self._path}: cannot sync to disk: {self._error}. Nothing was "
                    "released; the disk may have lost recent charges, so this ledger takes "
                    "no more: check the disk, then restart dpsql (or open the ledger again)"
                )

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _run(self) -> None:
        while True:
            with self._changed:
                while self._done == self._requested and not self._closed:
                    self._changed.wait()
                if self._done == self._requested:
                    break  # closed, nothing pending
                target = self._requested
            try:
                self._sync()
            except OSError as exc:
                with self._changed:
                    self._error = exc
                    self._changed.notify_all()
                break
            with self._changed:
                self._done = target
                self._changed.notify_all()
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None

    def _sync(self) -> None:
        assert self._path is not None
        try:
            current = os.stat(self._path)
        except FileNotFoundError:
            # The last connection closed: SQLite checkpointed the WAL into the database
            # file, synced that, and removed it. Nothing of it is left to sync.
            return
        if self._descriptor is not None and not os.path.samestat(
            os.fstat(self._descriptor), current
        ):
            os.close(self._descriptor)
            self._descriptor = None
        if self._descriptor is None:
            # Read-only is enough: fsync writes out the file's pages, whoever wrote them.
            self._descriptor = os.open(self._path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            folder = os.open(os.path.dirname(self._path) or ".", os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        os.fsync(self._descriptor)
