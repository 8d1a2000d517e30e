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
from decimal import Decimal

import duckdb
import numpy as np
import pytest
from conftest import postgres_tables
from hypothesis import given, settings
from hypothesis import strategies as st

import dpsql
from dpsql.adapters.duckdb import DuckDBAdapter
from dpsql.ledger import Ledger
from dpsql.mechanisms.grid import GRID_LIMIT
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.policy import load_policy
from dpsql.session import Session
from dpsql.sql.intervals import Interval
from dpsql.sql.parse import parse_statement
from dpsql.sql.plan import (
    ROW_STEP_BITS,
    SUMMED_ROW_BITS,
    exact_integers,
    sum_grid,
)

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
    # AVG sums x - 49.5, the centre of [0, 99]: x is clamped where the source computes it
    ("SELECT AVG(x) FROM t WHERE x > 0 AND x < 99", lambda v: 0 < v < 99, 2),
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
    centre = plan.analysis.aggregates[0].centre  # an AVG's SUM is of x - centre
    # The database orders NaN above every number, infinity included: as +inf it
    # passes and fails the same conditions here, and clamps the same.
    values = [math.inf if v != v else v for v in (X if " t" in sql else N) if v is not None]
    expected = sum(
        _steps(v - centre, bounds.lower, bounds.upper, step) for v in values if passes(v)
    )
    _, rows = session.adapter.execute(plan.sql)
    assert int(rows[0][0]) == expected, plan.sql
    # the clamp is the only CASE, besides PostgreSQL's near-zero guard of a float column
    # the query computes with (rewrite.near_zero: one WHEN more)
    guards = plan.sql.count("BETWEEN -1E-30 AND 1e-30")
    assert plan.sql.count("WHEN") - guards == sides, plan.sql


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    # 0 or at least 1e-9 in size (2^-1000, the finest grid, binds only far below)
    lower=st.one_of(st.just(0.0), st.floats(1e-9, 1e15), st.floats(-1e15, -1e-9)),
    width=st.one_of(st.just(0.0), st.floats(1e-9, 1e15)),
    integer=st.booleans(),
    contributions=st.integers(1, 1000),
    totals=st.integers(1, 1000),
    epsilon=st.floats(1e-6, 1e6),
)
def test_a_row_adds_at_most_two_to_the_twenty_two_grid_steps(
    lower, width, integer, contributions, totals, epsilon
) -> None:
    """So that a SUM over up to 2^40 rows stays below 2^62 in grid steps, at any epsilon."""
    if integer:
        lower, width = float(math.floor(lower)), float(math.floor(width))
    bounds = Interval(lower, lower + width, integer)
    grid, per_total = sum_grid(bounds, contributions, totals, epsilon)
    assert grid.step == 2.0 ** round(math.log2(grid.step))
    per_row = max(
        abs(math.floor(bounds.lower / grid.step)), abs(math.ceil(bounds.upper / grid.step))
    )
    assert per_row <= 2**ROW_STEP_BITS
    assert per_total == max(1, contributions * per_row)
    assert 2**SUMMED_ROW_BITS * per_row <= GRID_LIMIT
    if bounds.magnitude and not integer:
        # the grid is about the noise scale / 2^20, and coarser only where a row would
        # otherwise add more than 2^22 steps (then it still adds at least 2^21)
        scale = bounds.magnitude * contributions * totals / epsilon
        assert grid.step <= scale / 2**19 or per_row >= 2 ** (ROW_STEP_BITS - 1)


def test_totals_beyond_int64_are_saturated_not_an_error() -> None:
    """An exact total the backend returns as HUGEINT or numeric beyond int64 is clamped
    to +/-2^62 (a 1-Lipschitz map: the noise still covers it); it used to raise after
    the charge, an answer without noise."""
    values = (2**70, -(2**70), Decimal(2**64), None, 5, 2**62 + 1)
    assert exact_integers(values).tolist() == [GRID_LIMIT, -GRID_LIMIT, GRID_LIMIT, 0, 5,
                                               GRID_LIMIT]  # fmt: skip
    assert exact_integers((1, 2, 3)).dtype == np.int64
    # the samplers take a saturated total as it is, and add their noise exactly
    noise = DiscreteLaplace(1, 1.0)
    noisy = noise.sample(exact_integers((2**70, -(2**70))), np.random.default_rng(1))
    assert abs(noisy[0] - GRID_LIMIT) < 100 and abs(noisy[1] + GRID_LIMIT) < 100


def test_a_large_sum_at_a_large_epsilon_is_answered(tmp_path) -> None:
    """5.2M rows at the upper bound, epsilon 9e5: the old grid (2^-20, so 2^40.8 steps a
    row) made the exact totals 2^62.1 and 2^63.1 steps, and the release raised an
    error after the charge (ValueError from the sampler's limit, OverflowError
    from int64) when, and only when, enough rows passed the WHERE."""
    path = tmp_path / "large.duckdb"
    with duckdb.connect(str(path)) as connection:
        connection.execute(
            "CREATE TABLE t AS SELECT 1790000.0::DOUBLE AS x, range % 2 AS g FROM range(?)",
            [2**22 + 2**20],
        )
    policy = {
        "analysts": {"default": {"epsilon": 1e7}},
        "tables": {"t": {"columns": {"x": {"type": "float", "lower": 0, "upper": 1790000},
                                     "g": {"type": "int"}}}},
    }  # fmt: skip
    with dpsql.connect(str(path), policy=policy, epsilon=9e5, ledger=tmp_path / "l") as con:
        for where, rows in (("g = 0", 2**21 + 2**19), ("g >= 0", 2**22 + 2**20)):
            total = con.execute(f"SELECT SUM(x) FROM t WHERE {where}").fetchone()[0]
            assert total == pytest.approx(1790000.0 * rows, rel=1e-9)
