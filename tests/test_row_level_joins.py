"""A row-level private table (no privacy_unit) joined with public tables on keys the
database keeps unique (sql/row_level.py): answered near the truth, each measurement
moving by at most its sensitivity when one row is removed, and every other join of it
refused before the database runs."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest
import tpch
from test_relations import _check_neighbours, _copy, _options

import dpsql
from dpsql.errors import QueryRefused
from dpsql.policy import load_policy
from dpsql.sql import PlanContext, plan_query
from dpsql.sql.parse import parse_statement

KEPT = frozenset({"nation.n_nationkey", "region.r_regionkey", "part.p_partkey"})
VISITS = (
    "SELECT CAST(hash(i, 1) % 25 AS INTEGER) AS v_nationkey, "
    "CAST(hash(i, 2) % 100 AS DOUBLE) AS v_minutes, "
    "CAST(1 + hash(i, 3) % 200 AS BIGINT) AS v_partkey FROM range(2000) t(i)"
)
ACCEPTED = [
    "SELECT n.n_name, COUNT(*), SUM(v.v_minutes) FROM visits v JOIN nation n "
    "ON v.v_nationkey = n.n_nationkey JOIN region r ON n.n_regionkey = r.r_regionkey "
    "WHERE r.r_name = 'ASIA' GROUP BY n.n_name",
    "SELECT COUNT(*), AVG(v.v_minutes) FROM visits v JOIN part p ON v.v_partkey = p.p_partkey "
    "WHERE p.p_size < 10",
    "SELECT p.p_brand, COUNT(*) FROM visits v LEFT JOIN part p ON p.p_partkey = v.v_partkey "
    "GROUP BY p.p_brand",
    "SELECT COUNT(*) FROM visits v, nation n WHERE v.v_nationkey = n.n_nationkey "
    "AND n.n_regionkey = 2",
    "WITH long AS (SELECT * FROM visits WHERE v_minutes > 50) SELECT COUNT(*) FROM long",
    # a relation the query reads no column of (its SQL once selected nothing: SELECT FROM)
    "SELECT COUNT(*) FROM (SELECT * FROM visits) AS t",
    "WITH t AS (SELECT * FROM visits) SELECT COUNT(*) FROM t",
]
REFUSED = [
    # a join that can repeat a row: not on a kept key
    "SELECT COUNT(*) FROM visits v JOIN nation n ON v.v_nationkey > n.n_nationkey",
    "SELECT COUNT(*) FROM visits v JOIN nation n ON v.v_nationkey = n.n_regionkey",
    "SELECT COUNT(*) FROM visits v CROSS JOIN region r",
    "SELECT COUNT(*) FROM visits v JOIN part p ON v.v_partkey = p.p_partkey JOIN supplier s "
    "ON s.s_nationkey = p.p_size",
    # with another private table: no unit to tie the rows to one person
    "SELECT COUNT(*) FROM visits v JOIN customer c ON v.v_nationkey = c.c_nationkey",
    "SELECT COUNT(*) FROM visits a JOIN visits b ON a.v_nationkey = b.v_nationkey",
    "SELECT COUNT(*) FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey "
    "JOIN visits v ON v.v_nationkey = n.n_nationkey",
    # per-unit aggregation of a table whose unit is each row
    "SELECT AVG(k) FROM (SELECT v_nationkey, COUNT(*) AS k FROM visits GROUP BY v_nationkey) t",
]


def _policy(epsilon: float = 1.0) -> dict:
    policy = tpch.policy(epsilon=epsilon)
    policy["tables"]["visits"] = {
        "columns": {
            "v_nationkey": {"type": "int"},
            "v_minutes": {"type": "float", "lower": 0, "upper": 100},
            "v_partkey": {"type": "int"},
        }
    }
    return policy


@pytest.fixture(scope="module")
def warehouse() -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect()
    tpch.generate(connection, 0.001)
    connection.execute(f"CREATE TABLE visits AS {VISITS}")
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def loaded(warehouse):
    from dpsql.adapters import open_adapter

    policy = load_policy(_policy())
    adapter = open_adapter(warehouse)
    return policy.with_public_columns(
        {k: adapter.table_columns(k) for k in policy.tables}, "duckdb"
    )


def _plan(sql: str, policy):
    context = PlanContext(policy, _options(), "duckdb", seed=5, unique_references=KEPT)
    return plan_query(parse_statement(sql, "duckdb").tree, context)


@pytest.mark.parametrize("sql", ACCEPTED)
def test_row_level_joins_are_answered_near_the_truth(warehouse, tmp_path, sql):
    with dpsql.connect(warehouse, policy=_policy(1e5), ledger=tmp_path / "l.sqlite") as con:
        released = sorted(con.execute(sql).fetchall(), key=repr)
    truth = sorted(warehouse.execute(sql).fetchall(), key=repr)
    assert len(released) == len(truth)
    for row, exact in zip(released, truth, strict=True):
        for value, expected in zip(row, exact, strict=True):
            if isinstance(expected, str | type(None)):
                assert value == expected
            else:
                assert abs(value - expected) <= 0.01 * abs(expected) + 1, (sql, row, exact)


def test_row_level_joins_hold_on_neighbours(warehouse, loaded):
    plans = [_plan(sql, loaded) for sql in ACCEPTED]
    for plan in plans:
        assert plan.analysis.table.privacy_unit is None  # one row per private row: row-level
        assert plan.analysis.table.max_rows_per_unit == 1
    full = [warehouse.execute(plan.sql).fetchall() for plan in plans]
    for removed in (0, 7, 1999):  # one visit, with every relation row it is in
        neighbour = _copy(warehouse)
        neighbour.execute(f"CREATE TABLE visits AS {VISITS}")
        neighbour.execute(f"DELETE FROM visits WHERE rowid = {removed}")
        assert neighbour.execute("SELECT COUNT(*) FROM visits").fetchone() == (1999,)
        after = [neighbour.execute(plan.sql).fetchall() for plan in plans]
        _check_neighbours(plans, full, after)
        neighbour.close()


@pytest.mark.parametrize("sql", REFUSED)
def test_other_joins_of_a_row_level_table_are_refused_before_the_database(loaded, sql):
    with pytest.raises(QueryRefused) as refused:
        _plan(sql, loaded)
    assert "row-level" in str(refused.value)


def test_a_key_the_database_does_not_keep_is_refused(warehouse, tmp_path):
    """Without nation's PRIMARY KEY, a visit could match several nations."""
    copy = _copy(warehouse)  # the tables without their keys
    copy.execute(f"CREATE TABLE visits AS {VISITS}")
    with dpsql.connect(copy, policy=_policy(), ledger=tmp_path / "l.sqlite") as con:
        with pytest.raises(dpsql.ProgrammingError, match="keeps unique"):
            con.execute(ACCEPTED[0])
        assert con.budget().epsilon_spent == 0
    copy.close()
