"""How the rewrite reads columns: only compared ones as stored, computed and bare ones widened.

A column the query only compares is read without a cast (a cast in the way
keeps the database from filtering as it scans); the counts must still equal
the raw query's on narrow storage types (SMALLINT, INTEGER, REAL) compared
with values beyond their range, in DuckDB and in PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest
from conftest import postgres_tables

from dpsql.adapters.duckdb import DuckDBAdapter
from dpsql.ledger import Ledger
from dpsql.policy import load_policy
from dpsql.session import Session
from dpsql.sql.parse import parse_statement

ROWS = [(1, 10, -2.5), (2, 300, 0.0), (3, 32767, 1.5e30), (4, -32768, None), (None, 7, 3.25)]

POLICY = {
    "analysts": {"default": {"epsilon": 100.0, "delta": 0.5}},
    "tables": {
        "n": {
            "columns": {
                "a": {"type": "int", "lower": 0, "upper": 10},
                "b": {"type": "int", "lower": -40000, "upper": 40000},
                "c": {"type": "float", "lower": 0, "upper": 100},
            }
        }
    },
}

CONDITIONS = [
    "a > 1",
    "b > 40000",
    "b < 3000000000",
    "b BETWEEN -32768 AND 300",
    "c > 1e20",
    "c <= 0",
    "a IN (1, 3, 99999999999)",
    "a IS NULL OR c IS NULL",
    "NOT (b = 7)",
]


def _session(adapter) -> Session:
    return Session(adapter, load_policy(POLICY), Ledger(":memory:"))


@pytest.fixture(scope="module")
def duck(tmp_path_factory: pytest.TempPathFactory) -> Session:
    path = tmp_path_factory.mktemp("reads") / "reads.duckdb"
    with duckdb.connect(str(path)) as connection:
        connection.execute("CREATE TABLE n (a SMALLINT, b INTEGER, c REAL)")
        connection.executemany("INSERT INTO n VALUES (?, ?, ?)", ROWS)
    return _session(DuckDBAdapter(str(path)))


@pytest.fixture(scope="module")
def postgres(postgres_url: str) -> Iterator[Session]:
    from dpsql.adapters.postgres import PostgresAdapter

    with postgres_tables(postgres_url, {"n (a SMALLINT, b INTEGER, c REAL)": ROWS}) as url:
        adapter = PostgresAdapter(url)
        yield _session(adapter)
        adapter.close()


@pytest.mark.parametrize("backend", ["duck", "postgres"])
@pytest.mark.parametrize("condition", CONDITIONS)
def test_compared_columns_count_as_the_raw_query(backend, condition, request) -> None:
    session = request.getfixturevalue(backend)
    plan = session.plan(parse_statement(f"SELECT COUNT(*) FROM n WHERE {condition}", "duckdb").tree)
    assert "CAST" not in plan.sql, plan.sql
    _, exact = session.adapter.execute(plan.sql)
    _, raw = session.adapter.execute(f"SELECT COUNT(*) FROM n WHERE {condition}")
    assert exact[0][0] == raw[0][0]


def test_computed_and_bare_columns_are_still_widened(duck) -> None:
    plan = duck.plan(
        parse_statement(
            "SELECT a, SUM(c), COUNT(*) FROM n WHERE b * 2 > 0 GROUP BY a", "duckdb"
        ).tree
    )
    for column, widened in (("a", "BIGINT"), ("b", "BIGINT"), ("c", "DOUBLE")):
        assert f'AS {widened}) AS "{column}"' in plan.sql, plan.sql


DATED = {
    "analysts": {"default": {"epsilon": 100.0, "delta": 0.5}},
    "tables": {"d": {"columns": {"day": {"type": "date"}, "k": {"type": "int"}}}},
}


@pytest.mark.parametrize(
    ("where", "stored"),
    [
        ("day >= '2020-01-01' AND day < '2021-01-01'", True),
        ("day BETWEEN DATE '2020-01-01' AND DATE '2020-12-31' AND k = 1", True),
        ("day IN ('2020-01-01', '2020-01-02')", True),
        ("'2020-01-01' <= day AND day = '2020-05-05'", True),
        ("day >= '2020-01-01'", False),  # no upper bound: infinity passes
        ("day >= '0001-01-01' AND day < '2021-01-01'", False),  # a zone away from BC
        ("day - DATE '2020-01-01' > 0 AND day < '2021-01-01'", False),  # computed, not held
    ],
)
def test_a_bare_date_held_by_where_is_read_as_stored(where: str, stored: bool) -> None:
    """A date grouped by bare reads as NULL where it is infinite or out of Python's years,
    unless WHERE holds it between two dates Python reads: then no other value can reach a
    group key, and the stored column keeps the database's own aggregation on it (a running
    count's tick cost 2.3x the raw query under the guard). Comparisons of a guarded date
    with constants are made again inside the source, on the stored value."""
    session = Session(DuckDBAdapter(duckdb.connect()), load_policy(DATED), Ledger(":memory:"))
    sql = session.plan(
        parse_statement(f"SELECT day, COUNT(*) FROM d WHERE {where} GROUP BY day", "duckdb").tree
    ).sql
    assert ("9999-12-31" not in sql) == stored, sql  # the guard's upper end
    if not stored:  # its comparisons with constants, never a computation, inside too
        inner = sql.split('AS "__dpsql_source"')[0]
        assert " WHERE " in inner and '"day" - ' not in inner, sql
