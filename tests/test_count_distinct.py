"""COUNT(DISTINCT col) of a column that is not the unit: each unit adds at most
max_rows_per_unit rows to a group (the rewrite's bounding), hence at most that many
distinct values, so removing one unit moves a group's distinct count by at most
max_rows_per_unit, times max_groups_per_unit across groups. Tested on neighbouring
databases, statistically (the stated interval covers 95%), end to end on DuckDB and
PostgreSQL, with text columns, and refusals."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest
import sqlglot
from test_dispersion import (
    SIZES,
    _connect,
    _exact,
    _releases,
    _tolerance,
    assert_refused,
    duckdb_table,
    policy,
    rows,
)

TRIALS = 400


def _hoarder(data: list[tuple]) -> list[tuple]:
    """`data` and unit 7 holding 60 rows of 60 distinct names and values in group 1."""
    return data + [(7, 1, float(i), i % 11, f"only{i}", 1.0) for i in range(60)]


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return duckdb_table(tmp_path_factory.mktemp("distinct") / "t.duckdb", _hoarder(rows()))


@pytest.mark.parametrize(
    ("sql", "bounds"),
    [
        ("SELECT COUNT(DISTINCT name) FROM t", (2, 1)),
        ("SELECT COUNT(DISTINCT CASE WHEN v > 1 THEN name END) FROM t", (2, 1)),
        ("SELECT COUNT(DISTINCT v), COUNT(DISTINCT name) FROM t", (1, 1)),
        ("SELECT g, COUNT(DISTINCT name), COUNT(DISTINCT n) FROM t GROUP BY g", (2, 2)),
        ("SELECT g, COUNT(DISTINCT LOWER(name)) FROM t WHERE v > 5 GROUP BY g", (3, 2)),
    ],
)
def test_neighbours_move_a_distinct_count_by_at_most_its_sensitivity(
    tmp_path: Path, sql: str, bounds: tuple[int, int]
) -> None:
    """Removing a unit (the hoarder of 60 distinct names among them) moves each exact
    distinct count by at most max_rows (x max_groups, summed over the groups)."""
    max_rows, max_groups = bounds
    data = _hoarder(rows())
    full = duckdb_table(tmp_path / "full.duckdb", data)
    with _connect(full, tmp_path, policy=policy(True, max_rows, max_groups)) as connection:
        plan = connection.session.plan(sqlglot.parse_one(sql))
        base = _exact(plan, connection.session.adapter.execute(plan.sql)[1])
    sensitivities = [m.noise.sensitivity for m in plan.measures]
    assert sensitivities == [max_rows * (max_groups if "GROUP BY" in sql else 1)] * len(
        sensitivities
    )
    for unit in (7, 0, 3, 2005):
        kept = [row for row in data if row[0] != unit]
        with duckdb.connect(str(duckdb_table(tmp_path / f"without{unit}.duckdb", kept))) as raw:
            neighbour = _exact(plan, raw.execute(plan.sql).fetchall())
        for i, sensitivity in enumerate(sensitivities):
            empty = (0,) * len(sensitivities)
            moved = sum(abs(base[k][i] - neighbour.get(k, empty)[i]) for k in base)
            assert moved <= sensitivity, (unit, i, moved)
            if unit == 7 and "name" in sql and i == 0:  # the hoarder's names count, bounded
                assert moved > 0


def test_unbounded_count_would_move_more(database: Path) -> None:
    """The bound matters: without it the hoarder alone adds 60 distinct names."""
    with duckdb.connect(str(database), read_only=True) as raw:
        (everyone,) = raw.execute("SELECT COUNT(DISTINCT name) FROM t").fetchone()
        (others,) = raw.execute("SELECT COUNT(DISTINCT name) FROM t WHERE uid <> 7").fetchone()
    assert everyone - others == 60


def test_stated_interval_covers_and_is_unbiased(database: Path, tmp_path: Path) -> None:
    with duckdb.connect(str(database), read_only=True) as raw:
        truth = dict(raw.execute("SELECT g, COUNT(DISTINCT n) FROM t GROUP BY g").fetchall())
    sql = "SELECT g, COUNT(DISTINCT n) AS d FROM t GROUP BY g"
    with _connect(database, tmp_path) as connection:
        releases = _releases(connection, sql, TRIALS)
    for index, group in enumerate(SIZES):
        values = np.array([release.rows[index][1] for release in releases], dtype=float)
        half = releases[0].accuracy["d"].interval95
        inside = np.mean(np.abs(values - truth[group]) <= half)
        assert inside >= 0.95 - _tolerance(TRIALS)
        error = values.std(ddof=1) / np.sqrt(TRIALS)
        assert abs(values.mean() - truth[group]) <= 4 * error


def test_text_column_grouped_end_to_end(database: Path, tmp_path: Path) -> None:
    with _connect(database, tmp_path, policy=policy(True, 2, 1), epsilon=5.0) as connection:
        cursor = connection.cursor()
        cursor.execute("SELECT g, COUNT(DISTINCT name) AS names FROM t GROUP BY g ORDER BY g")
        released = cursor.fetchall()
        assert [row[0] for row in released] == list(SIZES)
        assert all(isinstance(row[1], int) for row in released)
        assert cursor.accuracy["names"].sensitivity == 2
        cursor.execute("EXPLAIN SELECT COUNT(DISTINCT name) FROM t")
        lines = dict(cursor.fetchall())
        assert "sensitivity 2" in lines['measure count_distinct("name")']


def test_postgres_end_to_end(postgres_url: str, tmp_path: Path) -> None:
    from conftest import postgres_tables

    spec = "t (uid int, g int, v double precision, n int, name text, w double precision)"
    data = _hoarder(rows())
    # each group's names, the hoarder's bounded to the 2 rows it may add
    others = {g: len({r[4] for r in data if r[1] == g and r[0] != 7}) for g in SIZES}
    with (
        postgres_tables(postgres_url, {spec: data}) as url,
        _connect(url, tmp_path, policy=policy(True, 2, 2), epsilon=30.0) as connection,
    ):
        cursor = connection.cursor()
        cursor.execute("SELECT g, COUNT(DISTINCT name) AS d FROM t GROUP BY g")
        for g, d in cursor.fetchall():  # noise scale 4 / 30 here: within 2 but rarely
            assert others[g] - 2 <= d <= others[g] + 2 + (2 if g == 1 else 0), (g, d)


@pytest.mark.parametrize(
    ("sql", "refused", "hint"),
    [
        ("SELECT COUNT(DISTINCT name, n) FROM t", "COUNT(DISTINCT name, n)", "GROUP BY"),
        (
            "SELECT g, SUM(COUNT(DISTINCT name)) OVER (ORDER BY g) FROM t GROUP BY g",
            "running COUNT(DISTINCT",
            "running SUM",
        ),
    ],
)
def test_refusals(database: Path, tmp_path: Path, sql: str, refused: str, hint: str) -> None:
    assert_refused(database, tmp_path, sql, refused, hint)
