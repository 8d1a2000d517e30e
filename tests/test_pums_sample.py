"""The generated PUMS stand-in has the shape the tests rely on, and, where the real
sample is present, the real sample's tables, columns and column types."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from conftest import PUMS_TABLES, real_pums
from pums_sample import write_sample


def _load(folder: Path) -> duckdb.DuckDBPyConnection:
    connection = duckdb.connect()
    for table, name in PUMS_TABLES.items():
        connection.execute(
            f"CREATE TABLE {table} AS SELECT * FROM read_csv(?, header=true)", [str(folder / name)]
        )
    return connection


def _types(connection: duckdb.DuckDBPyConnection) -> dict[str, list[tuple[str, str]]]:
    return {t: [r[:2] for r in connection.execute(f"DESCRIBE {t}").fetchall()] for t in PUMS_TABLES}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    return _load(write_sample(tmp_path_factory.mktemp("generated")))


def test_the_generated_sample_has_ids_repeats_and_nulls(generated) -> None:
    rows = generated.execute(
        "SELECT COUNT(*), COUNT(DISTINCT pid), MIN(pid), MAX(pid) FROM pums_pid"
    )
    assert rows.fetchone() == (1000, 1000, 1, 1000)
    copies = generated.execute(
        "SELECT MIN(n), MAX(n) FROM (SELECT COUNT(*) AS n FROM pums_dup GROUP BY pid)"
    ).fetchone()
    assert copies == (1, 4)
    # repeats are copies of the person's row, as in the real file
    assert (
        generated.execute("SELECT COUNT(*) FROM (SELECT DISTINCT * FROM pums_dup)").fetchone()[0]
        == 1000
    )
    nulls = generated.execute(
        "SELECT COUNT(*) - COUNT(pid), COUNT(*) - COUNT(age), COUNT(*) - COUNT(income) "
        "FROM pums_null"
    ).fetchone()
    assert all(n > 0 for n in nulls)
    # within the policy's bounds (conftest's columns), as the real sample is
    low_age, high_age, low_income, high_income = generated.execute(
        "SELECT MIN(age), MAX(age), MIN(income), MAX(income) FROM pums"
    ).fetchone()
    assert 0 <= low_age <= high_age <= 100 and 0 <= low_income <= high_income <= 500_000


def test_the_generated_sample_has_the_real_samples_columns_and_types(generated) -> None:
    folder = real_pums()
    if folder is None:
        pytest.skip("the real PUMS sample is absent: nothing to cross-check against")
    assert _types(generated) == _types(_load(folder))
