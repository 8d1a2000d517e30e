"""Quantiles through the SQLAlchemy adapter on SQLite (sql/quantiles.py): a median, a
grouped percentile beside a count, keys from the data, each a rank-approximate quantile
of the PUMS sample; and the histogram on neighbouring databases, run by SQLite."""

from __future__ import annotations

import sqlite3
from collections import Counter
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
import pytest
from conftest import load_pums, pums_policy

import dpsql
from dpsql.mechanisms.quantiles import rank_error_bound

OLD = "CASE WHEN age < 45 THEN 0 ELSE 1 END"
QUERIES = {
    "median": ("SELECT MEDIAN(age) AS m FROM pums", Fraction(1, 2), 1, 1),
    "grouped": (
        "SELECT educ, COUNT(*) AS n, PERCENTILE_DISC(0.9) WITHIN GROUP (ORDER BY age) AS p "
        "FROM pums GROUP BY educ",
        Fraction(9, 10),
        2,
        1,
    ),
    # keys from the data: two large groups, which pass partition selection on any sample
    "data keys": (
        f"SELECT {OLD} AS old, MEDIAN(income) AS m FROM pums GROUP BY 1",
        Fraction(1, 2),
        2,
        1,
    ),
}


def pums_only() -> dict:
    """The PUMS policy over the one table `pums` (row-level)."""
    return pums_policy(tables={"pums": pums_policy()["tables"]["pums"]})


def check_quantiles(cursor: dpsql.Cursor, truth: duckdb.DuckDBPyConnection) -> None:
    """Each query's released quantiles are rank-approximate: q n (n the group's rows) lies
    between the rank just below the released value and its rank, widened by the rank
    bound at beta 1e-4 over the buckets EXPLAIN states."""
    for sql, q, shares, sensitivity in QUERIES.values():
        cursor.execute(f"EXPLAIN {sql}")
        lines = cursor.fetchall()
        buckets = int(next(d for item, d in lines if item.strip() == "buckets").split()[0])
        cursor.execute(sql)
        rows = cursor.fetchall()
        assert rows, sql
        bound = rank_error_bound(Fraction(1, shares), sensitivity, buckets, 1e-4, Fraction(q))
        argument = "income" if "income" in sql else "age"
        grouped = "educ" if "educ" in sql else OLD
        for row in rows:
            key, value = (row[0], row[-1]) if len(row) > 1 else (None, row[0])
            where = "" if key is None else f" WHERE {grouped} = {key}"
            values = np.sort(
                [v for (v,) in truth.execute(f"SELECT {argument} FROM pums{where}").fetchall()]
            )
            below = np.searchsorted(values, value, side="left")
            at = np.searchsorted(values, value, side="right")
            assert below - bound <= float(q) * len(values) <= at + bound, (sql, key, value)


@pytest.fixture(scope="module")
def pums_sqlite(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, duckdb.DuckDBPyConnection]:
    source = duckdb.connect()
    load_pums(source)
    rows = source.execute("SELECT age, sex, educ, race, income, married FROM pums").fetchall()
    path = tmp_path_factory.mktemp("sqlite") / "pums.db"
    with sqlite3.connect(path) as database:
        database.execute(
            "CREATE TABLE pums (age INTEGER, sex INTEGER, educ INTEGER, race INTEGER, "
            "income REAL, married INTEGER)"
        )
        database.executemany("INSERT INTO pums VALUES (?, ?, ?, ?, ?, ?)", rows)
    return path, source


def test_quantiles_through_sqlalchemy_on_sqlite(pums_sqlite) -> None:
    path, truth = pums_sqlite
    with dpsql.connect(
        f"sqlite:///{path}", policy=pums_only(), epsilon=1.0, ledger=":memory:", seed=6
    ) as connection:
        check_quantiles(connection.cursor(), truth)


def test_the_histogram_on_sqlite_neighbours_moves_by_one_row(pums_sqlite, tmp_path) -> None:
    """Row-level PUMS: removing any one of 20 rows moves the bucket counts by at most one
    in all (by none for a NULL income), and some removal moves them."""
    path, _ = pums_sqlite
    with dpsql.connect(f"sqlite:///{path}", policy=pums_only(), ledger=":memory:") as c:
        cursor = c.cursor()
        cursor.execute("EXPLAIN SELECT educ, MEDIAN(income) FROM pums GROUP BY educ")
        sql = dict(cursor.fetchall())["sql"]
    database = sqlite3.connect(tmp_path / "near.db")
    database.execute(f"ATTACH DATABASE '{path}' AS source")
    database.execute("CREATE TABLE pums AS SELECT rowid AS r, * FROM source.pums")

    def histogram() -> Counter:
        return Counter({row[:-1]: row[-1] for row in database.execute(sql).fetchall()})

    full = histogram()
    assert sum(full.values()) > 0
    changes = []
    for removed in range(1, 1000, 50):
        database.execute("DROP TABLE pums")
        database.execute(
            f"CREATE TABLE pums AS SELECT rowid AS r, * FROM source.pums WHERE rowid <> {removed}"
        )
        near = histogram()
        changes.append(sum(abs(full[cell] - near[cell]) for cell in full.keys() | near.keys()))
    assert max(changes) == 1
