"""The built-in demo: a synthetic census-like table and a ready policy.

The table is generated deterministically (a fixed-seed numpy generator) with
marginals shaped like the US census microdata the tests use: age, sex,
education, race, income (log-normal, rising with education, zero for many)
and marital status, one row per person, `pid` the privacy unit. The same
generator builds the large tables of the benchmarks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import numpy as np

DEMO_ROWS = 50_000
DEMO_SEED = 20_261_121

DEMO_POLICY: dict[str, Any] = {
    "version": 1,
    "defaults": {"epsilon_per_query": 1.0, "delta": 1.0e-6, "mechanism": "laplace"},
    "analysts": {"default": {"epsilon": 20.0, "delta": 1.0e-4}},
    "tables": {
        "census": {
            "privacy_unit": "pid",
            "max_groups_per_unit": 1,
            "max_rows_per_unit": 1,
            "columns": {
                "pid": {"type": "int", "private": True},
                "age": {"type": "int", "lower": 0, "upper": 100},
                "sex": {"type": "int", "values": [0, 1]},
                "educ": {"type": "int", "lower": 1, "upper": 16, "public": True},
                "race": {"type": "int", "values": [1, 2, 3, 4, 5, 6]},
                "income": {"type": "float", "lower": 0, "upper": 500_000},
                "married": {"type": "int", "values": [0, 1]},
                "state": {"type": "string"},
            },
        }
    },
}

_AGE_BRACKETS = np.array([0, 18, 35, 55, 75, 101])
_AGE_SHARES = np.array([0.22, 0.23, 0.26, 0.21, 0.08])
_RACE_SHARES = np.array([0.60, 0.12, 0.06, 0.14, 0.02, 0.06])
_STATES = np.array(["CA", "TX", "FL", "NY", "PA", "IL", "OH", "GA", "NC", "MI", "WY", "VT"])
_STATE_SHARES = np.array([0.20, 0.15, 0.11, 0.10, 0.07, 0.07, 0.06, 0.06, 0.06, 0.05, 0.04, 0.03])


def census_arrays(rows: int, seed: int = DEMO_SEED) -> dict[str, np.ndarray]:
    """Columns of a synthetic census table, the same for the same (rows, seed)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    bracket = rng.choice(len(_AGE_SHARES), size=rows, p=_AGE_SHARES)
    low, high = _AGE_BRACKETS[bracket], _AGE_BRACKETS[bracket + 1]
    age = (low + rng.integers(0, 1 << 30, size=rows) % (high - low)).astype(np.int64)
    adult = age >= 18
    # Education: years of school capped by age, then a skewed spread above high school.
    educ = np.where(
        adult,
        np.clip(np.round(rng.normal(10.5, 2.6, size=rows)), 1, 16),
        np.clip(age // 2, 1, 9),
    ).astype(np.int64)
    working = adult & (rng.random(rows) > 0.18)
    log_income = 10.2 + 0.12 * (educ - 9) + 0.01 * np.minimum(age - 18, 30)
    income = np.where(working, np.exp(log_income + rng.normal(0, 0.85, size=rows)), 0.0)
    return {
        "pid": np.arange(1, rows + 1, dtype=np.int64),
        "age": age,
        "sex": (rng.random(rows) < 0.51).astype(np.int64),
        "educ": educ,
        "race": rng.choice(np.arange(1, 7), size=rows, p=_RACE_SHARES).astype(np.int64),
        "income": np.round(income, -2),
        "married": (adult & (rng.random(rows) < 0.52)).astype(np.int64),
        "state": rng.choice(_STATES, size=rows, p=_STATE_SHARES).astype(object),
    }


def create_census(
    connection: duckdb.DuckDBPyConnection, rows: int = DEMO_ROWS, table: str = "census"
) -> None:
    """Create (or replace) the synthetic census table in a DuckDB connection."""
    cursor = connection.cursor()
    cursor.register("__dpsql_census", census_arrays(rows))
    # pid is a declared primary key: dpsql sees one row per person and skips bounding
    cursor.execute(
        f'CREATE OR REPLACE TABLE "{table}" (pid BIGINT PRIMARY KEY, age BIGINT, sex BIGINT, '
        "educ BIGINT, race BIGINT, income DOUBLE, married BIGINT, state VARCHAR)"
    )
    cursor.execute(f'INSERT INTO "{table}" SELECT * FROM __dpsql_census')
    cursor.unregister("__dpsql_census")


def demo_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB holding the demo census table."""
    connection = duckdb.connect(":memory:")
    create_census(connection)
    connection.execute("SET enable_external_access = false")
    return connection


def demo_ledger_path() -> Path:
    """Where the demo keeps its budget ledger, so the budget persists between runs."""
    path = Path.home() / ".dpsql" / "demo-ledger.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_demo(directory: Path) -> tuple[Path, Path]:
    """Write the demo database and its policy into `directory`; return both paths."""
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    database = directory / "census.duckdb"
    database.unlink(missing_ok=True)
    with duckdb.connect(str(database)) as connection:
        create_census(connection)
    policy = directory / "policy.yaml"
    policy.write_text(yaml.safe_dump(DEMO_POLICY, sort_keys=False))
    return database, policy
