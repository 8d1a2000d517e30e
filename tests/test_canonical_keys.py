"""Released group keys are a function of their group alone (sql/keys.py).

Each case is the attack that found the hazard: one person (unit 1, the first
unit the bounding windows meet) decides how a large group's key is written,
unless keys are canonical. The same query runs on neighbouring databases,
with and without that person; the released keys must be written identically
(type, value, sign bit), and public-domain counts may move by one person only.
"""

from __future__ import annotations

import math
import struct
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pytest
from conftest import postgres_tables

import dpsql
from dpsql.errors import QueryRefused

UNITS = 300
EPSILON = 50.0  # noise far below one person, so public-domain counts read near exactly


def _policy(table: str, columns: dict) -> dict:
    return {
        "version": 1,
        "defaults": {"epsilon_per_query": EPSILON, "delta": 1e-6},
        "analysts": {"default": {"epsilon": 1e6, "delta": 0.5}},
        "tables": {
            table: {
                "privacy_unit": "pid",
                "max_rows_per_unit": 1,
                "max_groups_per_unit": 1,
                "columns": {"pid": {"type": "int", "private": True}, **columns},
            }
        },
    }


def _written(value: object) -> tuple:
    """Everything a released value shows: its type, its text, a float's bits."""
    bits = struct.pack(">d", value).hex() if isinstance(value, float) else None
    return type(value).__name__, repr(value), bits


def _released(connection: dpsql.Connection, sql: str) -> list[tuple]:
    cursor = connection.cursor()
    cursor.execute(sql)
    return cursor.fetchall()


def _neighbours(
    opener: Callable[[bool], Iterator[dpsql.Connection]], sql: str
) -> tuple[list[tuple], list[tuple]]:
    """The release of `sql` with unit 1 and without it."""
    results = []
    for with_first in (True, False):
        with opener(with_first) as connection:
            results.append(_released(connection, sql))
    return results[0], results[1]


def _rows(first: tuple, others: tuple, with_first: bool) -> list[tuple]:
    """Unit 1 holding `first`, units 2..UNITS holding `others`."""
    rows = [(pid, *others) for pid in range(2, UNITS + 1)]
    return ([(1, *first)] if with_first else []) + rows


# -- DuckDB -------------------------------------------------------------------


def _duckdb_opener(tmp_path: Path, ddl: str, columns: dict, first: tuple, others: tuple):
    @contextmanager
    def opener(with_first: bool) -> Iterator[dpsql.Connection]:
        database = duckdb.connect()
        database.execute(f"CREATE TABLE people ({ddl})")
        database.executemany(
            f"INSERT INTO people VALUES ({', '.join(['?'] * (len(first) + 1))})",
            _rows(first, others, with_first),
        )
        ledger = tmp_path / f"{uuid.uuid4().hex}.sqlite"
        connection = dpsql.connect(database, policy=_policy("people", columns), ledger=ledger)
        try:
            yield connection
        finally:
            connection.close()
            database.close()

    return opener


def test_duckdb_signed_zero_key(tmp_path):
    opener = _duckdb_opener(
        tmp_path,
        "pid INT, income DOUBLE",
        {"income": {"type": "float", "lower": 0, "upper": 100000}},
        (20000.0,),
        (10000.0,),
    )
    sql = (
        "SELECT CASE WHEN income >= 17000 THEN -0.0 ELSE 0.0 END AS k, COUNT(*) "
        "FROM people GROUP BY 1"
    )
    before, after = _neighbours(opener, sql)
    assert [_written(r[0]) for r in before] == [_written(r[0]) for r in after]
    assert [_written(r[0]) for r in before] == [_written(0.0)]


def test_duckdb_nan_key(tmp_path):
    """Every NaN is one group; its key is one NaN, whichever sign the first row's had."""
    opener = _duckdb_opener(
        tmp_path, "pid INT, x DOUBLE", {"x": {"type": "float"}}, (-math.nan,), (math.nan,)
    )
    before, after = _neighbours(opener, "SELECT x, COUNT(*) FROM people GROUP BY x")
    assert [_written(r[0]) for r in before] == [_written(r[0]) for r in after]
    assert len(before) == 1 and math.isnan(before[0][0])


@pytest.mark.parametrize("domain", [None, ["Smith", "Jones"]])
def test_duckdb_case_insensitive_text_key(tmp_path, domain):
    """Under COLLATE NOCASE 'Smith' and 'smith' were one group keyed by the first row."""
    column = {"type": "string", **({"values": domain} if domain else {})}
    opener = _duckdb_opener(
        tmp_path, "pid INT, name VARCHAR COLLATE NOCASE", {"name": column}, ("Smith",), ("smith",)
    )
    before, after = _neighbours(opener, "SELECT name, COUNT(*) FROM people GROUP BY name")
    if domain is None:  # 'Smith' alone is one person: suppressed; 'smith' is released
        assert [r[0] for r in before] == [r[0] for r in after] == ["smith"]
    else:  # every domain key, counted on exact spelling: one person moves 'Smith' by one
        assert [r[0] for r in before] == [r[0] for r in after] == ["Jones", "Smith"]
        for (_, count_before), (_, count_after) in zip(before, after, strict=True):
            assert abs(count_before - count_after) <= 1.5


def test_duckdb_default_collation_text_key(tmp_path):
    """A database-wide case-insensitive default collation is overridden too."""

    @contextmanager
    def opener(with_first: bool) -> Iterator[dpsql.Connection]:
        database = duckdb.connect()
        database.execute("SET default_collation = 'nocase'")
        database.execute("CREATE TABLE people (pid INT, name VARCHAR)")
        database.executemany(
            "INSERT INTO people VALUES (?, ?)", _rows(("Smith",), ("smith",), with_first)
        )
        policy = _policy("people", {"name": {"type": "string"}})
        connection = dpsql.connect(
            database, policy=policy, ledger=tmp_path / f"{uuid.uuid4().hex}.sqlite"
        )
        try:
            yield connection
        finally:
            connection.close()
            database.close()

    before, after = _neighbours(opener, "SELECT name, COUNT(*) FROM people GROUP BY name")
    assert [r[0] for r in before] == [r[0] for r in after] == ["smith"]


def test_interval_key_refused(tmp_path):
    opener = _duckdb_opener(
        tmp_path,
        "pid INT, age INT",
        {"age": {"type": "int", "lower": 0, "upper": 100}},
        (40,),
        (20,),
    )
    with opener(True) as connection, pytest.raises(QueryRefused, match="intervals"):
        _released(
            connection,
            "SELECT CASE WHEN age > 30 THEN INTERVAL '1 day' ELSE INTERVAL '24 hours' END AS k, "
            "COUNT(*) FROM people GROUP BY 1",
        )


# -- PostgreSQL ---------------------------------------------------------------


def _postgres_opener(url: str, tmp_path: Path, spec: str, columns: dict, first, others, setup=""):
    @contextmanager
    def opener(with_first: bool) -> Iterator[dpsql.Connection]:
        rows = _rows(first, others, with_first)
        with postgres_tables(url, {f"people ({spec})": rows}) as scoped:
            ledger = tmp_path / f"{uuid.uuid4().hex}.sqlite"
            connection = dpsql.connect(scoped, policy=_policy("people", columns), ledger=ledger)
            try:
                yield connection
            finally:
                connection.close()

    return opener


def test_postgres_signed_zero_key(postgres_url, tmp_path):
    opener = _postgres_opener(
        postgres_url,
        tmp_path,
        "pid INT, income DOUBLE PRECISION, age INT",
        {
            "income": {"type": "float", "lower": 0, "upper": 100000},
            "age": {"type": "int", "lower": 0, "upper": 100},
        },
        (20000.0, 40),
        (10000.0, 40),
    )
    sql = (
        "SELECT CASE WHEN income >= 17000 THEN -0.0 ELSE 0.0 END AS k, COUNT(*) "
        "FROM people WHERE age BETWEEN 30 AND 50 GROUP BY 1"
    )
    before, after = _neighbours(opener, sql)
    assert [_written(r[0]) for r in before] == [_written(r[0]) for r in after] == [_written(0.0)]


def test_postgres_numeric_scale_key(postgres_url, tmp_path):
    """A NUMERIC keeps its scale: 1 and 1.00 compare equal but print differently."""
    opener = _postgres_opener(
        postgres_url,
        tmp_path,
        "pid INT, amount NUMERIC(10, 2), n INT",
        {
            "amount": {"type": "float", "lower": 0, "upper": 100},
            "n": {"type": "int", "lower": 0, "upper": 10},
        },
        (10, 1),
        (1, 1),
    )
    sql = "SELECT CASE WHEN amount > 5 THEN n ELSE amount END AS k, COUNT(*) FROM people GROUP BY 1"
    before, after = _neighbours(opener, sql)
    assert [_written(r[0]) for r in before] == [_written(r[0]) for r in after] == [_written(1.0)]


def test_postgres_char_padding_key(postgres_url, tmp_path):
    """CHAR compares without trailing spaces, but a CHAR of no length outputs them."""
    opener = _postgres_opener(
        postgres_url,
        tmp_path,
        "pid INT, short CHAR(1), wide CHAR(2), age INT",
        {
            "short": {"type": "string"},
            "wide": {"type": "string"},
            "age": {"type": "int", "lower": 0, "upper": 100},
        },
        ("a", "a", 40),
        ("a", "a", 20),
    )
    sql = (
        "SELECT CASE WHEN age > 30 THEN wide ELSE short END AS code, COUNT(*) "
        "FROM people GROUP BY 1"
    )
    before, after = _neighbours(opener, sql)
    assert [r[0] for r in before] == [r[0] for r in after] == ["a"]


@pytest.mark.parametrize("domain", [None, ["Smith", "Jones"]])
def test_postgres_nondeterministic_collation_key(postgres_url, tmp_path, domain):
    import psycopg

    collation = f"ci_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(
            f"CREATE COLLATION public.{collation} "
            "(provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
        )
    try:
        column = {"type": "string", **({"values": domain} if domain else {})}
        opener = _postgres_opener(
            postgres_url,
            tmp_path,
            f"pid INT, name TEXT COLLATE public.{collation}",
            {"name": column},
            ("Smith",),
            ("smith",),
        )
        before, after = _neighbours(opener, "SELECT name, COUNT(*) FROM people GROUP BY name")
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(f"DROP COLLATION public.{collation}")
    if domain is None:
        assert [r[0] for r in before] == [r[0] for r in after] == ["smith"]
    else:
        assert [r[0] for r in before] == [r[0] for r in after] == ["Jones", "Smith"]
        for (_, count_before), (_, count_after) in zip(before, after, strict=True):
            assert abs(count_before - count_after) <= 1.5


# -- SQLite through SQLAlchemy -----------------------------------------------


def _sqlite_opener(tmp_path: Path, ddl: str, columns: dict, first: tuple, others: tuple):
    import sqlite3

    @contextmanager
    def opener(with_first: bool) -> Iterator[dpsql.Connection]:
        path = tmp_path / f"{uuid.uuid4().hex}.db"
        with sqlite3.connect(path) as database:
            database.execute(f"CREATE TABLE people ({ddl})")
            database.executemany(
                f"INSERT INTO people VALUES ({', '.join(['?'] * (len(first) + 1))})",
                _rows(first, others, with_first),
            )
        database.close()
        connection = dpsql.connect(
            f"sqlite:///{path}",
            policy=_policy("people", columns),
            ledger=tmp_path / f"{uuid.uuid4().hex}.sqlite",
        )
        try:
            yield connection
        finally:
            connection.close()

    return opener


def test_sqlite_key_type(tmp_path):
    """SQLite's values carry their own types: the key's type was the first row's."""
    opener = _sqlite_opener(
        tmp_path,
        "pid INTEGER, income REAL",
        {"income": {"type": "float", "lower": 0, "upper": 100000}},
        (20000.0,),
        (10000.0,),
    )
    sql = (
        "SELECT CASE WHEN income >= 17000 THEN 1 ELSE 1.0 END AS k, COUNT(*) FROM people GROUP BY 1"
    )
    before, after = _neighbours(opener, sql)
    assert [_written(r[0]) for r in before] == [_written(r[0]) for r in after]


def test_sqlite_nocase_text_key(tmp_path):
    opener = _sqlite_opener(
        tmp_path, "pid INTEGER, name TEXT COLLATE NOCASE", {"name": {"type": "string"}},
        ("Smith",), ("smith",),
    )  # fmt: skip
    before, after = _neighbours(opener, "SELECT name, COUNT(*) FROM people GROUP BY name")
    assert [r[0] for r in before] == [r[0] for r in after] == ["smith"]


# -- Spark --------------------------------------------------------------------


@pytest.mark.spark
def test_spark_case_insensitive_text_key(spark_session, tmp_path):
    """Spark 4's UTF8_LCASE collation groups 'Smith' with 'smith'."""

    @contextmanager
    def opener(with_first: bool) -> Iterator[dpsql.Connection]:
        table = f"people_{uuid.uuid4().hex[:8]}"
        spark_session.sql(f"CREATE TABLE {table} (pid INT, name STRING COLLATE UTF8_LCASE)")
        values = ", ".join(
            f"({pid}, '{name}')" for pid, name in _rows(("Smith",), ("smith",), with_first)
        )
        spark_session.sql(f"INSERT INTO {table} VALUES {values}")
        policy = _policy(table, {"name": {"type": "string"}})
        connection = dpsql.connect(
            spark_session, policy=policy, ledger=tmp_path / f"{uuid.uuid4().hex}.sqlite"
        )
        try:
            yield connection
        finally:
            connection.close()
            spark_session.sql(f"DROP TABLE {table}")

    results = []
    for with_first in (True, False):
        with opener(with_first) as connection:
            (table,) = connection.session.policy.tables
            sql = f"SELECT name, COUNT(*) FROM {table} GROUP BY name"
            results.append(_released(connection, sql))
    assert [r[0] for r in results[0]] == [r[0] for r in results[1]] == ["smith"]
