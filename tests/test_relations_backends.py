"""Relational queries (joins, CTEs, per-unit subqueries, UNION ALL, IN over public tables,
keys from public tables) on SQLAlchemy over a SQLite file and on Spark in local mode,
answered near the truth at a large epsilon, on the small TPC-H-shaped database of
tests/tpch.py. Spark keeps no keys, so there lineitem (whose unit is read through a
reference to a kept key) is refused and the queries leave it out."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
import tpch

import dpsql

TABLES = ("region", "nation", "part", "supplier", "customer", "orders", "lineitem")
WITHOUT_REFERENCES = [
    # per nation: the keys read from the public table, every nation released
    "SELECT n.n_name, COUNT(*), SUM(c.c_acctbal) FROM customer c JOIN nation n "
    "ON c.c_nationkey = n.n_nationkey JOIN region r ON n.n_regionkey = r.r_regionkey "
    "WHERE r.r_name = 'ASIA' GROUP BY n.n_name",
    "SELECT c.c_mktsegment, COUNT(*), AVG(o.o_totalprice) FROM customer c JOIN orders o "
    "ON c.c_custkey = o.o_custkey GROUP BY c.c_mktsegment",
    "WITH recent AS (SELECT * FROM orders WHERE o_orderdate >= DATE '1997-01-01') "
    "SELECT COUNT(*), SUM(o_totalprice) FROM recent",
    "SELECT n, COUNT(*) FROM (SELECT o_custkey, COUNT(*) AS n FROM orders "
    "WHERE o_orderstatus = 'F' GROUP BY o_custkey) t GROUP BY n",
    "SELECT COUNT(*) FROM (SELECT o_custkey FROM orders UNION ALL SELECT c_custkey "
    "FROM customer) u",
    "SELECT COUNT(*) FROM customer WHERE c_nationkey IN (SELECT n_nationkey FROM nation "
    "WHERE n_regionkey = 1)",
]
WITH_REFERENCES = [
    "SELECT l_returnflag, COUNT(*), SUM(l_quantity) FROM lineitem "
    "WHERE l_shipdate <= DATE '1998-09-01' GROUP BY l_returnflag",
    "SELECT n.n_name, SUM(l.l_extendedprice * (1 - l.l_discount)) AS revenue "
    "FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
    "JOIN lineitem l ON l.l_orderkey = o.o_orderkey "
    "JOIN nation n ON c.c_nationkey = n.n_nationkey "
    "JOIN region r ON n.n_regionkey = r.r_regionkey "
    "WHERE r.r_name = 'ASIA' AND o.o_orderdate >= DATE '1994-01-01' GROUP BY n.n_name",
]


@pytest.fixture(scope="module")
def warehouse() -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect()
    tpch.generate(connection, 0.001)
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def owned() -> Iterator[duckdb.DuckDBPyConnection]:
    """The truth's database: without the rows of nobody (orders without a customer, and
    their lineitems), which every release leaves out."""
    connection = duckdb.connect()
    tpch.generate(connection, 0.001)
    connection.execute(
        "DELETE FROM lineitem WHERE l_orderkey IN "
        "(SELECT o_orderkey FROM orders WHERE o_custkey IS NULL)"
    )
    connection.execute("DELETE FROM orders WHERE o_custkey IS NULL")
    yield connection
    connection.close()


def _close(released: list[tuple], truth: list[tuple], accuracy: dict, names: list[str], sql):
    width = len(names) - len(accuracy)  # the keys, then the noisy values
    by_key = {tuple(row[:width]): row[width:] for row in truth}
    assert {tuple(row[:width]) for row in released} >= set(by_key), sql
    for row in released:
        exact_row = by_key.get(tuple(row[:width]), [0] * (len(row) - width))
        for name, value, exact in zip(names[width:], row[width:], exact_row, strict=True):
            item = accuracy.get(name)
            room = 3 * item.interval95 if item is not None and item.interval95 else 0
            exact = float(exact or 0)
            assert math.isclose(value, exact, rel_tol=0.01, abs_tol=room + 1e-6), (sql, row)


def _answer(connection, sql: str):
    cursor = connection.execute(sql)
    return cursor.fetchall(), cursor.accuracy, [c[0] for c in cursor.description]


# -- SQLAlchemy over SQLite ------------------------------------------------------------


@pytest.fixture(scope="module")
def sqlite_url(warehouse, tmp_path_factory) -> str:
    """The tables in a SQLite file, with their primary keys (kept keys for references)."""
    path = tmp_path_factory.mktemp("tpch") / "tpch.sqlite"
    keys = {"region": "r_regionkey", "nation": "n_nationkey", "part": "p_partkey",
            "supplier": "s_suppkey", "customer": "c_custkey", "orders": "o_orderkey"}  # fmt: skip
    types = {"BIGINT": "INTEGER", "INTEGER": "INTEGER", "DOUBLE": "REAL", "VARCHAR": "TEXT",
             "DATE": "TEXT"}  # fmt: skip
    with sqlite3.connect(path) as target:
        for table in TABLES:
            columns = warehouse.execute(f"DESCRIBE {table}").fetchall()
            spec = ", ".join(
                f"{c[0]} {types[c[1]]}{' PRIMARY KEY' if keys.get(table) == c[0] else ''}"
                for c in columns
            )
            target.execute(f"CREATE TABLE {table} ({spec})")
            rows = warehouse.execute(f"SELECT * FROM {table}").fetchall()
            marks = ", ".join("?" * len(columns))
            target.executemany(
                f"INSERT INTO {table} VALUES ({marks})",
                [tuple(str(v) if hasattr(v, "isoformat") else v for v in r) for r in rows],
            )
    return f"sqlite:///{path}"


@pytest.mark.parametrize("sql", WITHOUT_REFERENCES + WITH_REFERENCES)
def test_relational_queries_on_sqlite(owned, sqlite_url, tmp_path: Path, sql):
    policy = tpch.policy(epsilon=1e5)
    with dpsql.connect(sqlite_url, policy=policy, ledger=tmp_path / "l.sqlite", seed=3) as con:
        released, accuracy, names = _answer(con, sql)
    _close(released, owned.execute(sql).fetchall(), accuracy, names, sql)


# -- Spark in local mode -----------------------------------------------------------------


@pytest.fixture(scope="module")
def parquet(spark_session, warehouse, tmp_path_factory) -> Path:
    """The tables as Parquet files, read by the shared local Spark context."""
    folder = tmp_path_factory.mktemp("tpch-spark")
    for table in TABLES:
        warehouse.execute(f"COPY {table} TO '{folder / table}.parquet' (FORMAT parquet)")
    return folder


@pytest.mark.spark
def test_relational_queries_on_spark(owned, parquet, tmp_path: Path):
    policy = tpch.policy(epsilon=1e5)
    for table in TABLES:
        policy["tables"][table]["source"] = f"parquet:{parquet / table}.parquet"
    with dpsql.connect("spark://local[2]", policy, ledger=tmp_path / "l.sqlite", seed=3) as con:
        for sql in WITHOUT_REFERENCES:
            released, accuracy, names = _answer(con, sql)
            _close(released, owned.execute(sql).fetchall(), accuracy, names, sql)
        # Spark keeps no keys: a table whose unit is read through a reference is refused
        with pytest.raises(dpsql.ProgrammingError, match="PRIMARY KEY or UNIQUE"):
            con.execute(WITH_REFERENCES[0])
        assert con.budget().epsilon_spent == pytest.approx(1e5 * len(WITHOUT_REFERENCES))
