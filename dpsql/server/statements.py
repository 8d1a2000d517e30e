"""One wire connection's statements and portals, run through that analyst's Session.

pg-mimic drives a Statement/Portal interface for both the simple and the
extended protocol; here a statement that is not introspection becomes a
`PrivateStatement`, whose portal runs `Session.execute` in the server's
thread pool (it blocks: planning, the ledger's fsync, the database) so the
event loop keeps serving other clients; a repeat that the release cache
answers is taken from the server's memo of it (memo.py) without that trip.
A statement runs once per portal, at its first Execute (a simple query at
once), and that release is what is charged. A Describe runs nothing: the
columns come from planning (Session.describe), or from the text when the
parameters are not yet bound, and the release is converted to them. After a
noisy release the portal sends a NoticeResponse
`dpsql accuracy` whose detail is JSON {column: {mechanism, scale,
interval95, sensitivity, note, intervals}} (full floats, for programs;
`intervals` is one [low, high] per row where the interval differs per row,
as for AVG) and whose hint is the same for a person, at the precision each
interval supports (results.noisy_text); `dpsql shell` reads the detail.

A statement that runs over the query timeout, or that the client cancels,
is answered 57014 at once and its statement is interrupted in the database
(the adapter's `interrupt`), so the worker thread is soon free again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import sqlglot
from pg_mimic import PgError, ResultColumn
from pg_mimic import Session as MimicSession
from pg_mimic.messages import make_notice_response
from pg_mimic.middleware import resolve
from pg_mimic.session import Portal, Statement

from dpsql.errors import Error, InterfaceError, ProgrammingError
from dpsql.lru import WeightedLru
from dpsql.results import MAX_GROUPS, Release, half_width_text, noisy_text
from dpsql.server import copy, introspection
from dpsql.server.catalog import Catalog, database_keys
from dpsql.server.memo import (
    ENTRY_BYTES,
    VALUE_BYTES,
    Answer,
    ReleaseMemo,
    memo_key,
)
from dpsql.server.sqlstate import (
    INSUFFICIENT_PRIVILEGE,
    INTERNAL_ERROR,
    QUERY_CANCELED,
    UNDEFINED_PARAMETER,
    pg_error,
)
from dpsql.server.values import (
    announced_columns,
    convert,
    described_columns,
    parameter_oids,
    python_value,
    released_columns,
)
from dpsql.server.workers import WorkerPool
from dpsql.session import Session

_logger = logging.getLogger(__name__)
ACCURACY_NOTICE = "dpsql accuracy"
HINT_ROWS = 10  # rows whose own intervals the accuracy notice's hint spells out
# How often a stopped statement's interrupt is repeated until its worker is free:
# the worker may be planning or charging when the first one comes, before the
# database has a statement to interrupt.
INTERRUPT_EVERY = 0.05
SHAPE_BYTES = 1024 * 1024  # the statement shapes kept, in approximate bytes


class Shape(NamedTuple):
    """What a statement's text says before it runs: its parameters' types and, when it
    has parameters, the columns it will release."""

    param_oids: list[int]
    announced: list[ResultColumn] | None


@dataclass(eq=False)
class Job:
    """One statement handed to the pool: the worker thread running it, while it runs;
    whether it ended; whether it was stopped (cancelled or timed out) at any point."""

    thread: int | None = None
    ended: bool = False
    stopped: bool = False


class Backend:
    """What every connection shares: one adapter, policy and ledger, and the thread pool."""

    def __init__(
        self,
        connection: Any,  # a Session (dpsql serve's), or a DB-API connection over one
        workers: int = 8,
        query_timeout: float = 0.0,
        max_groups: int = MAX_GROUPS,
    ):
        template = connection if isinstance(connection, Session) else connection.session
        if template.seeded:
            raise InterfaceError(
                "refused to serve a connection opened with a fixed seed: noise must come "
                "from the operating system when answers leave the process (DESIGN section 5); "
                "open it without seed="
            )
        self.connection = connection
        self.query_timeout = query_timeout  # seconds; 0: no limit
        self.max_groups = max_groups
        self.template = template
        self.adapter, self.policy, self.ledger = template.adapter, template.policy, template.ledger
        self.catalog = Catalog(self.policy, lambda: database_keys(self.policy, self.adapter))
        self.memo = ReleaseMemo()
        self.shapes = WeightedLru(SHAPE_BYTES, largest=SHAPE_BYTES // 16)
        self.pool = WorkerPool(workers)
        self._jobs = threading.Lock()  # guards every Job's thread, ended and stopped
        self._stopping: set[asyncio.Task] = set()

    def shape(self, sql: str, declared: list[int | None]) -> Shape:
        """A statement's parameter types and announced columns, parsed once per text and
        declared types (sqlglot, ~0.1 ms): a client that does not prepare its statements
        sends the same Parse again and again."""
        if not declared and "$" not in sql:
            return Shape([], None)  # no parameter to type, so no columns to announce
        key = sql, tuple(declared)
        shape = self.shapes.get(key)
        if shape is None:
            try:
                tree = sqlglot.parse_one(sql, dialect="postgres")
            except sqlglot.errors.SqlglotError:
                tree = None  # the Session says what is wrong with it, at Bind
            announced = announced_columns(tree, self.template.column_types(tree))
            shape = Shape(parameter_oids(tree, self.policy, declared), announced)
            values = len(shape.param_oids) + len(announced or ())
            size = ENTRY_BYTES + len(sql) + VALUE_BYTES * values
            self.shapes.put(key, shape, size)
        return shape

    def open_session(self, analyst: str, settings: dict[str, str] | None = None) -> Session:
        return self.template.for_analyst(analyst, settings=settings, max_groups=self.max_groups)

    def execute(
        self, session: Session, sql: str, parameters: list[Any] | None, job: Job | None = None
    ) -> Release:
        """Session.execute, one at a time per (analyst, statement, parameters) among every
        thread, server process and proxy that shares the ledger.

        The Session looks up its release cache and then charges; two identical
        queries racing through that gap would both be charged. A client that
        retries after a dropped connection does exactly that, often through
        another process, so identical statements of one analyst wait for each
        other (Ledger.exclusive) and the second finds the first's release in
        the cache. One stopped while it waited never runs.
        """
        key = "\0".join((session.analyst, sql, repr(parameters)))
        job = job or Job()
        with self._jobs:
            if job.ended:  # stopped before a worker took it: it never runs
                raise PgError(
                    QUERY_CANCELED,
                    "canceling statement before it started (cancelled, or over the query "
                    "timeout while every worker was busy): nothing was charged; send it again",
                )
            job.thread = threading.get_ident()
        try:
            with self.ledger.exclusive(key):
                with self._jobs:
                    if job.stopped:
                        raise PgError(
                            QUERY_CANCELED,
                            "canceling statement before it started (cancelled, or over the "
                            "query timeout while an identical statement ran): nothing was "
                            "charged; send it again",
                        )
                return session.execute(sql, parameters)
        finally:
            with self._jobs:
                job.thread, job.ended = None, True

    def stop(self, job: Job) -> None:
        """Interrupt `job`'s statement in the database, again until its worker is free."""
        if self._interrupt(job):
            task = asyncio.get_running_loop().create_task(self._keep_interrupting(job))
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    def _interrupt(self, job: Job) -> bool:
        """Interrupt the job's statement if it still runs; whether it still runs.

        Under the jobs lock the worker cannot finish the job and take another
        one's statement in between: the interrupt reaches this job's only.
        """
        with self._jobs:
            job.stopped = True
            if job.thread is None:
                job.ended = True  # not started: the worker will skip it
                return False
            self.adapter.interrupt(job.thread)
            return True

    async def _keep_interrupting(self, job: Job) -> None:
        while True:
            await asyncio.sleep(INTERRUPT_EVERY)
            if not self._interrupt(job):
                return

    def run(self, function: Any, *args: Any) -> asyncio.Future:
        """`function(*args)` in a worker thread: a future, awaited in the caller's own task."""
        return self.pool.run(function, *args)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)  # its threads hold DuckDB cursors
        self.catalog.stop()
        self.connection.close()


class WireSession(MimicSession):
    """pg-mimic's session for one connection: introspection first, then the analyst's Session."""

    middleware = introspection.MIDDLEWARE

    def __init__(self, backend: Backend):
        self.backend = backend
        self.session: Session | None = None

    async def init(self, connection: Any) -> None:
        await super().init(connection)
        connection.session_vars.update(introspection.SETTINGS)
        try:
            settings = introspection.startup_settings(connection.startup_params)
            self.session = await self.backend.run(
                self.backend.open_session, connection.username, settings
            )
        except (PgError, ProgrammingError) as exc:
            # PostgreSQL too ends a connection whose startup options it cannot take (a
            # bad value is a ProgrammingError of Session.set_option)
            error = exc if isinstance(exc, PgError) else pg_error(exc)
            await connection.stream.fatal(
                error.sqlstate, f"{error.message} (in the connection's startup options)"
            )
        except Error as exc:
            error = pg_error(exc)
            await connection.stream.fatal(error.sqlstate, error.message)

    async def prepare(self, sql: str, param_oids: list[int | None]) -> Statement:
        if copy.is_copy(sql):  # the simple-query path answers COPY before it prepares
            raise PgError(
                INSUFFICIENT_PRIVILEGE,
                "refused COPY in the extended query protocol: dpsql answers COPY (SELECT ...) "
                "TO STDOUT as a simple query only. Instead: send it without parameters as a "
                "simple query (psql's \\copy, psycopg's cursor.copy(), asyncpg's copy_from_query)",
            )
        answered = await resolve(self._connection, sql, param_oids, self.middleware)
        return answered or PrivateStatement(self, sql, param_oids)

    async def execute(self, sql: str, parameters: list[Any]) -> Answer:
        """Answer a repeat from the memo, else run the statement in the pool; dpsql
        errors become ErrorResponses."""
        key = memo_key(self.session, sql, parameters)
        answer = self.backend.memo.get(key)
        if answer is None:
            answer = await self._run(sql, parameters)
            self.backend.memo.keep(key, answer)
        return answer

    def _answer(self, sql: str, parameters: list[Any] | None, job: Job) -> Answer:
        """Run the statement, in a worker: the answer's column types and notices are made
        there too, beside the release just built, and off the event loop."""
        release = self.backend.execute(self.session, sql, parameters, job)
        return Answer(release, _columns(release), _notices(release))

    async def describe(self, sql: str, parameters: list[Any]) -> list[ResultColumn] | None:
        """The columns `sql` will release, from planning alone (Session.describe): nothing
        runs or is charged. A repeat the memo holds is described by its answer."""
        answer = self.backend.memo.get(memo_key(self.session, sql, parameters))
        if answer is not None:
            return answer.columns
        try:
            release = await self.backend.run(self.session.describe, sql, parameters or None)
        except Exception as exc:
            raise _pg_error(exc, sql) from None
        return described_columns(release)

    async def _run(self, sql: str, parameters: list[Any]) -> Answer:
        timeout = self.backend.query_timeout or None
        job = Job()
        try:
            # not asyncio.wait_for: it waits on a future of its own, one more loop turn
            async with asyncio.timeout(timeout):
                return await self.backend.run(self._answer, sql, parameters or None, job)
        except TimeoutError:
            # The charge (made before the database ran) stands; the statement is
            # interrupted, so no release is made or cached.
            self.backend.stop(job)
            raise PgError(
                QUERY_CANCELED,
                f"canceling statement due to statement timeout: it ran over {timeout:g} s "
                "(dpsql serve --query-timeout) and was stopped in the database; if it was "
                "charged, the charge stands. Narrow the query (a WHERE, fewer groups) or ask "
                "the operator for a longer timeout",
            ) from None
        except asyncio.CancelledError:
            self.backend.stop(job)  # the client's cancel request: stop the database too
            raise
        except Exception as exc:
            raise _pg_error(exc, sql) from None

    def notify(self, answer: Answer) -> None:
        """Send the answer's NoticeResponses (its accuracy and notes), if it has any."""
        if answer.notices:
            self._connection.stream.write(answer.notices)


def _pg_error(exc: Exception, sql: str) -> PgError:
    """The ErrorResponse for an error of the Session (or of the server itself)."""
    if isinstance(exc, PgError):
        return exc
    if isinstance(exc, Error):
        return pg_error(exc)
    # an unexpected error's text could quote a value: log it, send none of it
    _logger.error("internal error on %r", sql[:200], exc_info=exc)
    return PgError(INTERNAL_ERROR, "internal error in dpsql; see the server log")


def _notices(release: Release) -> bytes:
    """The accuracy of a noisy release, and its notes, as NoticeResponses."""
    if not release.accuracy:
        return b""
    detail = {
        column: {
            "mechanism": a.mechanism, "scale": a.scale,
            "interval95": a.interval95, "sensitivity": a.sensitivity, "note": a.note,
            "intervals": None if a.intervals is None else [list(pair) for pair in a.intervals],
        }
        for column, a in release.accuracy.items()
    }  # fmt: skip
    notes = [_notice(note) for note in release.notes]
    hint = _accuracy_hint(release)
    return b"".join([_notice(ACCURACY_NOTICE, json.dumps(detail), hint), *notes])


def _accuracy_hint(release: Release) -> str:
    """Each noisy column's 95% interval as a person reads it: one half-width, or the first
    HINT_ROWS rows' values with their own intervals."""
    lines = []
    for column, accuracy in release.accuracy.items():
        if accuracy.intervals is None:
            width = accuracy.interval95
            stated = "not stated" if width is None else half_width_text(width)
            lines.append(f"{column}: 95% interval {stated} ({accuracy.mechanism})")
            continue
        index = release.columns.index(column)
        shown = [noisy_text(row[index], accuracy, i) for i, row in enumerate(release.rows)]
        more = ", ..." if len(shown) > HINT_ROWS else ""
        lines.append(f"{column}: per row, {', '.join(shown[:HINT_ROWS])}{more}")
    return "\n".join(lines)


def _notice(message: str, detail: str | None = None, hint: str | None = None) -> bytes:
    fields = {"S": "NOTICE", "V": "NOTICE", "C": "00000", "M": message}
    fields |= {"D": detail} if detail is not None else {}
    return make_notice_response(fields | ({"H": hint} if hint else {}))


class PrivateStatement(Statement):
    """A statement for the Session: its parameters' types and, once described, its columns."""

    def __init__(self, owner: WireSession, sql: str, declared: list[int | None]):
        self.owner = owner
        self.sql = sql
        self.param_oids, self._announced = owner.backend.shape(sql, declared)
        self.columns: list[ResultColumn] | None = None
        self.described = False

    async def describe(self) -> list[ResultColumn] | None:
        """Its columns without running it: from planning (Session.describe), or, when its
        parameters are not bound yet, as its text announces them."""
        if not self.described:
            self.columns = (
                self._announced if self.param_oids else await self.owner.describe(self.sql, [])
            )
            self.described = True
        return self.columns

    def bind(self, params: list[Any]) -> PrivatePortal:
        if len(params) < len(self.param_oids):
            # as PostgreSQL answers a simple query naming $n (psql without \bind)
            raise PgError(
                UNDEFINED_PARAMETER,
                f"there is no parameter ${len(params) + 1}: the statement names "
                f"{len(self.param_oids)} parameters but {len(params)} values were sent; send "
                "them with the extended protocol (psql: \\bind value \\g) or write the values",
            )
        values = [
            python_value(oid, text) for oid, text in zip(self.param_oids, params, strict=True)
        ]
        return PrivatePortal(self, values)


class PrivatePortal(Portal):
    """A bound statement: runs once, at its first Execute, then hands out its rows. Its
    columns are known before that only when it was described."""

    def __init__(self, statement: PrivateStatement, values: list[Any]):
        self.statement = statement
        self.values = values
        self.answer: Answer | None = None
        self.columns = statement.columns if statement.described else None
        self.described = statement.described
        self._rows: list[tuple] | None = None
        self._sent = 0

    async def describe(self) -> list[ResultColumn] | None:
        """Its columns, from planning with its values bound: nothing runs or is charged."""
        if not self.described:
            self.columns = await self.statement.owner.describe(self.statement.sql, self.values)
            self.described = True
        return self.columns

    async def run(self) -> list[ResultColumn] | None:
        """Execute (once); return the columns: those described, to which the release is
        converted, else the release's own."""
        if self._rows is not None:
            return self.columns
        owner = self.statement.owner
        self.answer = await owner.execute(self.statement.sql, self.values)
        rows = self.answer.release.rows
        if self.described and self.columns is not None:
            rows = _converted(rows, self.columns)
        else:
            self.columns = self.answer.columns
        owner.notify(self.answer)
        self._rows = rows
        return self.columns

    async def execute(self, max_rows: int) -> tuple[list[tuple], bool]:
        """The next `max_rows` rows (all if 0), and whether the client must Execute again
        to find out if there are more (as PostgreSQL: when the limit was reached)."""
        await self.run()
        end = self._sent + max_rows if max_rows > 0 else len(self._rows)
        rows = self._rows[self._sent : end]
        self._sent += len(rows)
        return rows, max_rows > 0 and len(rows) == max_rows


def _columns(release: Release) -> list[ResultColumn] | None:
    return released_columns(release.columns, release.rows) if release.columns else None


def _converted(rows: list[tuple], columns: list[ResultColumn]) -> list[tuple]:
    if rows and len(rows[0]) != len(columns):
        raise PgError(
            INTERNAL_ERROR,
            f"the statement was described with {len(columns)} columns but released "
            f"{len(rows[0])}; prepare it again",
        )
    return [tuple(convert(v, c.oid) for v, c in zip(row, columns, strict=True)) for row in rows]
