"""VAR and STDDEV (sql/dispersion.py): over many seeded releases the stated 95% intervals
cover the true spread at least 95% of the time and the estimates of a large group are
unbiased within their sampling error; the centred sums and sums of squares move by at
most their sensitivity when one unit is removed; DuckDB and PostgreSQL answer them
grouped and ungrouped; and what cannot be answered is refused with a tailored hint."""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import numpy as np
import pytest
import sqlglot

import dpsql
from dpsql.errors import QueryRefused

UPPER = 100.0
SIZES = {0: 3, 1: 40, 2: 4000}  # rows per group: tiny, small, large
TRIALS = 400
FUNCTIONS = ("VAR_POP", "VAR_SAMP", "STDDEV_POP", "STDDEV_SAMP")


def policy(unit: bool = False, max_rows: int = 3, max_groups: int = 1) -> dict:
    columns = {
        "g": {"type": "int", "lower": 0, "upper": max(SIZES), "public": True},
        "v": {"type": "float", "lower": 0, "upper": UPPER},
        "n": {"type": "int", "lower": 0, "upper": 10},
        "name": {"type": "string"},
        "w": {"type": "float"},
    }
    table: dict = {"columns": columns}
    if unit:
        columns["uid"] = {"type": "int"}
        table |= {"privacy_unit": "uid", "max_rows_per_unit": max_rows,
                  "max_groups_per_unit": max_groups}  # fmt: skip
    return {
        "version": 1,
        "defaults": {"epsilon_per_query": 1.0, "delta": 1e-6},
        "analysts": {"default": {"epsilon": 1e6, "delta": 0.5}},
        "tables": {"t": table},
    }


def rows(seed: int = 2026) -> list[tuple]:
    """(uid, g, v, n, name, w): skewed values within bounds, a few units with many rows."""
    rng = np.random.default_rng(seed)
    out = []
    for g, size in SIZES.items():
        values = np.minimum(rng.gamma(2.0, 12.0, size), UPPER)
        for i, value in enumerate(values):
            uid = int(rng.integers(0, 50)) if i % 7 == 0 else 1000 * g + i
            out.append((uid, g, float(value), int(value) % 11, f"n{int(value) % 5}", 1.0))
    return out


_COLUMNS = ("uid", "g", "v", "n", "name", "w")
_TYPES = ("INTEGER", "INTEGER", "DOUBLE", "INTEGER", "VARCHAR", "DOUBLE")


def duckdb_table(path: Path, data: list[tuple]) -> Path:
    """`data` as table t of a new DuckDB file, loaded a column at a time (fast)."""
    source = {
        name: list(column) for name, column in zip(_COLUMNS, zip(*data, strict=True), strict=True)
    }
    casts = ", ".join(f"CAST({n} AS {t}) AS {n}" for n, t in zip(_COLUMNS, _TYPES, strict=True))
    with duckdb.connect(str(path)) as connection:
        connection.register("source", {n: np.array(v, dtype=object) for n, v in source.items()})
        connection.execute(f"CREATE TABLE t AS SELECT {casts} FROM source")
    return path


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return duckdb_table(tmp_path_factory.mktemp("dispersion") / "t.duckdb", rows())


def _truth(path: Path, function: str) -> dict[int, float]:
    with duckdb.connect(str(path), read_only=True) as connection:
        return dict(connection.execute(f"SELECT g, {function}(v) FROM t GROUP BY g").fetchall())


def _connect(path: Path | str, tmp_path: Path, **options: object) -> dpsql.Connection:
    options = {"seed": 1, "policy": policy()} | options
    return dpsql.connect(str(path), ledger=tmp_path / "ledger.sqlite", **options)


def _releases(connection: dpsql.Connection, sql: str, trials: int) -> list:
    """`trials` releases of one plan over one read of the database, seeded 0, 1, ..."""
    session = connection.session
    plan = session.plan(sqlglot.parse_one(sql))
    columns, result = session.adapter.execute(plan.sql)
    return [plan.release(columns, result, np.random.default_rng(i)) for i in range(trials)]


def _tolerance(trials: int, p: float = 0.95) -> float:
    return 4 * math.sqrt(p * (1 - p) / trials)  # four binomial deviations: never flaky


@pytest.mark.parametrize("function", FUNCTIONS)
def test_intervals_cover_the_true_spread(database: Path, tmp_path: Path, function: str) -> None:
    truth = _truth(database, function)
    with _connect(database, tmp_path) as connection:
        releases = _releases(connection, f"SELECT g, {function}(v) AS s FROM t GROUP BY g",
                             TRIALS)  # fmt: skip
    for group in SIZES:
        inside = 0
        for release in releases:
            row = [r[0] for r in release.rows].index(group)
            low, high = release.accuracy["s"].intervals[row]
            assert low <= release.rows[row][1] <= high  # the estimate lies in its interval
            inside += low <= truth[group] <= high
        assert inside / TRIALS >= 0.95 - _tolerance(TRIALS), (function, group)


@pytest.mark.parametrize("function", ["VAR_POP", "VAR_SAMP"])
def test_large_group_variance_is_unbiased(database: Path, tmp_path: Path, function: str) -> None:
    """At 4,000 rows the post-processing (count floor, clip to [0, h^2]) never binds, so the
    estimate is the plug-in of three unbiased sums: its mean over releases matches the
    truth within four standard errors (the ratio's bias is far below that)."""
    truth = _truth(database, function)[2]
    with _connect(database, tmp_path) as connection:
        releases = _releases(connection, f"SELECT g, {function}(v) AS s FROM t GROUP BY g",
                             TRIALS)  # fmt: skip
    estimates = np.array([r.rows[2][1] for r in releases])
    error = estimates.std(ddof=1) / math.sqrt(TRIALS)
    assert abs(estimates.mean() - truth) <= 4 * error
    assert estimates.std() < 0.2 * truth  # and the noise is small beside the spread


def _exact(plan, result: list[tuple]) -> dict[tuple, tuple]:
    """The plan's exact measurements per group, from its SQL's result."""
    width, count = len(plan.analysis.keys), len(plan.measures)
    return {row[:width]: row[width : width + count] for row in result}


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT STDDEV(v) FROM t",
        "SELECT g, VAR_POP(v) FROM t GROUP BY g",
        "SELECT g, STDDEV_SAMP(n * 3 - 2) FROM t WHERE v < 60 GROUP BY g",
    ],
)
def test_neighbours_move_the_sums_by_at_most_their_sensitivity(tmp_path: Path, sql: str) -> None:
    """Remove each of several units (the heaviest among them): every exact measurement of
    the rewrite (COUNT, centred SUM, centred SUM of squares, in grid steps) moves by at
    most its noise's L1 sensitivity, summed over the groups."""
    data = rows()
    full = duckdb_table(tmp_path / "full.duckdb", data)
    with _connect(full, tmp_path, policy=policy(True, max_rows=3, max_groups=2)) as connection:
        plan = connection.session.plan(sqlglot.parse_one(sql))
        base = _exact(plan, connection.session.adapter.execute(plan.sql)[1])
    sensitivities = [m.noise.sensitivity for m in plan.measures]
    # exact integers (grid steps), never float sums whose rounding depends on the order
    assert all(type(value) is int for values in base.values() for value in values)
    for unit in (0, 3, 17, 2005):
        kept = [row for row in data if row[0] != unit]
        assert len(kept) < len(data)
        with duckdb.connect(str(duckdb_table(tmp_path / f"without{unit}.duckdb", kept))) as raw:
            neighbour = _exact(plan, raw.execute(plan.sql).fetchall())
        for i, sensitivity in enumerate(sensitivities):
            empty = (0,) * len(sensitivities)
            moved = sum(abs(base[k][i] - neighbour.get(k, empty)[i]) for k in base)
            assert moved <= sensitivity, (unit, i)
            if unit == 0 and i == 2:  # the heavy unit moves the squares: a real test
                assert moved > 0


def test_centred_sums_have_the_stated_sensitivity(database: Path, tmp_path: Path) -> None:
    """v in [0, 100]: centred on 50, a row moves the centred SUM by at most 50 and the SUM of
    squares by 2500 (not 100 and 10000 uncentred); 3 rows and 2 groups per unit."""
    with _connect(database, tmp_path, policy=policy(True, 3, 2)) as connection:
        plan = connection.session.plan(sqlglot.parse_one("SELECT g, VAR_POP(v) FROM t GROUP BY g"))
        count, total, squares = plan.measures
        assert count.noise.sensitivity == 3 * 2
        assert total.noise.sensitivity * total.step == pytest.approx(50 * 3 * 2, rel=1e-5)
        assert squares.noise.sensitivity * squares.step == pytest.approx(2500 * 3 * 2, rel=1e-5)
        lines = dict(plan.explain())
        assert "split equally over the three measurements" in lines["VAR/STDDEV interval"]


def test_where_tightens_the_centre(database: Path, tmp_path: Path) -> None:
    with _connect(database, tmp_path) as connection:
        plan = connection.session.plan(sqlglot.parse_one("SELECT STDDEV(v) FROM t WHERE v < 60"))
        _, total, squares = plan.measures
        assert total.noise.sensitivity * total.step == pytest.approx(30, rel=1e-5)
        assert squares.noise.sensitivity * squares.step == pytest.approx(900, rel=1e-5)


def test_the_same_measurement_is_shared_and_charged_once(database: Path, tmp_path: Path) -> None:
    with _connect(database, tmp_path) as connection:
        plan = connection.session.plan(
            sqlglot.parse_one("SELECT COUNT(v), VAR_POP(v), STDDEV_SAMP(v) FROM t")
        )
        assert len(plan.measures) == 3
        assert plan.cost.epsilon == pytest.approx(1.0)


@pytest.mark.parametrize("spelling", ["VAR", "VARIANCE", "VAR_SAMP", "STDDEV", "STDDEV_POP"])
def test_every_spelling_end_to_end(database: Path, tmp_path: Path, spelling: str) -> None:
    with _connect(database, tmp_path, seed=3) as connection:
        cursor = connection.cursor()
        cursor.execute(f"SELECT {spelling}(v) AS s FROM t")
        (value,) = cursor.fetchone()
        low, high = cursor.accuracy["s"].intervals[0]
        assert 0 <= low <= value <= high
        cap = UPPER**2 / 4 * 1.01
        assert high <= (math.sqrt(cap) if spelling.startswith("STDDEV") else cap)


def test_post_processing_gives_a_valid_value_for_tiny_groups(tmp_path: Path) -> None:
    """A group with one row, at a tiny epsilon: the variance is never negative nor above
    h^2, the deviation is its root."""
    path = duckdb_table(tmp_path / "tiny.duckdb", [(1, 0, 5.0, 1, "a", 1.0)])
    with _connect(path, tmp_path) as connection:
        for release in _releases(connection, "SELECT VAR_SAMP(v), STDDEV_POP(v) FROM t", 200):
            variance, deviation = release.rows[0]
            assert 0 <= variance <= 2 * 50**2 * (1 + 1e-6)
            assert 0 <= deviation <= 50 * (1 + 1e-6)


def test_postgres_end_to_end(postgres_url: str, tmp_path: Path) -> None:
    from conftest import postgres_tables

    spec = "t (uid int, g int, v double precision, n int, name text, w double precision)"
    with (
        postgres_tables(postgres_url, {spec: rows()}) as url,
        _connect(url, tmp_path, policy=policy(True, 3, 1), epsilon=4.0) as connection,
    ):
        cursor = connection.cursor()
        cursor.execute("SELECT g, STDDEV_SAMP(v) AS s, VAR_POP(n) AS p FROM t GROUP BY g")
        released = cursor.fetchall()
        assert [row[0] for row in released] == list(SIZES)
        for index, row in enumerate(released):
            low, high = cursor.accuracy["s"].intervals[index]
            assert low <= row[1] <= high
        cursor.execute("SELECT STDDEV(v) FROM t WHERE v BETWEEN 10 AND 40")
        (value,) = cursor.fetchone()
        assert 0 < value <= 15


@pytest.mark.parametrize(
    ("sql", "refused", "hint"),
    [
        ("SELECT VAR_POP(name) FROM t", "VAR_POP(name)", "COUNT(DISTINCT name)"),
        ("SELECT STDDEV(w) FROM t", "STDDEV(w)", "declare lower/upper for w"),
        ("SELECT VARIANCE(DISTINCT v) FROM t", "VARIANCE(DISTINCT", "without DISTINCT"),
        # squares beyond 2^53 (BIGINT would overflow for some row: an error is a leak)
        (
            "SELECT VAR_POP(n * 1000000000) FROM t",
            "VAR_POP(n * 1000000000)",
            "n * 1000000000 / 1000",
        ),
        ("SELECT STDDEV(STDDEV(v)) FROM t", "nested aggregate", "released values"),
        (
            "SELECT g, SUM(STDDEV(v)) OVER (ORDER BY g) FROM t GROUP BY g",
            "running STDDEV",
            "running SUM",
        ),
    ],
)
def test_refusals_name_the_query(
    database: Path, tmp_path: Path, sql: str, refused: str, hint: str
) -> None:
    assert_refused(database, tmp_path, sql, refused, hint)


def assert_refused(database: Path, tmp_path: Path, sql: str, refused: str, hint: str) -> None:
    """`sql` is refused, the refusal naming `refused` and its hint saying `hint`."""
    with _connect(database, tmp_path) as connection, pytest.raises(QueryRefused) as caught:
        connection.cursor().execute(sql)
    text = str(caught.value).replace('"', "")
    assert refused.lower() in text.lower(), text
    assert hint.lower() in caught.value.hint.replace('"', "").lower(), text
