"""The privacy-budget ledger: its one job is to never let an analyst spend more than their budget.

It is an append-only log of charges in an SQLite file (stdlib ``sqlite3``), plus
the cache of noisy releases that makes repeated queries free and identical.
The amount spent is always derived from the log (``SUM`` over the charges); it
is never stored separately, so the log and the balance cannot disagree, even
after a crash.

Guarantees and how they are kept:

* **Atomic check-and-append.** A charge is one ``BEGIN IMMEDIATE`` transaction:
  it takes the database write lock first, then sums the analyst's charges,
  checks the new charge fits and appends it. Two charges (from threads,
  processes, or several proxies on one file) can never both pass the check.
  A refused charge rolls back and writes nothing.
* **Waiting, not failing, under contention.** A busy timeout (60 s by default)
  makes a writer wait for the lock instead of raising "database is locked".
* **Durable before return.** ``journal_mode=WAL`` with ``synchronous=FULL``:
  the WAL is fsynced at every commit, so a charge that ``charge()`` returned
  survives a process kill *and* an OS crash or power loss. ``NORMAL`` would
  survive a process kill but could lose the last charges on power loss, after
  their noisy answers were released; that would let budget be spent twice, so
  we pay one fsync per charge.
* **Never underestimates.** Costs are exact Fractions (``dpsql.accounting``);
  the log stores them as integers rounded **up** to a fixed quantum (epsilon in
  units of 1e-12, delta in units of 1e-18) so that SQL ``SUM`` is exact integer
  arithmetic. The budget is rounded **down** to the same quantum for the check.
  Decimal costs with at most 12 (epsilon) / 18 (delta) decimal places, given
  as exact Fractions such as ``Fraction("0.1")``, are stored without rounding.
  A binary float such as ``0.1`` is slightly more than one tenth, and is
  charged as such (rounded up by less than one quantum).
* **Append-only.** Triggers refuse UPDATE and DELETE on the charges table;
  ``clear_cache`` drops cached releases only, never charges.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from types import TracebackType

from dpsql.accounting import Cost
from dpsql.errors import BudgetExhausted, InterfaceError, NotSupportedError, OperationalError

SCHEMA_VERSION = 1

#: Units per 1.0 of epsilon and of delta in the stored integers.
EPSILON_QUANTUM = 10**12
DELTA_QUANTUM = 10**18

# SQLite integers are signed 64-bit; SUM raises on overflow, so no single
# charge and no checked total may exceed this.
_MAX_UNITS = 2**63 - 1

DEFAULT_TIMEOUT = 60.0

_INHERITED_CONNECTIONS: list[sqlite3.Connection] = []

# One statement per item: trigger bodies contain ";", so no naive splitting.
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS charges (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        analyst       TEXT    NOT NULL,
        charged_at    TEXT    NOT NULL,
        fingerprint   TEXT    NOT NULL,
        epsilon_units INTEGER NOT NULL CHECK (epsilon_units >= 0),
        delta_units   INTEGER NOT NULL CHECK (delta_units >= 0)
    )""",
    # Covering index: SUM per analyst reads the index only.
    """CREATE INDEX IF NOT EXISTS charges_by_analyst
        ON charges (analyst, epsilon_units, delta_units)""",
    """CREATE TRIGGER IF NOT EXISTS charges_no_update BEFORE UPDATE ON charges
        BEGIN SELECT RAISE(ABORT, 'the charges log is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS charges_no_delete BEFORE DELETE ON charges
        BEGIN SELECT RAISE(ABORT, 'the charges log is append-only'); END""",
    """CREATE TABLE IF NOT EXISTS releases (
        analyst     TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        payload     TEXT NOT NULL,
        created_at  TEXT NOT NULL,
        PRIMARY KEY (analyst, fingerprint)
    )""",
    f"""INSERT OR IGNORE INTO meta (key, value) VALUES
        ('schema_version', '{SCHEMA_VERSION}'),
        ('epsilon_quantum', '{EPSILON_QUANTUM}'),
        ('delta_quantum', '{DELTA_QUANTUM}')""",
)


@dataclass(frozen=True)
class Charge:
    """One entry of the log. `cost` is the amount logged: rounded up to the quantum."""

    id: int
    analyst: str
    time: datetime
    fingerprint: str
    cost: Cost


def _exact(value: object, name: str) -> Fraction:
    # Cost(...) built directly (not via Cost.of) skips validation, so check here.
    if isinstance(value, bool) or not isinstance(value, int | float | Fraction):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    exact = Fraction(value)
    if exact < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    return exact


def _ceil_units(value: Fraction, quantum: int) -> int:
    return -(-(value.numerator * quantum) // value.denominator)


def _floor_units(value: Fraction, quantum: int) -> int:
    return (value.numerator * quantum) // value.denominator


def _cost_units(cost: Cost) -> tuple[int, int]:
    """A charge in stored units, rounded up so the log never understates it."""
    if not isinstance(cost, Cost):
        raise TypeError(f"cost must be a dpsql.accounting.Cost, got {type(cost).__name__}")
    eps = _ceil_units(_exact(cost.epsilon, "epsilon"), EPSILON_QUANTUM)
    delta = _ceil_units(_exact(cost.delta, "delta"), DELTA_QUANTUM)
    if eps > _MAX_UNITS or delta > _MAX_UNITS:
        raise ValueError(f"cost ({cost}) is too large for the ledger")
    return eps, delta


def _budget_units(budget: Cost) -> tuple[int, int]:
    """A budget in stored units, rounded down so it is never overstated.

    Capped at the largest storable total: a budget beyond ~9.2e6 epsilon
    offers no privacy anyway, and the cap keeps SQL SUM from overflowing.
    """
    if not isinstance(budget, Cost):
        raise TypeError(f"budget must be a dpsql.accounting.Cost, got {type(budget).__name__}")
    eps = _floor_units(_exact(budget.epsilon, "budget epsilon"), EPSILON_QUANTUM)
    delta = _floor_units(_exact(budget.delta, "budget delta"), DELTA_QUANTUM)
    return min(eps, _MAX_UNITS), min(delta, _MAX_UNITS)


def _as_cost(eps_units: int, delta_units: int) -> Cost:
    return Cost(Fraction(eps_units, EPSILON_QUANTUM), Fraction(delta_units, DELTA_QUANTUM))


def _check_text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    return value


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class Ledger:
    """The persistent, append-only privacy-budget log of one SQLite file.

    One connection guarded by a lock serves all threads of a process: a charge
    is a few microseconds of SQL plus an fsync, and the file's write lock
    serialises charges anyway. Per-thread connections would only let reads
    overlap, and would break ``":memory:"`` (each connection would get its own
    database). Other processes (and other Ledger objects) coordinate through
    SQLite's file locks. Not fork-safe while another thread is inside a call.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = DEFAULT_TIMEOUT):
        self.path = os.fspath(path)
        self._timeout = timeout
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._closed = False
        if self.path != ":memory:" and not self.path.startswith("file:"):
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._connection()

    # -- connection -------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise InterfaceError(f"the ledger {self.path} is closed")
        # A connection must not cross fork(): SQLite's locks are per process, so
        # a forked child reusing it could corrupt the file. Open a fresh one,
        # and keep the inherited one referenced so that garbage collection
        # does not close (and possibly checkpoint) it from the child either.
        if self._conn is None or self._pid != os.getpid():
            if self._conn is not None:
                _INHERITED_CONNECTIONS.append(self._conn)
            self._pid = os.getpid()
            self._conn = self._open()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self._timeout,
            isolation_level=None,  # we issue BEGIN/COMMIT ourselves
            check_same_thread=False,  # safe: every use holds self._lock
            uri=self.path.startswith("file:"),
        )
        try:
            # WAL lets readers (spent, cached_release) proceed while a charge
            # commits. The mode is persistent in the file; switching it needs
            # an exclusive lock, and some SQLite versions return "locked"
            # without calling the busy handler, so retry for the timeout.
            self._retry_locked(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone())
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA busy_timeout={int(self._timeout * 1000)}")
            self._retry_locked(lambda: self._create_schema(conn))
        except BaseException:
            conn.close()
            raise
        return conn

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
                    raise OperationalError(f"ledger {self.path}: {message}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        # Idempotent and safe when several processes open a new file at once:
        # IF NOT EXISTS / INSERT OR IGNORE under one write transaction.
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                conn.execute(statement)
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        expected = {
            "schema_version": str(SCHEMA_VERSION),
            "epsilon_quantum": str(EPSILON_QUANTUM),
            "delta_quantum": str(DELTA_QUANTUM),
        }
        for key, value in expected.items():
            if meta.get(key) != value:
                raise OperationalError(
                    f"ledger {self.path} has {key}={meta.get(key)!r}, but this version of "
                    f"dpsql understands only {value}. Use the dpsql version that wrote it, "
                    "or point the policy at a new ledger file."
                )

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction holding the file's write lock from the start.

        IMMEDIATE (not DEFERRED) takes the lock before the first read, so the
        check and the append cannot interleave with another writer, and a
        waiting writer goes through the busy handler instead of failing with
        a lock-upgrade deadlock.
        """
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _read(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple]:
        # One statement in autocommit mode reads one consistent snapshot.
        with self._lock:
            return self._connection().execute(sql, params).fetchall()

    @staticmethod
    def _spent_units(conn: sqlite3.Connection, analyst: str) -> tuple[int, int]:
        eps, delta = conn.execute(
            "SELECT COALESCE(SUM(epsilon_units), 0), COALESCE(SUM(delta_units), 0) "
            "FROM charges WHERE analyst = ?",
            (analyst,),
        ).fetchone()
        return eps, delta

    # -- budget -----------------------------------------------------------------

    def spent(self, analyst: str) -> Cost:
        """Everything `analyst` has been charged, as logged (rounded up)."""
        _check_text(analyst, "analyst")
        with self._lock:
            return _as_cost(*self._spent_units(self._connection(), analyst))

    def remaining(self, analyst: str, budget: Cost) -> Cost:
        """What `analyst` can still be charged under `budget` (never overstated).

        It is the budget rounded down to the quantum minus the logged spend,
        and zero, not negative, if a budget was lowered below what was spent.
        """
        _check_text(analyst, "analyst")
        budget_eps, budget_delta = _budget_units(budget)
        with self._lock:
            spent_eps, spent_delta = self._spent_units(self._connection(), analyst)
        return _as_cost(max(0, budget_eps - spent_eps), max(0, budget_delta - spent_delta))

    def charge(self, analyst: str, cost: Cost, budget: Cost, fingerprint: str) -> Cost:
        """Append a charge if it fits in `budget`; return what remains after it.

        Raises BudgetExhausted (and writes nothing) if it does not fit. The
        charge is committed and fsynced before this returns.
        """
        _check_text(analyst, "analyst")
        _check_text(fingerprint, "fingerprint")
        eps, delta = _cost_units(cost)
        budget_eps, budget_delta = _budget_units(budget)
        with self._write() as conn:
            spent_eps, spent_delta = self._spent_units(conn, analyst)
            left_eps, left_delta = budget_eps - spent_eps, budget_delta - spent_delta
            if eps > left_eps or delta > left_delta:
                raise BudgetExhausted(analyst, cost, _as_cost(max(0, left_eps), max(0, left_delta)))
            conn.execute(
                "INSERT INTO charges (analyst, charged_at, fingerprint, epsilon_units, "
                "delta_units) VALUES (?, ?, ?, ?, ?)",
                (analyst, _now(), fingerprint, eps, delta),
            )
        return _as_cost(left_eps - eps, left_delta - delta)

    def charges(self, analyst: str | None = None) -> list[Charge]:
        """The log, oldest first; only `analyst`'s charges if given."""
        sql = "SELECT id, analyst, charged_at, fingerprint, epsilon_units, delta_units FROM charges"
        params: tuple[object, ...] = ()
        if analyst is not None:
            sql += " WHERE analyst = ?"
            params = (_check_text(analyst, "analyst"),)
        rows = self._read(sql + " ORDER BY id", params)
        return [
            Charge(row[0], row[1], datetime.fromisoformat(row[2]), row[3], _as_cost(row[4], row[5]))
            for row in rows
        ]

    # -- cached releases --------------------------------------------------------

    def cached_release(self, analyst: str, fingerprint: str) -> str | None:
        """The stored release payload for this query, or None."""
        rows = self._read(
            "SELECT payload FROM releases WHERE analyst = ? AND fingerprint = ?",
            (_check_text(analyst, "analyst"), _check_text(fingerprint, "fingerprint")),
        )
        return rows[0][0] if rows else None

    def store_release(self, analyst: str, fingerprint: str, payload: str) -> str:
        """Store `payload` unless a release is already stored; return the stored one.

        The first writer wins, so concurrent identical queries and every later
        repeat all see one identical noisy answer.
        """
        _check_text(analyst, "analyst")
        _check_text(fingerprint, "fingerprint")
        _check_text(payload, "payload")
        with self._write() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO releases (analyst, fingerprint, payload, created_at) "
                "VALUES (?, ?, ?, ?)",
                (analyst, fingerprint, payload, _now()),
            )
            (stored,) = conn.execute(
                "SELECT payload FROM releases WHERE analyst = ? AND fingerprint = ?",
                (analyst, fingerprint),
            ).fetchone()
        return stored

    def stored_releases(self, analyst: str, prefix: str) -> dict[str, str]:
        """Every stored payload of `analyst` whose fingerprint starts with `prefix`.

        Plans that keep state (a range synopsis, a running stream) store it under
        fingerprints of their own, e.g. ``synopsis:<table>.<column>:...``.
        """
        escaped = _check_text(prefix, "prefix").replace("!", "!!").replace("%", "!%")
        rows = self._read(
            "SELECT fingerprint, payload FROM releases WHERE analyst = ? "
            "AND fingerprint LIKE ? ESCAPE '!' ORDER BY fingerprint",
            (_check_text(analyst, "analyst"), escaped.replace("_", "!_") + "%"),
        )
        return dict(rows)

    def forget_release(self, analyst: str, fingerprint: str) -> bool:
        """Drop one stored payload (`dpsql synopsis drop`); charges stay. True if it existed."""
        _check_text(analyst, "analyst")
        _check_text(fingerprint, "fingerprint")
        with self._write() as conn:
            return bool(
                conn.execute(
                    "DELETE FROM releases WHERE analyst = ? AND fingerprint = ?",
                    (analyst, fingerprint),
                ).rowcount
            )

    def clear_cache(self) -> int:
        """Drop every cached release (the data changed); return how many. Charges stay."""
        with self._write() as conn:
            return conn.execute("DELETE FROM releases").rowcount

    # -- lifecycle --------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
            self._closed = True

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({self.path!r})"


def open_ledger(location: str | os.PathLike[str]) -> Ledger:
    """The ledger at `location`: a file path, ``sqlite:///path`` or ``":memory:"``."""
    text = os.fspath(location)
    if text.startswith("sqlite:///"):
        text = text[len("sqlite:///") :] or ":memory:"
    elif "://" in text:
        scheme = text.split("://", 1)[0]
        raise NotSupportedError(
            f"ledger location {scheme}://... is not supported yet; use an SQLite file path"
        )
    return Ledger(text)
