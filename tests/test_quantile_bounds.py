"""A quantile's 95% value interval (mechanisms/quantile_bounds.py, SET
dpsql.quantile_interval = on): the released distances move by at most the noise's
sensitivity on neighbouring histograms, the interval covers the quantile in at least
95% of seeded releases (dense data, a point mass, values past the domain), and the
option spends a tenth of each quantile's epsilon for the same charge."""

from __future__ import annotations

import itertools
from fractions import Fraction

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.mechanisms.quantile_bounds import QuantileBounds, edges_around, most_edges

POLICY = {
    "analysts": {"default": {"epsilon": 1e6, "delta": 1e-6}},
    "tables": {
        "t": {
            "columns": {
                "g": {"type": "int", "lower": 0, "upper": 1, "public": True},
                "x": {"type": "float", "lower": 0, "upper": 1000},
                "n": {"type": "int", "lower": 0, "upper": 1000},
            }
        }
    },
}


def test_the_edges_are_geometric_in_positions_and_fixed_by_the_pick() -> None:
    positions = np.array([0, 1, 2, 3, 10, 50, 51, 52, 200, 1000])  # a refined grid's keys
    assert list(edges_around(positions, 5)) == [4, 5, 6, 7, 8]  # 49, 50, 51, 54-114, 306
    assert list(edges_around(np.arange(100), 0)) == [0, 1, 4, 16, 64]
    assert most_edges(100) == 2 * 5 + 1 and most_edges(1) == 3


@pytest.mark.parametrize("q", [Fraction(1, 2), Fraction(9, 10), Fraction(1, 100)])
def test_a_unit_moves_the_distances_by_at_most_the_noise_sensitivity(q: Fraction) -> None:
    """Every neighbour of small histograms (1 to s values added anywhere): the signed
    distances at the edges move in L1 by at most edges x max(a, D - a) x s."""
    s, size = 2, 6
    bounds = QuantileBounds(q, Fraction(1), s, size)
    spread = max(q.numerator, q.denominator - q.numerator)
    assert bounds.noise.sensitivity == bounds.edges * spread * s
    positions = np.arange(size)
    for counts in ([0, 0, 0, 0, 0, 0], [3, 0, 1, 4, 0, 2], [0, 9, 0, 0, 0, 1]):
        for pick in range(size):
            edges = edges_around(positions, pick)
            for added in itertools.product(range(size), repeat=s):
                for m in range(1, s + 1):
                    more = np.array(counts)
                    np.add.at(more, list(added[:m]), 1)
                    moved = sum(
                        abs(_distance(more, e, q) - _distance(np.array(counts), e, q))
                        for e in edges
                    )
                    assert moved <= bounds.noise.sensitivity


def _distance(counts: np.ndarray, edge: int, q: Fraction) -> int:
    ranks = np.cumsum(counts)
    return q.denominator * int(ranks[edge]) - q.numerator * int(ranks[-1])


def _table(values: np.ndarray) -> duckdb.DuckDBPyConnection:
    database = duckdb.connect()
    database.execute("CREATE TABLE t (g INT, x DOUBLE, n BIGINT)")
    frame = {"g": np.arange(len(values)) % 2, "x": values, "n": np.round(values).astype(int)}
    database.register("frame", frame)
    database.execute("INSERT INTO t SELECT * FROM frame")
    return database


def _truth(database: duckdb.DuckDBPyConnection, column: str, q: float) -> tuple[float, float]:
    """The quantile's values the interval must hold: DuckDB's DISC and CONT, of the
    values clamped into the domain."""
    clamped = f"LEAST(GREATEST({column}, 0), 1000)"
    return database.execute(
        f"SELECT quantile_disc({clamped}, {q}), quantile_cont({clamped}, {q}) FROM t"
    ).fetchone()


@pytest.mark.parametrize(
    ("case", "column", "q"),
    [("dense", "x", 0.5), ("dense", "x", 0.9), ("mass", "n", 0.5), ("past", "x", 0.95)],
)
def test_the_interval_covers_the_quantile(case: str, column: str, q: float) -> None:
    """60 seeded releases at epsilon 1: each interval holds the quantile (at most 9
    misses: a binomial(60, 0.05) tail below 1e-3 past that); over 40,000 dense values,
    each end's median distance in ranks is within what the margin allows: an edge past
    twice the margin's ranks qualifies on the 95% event, and the next edge out is at
    most 4 times as far (positions of a smooth density: ranks alike)."""
    rng = np.random.default_rng(7)
    values = {
        "dense": 1000 * rng.random(40_000) ** 2,
        "mass": np.where(rng.random(4000) < 0.6, 300.0, 1000 * rng.random(4000)),
        "past": np.concatenate([1000 * rng.random(3700), np.full(300, 5000.0)]),
    }[case]
    database = _table(values)
    truth = _truth(database, column, q)
    misses, ends = 0, []
    with dpsql.connect(database, policy=POLICY, epsilon=1.0, ledger=":memory:", seed=4) as c:
        cursor = c.cursor()
        cursor.execute("SET dpsql.quantile_interval = on")
        for i in range(60):
            cursor.execute(f"SELECT quantile_cont({column}, {q}) AS v FROM t WHERE g >= -{i}")
            cursor.fetchone()
            (low, high) = cursor.accuracy["v"].intervals[0]
            misses += not all(low <= t <= high for t in truth)
            ends.append((low, high))
            assert low <= high
    assert misses <= 9, (misses, truth)
    if case == "dense":
        fraction = Fraction(str(q))
        bounds = QuantileBounds(fraction, Fraction(1, 10), 1, 4096 * 124)
        allowed = 4 * (2 * bounds.margin / fraction.denominator + 1)
        ordered = np.sort(values)
        at = np.searchsorted(ordered, truth[0])
        below = np.median([at - np.searchsorted(ordered, low) for low, _ in ends])
        above = np.median([np.searchsorted(ordered, high) - at for _, high in ends])
        assert 0 < below <= allowed and 0 < above <= allowed, (below, above, allowed)


def test_the_option_spends_a_tenth_of_each_quantile_for_the_same_charge() -> None:
    database = _table(1000 * np.random.default_rng(1).random(2000))
    with dpsql.connect(database, policy=POLICY, epsilon=1.0, ledger=":memory:", seed=2) as c:
        cursor = c.cursor()
        query = "SELECT g, MEDIAN(n) AS m FROM t GROUP BY g"
        cursor.execute(f"EXPLAIN {query}")
        plain = dict(cursor.fetchall())
        cursor.execute(query)
        assert cursor.accuracy["m"].intervals is None
        spent = c.session.budget().epsilon_spent
        cursor.execute("SET dpsql.quantile_interval = on")
        cursor.execute(f"EXPLAIN {query}")
        bounded = dict(cursor.fetchall())
        assert "95% value interval" in bounded and "95% value interval" not in plain
        assert "epsilon 0.1 of its 1" in bounded["95% value interval"]
        assert bounded["cost"] == plain["cost"]
        cursor.execute(query)
        rows = cursor.fetchall()
        intervals = cursor.accuracy["m"].intervals
        assert len(intervals) == len(rows) == 2
        assert all(low <= m <= high for (_, m), (low, high) in zip(rows, intervals, strict=True))
        assert c.session.budget().epsilon_spent == pytest.approx(2 * spent)
        # a bigger rank bound: the mechanism has nine tenths of the epsilon
        assert float(bounded["95% rank error"].split()[1]) > float(
            plain["95% rank error"].split()[1]
        )


def test_an_interval_whose_noise_cannot_be_drawn_is_refused_before_the_charge() -> None:
    database = _table(1000 * np.random.default_rng(3).random(500))
    with dpsql.connect(database, policy=POLICY, ledger=":memory:", seed=1) as c:
        cursor = c.cursor()
        cursor.execute("SET dpsql.quantile_interval = on")
        cursor.execute("SET dpsql.epsilon = 1e-13")
        with pytest.raises(dpsql.QueryRefused, match=r"dpsql\.quantile_interval = off"):
            cursor.execute("SELECT quantile_cont(x, 0.99) FROM t")
        assert c.session.budget().epsilon_spent == 0


@pytest.mark.parametrize(
    "query",
    [
        "SELECT g, MEDIAN(n) AS m FROM t GROUP BY g ORDER BY m DESC",
        "SELECT g, MEDIAN(n) AS m, COUNT(*) AS c FROM t GROUP BY g ORDER BY m DESC",
    ],
)
def test_each_row_has_its_own_interval_after_ordering(query: str) -> None:
    """Group 0's values are low and group 1's high, so an interval given to the other
    row would not hold its median: one release alone (public keys) and the two-release
    path beside COUNT, both reordered by ORDER BY."""
    rng = np.random.default_rng(5)
    values = np.where(np.arange(20_000) % 2 == 0, 100, 800) + 50 * rng.random(20_000)
    database = _table(values)
    with dpsql.connect(database, policy=POLICY, epsilon=1.0, ledger=":memory:", seed=6) as c:
        cursor = c.cursor()
        cursor.execute("SET dpsql.quantile_interval = on")
        cursor.execute(query)
        rows = cursor.fetchall()
        intervals = cursor.accuracy["m"].intervals
    assert [row[0] for row in rows] == [1, 0]
    for (_, median, *_), (low, high) in zip(rows, intervals, strict=True):
        assert low <= median <= high and high - low < 300, (median, low, high)
