"""A two-stage quantile in one snapshot (RefinedQuantiles.release_with, `shared`): the
second stage reads only the rows of the groups it splits and takes every other group's
count from the first stage's exact histogram. On DuckDB and PostgreSQL, the combined
histogram equals the whole second-stage histogram (every row counted once, at bucket
edges, beyond the domain, NaN, infinities, NULL, with per-unit bounding); it moves by
at most the rank sensitivity on neighbouring databases; and a write between the two
stages changes nothing the release reads."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import duckdb
import numpy as np
import pytest
from conftest import postgres_server_url, postgres_tables

import dpsql
from dpsql.adapters import open_adapter
from dpsql.dbapi import Connection
from dpsql.ledger import Ledger
from dpsql.policy import load_policy
from dpsql.session import Session
from dpsql.sql.parse import parse_statement
from dpsql.sql.quantiles import RefinedQuantiles

POLICY = {
    "analysts": {"default": {"epsilon": 1e6, "delta": 1e-6}},
    "tables": {
        "t": {
            "privacy_unit": "uid",
            "max_rows_per_unit": 2,
            "max_groups_per_unit": 2,
            "columns": {
                "uid": {"type": "int", "private": True},
                "g": {"type": "int", "lower": 0, "upper": 2, "public": True},
                "x": {"type": "float", "lower": 0, "upper": 1000},
                "n": {"type": "int", "lower": 0, "upper": 1_000_000},
                "d": {"type": "date", "lower": "1900-01-01", "upper": "2099-12-31"},
                "ts": {"type": "timestamp", "lower": "2020-01-01", "upper": "2021-01-01"},
            },
        }
    },
}
COLUMNS = "t (uid INT, g INT, x DOUBLE PRECISION, n BIGINT, d DATE, ts TIMESTAMP)"


def _edges(lower: float, width: float, count: int) -> list[float]:
    """Values on, just under and just over bucket edges all over a domain."""
    edges = [lower + i * width for i in range(0, count + 1, max(1, count // 97))]
    return [v + shift for v in edges for shift in (0.0, -1e-9 * width, 1e-9 * width)]


def _rows() -> list[tuple]:
    """Units of 1-4 rows over three groups; values on the coarse and fine edges of the
    grids these policies give (x: 256 buckets of 1000/256, fine 1/128 of those), beyond
    the domain (and, for floats, NaN and infinities), some NULL."""
    xs = _edges(0.0, 1000 / 256, 256) + _edges(500.0, 1000 / 256 / 128, 300)
    xs += [-1.0, -1e300, 1000.0, 1000.5, 1e300, float("nan"), float("inf"), float("-inf")]
    ns = [int(v * 1000) for v in xs[:-8]] + [-5, 2_000_000, 0, 1_000_000]
    day, second = dt.date(1900, 1, 1), dt.datetime(2020, 1, 1)
    ds = [day + dt.timedelta(days=(i * 379) % 73_100 - 30) for i in range(len(xs))]
    stamps = [second + dt.timedelta(seconds=i * 86413.5 % (368 * 86400)) for i in range(len(xs))]
    ds[:2], stamps[:2] = (
        [dt.date(1800, 1, 1), dt.date(2200, 6, 1)],
        [second.replace(year=1999), second.replace(year=2030)],
    )
    rows = []
    for i, x in enumerate(xs):
        unit = i // 3 if i % 5 else i // 2
        n = ns[i % len(ns)] if i % 11 else None
        rows.append((unit, i % 3, x if i % 13 else None, n, ds[i], stamps[i]))
    return rows


def _duckdb(rows: list[tuple]) -> tuple[Any, Any]:
    database = duckdb.connect()
    database.execute(f"CREATE TABLE {COLUMNS.replace('DOUBLE PRECISION', 'DOUBLE')}")
    database.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)", rows)
    return database, lambda sql: database.execute(sql).fetchall()


@pytest.fixture(scope="module", params=["duckdb", "postgres"])
def backend(request) -> Any:
    """(what dpsql.connect takes, a function running raw SQL there)."""
    rows = _rows()
    if request.param == "duckdb":
        yield _duckdb(rows)
        return
    import psycopg

    with (
        postgres_tables(postgres_server_url(), {COLUMNS: rows}) as url,
        psycopg.connect(url, autocommit=True) as raw,
    ):
        yield url, lambda sql: raw.execute(sql).fetchall()


def _plan(connection: Connection, query: str) -> RefinedQuantiles:
    plan = connection.session.plan(parse_statement(query, connection.session.adapter.dialect).tree)
    assert isinstance(plan, RefinedQuantiles), type(plan)
    return plan


def _histograms(plan: Any, run: Any) -> dict[tuple, np.ndarray]:
    return plan.histograms(run(plan.sql))


@pytest.mark.parametrize("column", ["x", "n", "d", "ts"])
@pytest.mark.parametrize("grouped", [False, True])
def test_the_windows_and_the_first_stage_count_each_row_as_one_histogram(
    backend, column: str, grouped: bool
) -> None:
    database, run = backend
    query = f"SELECT {'g, ' if grouped else ''}MEDIAN({column}) FROM t"
    with dpsql.connect(database, policy=POLICY, ledger=":memory:", seed=5) as connection:
        plan = _plan(connection, query + (" GROUP BY g" if grouped else ""))
        (coarse,) = plan.parts
        first = _histograms(coarse, run)
        last = coarse.grid.size - 1
        for picks in ({0}, {last}, {3, 40}, {last // 2, last // 2 + 20}, {17, last - 5}):
            whole = _histograms(plan.finish_outer(picks), run)
            windowed = plan.finish_outer(picks, first)
            read = sum(row[-1] for row in run(windowed.sql))
            assert read < sum(int(h.sum()) for h in first.values())  # only the windows
            combined = windowed.histograms(run(windowed.sql))
            assert whole.keys() == combined.keys()
            for key, counts in whole.items():
                assert counts.sum() > 0
                np.testing.assert_array_equal(combined[key], counts, err_msg=f"{picks} {key}")


def test_the_windows_match_the_whole_histogram_where_buckets_are_below_a_float_step() -> None:
    """A domain of width 1 at 10^15, where a double steps by 0.125 and every bucket is
    narrower (most hold no representable value): the comparison before the exact test
    still lets every row of a window through, and the two add up."""
    policy = {
        "analysts": POLICY["analysts"],
        "tables": {"u": {"columns": {"x": {"type": "float", "lower": 1e15, "upper": 1e15 + 1}}}},
    }
    database = duckdb.connect()
    database.execute(
        "CREATE TABLE u AS SELECT 1e15 + (i % 11) * 0.125 - 0.25 AS x FROM range(5000) r(i)"
    )
    run = lambda sql: database.execute(sql).fetchall()  # noqa: E731
    with dpsql.connect(database, policy=policy, ledger=":memory:", seed=2) as connection:
        plan = _plan(connection, "SELECT MEDIAN(x) FROM u")
        (coarse,) = plan.parts
        first = _histograms(coarse, run)
        for picks in ({0}, {coarse.grid.size // 2}, {coarse.grid.size - 1}):
            whole = _histograms(plan.finish_outer(picks), run)[()]
            combined = _histograms(plan.finish_outer(picks, first), run)[()]
            np.testing.assert_array_equal(combined, whole)
            assert whole.sum() == 5000


@pytest.mark.parametrize("column", ["x", "n"])
def test_the_combined_histogram_moves_by_at_most_the_rank_sensitivity(column: str) -> None:
    rows = _rows()
    dropped = max((r[0] for r in rows), key=lambda u: sum(r[0] == u for r in rows))
    combined = []
    for kept in (rows, [r for r in rows if r[0] != dropped]):
        database, run = _duckdb(kept)
        with dpsql.connect(database, policy=POLICY, ledger=":memory:", seed=5) as connection:
            plan = _plan(connection, f"SELECT MEDIAN({column}) FROM t")
            (coarse,) = plan.parts
            first = _histograms(coarse, run)
            combined.append(_histograms(plan.finish_outer({30, 200}, first), run)[()])
    moved = np.abs(combined[0] - combined[1]).sum()
    assert 0 < moved <= 2, moved  # max_rows_per_unit; the unit had rows to drop


class _WritingBetweenStages:
    """A real adapter that, before its second statement, has `write` run elsewhere (a
    writer committing between the stages); `snapshots`: whether it gives them."""

    def __init__(self, database: Any, write: Any, snapshots: bool):
        self.adapter = open_adapter(database)
        self.dialect, self.write, self.snapshots = self.adapter.dialect, write, snapshots
        self.statements = 0

    def stream(self, sql: str, *batching: int) -> Any:
        self.statements += 1
        if self.statements == 2:
            self.write()
        return self.adapter.stream(sql, *batching)

    def execute(self, sql: str) -> Any:
        return self.adapter.execute(sql)

    def snapshot(self) -> AbstractContextManager[bool]:
        return self.adapter.snapshot() if self.snapshots else nullcontext(False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.adapter, name)


@contextmanager
def _written_between(engine: str, rows: list[tuple], added: str) -> Iterator[tuple[Any, Any]]:
    """(what dpsql.connect takes, a function committing `added` from another connection)
    over a fresh table of `rows`; `added` ends in a FROM of 10,000 numbers i."""
    if engine == "duckdb":
        database, _ = _duckdb(rows)
        yield database, lambda: database.execute(f"{added} FROM range(10000) AS r(i)")
        return
    import psycopg

    with postgres_tables(postgres_server_url(), {COLUMNS: rows}) as url:

        def write() -> None:
            with psycopg.connect(url, autocommit=True) as writer:
                writer.execute(f"{added} FROM generate_series(0, 9999) AS r(i)")

        yield url, write


@pytest.mark.parametrize("engine", ["duckdb", "postgres"])
def test_a_write_between_the_stages_changes_nothing_a_snapshot_reads(engine: str, tmp_path) -> None:
    """1,000 values from 40 to 60; between the stages, 10,000 rows at 50.5 (inside the
    second stage's windows, a few coarse buckets either side of 50) are committed. In
    one snapshot the median stays at 50; without one, the same release moves to the
    new rows (so the test can tell)."""
    rows = [(u, 0, 40 + 20 * u / 1000, 0, dt.date(2001, 1, 1), None) for u in range(1000)]
    added = "INSERT INTO t SELECT 5000 + i, 0, 50.5, 0, DATE '2001-01-01', NULL"
    released = {}
    for snapshots in (True, False):
        with _written_between(engine, rows, added) as (database, write):
            adapter = _WritingBetweenStages(database, write, snapshots)
            ledger = Ledger(tmp_path / f"{engine}-{snapshots}.sqlite")
            session = Session(adapter, load_policy(POLICY), ledger, seed=11)
            with Connection(session) as connection:
                cursor = connection.cursor()
                cursor.execute("SET dpsql.epsilon = 50")
                cursor.execute("SELECT MEDIAN(x) FROM t")
                released[snapshots] = cursor.fetchall()[0][0]
                assert adapter.statements == 2
    assert abs(released[True] - 50) < 0.2, released
    assert abs(released[False] - 50.5) < 0.2, released
