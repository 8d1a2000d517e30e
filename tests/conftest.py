"""Shared fixtures: the PUMS sample loaded into each backend, and policies for it.

The PUMS CSV files are read from DPSQL_PUMS_DIR (default: ../shared/data/pums
beside the repository); where that folder is absent (a fresh clone), or
DPSQL_PUMS_DIR is `generated`, tests run on a generated sample of the same shape
(tests/pums_sample.py), so the suite runs whole. Nothing from the real sample is
copied into the repository.

Backends: DuckDB always; PostgreSQL on the server DPSQL_TEST_POSTGRES_URL
names, else on one the session starts itself (initdb, as `nobody` when run as
root), else skipped with the reason;
Spark in local mode (marked `spark`: `-m spark` selects it, `-m "not spark"`
leaves it out; skipped with the reason without PySpark or Java), one
SparkSession for the whole test session with the PUMS tables as Parquet views.
The PUMS tables are loaded once per session into a DuckDB file and into a
PostgreSQL schema of their own (dropped at the end). Tests that run on every
backend take the `backend` fixture and carry `@on_every_backend`.
"""

from __future__ import annotations

import atexit
import copy
import decimal
import importlib.util
import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest

from dpsql.adapters.duckdb import LOCKED as _LOCKED

REPO = Path(__file__).resolve().parent.parent
PUMS_DIR = Path(os.environ.get("DPSQL_PUMS_DIR", REPO.parent / "shared" / "data" / "pums"))
PUMS_TABLES = {
    "pums": "PUMS.csv",
    "pums_pid": "PUMS_pid.csv",
    "pums_dup": "PUMS_dup.csv",
    "pums_null": "PUMS_null.csv",
}

_COLUMNS = {
    "age": {"type": "int", "lower": 0, "upper": 100},
    "sex": {"type": "int", "values": [0, 1]},
    "educ": {"type": "int", "lower": 1, "upper": 16, "public": True},
    "race": {"type": "int", "values": [1, 2, 3, 4, 5, 6]},
    "income": {"type": "float", "lower": 0, "upper": 500000},
    "married": {"type": "int", "values": [0, 1]},
}


def _user_level(max_groups: int = 1, max_rows: int = 1) -> dict:
    return {
        "privacy_unit": "pid",
        "max_groups_per_unit": max_groups,
        "max_rows_per_unit": max_rows,
        "columns": {"pid": {"type": "int", "private": True}, **copy.deepcopy(_COLUMNS)},
    }


def pums_policy(**overrides: object) -> dict:
    """A policy over all four PUMS tables; keyword arguments replace top-level keys."""
    policy = {
        "version": 1,
        "defaults": {"epsilon_per_query": 1.0, "delta": 1e-6},
        "analysts": {"default": {"epsilon": 1000.0, "delta": 1e-3}},
        "tables": {
            "pums": {"columns": copy.deepcopy(_COLUMNS)},
            "pums_pid": _user_level(),
            "pums_dup": _user_level(max_groups=2, max_rows=2),
            "pums_null": _user_level(),
        },
    }
    policy.update(overrides)
    return policy


def real_pums() -> Path | None:
    """The folder of the real PUMS sample, or None where it is absent or not wanted."""
    if os.environ.get("DPSQL_PUMS_DIR") == "generated":
        return None
    readable = all(os.access(PUMS_DIR / name, os.R_OK) for name in PUMS_TABLES.values())
    return PUMS_DIR if readable else None


_GENERATED: list[Path] = []  # this process's generated sample, written on first use


def require_pums() -> Path:
    """The folder of the PUMS CSV files: the real sample, else the generated one."""
    folder = real_pums()
    if folder is not None:
        return folder
    if not _GENERATED:
        from pums_sample import write_sample

        # per process (each xdist worker has its own); the seeded files are identical
        folder = Path(tempfile.mkdtemp(prefix="dpsql-pums-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _GENERATED.append(write_sample(folder))
    return _GENERATED[0]


def load_pums(connection: duckdb.DuckDBPyConnection, tables: dict[str, str] = PUMS_TABLES) -> None:
    folder = require_pums()
    for table, name in tables.items():
        connection.execute(
            f"CREATE OR REPLACE TABLE {table} AS SELECT * FROM read_csv(?, header=true)",
            [str(folder / name)],
        )


@pytest.fixture(scope="session")
def pums_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DuckDB file holding the four PUMS tables (read-only use: copy it to modify)."""
    path = tmp_path_factory.mktemp("pums") / "pums.duckdb"
    with duckdb.connect(str(path)) as connection:
        load_pums(connection)
    return path


# -- fuzzing budgets -------------------------------------------------------------

# DPSQL_FUZZ=long (or HYPOTHESIS_PROFILE=long, its older name) runs the fuzzers at
# their full budgets, with random seeds; without it they run a smaller, derandomised
# number of examples, to keep the suite within its time on two cores.
FUZZ_LONG = "long" in (os.environ.get("DPSQL_FUZZ"), os.environ.get("HYPOTHESIS_PROFILE"))


def fuzz_examples(ci: int, long: int) -> int:
    """The number of examples a fuzzer runs: DPSQL_FUZZ_EXAMPLES if set, else `long`
    under DPSQL_FUZZ=long, else `ci`."""
    return int(os.environ.get("DPSQL_FUZZ_EXAMPLES", long if FUZZ_LONG else ci))


# -- backends ------------------------------------------------------------------

BACKENDS = ["duckdb", "postgres", pytest.param("spark", marks=pytest.mark.spark)]
on_every_backend = pytest.mark.parametrize("backend", BACKENDS, indirect=True)
PG_BIN = Path("/usr/lib/postgresql/15/bin")
# DuckDB's types of the loaded CSV columns, in PostgreSQL's words
_PG_TYPES = {"BIGINT": "bigint", "INTEGER": "integer", "DOUBLE": "double precision",
             "VARCHAR": "text", "BOOLEAN": "boolean", "DATE": "date"}  # fmt: skip


class RawDatabase:
    """Direct access to a backend's tables, for the truth a test compares against."""

    def __init__(self, connection: Any, close: Any = None):
        self._connection = connection
        self._close = close or connection.close

    def rows(self, sql: str) -> list[tuple]:
        """The rows of `sql`, with DECIMAL values as floats (PostgreSQL returns them for SUM)."""
        rows = self._connection.execute(sql).fetchall()
        return [tuple(float(v) if isinstance(v, decimal.Decimal) else v for v in r) for r in rows]

    def replace_table(self, name: str, select: str) -> None:
        if isinstance(self._connection, duckdb.DuckDBPyConnection):
            self._connection.execute(f"CREATE OR REPLACE TABLE {name} AS {select}")
        else:
            self._connection.execute(f"DROP TABLE IF EXISTS {name}")
            self._connection.execute(f"CREATE TABLE {name} AS {select}")

    def close(self) -> None:
        self._close()


@dataclass
class Backend:
    """One backend holding the PUMS tables: what dpsql.connect takes, and raw access."""

    name: str
    dialect: str
    database: Any  # a DuckDB path, a postgresql:// URL or a SparkSession
    admin_url: str | None = None  # PostgreSQL: a URL with rights to create schemas

    def raw(self) -> RawDatabase:
        if self.name == "spark":
            return RawDatabase(_SparkSQL(self.database), close=lambda: None)
        if self.name == "duckdb":
            return RawDatabase(duckdb.connect(self.database, read_only=True, config=_LOCKED))
        import psycopg

        return RawDatabase(psycopg.connect(self.database, autocommit=True))

    def scratch(self, tables: dict[str, str]) -> RawDatabase:
        """A writable database of its own holding copies of PUMS tables (new name -> table)."""
        if self.name == "spark":
            pytest.skip(
                "Spark: tests that rewrite tables per statement are too slow there (a Spark "
                "job each); bounding on neighbouring databases runs batched in test_spark.py"
            )
        if self.name == "duckdb":
            connection = duckdb.connect()
            load_pums(connection, {new: PUMS_TABLES[old] for new, old in tables.items()})
            return RawDatabase(connection)
        import psycopg

        schema = _fresh_schema()
        main = _schema_of(self.database)
        admin = psycopg.connect(self.admin_url, autocommit=True)
        admin.execute(f"CREATE SCHEMA {schema}")
        for new, old in tables.items():
            admin.execute(f"CREATE TABLE {schema}.{new} AS SELECT * FROM {main}.{old}")
        admin.execute(f"SET search_path = {schema}")

        def drop() -> None:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")
            admin.close()

        return RawDatabase(admin, drop)


def _fresh_schema() -> str:
    # one schema per test session: several sessions may share the server
    return f"dpsql_test_{secrets.token_hex(4)}"


def _schema_of(url: str) -> str:
    return url.rsplit("search_path%3D", 1)[1]


def _with_search_path(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"


@contextmanager
def cancelling(connection: Any, every: float) -> Iterator[None]:
    """Send `connection`'s cancel request every `every` seconds until the block ends: a
    cancel that reaches the server before its query is ignored, so it is sent again."""
    done = threading.Event()

    def cancel() -> None:
        while not done.wait(every):
            connection.cancel_safe()

    canceller = threading.Thread(target=cancel)
    canceller.start()
    try:
        yield
    finally:
        done.set()
        canceller.join()


@contextmanager
def postgres_tables(url: str, tables: dict[str, list[tuple]]) -> Iterator[str]:
    """A fresh schema holding `tables` ("name (column type, ...)" -> rows), dropped after;
    yields a URL whose search_path is that schema."""
    import psycopg

    schema = _fresh_schema()
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            for spec, rows in tables.items():
                admin.execute(f"CREATE TABLE {schema}.{spec}")
                if rows:
                    values = ", ".join(["%s"] * len(rows[0]))
                    with admin.cursor() as cursor:
                        cursor.executemany(
                            f"INSERT INTO {schema}.{spec.split()[0]} VALUES ({values})", rows
                        )
            yield _with_search_path(url, schema)
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(scope="session")
def duckdb_backend(pums_db: Path) -> Backend:
    return Backend("duckdb", "duckdb", str(pums_db))


_POSTGRES: dict[str, str] = {}  # this process's server URL, or why there is none


def postgres_server_url() -> str:
    """A PostgreSQL server's URL: DPSQL_TEST_POSTGRES_URL, else one this process starts
    on first use (stopped when it exits); skips the test, saying why, if neither can be."""
    url = os.environ.get("DPSQL_TEST_POSTGRES_URL")
    if url:
        return url
    if not _POSTGRES:
        try:
            _POSTGRES["url"] = _start_postgres()
        except RuntimeError as exc:
            _POSTGRES["why"] = f"no PostgreSQL: set DPSQL_TEST_POSTGRES_URL ({exc})"
    if "why" in _POSTGRES:
        pytest.skip(_POSTGRES["why"])
    return _POSTGRES["url"]


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """A PostgreSQL server: DPSQL_TEST_POSTGRES_URL, else one of this process's own."""
    return postgres_server_url()


def _as_server_user(folder: Path) -> list[str]:
    """The prefix that runs a PostgreSQL program as a user it accepts: initdb and postgres
    refuse root (pytest-postgresql has no way round that), so root runs them as nobody."""
    if os.geteuid() != 0:
        return []
    shutil.chown(folder, "nobody")
    return ["runuser", "-u", "nobody", "--"]


def _start_postgres() -> str:
    """initdb and start a throwaway server on a free loopback port, stopped and deleted
    when the process exits; RuntimeError saying why if it cannot start."""
    import socket
    import subprocess

    if not (PG_BIN / "pg_ctl").exists():
        raise RuntimeError(f"no pg_ctl in {PG_BIN}")
    folder = Path(tempfile.mkdtemp(prefix="dpsql-pg-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    data = folder / "data"
    prefix = _as_server_user(folder)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    run = {"check": True, "capture_output": True}
    try:
        subprocess.run([*prefix, PG_BIN / "initdb", "-D", data, "-U", "postgres", "-A", "trust",
                        "--no-sync"], **run)  # fmt: skip
        subprocess.run([*prefix, PG_BIN / "pg_ctl", "-D", data, "-o", options, "-w",
                        "-l", folder / "log", "start"], **run)  # fmt: skip
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(exc.stderr.decode(errors="replace")[-300:]) from None
    # registered after rmtree, so it runs first
    atexit.register(subprocess.run, [*prefix, PG_BIN / "pg_ctl", "-D", data, "-m", "fast", "stop"],
                    capture_output=True)  # fmt: skip
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


@pytest.fixture(scope="session")
def postgres_backend(postgres_url: str, pums_db: Path) -> Iterator[Backend]:
    import psycopg

    try:
        admin = psycopg.connect(postgres_url, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL at DPSQL_TEST_POSTGRES_URL is unreachable: {exc}")
    schema = _fresh_schema()
    admin.execute(f"CREATE SCHEMA {schema}")
    try:
        _load_pums_postgres(admin, schema, pums_db)
        yield Backend("postgres", "postgres", _with_search_path(postgres_url, schema), postgres_url)
    finally:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()


def _load_pums_postgres(admin: Any, schema: str, pums_db: Path) -> None:
    """The PUMS tables with the column types DuckDB gave them, filled by COPY."""
    folder = require_pums()
    with duckdb.connect(str(pums_db), read_only=True, config=_LOCKED) as source:
        for table, name in PUMS_TABLES.items():
            columns = source.execute(f"DESCRIBE {table}").fetchall()
            spec = ", ".join(f"{c[0]} {_PG_TYPES[c[1]]}" for c in columns)
            admin.execute(f"CREATE TABLE {schema}.{table} ({spec})")
            with admin.cursor().copy(
                f"COPY {schema}.{table} FROM STDIN WITH (FORMAT csv, HEADER true)"
            ) as copy_in:
                copy_in.write((folder / name).read_bytes())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: runs on Spark in local mode (needs PySpark, Java)")


class _SparkSQL:
    """A SparkSession behind RawDatabase's execute(sql).fetchall(); the SQL is read as
    dpsql reads it on Spark (sqlglot's Spark dialect: "x" is a string there)."""

    def __init__(self, session: Any):
        self._session = session

    def execute(self, sql: str) -> Any:
        import sqlglot

        rows = self._session.sql(sqlglot.transpile(sql, read="spark", write="spark")[0]).collect()
        return _Fetched([tuple(row) for row in rows])


@dataclass
class _Fetched:
    rows: list[tuple]

    def fetchall(self) -> list[tuple]:
        return self.rows


_SPARK: dict[str, Any] = {}  # the one local SparkSession, or why there is none


def _spark() -> Any:
    """The shared local SparkSession (started on first call), or the reason it cannot run."""
    if not _SPARK:
        if importlib.util.find_spec("pyspark") is None:
            _SPARK["why"] = "Spark tests need PySpark: pip install 'pyspark>=4.0'"
        elif not (os.environ.get("JAVA_HOME") or shutil.which("java")):
            _SPARK["why"] = "Spark tests need Java 17 or later (on PATH or in JAVA_HOME)"
        else:
            from pyspark.sql import SparkSession

            _SPARK["session"] = (
                SparkSession.builder.master("local[2]").appName("dpsql-tests")
                .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "2").config("spark.log.level", "ERROR")
                .getOrCreate()
            )  # fmt: skip
    return _SPARK.get("session") or _SPARK["why"]


def pytest_collection_finish(session: pytest.Session) -> None:
    # PySpark forks its JVM with a preexec_fn, which can crash in a process that
    # earlier tests filled with threads and native libraries: start it first.
    if any(item.get_closest_marker("spark") for item in session.items):
        _spark()


@pytest.fixture(scope="session")
def spark_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local SparkSession for the test session, the PUMS tables in it as Parquet views."""
    session = _spark()
    if isinstance(session, str):
        pytest.skip(session)
    folder = tmp_path_factory.mktemp("spark")
    with duckdb.connect() as source:
        load_pums(source)
        for table in PUMS_TABLES:
            source.execute(f"COPY {table} TO '{folder / table}.parquet' (FORMAT parquet)")
    for table in PUMS_TABLES:
        session.read.parquet(f"{folder / table}.parquet").createOrReplaceTempView(table)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_backend(spark_session: Any) -> Backend:
    return Backend("spark", "spark", spark_session)


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> Backend:
    """The backend a test runs on: DuckDB unless parametrised by `@on_every_backend`."""
    return request.getfixturevalue(f"{getattr(request, 'param', 'duckdb')}_backend")


@pytest.fixture
def policy() -> dict:
    return pums_policy()


@pytest.fixture
def connect(backend: Backend, tmp_path: Path):
    """dpsql.connect to the PUMS tables on `backend` with a fresh ledger per test."""
    import dpsql

    opened = []

    def _connect(policy: dict | None = None, **options: object) -> dpsql.Connection:
        options.setdefault("ledger", tmp_path / "ledger.sqlite")
        options.setdefault("seed", 7)
        connection = dpsql.connect(backend.database, policy=policy or pums_policy(), **options)
        opened.append(connection)
        return connection

    yield _connect
    for connection in opened:
        connection.close()


@pytest.fixture(params=["duckdb", "postgres"])
def visits(request, tmp_path):
    """A connection to a table with text, date and timestamp columns, on each backend."""
    create = (
        "CREATE TABLE {t} AS SELECT (i % 100)::SMALLINT AS age, CASE WHEN i % 2 = 0 "
        "THEN 'CA' ELSE 'NY' END AS state, DATE '2020-01-01' + i::INT AS day, "
        "TIMESTAMP '2020-01-01' + i * INTERVAL '1 hour' AS ts FROM {rows}"
    )
    span = {"lower": "2020-01-01", "upper": "2021-12-31"}
    columns = {"age": {"type": "int", "lower": 0, "upper": 100}, "state": {"type": "string"},
               "day": {"type": "date", **span}, "ts": {"type": "timestamp", **span}}  # fmt: skip
    if request.param == "duckdb":
        import duckdb

        database, table = duckdb.connect(), "visits"
        database.execute(create.format(t=table, rows="range(200) r(i)"))
        cleanup = database.close
    else:
        import uuid

        import psycopg

        database = request.getfixturevalue("postgres_url")
        schema = f"visits_{uuid.uuid4().hex[:8]}"
        table = f"{schema}.visits"
        admin = psycopg.connect(database, autocommit=True)
        admin.execute(f"CREATE SCHEMA {schema}")
        admin.execute(create.format(t=table, rows="generate_series(0, 199) r(i)"))

        def cleanup():
            admin.execute(f"DROP SCHEMA {schema} CASCADE")
            admin.close()

    import dpsql

    policy = {"version": 1, "analysts": {"default": {"epsilon": 1000.0, "delta": 1e-3}},
              "tables": {table: {"columns": columns}}}  # fmt: skip
    connection = dpsql.connect(database, policy=policy, ledger=tmp_path / "l.sqlite")
    yield connection, table
    connection.close()
    cleanup()
