"""PEP 249 (DB-API 2.0) Connection and Cursor over a Session: this module's one job.

`connect()` gets its Session from `dpsql.session.open_session` (which opens the
database, checks the policy and opens the ledger) and returns a Connection;
cursors run statements through the Session and expose the release, its
accuracy and notes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dpsql.errors import InterfaceError, NotSupportedError
from dpsql.results import MAX_GROUPS, Accuracy, Release
from dpsql.session import Budget, LedgerSource, PolicySource, Session, open_session

apilevel = "2.0"
threadsafety = 1  # threads may share the module; give each thread its own connection
paramstyle = "qmark"  # also $1 (numeric) and :name (named)


class _TypeObject:
    """A PEP 249 type object: equal to each type code it stands for."""

    def __init__(self, *codes: str):
        self.codes = frozenset(codes)

    def __eq__(self, other: object) -> bool:
        return other in self.codes

    def __hash__(self) -> int:
        return hash(self.codes)


STRING = _TypeObject("STRING")
BINARY = _TypeObject("BINARY")
NUMBER = _TypeObject("NUMBER")
DATETIME = _TypeObject("DATETIME")
ROWID = _TypeObject("ROWID")

Date = dt.date
Time = dt.time
Timestamp = dt.datetime
Binary = bytes


def DateFromTicks(ticks: float) -> dt.date:
    return dt.date.fromtimestamp(ticks)


def TimeFromTicks(ticks: float) -> dt.time:
    return dt.datetime.fromtimestamp(ticks).time()


def TimestampFromTicks(ticks: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ticks)


def connect(
    database: Any = ":memory:",
    policy: PolicySource | None = None,
    analyst: str = "default",
    epsilon: float | None = None,
    mechanism: str | None = None,
    ledger: LedgerSource | None = None,
    *,
    seed: int | None = None,
    continual: str | None = None,
    max_groups: int = MAX_GROUPS,
) -> Connection:
    """Open a private connection to `database` under `policy` for `analyst`.

    `database` is a DuckDB file path, ":memory:", an open DuckDB connection,
    a `postgresql://` URL, any SQLAlchemy URL, a `spark://` or `sc://` URL
    or a SparkSession. `ledger` (a location, or an open dpsql Ledger) defaults
    to the policy's `ledger:` entry, else a file beside a DuckDB file
    (`<database>.ledger.sqlite`); a database named by URL needs one of the two,
    since a budget kept in memory would silently reset. `seed` makes noise
    reproducible and is for tests only. `continual` picks the mechanism of
    running totals ('binary' or 'factorization'; default: each column's policy
    choice), as SET dpsql.continual does. `max_groups` caps the groups one
    query may release (default 1,000,000); a larger release is refused after
    its charge (TooManyGroups), and memory follows released groups, not the
    groups in the data.
    """
    if policy is None:
        raise InterfaceError(
            "connect() needs a policy: dpsql.connect(database, policy='policy.yaml')"
        )
    session = open_session(
        database, policy, analyst, ledger=ledger, epsilon=epsilon, mechanism=mechanism,
        seed=seed, continual=continual, max_groups=max_groups,
    )  # fmt: skip
    return Connection(session)


class Connection:
    """A PEP 249 connection: one analyst's Session."""

    def __init__(self, session: Session):
        self.session = session
        self._closed = False

    def cursor(self) -> Cursor:
        self._check_open()
        return Cursor(self)

    def execute(self, sql: str, parameters: Any = None) -> Cursor:
        """Shortcut: a new cursor that has run `sql` (as DuckDB's API offers)."""
        return self.cursor().execute(sql, parameters)

    def budget(self) -> Budget:
        """Spent and remaining epsilon and delta for this connection's analyst."""
        self._check_open()
        return self.session.budget()

    def watch(self, sql: str, every: float, ticks: int | None = None) -> Iterator[Release]:
        """Yield the new rows of a running-total query now and every `every` seconds."""
        self._check_open()
        return self.session.watch(sql, every, ticks)

    def commit(self) -> None:
        self._check_open()  # dpsql never changes data: nothing to commit

    def rollback(self) -> None:
        self._check_open()
        raise NotSupportedError("dpsql is read-only: there are no transactions to roll back")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.session.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the connection is closed")

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Cursor:
    """A PEP 249 cursor; `accuracy` and `notes` describe the last release."""

    arraysize = 1

    def __init__(self, connection: Connection):
        self.connection = connection
        self._release: Release | None = None
        self._position = 0
        self._closed = False

    # -- running ------------------------------------------------------------

    def execute(self, operation: str, parameters: Sequence | Mapping | None = None) -> Cursor:
        self._check_open()
        self._release = None
        self._release = self.connection.session.execute(operation, parameters)
        self._position = 0
        return self

    def executemany(self, operation: str, seq_of_parameters: Sequence) -> Cursor:
        for parameters in seq_of_parameters:
            self.execute(operation, parameters)
        return self

    # -- results ------------------------------------------------------------

    @property
    def description(self) -> list[tuple] | None:
        if self._release is None or not self._release.columns:
            return None
        return [
            (name, _type_code(self._release.rows, i), None, None, None, None, None)
            for i, name in enumerate(self._release.columns)
        ]

    @property
    def rowcount(self) -> int:
        return -1 if self._release is None else len(self._release.rows)

    @property
    def accuracy(self) -> dict[str, Accuracy]:
        """Per noisy output column: mechanism, noise scale and 95% interval half-width, or,
        where it differs per row (AVG), `intervals`: one (low, high) per row."""
        return dict(self._release.accuracy) if self._release else {}

    @property
    def notes(self) -> list[str]:
        """What the release says about itself, e.g. which keys could have been suppressed."""
        return list(self._release.notes) if self._release else []

    def fetchone(self) -> tuple | None:
        rows = self._rows()
        if self._position >= len(rows):
            return None
        self._position += 1
        return rows[self._position - 1]

    def fetchmany(self, size: int | None = None) -> list[tuple]:
        rows = self._rows()
        count = self.arraysize if size is None else size
        # a negative count sliced from the end (fetchmany(-1) gave all rows but the last)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            source = "arraysize" if size is None else "fetchmany's size"
            raise InterfaceError(f"{source} must be a whole number of rows >= 0, got {count!r}")
        chunk = rows[self._position : self._position + count]
        self._position += len(chunk)
        return chunk

    def fetchall(self) -> list[tuple]:
        rows = self._rows()
        chunk = rows[self._position :]
        self._position = len(rows)
        return chunk

    def __iter__(self) -> Iterator[tuple]:
        while (row := self.fetchone()) is not None:
            yield row

    def _rows(self) -> list[tuple]:
        self._check_open()
        if self._release is None:
            raise InterfaceError("no statement has been executed on this cursor")
        return self._release.rows

    # -- PEP 249 housekeeping -------------------------------------------------

    def setinputsizes(self, sizes: Any) -> None:
        """Accepted and ignored, as PEP 249 allows."""

    def setoutputsize(self, size: Any, column: Any = None) -> None:
        """Accepted and ignored, as PEP 249 allows."""

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the cursor is closed")
        self.connection._check_open()

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _type_code(rows: list[tuple], index: int) -> str:
    for row in rows:
        value = row[index]
        if value is None:
            continue
        if isinstance(value, bool | int | float) or type(value).__name__ == "Decimal":
            return "NUMBER"
        if isinstance(value, dt.date | dt.datetime | dt.time):
            return "DATETIME"
        if isinstance(value, bytes):
            return "BINARY"
        return "STRING"
    return "STRING"
