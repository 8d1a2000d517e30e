"""Spark adapter: the same private SQL on Apache Spark SQL.

What it opens: `spark://local[2]` (a local SparkSession; `spark://host:7077`
is a standalone cluster), `sc://host:15002` (Spark Connect, with pyspark's
Connect client installed), or an existing SparkSession. Query parameters of a
`spark://` URL are Spark settings (`spark://local[4]?spark.driver.memory=4g`).
Tables come from the session's catalog, and tables the policy reads from
files (`source: "parquet:..."` or `"csv:..."`) are registered as temporary
views under their keys. A session it opens runs in UTC (as dpsql bins dates)
and, on a local master, with 2 shuffle partitions per core instead of 200.

What Spark needs from the rewrite: window functions (ROW_NUMBER and
DENSE_RANK over PARTITION BY unit, for contribution bounding) and a keyed
hash to order each unit's rows by, `xxhash64(secret, values...)`; sqlglot
writes both in the Spark dialect. Spark runs the whole bounded aggregate and
`toLocalIterator()` brings back its result a partition at a time, one row per
group: never a raw row. Each statement's jobs carry a tag of the thread that
runs it, so `interrupt` cancels them: a SparkContext job tag in a classic
session (the session's own tags miss the jobs toLocalIterator starts as it is
read), the session's tag (`interruptTag`) over Spark Connect.

Spark's messages can quote stored values (a failed cast, say), and PySpark
logs them too: only the error's condition name leaves the adapter, and the
loggers that would print the message are silenced.

Timestamps come back as TIMESTAMP_NTZ, the UTC wall clock (the session is in
UTC), naive, as from DuckDB: PySpark turns a TIMESTAMP into the Python
process's local time, which moved a group key with the process's time zone
and failed on the years 1 and 9999 (year 0 or 10000 there), after the charge
and only when such a row was in the result.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import re
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from dpsql.adapters.base import BATCH_ROWS, Batches, Running, ValueFacts, fetch_all
from dpsql.errors import BackendError
from dpsql.policy import Source

# Settings for a session dpsql starts (a URL's query overrides them): no web UI,
# which would show every query (and its hash secret) to anyone on the network,
# and no JVM log lines, which quote a failed task's values.
_DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.log.level": "FATAL",
}
_QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
# Shuffle partitions per core of a local master: Spark's default of 200 is
# sized for clusters. Adaptive execution coalesces them after the shuffle, so
# the gain is small (bench_spark.py --partitions 200 compares), but every map
# task still writes a block for each.
_PARTITIONS_PER_CORE = 2

# Adapters per SparkContext that dpsql started: the last one to close stops it.
_started: Counter[int] = Counter()
_lock = threading.Lock()


def is_spark_session(database: Any) -> bool:
    """Whether `database` is a SparkSession (classic or Connect), without importing pyspark."""
    return any(
        cls.__name__ == "SparkSession" and cls.__module__.startswith("pyspark.")
        for cls in type(database).__mro__
    )


class SparkAdapter:
    """Runs rewritten SQL on a SparkSession; see the module docstring."""

    dialect = "spark"

    def __init__(self, database: Any, sources: Mapping[str, Source] | None = None):
        try:
            from pyspark.errors import PySparkException
        except ImportError:
            raise BackendError(
                "the Spark backend needs PySpark: pip install 'pyspark>=4.0' (and Java 17)"
            ) from None
        self._errors: tuple[type[Exception], ...] = (PySparkException, *_py4j_errors())
        _quiet_query_loggers()
        self._on_close: Callable[[], None] = lambda: None  # stops what this adapter started
        self._views: list[str] = []
        self._running = Running()
        try:
            if is_spark_session(database):
                self._session = database
            elif str(database).lower().startswith("sc://"):
                self._session = self._connect(database)
            else:
                self._session = self._local_or_cluster(database)
            for key, source in (sources or {}).items():
                self._register(key, source)
        except BackendError:
            self.close()
            raise

    # -- opening ------------------------------------------------------------

    def _connect(self, url: str) -> Any:
        _check_reachable(url)
        try:
            # The Connect client's own builder: the classic one's remote() marks the whole
            # process as in Connect mode (an environment variable), after which a local
            # Spark could no longer start in it (SESSION_ALREADY_EXIST)
            from pyspark.sql.connect.session import SparkSession

            session = SparkSession.builder.remote(url).create()
        except ImportError as exc:
            raise BackendError(
                f"{url} needs pyspark's Spark Connect client ({exc}); "
                "pip install 'pyspark[connect]'"
            ) from None
        except self._errors as exc:
            raise BackendError(
                f"cannot open the Spark Connect session {url} ({_condition(exc)}); check that "
                "the Connect server runs there"
            ) from None
        self._on_close = session.stop
        # In UTC, as the sessions dpsql opens on a master are: the server's JVM may keep
        # another zone. (A Connect session takes runtime settings only: no partitions.)
        self._set(
            session,
            _session_conf(url),
            f"the Spark Connect server {url} refused it, and dpsql needs it to read dates",
        )
        return session

    def _local_or_cluster(self, url: str) -> Any:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        target, _, query = url.partition("?")
        master = target.split("://", 1)[1]
        if not master.startswith("local"):
            master = target  # spark://host:7077 is a standalone cluster's own URL
        settings = {**_session_conf(master), **dict(parse_qsl(query))}
        builder = SparkSession.builder.master(master).appName("dpsql")
        for name, value in {**_DEFAULT_CONF, **settings}.items():
            builder = builder.config(name, value)
        with _lock:
            fresh = SparkContext._active_spark_context is None
            try:
                # A running context (this process has one) is shared as it is:
                # getOrCreate would write the settings into its active session.
                base = (builder if fresh else SparkSession.builder).getOrCreate()
            except self._errors as exc:
                raise BackendError(
                    f"cannot start Spark for {url} ({_condition(exc)}); Spark needs Java 17 or "
                    "later on PATH or in JAVA_HOME"
                ) from None
            context = base.sparkContext
            if fresh or id(context) in _started:
                _started[id(context)] += 1
                self._on_close = lambda: _release(context)
        # A session of its own (same context and catalog): the temporary views
        # and settings of this adapter are not seen by, nor replace, anyone else's.
        session = base.newSession()
        if not fresh:
            self._set(
                session,
                {**_session_conf(context.master), **dict(parse_qsl(query))},
                "set it where the Spark context already running in this process is started",
            )
        return session

    def _set(self, session: Any, settings: Mapping[str, str], remedy: str) -> None:
        for name, value in settings.items():
            try:
                session.conf.set(name, value)
            except self._errors as exc:
                raise BackendError(
                    f"cannot set {name}={value} on the Spark session ({_condition(exc)}); {remedy}"
                ) from None

    def _register(self, key: str, source: Source) -> None:
        if self._temporary_view(key):
            # a session passed in: the source would replace the owner's view, and closing
            # would drop it from under them
            raise BackendError(
                f"the Spark session already has a temporary view '{key}', which the "
                f"policy's 'source:' for table '{key}' would replace; rename one of them, "
                "or pass a new session (spark.newSession())"
            )
        reader = self._session.read.format(source.format)
        if source.format == "csv":
            reader = reader.option("header", True).option("inferSchema", True)
        try:
            reader.load(source.path).createOrReplaceTempView(key)
        except self._errors as exc:
            raise BackendError(
                f"Spark cannot read the files of table '{key}' ({source.format}:{source.path}: "
                f"{_condition(exc)}); correct its 'source:' in the policy"
            ) from None
        self._views.append(key)

    def _temporary_view(self, name: str) -> bool:
        try:
            return bool(self._session.catalog.getTable(name).isTemporary)
        except self._errors:
            return False  # no such table or view

    # -- the Adapter protocol -----------------------------------------------

    def execute(self, sql: str) -> tuple[list[str], list[tuple]]:
        return fetch_all(self, sql)

    def snapshot(self) -> AbstractContextManager[bool]:
        """None: Spark reads the files as they are when each statement runs."""
        return nullcontext(False)

    @contextmanager
    def stream(self, sql: str, batch_rows: int = BATCH_ROWS) -> Iterator[tuple[list[str], Batches]]:
        tag = f"dpsql-{threading.get_ident()}"
        context = self._context()
        if context is None:
            self._session.addTag(tag)  # thread-local: only this thread's jobs carry it
        else:
            context.addJobTag(tag)  # thread-local too, and inherited by the iterator's jobs
            context.setInterruptOnCancel(True)  # cancelling stops running tasks at once
        try:
            with self._running.statement(tag):
                try:
                    frame = _timestamps_in_utc(self._session.sql(sql))
                    rows = frame.toLocalIterator(prefetchPartitions=True)
                except self._errors as exc:
                    raise self._error(exc) from None
                yield list(frame.columns), self._batches(rows, batch_rows)
        finally:
            if context is None:
                self._session.removeTag(tag)
            else:
                context.removeJobTag(tag)

    def _context(self) -> Any:
        """The classic session's SparkContext; None over Spark Connect, which has none."""
        if type(self._session).__module__.startswith("pyspark.sql.connect"):
            return None
        return self._session.sparkContext

    def _batches(self, rows: Iterator[Any], batch_rows: int) -> Batches:
        try:
            while batch := [tuple(row) for row in itertools.islice(rows, batch_rows)]:
                yield batch
        except self._errors as exc:
            raise self._error(exc) from None
        except (ValueError, OverflowError) as exc:
            # a value PySpark cannot make a Python one (a year beyond 1 to 9999): its
            # message quotes the value, so only its kind leaves
            raise self._running.failure("Spark", type(exc).__name__) from None

    def _error(self, exc: Exception) -> BackendError:
        return self._running.failure("Spark", _condition(exc))

    def interrupt(self, thread: int) -> None:
        context = self._context()
        cancel = self._session.interruptTag if context is None else context.cancelJobsWithTag
        self._running.interrupt(thread, cancel)

    def table_columns(self, name: str) -> dict[str, str] | None:
        try:
            fields = self._session.table(name).schema.fields
        except self._errors:
            return None
        return {field.name.lower(): field.dataType.simpleString() for field in fields}

    @functools.cached_property
    def identity(self) -> str:
        """The catalog the session reads: its warehouse, current catalog and database (the
        tables the policy names by path are in the policy, and so in every key already;
        temporary views a caller made are not seen)."""
        try:
            warehouse = self._session.conf.get("spark.sql.warehouse.dir")
            catalog = self._session.catalog.currentCatalog()
            database = self._session.catalog.currentDatabase()
        except self._errors as exc:
            raise self._error(exc) from None
        return f"spark:{warehouse}:{catalog}.{database}"

    def table_identities(self, name: str) -> set[tuple]:
        """The table or view `name` reads, as the session resolves it: a temporary view
        first, else the catalog's table in the current database (`census` and
        `default.census` are one table unless a view named census hides it)."""
        try:
            table = self._session.catalog.getTable(name)
        except self._errors:
            return set()
        namespace = tuple(part.lower() for part in table.namespace or ())
        return {(table.catalog, namespace, table.name.lower(), bool(table.isTemporary))}

    def unique_columns(self, name: str) -> set[str]:
        return set()  # Spark declares no enforced keys: every unit is bounded

    def value_facts(self, name: str, statistics: bool = False) -> ValueFacts:
        return ValueFacts()  # Spark enforces no CHECK constraint: every value is clamped

    def table_names(self) -> list[str]:
        """The tables and views of the current database (temporary views too)."""
        try:
            tables = self._session.catalog.listTables()
        except self._errors as exc:
            raise self._error(exc) from None
        return sorted(table.name.lower() for table in tables)

    def foreign_keys(self, name: str) -> dict[str, tuple[str, str]]:
        return {}  # Spark keeps no keys

    def close(self) -> None:
        try:
            for view in self._views:
                self._session.catalog.dropTempView(view)
        except self._errors:
            pass  # the session is already gone, and its views with it
        self._views = []
        stop, self._on_close = self._on_close, lambda: None
        stop()


CONNECT_PORT = 15002  # Spark Connect's default


def _check_reachable(url: str, seconds: float = 10.0) -> None:
    """Refuse a Spark Connect URL whose server does not answer: the Connect client would
    retry its first call for minutes before it gave up."""
    address = urlsplit(url.split("/;", 1)[0])  # sc://host:port/;token=...
    try:
        host, port = address.hostname or "localhost", address.port or CONNECT_PORT
    except ValueError as exc:  # a port that is not a number from 0 to 65535
        raise BackendError(
            f"{url} is not a Spark Connect URL ({exc}): write sc://host:port"
        ) from None
    try:
        socket.create_connection((host, port), timeout=seconds).close()
    except OSError as exc:
        raise BackendError(
            f"cannot reach the Spark Connect server at {host}:{port} ({exc.strerror or exc}); "
            "check that the Connect server runs there"
        ) from None


def _session_conf(master: str) -> dict[str, str]:
    """SQL settings for a session dpsql opens on `master` or a Spark Connect URL (a master
    URL's query overrides them).

    The session's time zone is UTC: dpsql bins dates and timestamps in UTC
    (synopses, running totals), as DuckDB reads them, and Spark would read a
    date literal, or turn a date into seconds, at the JVM's local time. A
    local master gets a few shuffle partitions per core instead of 200.
    """
    conf = {"spark.sql.session.timeZone": "UTC"}
    cores = _local_cores(master)
    if cores:
        conf["spark.sql.shuffle.partitions"] = str(_PARTITIONS_PER_CORE * cores)
    return conf


def _local_cores(master: str) -> int | None:
    """The cores of a local master (`local`, `local[4]`, `local[*]`, `local[4,2]`), else None."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master.strip())
    if match is None:
        return None
    cores = match.group(1) or "1"
    return (os.cpu_count() or 1) if cores == "*" else int(cores)


def _release(context: Any) -> None:
    """One adapter less on a SparkContext dpsql started; the last one stops it."""
    with _lock:
        _started[id(context)] -= 1
        if not _started[id(context)]:
            del _started[id(context)]
            context.stop()


def _condition(exc: Exception) -> str:
    """The error's condition name (e.g. CAST_INVALID_INPUT): never its message, which may
    quote a stored value."""
    name = getattr(exc, "getCondition", lambda: None)()
    return f"{type(exc).__name__} {name}" if name else type(exc).__name__


def _py4j_errors() -> tuple[type[Exception], ...]:
    """The JVM bridge's errors (a JVM that died); the Connect-only client has no py4j."""
    try:
        from py4j.protocol import Py4JError
    except ImportError:
        return ()
    return (Py4JError,)


def _quiet_query_loggers() -> None:
    # PySpark logs a failed query's message, values included, through these.
    from pyspark.logger import PySparkLogger

    for name in _QUERY_CONTEXT_LOGGERS:
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


def _timestamps_in_utc(frame: Any) -> Any:
    """`frame` with its TIMESTAMP columns cast to TIMESTAMP_NTZ (see the module's note)."""
    from pyspark.sql.types import TimestampType

    fields = frame.schema.fields
    if not any(isinstance(field.dataType, TimestampType) for field in fields):
        return frame
    return frame.select(
        *(
            frame[field.name].cast("timestamp_ntz").alias(field.name)
            if isinstance(field.dataType, TimestampType)
            else frame[field.name]
            for field in fields
        )
    )
