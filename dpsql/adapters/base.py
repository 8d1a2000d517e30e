"""The small Adapter protocol every backend implements, and the bookkeeping they share.

An adapter runs one rewritten, bounded SQL statement and returns its column
names and rows, all at once (`execute`) or in batches (`stream`, so a GROUP BY
with millions of groups never sits in Python's memory whole); it can interrupt
the statement another thread is running (the server's query timeout and a
client's cancel request); it also tells which columns a table has, and their
types, so a policy can be checked against the database. It knows nothing of privacy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from dpsql.errors import BackendError

# Rows per batch of a streamed result: small enough that a batch of wide rows
# stays within a few MB, large enough that per-batch overhead is negligible.
BATCH_ROWS = 10_000

Batches = Iterator[list[tuple]]


@dataclass(frozen=True)
class ValueFacts:
    """What the database itself guarantees about the values of one table's columns.

    `checks`: (constraint name, its condition as SQL in the adapter's dialect) of each
    CHECK constraint the database enforces on every row the table's name reads (in
    PostgreSQL: validated ones). `statistics`: lower-case column to (min, max) of the
    column's stored values as the database keeps them, only where no one can write the
    table while it is read (a DuckDB file dpsql opened read-only); None for an end the
    database does not know. Neither says anything of privacy: sql/proofs.py reads them.
    """

    checks: tuple[tuple[str, str], ...] = ()
    statistics: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)


class Adapter(Protocol):
    dialect: str  # the sqlglot dialect the rewritten SQL is generated in

    def execute(self, sql: str) -> tuple[list[str], list[tuple]]:
        """Run one statement; return (column names, rows)."""

    def stream(
        self, sql: str, batch_rows: int = BATCH_ROWS
    ) -> AbstractContextManager[tuple[list[str], Batches]]:
        """Run one statement; within the context, (column names, batches of rows).

        Leaving the context early stops the statement and frees its connection.
        """

    def snapshot(self) -> AbstractContextManager[bool]:
        """Within the context, the statements this thread runs read one snapshot of the
        database, and it yields True; where the backend gives none, it yields False and
        each statement reads the database as it is when it runs. Nests (an inner one is
        the outer's)."""

    def interrupt(self, thread: int) -> None:
        """Stop the statement that thread `thread` (a `threading.get_ident()`) is running,
        if any; its `stream`/`execute` then raises BackendError. Safe from any thread."""

    def table_columns(self, name: str) -> dict[str, str] | None:
        """The columns of table `name` (possibly schema-qualified), lower-case name to
        type as the database spells it (in `dialect`), or None when there is no such
        table. The policy is checked against both: a type the policy misstates would
        make the database convert values row by row, and a failed conversion would
        reveal a row without noise."""

    def unique_columns(self, name: str) -> set[str]:
        """Lower-case columns of table `name` that the database itself keeps unique
        (a single-column PRIMARY KEY or UNIQUE constraint)."""

    def value_facts(self, name: str, statistics: bool = False) -> ValueFacts:
        """The CHECK constraints of table `name` and, with `statistics`, the column
        statistics that hold for every row read (ValueFacts); empty for a view, or
        where the database cannot prove them."""

    def table_names(self) -> list[str]:
        """Every table and view of the database a policy could name (`dpsql policy init`
        drafts one from them), lower case, qualified by its schema where the schema is not
        the one an unqualified name reads."""

    def foreign_keys(self, name: str) -> dict[str, tuple[str, str]]:
        """The single-column foreign keys of table `name`: lower-case column to the table
        it references (spelled as `table_names` spells it) and that table's column."""

    @property
    def identity(self) -> str:
        """Which database this is, the same from every process and every name that reaches
        it: release caches, streams and synopses are kept per database, so that a
        ledger shared by two databases under one policy never answers one from the
        other's release, nor continues one's stream with the other's rows."""

    def close(self) -> None: ...


def fetch_all(adapter: Adapter, sql: str) -> tuple[list[str], list[tuple]]:
    """`execute` in terms of `stream`: every batch, joined."""
    with adapter.stream(sql) as (columns, batches):
        return columns, [row for batch in batches for row in batch]


class Running:
    """Which thread runs which statement, so that another thread can interrupt it.

    A handle (a DuckDB cursor, a psycopg connection, a Spark job tag) is
    registered for the span of one statement; `interrupt` applies the adapter's
    way of stopping it under the same lock, so it never reaches a handle whose
    statement has ended and whose thread may already run someone else's.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: dict[int, Any] = {}
        self._interrupted: set[int] = set()

    @contextmanager
    def statement(self, handle: Any) -> Iterator[None]:
        thread = threading.get_ident()
        with self._lock:
            self._handles[thread] = handle
            self._interrupted.discard(thread)
        try:
            yield
        finally:
            with self._lock:
                del self._handles[thread]

    def interrupt(self, thread: int, stop: Callable[[Any], None]) -> None:
        with self._lock:
            handle = self._handles.get(thread)
            if handle is not None:
                self._interrupted.add(thread)
                stop(handle)

    def was_interrupted(self) -> bool:
        """Whether this thread's current statement was interrupted (to word its error)."""
        with self._lock:
            return threading.get_ident() in self._interrupted

    def failure(self, engine: str, kind: str) -> BackendError:
        """The error of this thread's failed statement, by `engine` with an error of `kind`.

        Only the kind leaves the adapter: a database's message can quote a
        stored value (a failed conversion, say).
        """
        if self.was_interrupted():
            return BackendError(f"{engine} stopped: {INTERRUPTED}")
        return BackendError(
            f"{engine} could not run the rewritten query ({kind}); check the types of "
            "literals and columns in the query"
        )


INTERRUPTED = (
    "the query was interrupted (dpsql serve --query-timeout, or the client cancelled it); "
    "narrow it (a WHERE, fewer groups) or raise the timeout"
)
