"""Shared fixtures: the PUMS sample loaded into DuckDB files, and policies for it.

The PUMS CSV files are read from DPSQL_PUMS_DIR (default: ../shared/data/pums
beside the repository); tests that need them are skipped, saying why, when
the folder is absent. Nothing from it is copied into the repository.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import duckdb
import pytest

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


def require_pums() -> Path:
    if not all((PUMS_DIR / name).exists() for name in PUMS_TABLES.values()):
        pytest.skip(f"PUMS sample not found in {PUMS_DIR} (set DPSQL_PUMS_DIR to its folder)")
    return PUMS_DIR


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


@pytest.fixture
def policy() -> dict:
    return pums_policy()


@pytest.fixture
def connect(pums_db: Path, tmp_path: Path):
    """dpsql.connect to the PUMS database with a fresh ledger per test."""
    import dpsql

    opened = []

    def _connect(policy: dict | None = None, **options: object) -> dpsql.Connection:
        options.setdefault("ledger", tmp_path / "ledger.sqlite")
        options.setdefault("seed", 7)
        connection = dpsql.connect(str(pums_db), policy=policy or pums_policy(), **options)
        opened.append(connection)
        return connection

    yield _connect
    for connection in opened:
        connection.close()
