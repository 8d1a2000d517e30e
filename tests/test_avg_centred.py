"""AVG at a lower error for the same charge: its SUM is centred on the bounds' midpoint, and a
count of a column that cannot be NULL is COUNT(*) itself, measured once.

The error of a released AVG is checked against its closed form over many seeded releases
(fixed seeds, tolerance from the number of releases), and against the closed form of the
uncentred estimator it replaced, which it must beat; neighbouring databases for the
centred SUM are in tests/test_sensitivity.py (its AVG queries are centred now).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest
import sqlglot

import dpsql
from dpsql.errors import PolicyError
from dpsql.policy import load_policy

UPPER = 5000.0
ROWS = 3000
TRIALS = 2000


def _policy(nullable: bool = True) -> dict:
    value = {"type": "float", "lower": 0, "upper": UPPER}
    if not nullable:
        value["nullable"] = False
    return {
        "version": 1,
        "defaults": {"epsilon_per_query": 1.0, "delta": 1e-6},
        "analysts": {"default": {"epsilon": 1000.0, "delta": 1e-3}},
        "tables": {
            "t": {
                "columns": {
                    "g": {"type": "int", "lower": 0, "upper": 1, "public": True},
                    "v": value,
                }
            }
        },
    }


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """One group of ROWS skewed values (true mean about 800, far from the midpoint 2500)."""
    path = tmp_path_factory.mktemp("centred") / "t.duckdb"
    rng = np.random.default_rng(7)
    columns = {
        "g": np.zeros(ROWS, dtype=np.int32),
        "v": np.minimum(rng.exponential(800.0, ROWS), UPPER),
    }
    with duckdb.connect(str(path)) as connection:
        connection.register("source", columns)
        connection.execute("CREATE TABLE t AS SELECT g, v FROM source")
        (mean,) = connection.execute("SELECT AVG(v) FROM t").fetchone()
    return path, mean


def _connect(path: Path, tmp_path: Path, nullable: bool = True) -> dpsql.Connection:
    return dpsql.connect(
        str(path), policy=_policy(nullable), ledger=tmp_path / "ledger.sqlite", seed=1
    )


def _plan(connection: dpsql.Connection, sql: str):
    return connection.session.plan(sqlglot.parse_one(sql))


def test_nullable_is_a_true_or_false_setting() -> None:
    policy = _policy(nullable=False)
    assert not load_policy(policy).tables["t"].column("v").nullable
    assert load_policy(_policy()).tables["t"].column("v").nullable
    policy["tables"]["t"]["columns"]["v"]["nullable"] = "no"
    with pytest.raises(PolicyError, match=r"nullable.*true or false"):
        load_policy(policy)


@pytest.mark.parametrize(
    ("nullable", "where", "measured"),
    [
        (True, "", 3),  # COUNT(*), SUM(v - m), COUNT(v)
        (False, "", 2),  # declared: COUNT(v) is COUNT(*)
        (True, "WHERE v IS NOT NULL", 2),
        (True, "WHERE v > 10", 2),  # a NULL fails the comparison
        (True, "WHERE v > 10 OR g = 0", 3),  # not a conjunct: a NULL v may pass
    ],
)
def test_a_count_of_a_column_that_cannot_be_null_is_measured_once(
    table, tmp_path: Path, nullable: bool, where: str, measured: int
) -> None:
    with _connect(table[0], tmp_path, nullable) as connection:
        plan = _plan(connection, f"SELECT COUNT(*), COUNT(v), AVG(v) FROM t {where}")
        assert len(plan.analysis.measurements) == measured
        assert plan.share == pytest.approx(1.0 / measured)


def test_an_avg_shares_the_sum_the_query_releases_and_a_stddevs_centred_sum(
    table, tmp_path: Path
) -> None:
    with _connect(table[0], tmp_path, nullable=False) as connection:
        shared = _plan(connection, "SELECT SUM(v), AVG(v) FROM t")
        assert [m.key for m in shared.analysis.measurements] == ['sum("v")', "count(*)"]
        assert shared.analysis.aggregates[1].centre == 0.0
        spread = _plan(connection, "SELECT AVG(v), STDDEV(v) FROM t")
        assert len(spread.analysis.measurements) == 3  # COUNT(*), SUM(v - m), SUM((v - m)^2)


def test_the_centred_avgs_error_is_its_closed_form_and_below_the_uncentred_one(
    table, tmp_path: Path
) -> None:
    """Mean squared error of AVG over TRIALS seeded releases of one plan: to first order
    (Var S~ + (mean - m)^2 Var C~) / C^2, with Laplace variances 2 b^2 (b from the plan)."""
    path, mean = table
    with _connect(path, tmp_path, nullable=False) as connection:
        plan = _plan(connection, "SELECT AVG(v) FROM t")
        columns, rows = connection.session.adapter.execute(plan.sql)
        released = np.array(
            [
                plan.release(columns, rows, np.random.default_rng(seed)).rows[0][0]
                for seed in range(TRIALS)
            ]
        )
    indexes = plan.analysis.aggregates[0].measurements
    total, count = (float(plan.measures[i].noise.scale) * plan.measures[i].step for i in indexes)
    centre = plan.analysis.aggregates[0].centre
    assert centre == UPPER / 2
    closed = (2 * total**2 + (mean - centre) ** 2 * 2 * count**2) / ROWS**2
    uncentred = (2 * (2 * total) ** 2 + mean**2 * 2 * count**2) / ROWS**2
    mse = float(np.mean((released - mean) ** 2))
    # squared Laplace errors have relative sd sqrt(5 / TRIALS) = 5%: 5 of them
    assert mse == pytest.approx(closed, rel=0.25)
    assert mse < uncentred / 2
