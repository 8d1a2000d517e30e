"""The SUM a rewritten query measures is exact whatever the data, with or without each clamp.

rewrite.py leaves out a side of a bare column's clamp when the query's WHERE
already keeps every summed row on that side, sums a bare integer column on a
grid of 1 as it is, and scales by 1/step instead of dividing. Here, on values
beyond the bounds, NaN, infinities and NULL, the exact integers the database
returns must equal a reference computed in Python: each passing value clamped
to the bounds (NaN and +inf to the upper one, -inf to the lower one), in
whole grid steps. Both in DuckDB and in PostgreSQL, whose casts to BIGINT round
(the rewrite leaves out ROUND there).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import duckdb
import pytest
from conftest import postgres_tables

from dpsql.adapters.duckdb import DuckDBAdapter
from dpsql.ledger import Ledger
from dpsql.policy import load_policy
from dpsql.session import Session
from dpsql.sql.parse import parse_statement

X = [-5.3, 0.0, 3.1, 9.9, 10.0, 10.2, 42.7, 49.9, 50.0, 59.6, 60.0, 99.2, 100.0, 170.4,
     math.inf, -math.inf, math.nan, None]  # fmt: skip
N = [-3, 0, 1, 2, 3, 7, 10, 11, 250, None]

POLICY = {
    "analysts": {"default": {"epsilon": 100.0, "delta": 0.5}},
    "tables": {
        "t": {"columns": {"x": {"type": "float", "lower": 0, "upper": 100}}},
        "u": {"columns": {"n": {"type": "int", "lower": 0, "upper": 10}}},
    },
}

# (query, the Python condition on a row's value, clamp sides left in the SQL)
CASES = [
    ("SELECT SUM(x) FROM t", lambda v: True, 2),
    ("SELECT SUM(x) FROM t WHERE x < 50", lambda v: v < 50, 1),
    ("SELECT SUM(x) FROM t WHERE x >= 10", lambda v: v >= 10, 1),
    ("SELECT SUM(x) FROM t WHERE 10 < x", lambda v: v > 10, 1),
    ("SELECT SUM(x) FROM t WHERE x BETWEEN 10 AND 60", lambda v: 10 <= v <= 60, 0),
    ("SELECT SUM(x) FROM t WHERE x BETWEEN SYMMETRIC 60 AND 10", lambda v: 10 <= v <= 60, 0),
    ("SELECT SUM(x) FROM t WHERE x <= 150", lambda v: v <= 150, 2),
    ("SELECT SUM(x) FROM t WHERE x IN (3.1, 42.7)", lambda v: v in (3.1, 42.7), 0),
    ("SELECT AVG(x) FROM t WHERE x > 0 AND x < 99", lambda v: 0 < v < 99, 0),
    ("SELECT SUM(n) FROM u", lambda v: True, 2),
    ("SELECT SUM(n) FROM u WHERE n > 1", lambda v: v > 1, 1),
    ("SELECT SUM(n) FROM u WHERE n IN (1, 3, 250)", lambda v: v in (1, 3, 250), 1),
    ("SELECT SUM(n) FROM u WHERE n BETWEEN 0 AND 10", lambda v: 0 <= v <= 10, 0),
]


@pytest.fixture(scope="module")
def duckdb_session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    path = tmp_path_factory.mktemp("sums") / "sums.duckdb"
    with duckdb.connect(str(path)) as connection:
        connection.execute("CREATE TABLE t (x DOUBLE)")
        connection.executemany("INSERT INTO t VALUES (?)", [[v] for v in X])
        connection.execute("CREATE TABLE u (n BIGINT)")
        connection.executemany("INSERT INTO u VALUES (?)", [[v] for v in N])
    return Session(DuckDBAdapter(str(path)), load_policy(POLICY), Ledger(":memory:"))


@pytest.fixture(scope="module")
def postgres_session(postgres_url: str) -> Iterator[Session]:
    from dpsql.adapters.postgres import PostgresAdapter

    tables = {"t (x DOUBLE PRECISION)": [(v,) for v in X], "u (n BIGINT)": [(v,) for v in N]}
    with postgres_tables(postgres_url, tables) as url:
        adapter = PostgresAdapter(url)
        yield Session(adapter, load_policy(POLICY), Ledger(":memory:"))
        adapter.close()


@pytest.fixture(params=["duckdb", "postgres"])
def session(request: pytest.FixtureRequest) -> Session:
    return request.getfixturevalue(f"{request.param}_session")


def _steps(value: float, low: float, high: float, step: float) -> int:
    scaled = min(max(value, low), high) / step
    assert scaled % 1 != 0.5, "a tie: rounding modes would differ"
    return math.floor(scaled + 0.5)


@pytest.mark.parametrize(("sql", "passes", "sides"), CASES)
def test_sums_are_exact_with_only_the_clamps_they_need(session, sql, passes, sides) -> None:
    plan = session.plan(parse_statement(sql, session.adapter.dialect).tree)
    bounds, step = plan.analysis.measurements[0].bounds, plan.measures[0].step
    # The database orders NaN above every number, infinity included: as +inf it
    # passes and fails the same conditions here, and clamps the same.
    values = [math.inf if v != v else v for v in (X if " t" in sql else N) if v is not None]
    expected = sum(_steps(v, bounds.lower, bounds.upper, step) for v in values if passes(v))
    _, rows = session.adapter.execute(plan.sql)
    assert int(rows[0][0]) == expected, plan.sql
    assert plan.sql.count("WHEN") == sides, plan.sql  # the clamp is the only CASE
