"""Order statistics (sql/quantiles.py, mechanisms/quantiles.py): the exact sampler's
distribution against the exponential mechanism's closed form, its rank error against the
stated bound, the bounded histogram on neighbouring databases, end to end on DuckDB and
PostgreSQL (per group, dates, lists), and the refusals."""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections import Counter
from fractions import Fraction

import duckdb
import numpy as np
import pytest
from conftest import postgres_tables
from scipy import stats
from test_relations import _without

import dpsql
from dpsql.errors import QueryRefused
from dpsql.mechanisms.quantiles import exponential_quantile, quantile_weights, rank_error_bound
from dpsql.sql.quantile_grids import FINE_CANDIDATES
from dpsql.sql.quantiles import RefinedQuantiles

POLICY = {
    "analysts": {"default": {"epsilon": 1000.0, "delta": 1e-6}},
    "tables": {
        "t": {
            "privacy_unit": "uid",
            "max_rows_per_unit": 3,
            "max_groups_per_unit": 3,
            "columns": {
                "uid": {"type": "int", "private": True},
                "x": {"type": "float", "lower": 0, "upper": 1000},
                "n": {"type": "int", "lower": 0, "upper": 499},
                "g": {"type": "int", "lower": 0, "upper": 2, "public": True},
                "h": {"type": "int", "lower": 0, "upper": 5},
                "d": {"type": "date", "lower": "2020-01-01", "upper": "2020-12-31"},
                "s": {"type": "string"},
                "free": {"type": "float"},
            },
        }
    },
}
ROWS = 3000
_CREATE = (
    "CREATE TABLE t AS SELECT i // 3 AS uid, CAST((i * 37) % 1000 AS DOUBLE) AS x, "
    "CAST(i % 500 AS INTEGER) AS n, i % 3 AS g, i % 6 AS h, "
    "DATE '2020-01-01' + CAST(i % 300 AS INTEGER) AS d, 'a' AS s, 1.0 AS free "
    f"FROM range({ROWS}) r(i)"
)


def _rows() -> list[tuple]:
    return duckdb.connect().execute(_CREATE.replace("CREATE TABLE t AS ", "")).fetchall()


@pytest.fixture()
def cursor() -> dpsql.Cursor:
    database = duckdb.connect()
    database.execute(_CREATE)
    return dpsql.connect(database, policy=POLICY, epsilon=1.0, ledger=":memory:", seed=3).cursor()


def test_the_sampler_draws_the_exponential_mechanisms_distribution() -> None:
    """Chi-square of 1500 draws (fixed seed) against the closed form e^-x(i) / sum, with a
    unit sensitivity of 2: the exponent is epsilon |rank - q n| / (2 Delta), Delta =
    max(q, 1 - q) 2 = 1 for the median."""
    counts, q, epsilon = [3, 5, 2, 0, 4, 1], Fraction(1, 2), Fraction(3, 2)
    exponents = quantile_weights(counts, q, epsilon, sensitivity=2)
    ranks = np.cumsum(counts)
    closed = [float(epsilon) * abs(r - 7.5) / 2 for r in ranks]
    assert [float(x) for x in exponents] == pytest.approx([c - min(closed) for c in closed])
    weights = np.array([math.exp(-float(x)) for x in exponents])
    expected = weights / weights.sum()
    rng = np.random.default_rng(7)
    draws = 1500
    seen = Counter(
        exponential_quantile(counts, q, epsilon, rng, sensitivity=2) for _ in range(draws)
    )
    observed = np.array([seen[i] for i in range(len(counts))])
    _, p_value = stats.chisquare(observed, expected * draws)
    assert p_value > 1e-3


def test_the_lattice_of_exponents_is_the_closed_form_with_a_prior() -> None:
    """x(i) = epsilon |rank(i) - q n| / (2 max(q, 1 - q) s) + prior(i) - min, exactly, is what
    the sampler decides on (m(i) step, bit by bit); and with a prior of awkward
    denominators and q = 0.01, the draws still follow e^-x(i) / sum (chi-square)."""
    counts, q, epsilon = [4, 0, 7, 2, 9, 1, 3], Fraction(1, 100), Fraction(7, 3)
    prior = [Fraction(i, 11) for i in range(7)]
    ranks = np.cumsum(counts)
    spread = max(q, 1 - q) * 3  # the utility's sensitivity
    closed = [
        epsilon * abs(int(r) - q * 26) / (2 * spread) + p for r, p in zip(ranks, prior, strict=True)
    ]
    closed = [x - min(closed) for x in closed]
    assert quantile_weights(counts, q, epsilon, prior, 3) == closed
    rng = np.random.default_rng(11)
    assert_draws_follow(closed, lambda: exponential_quantile(counts, q, epsilon, rng, prior, 3))


def assert_draws_follow(closed: list[Fraction], draw, draws: int = 1500) -> None:
    """`draws` calls of `draw` follow e^-x(i) / sum over the exponents `closed` (chi-square
    at 1e-3, cells below 5 expected draws pooled)."""
    weights = np.array([math.exp(-float(x)) for x in closed])
    seen = Counter(draw() for _ in range(draws))
    expected = weights / weights.sum() * draws
    observed = np.array([seen[i] for i in range(len(closed))])
    kept = expected >= 5  # chi-square needs 5 expected per cell: the rest pooled
    pooled_o, pooled_e = observed[kept], expected[kept]
    if not kept.all():
        pooled_o = np.append(pooled_o, observed[~kept].sum())
        pooled_e = np.append(pooled_e, expected[~kept].sum())
    assert stats.chisquare(pooled_o, pooled_e)[1] > 1e-3


@pytest.mark.parametrize("q", [Fraction(1, 2), Fraction(9, 10), Fraction(1, 100), Fraction(1, 3)])
@pytest.mark.parametrize("sensitivity", [1, 3])
def test_every_neighbour_moves_each_log_probability_by_at_most_epsilon(q, sensitivity) -> None:
    """The privacy map, on every neighbour of small histograms: a unit's 1..s values added
    in any buckets (and so removed, the other way round) move no candidate's
    log-probability by more than epsilon; and some neighbour reaches 0.4 epsilon (with
    Delta = s, as before, the median's reached at most about 0.25)."""
    epsilon = Fraction(1, 2)
    rng = np.random.default_rng(int(q.denominator) * 10 + sensitivity)
    worst = 0.0
    for _ in range(4):
        counts = [int(c) for c in rng.integers(0, 4, 5)]
        base = _log_probabilities(counts, q, epsilon, sensitivity)
        for added in range(1, sensitivity + 1):
            for cells in itertools.combinations_with_replacement(range(5), added):
                neighbour = list(counts)
                for cell in cells:
                    neighbour[cell] += 1
                other = _log_probabilities(neighbour, q, epsilon, sensitivity)
                worst = max(worst, float(np.max(np.abs(base - other))))
    assert worst <= float(epsilon) + 1e-12
    assert worst >= 0.4 * float(epsilon)


def _log_probabilities(counts, q, epsilon, sensitivity) -> np.ndarray:
    exponents = np.array([float(x) for x in quantile_weights(counts, q, epsilon, (), sensitivity)])
    return -exponents - np.log(np.sum(np.exp(-exponents)))


def test_the_rank_error_stays_within_the_stated_bound() -> None:
    """120 medians of 2000 values over 64 buckets at epsilon 0.5, sensitivity 3: the
    share whose rank error exceeds the 95% bound is at most 5% (plus 3 sigma)."""
    rng = np.random.default_rng(5)
    counts = list(np.bincount(rng.integers(0, 64, 2000), minlength=64))
    epsilon, sensitivity = Fraction(1, 2), 3
    ranks = np.cumsum(counts)
    best = np.min(np.abs(ranks - 1000))
    bound = rank_error_bound(epsilon, sensitivity, 64, 0.05, Fraction(1, 2))
    errors = [
        abs(
            ranks[exponential_quantile(counts, Fraction(1, 2), epsilon, rng, (), sensitivity)]
            - 1000
        )
        - best
        for _ in range(120)
    ]
    beyond = sum(e > bound for e in errors) / len(errors)
    assert beyond <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 120)
    # and the error is not trivially zero: the mechanism does randomise at this epsilon
    assert np.mean(errors) > 0.5


def _explain(cursor: dpsql.Cursor, query: str) -> dict[str, str]:
    cursor.execute(f"EXPLAIN {query}")
    return dict(cursor.fetchall())


def _histogram(database: duckdb.DuckDBPyConnection, sql: str) -> Counter:
    return Counter({(row[:-1]): row[-1] for row in database.execute(sql).fetchall()})


@pytest.mark.parametrize("grouped", [False, True])
def test_removing_a_unit_moves_the_histogram_by_at_most_its_sensitivity(grouped: bool) -> None:
    """The rewritten SQL on neighbouring databases (each unit removed in turn, over units
    with up to 5 rows): bucket counts move by at most max_rows_per_unit in total per
    group, and by at most max_rows * max_groups over all groups."""
    columns = {k: POLICY["tables"]["t"]["columns"][k] for k in ("uid", "x", "g")}
    table = {**POLICY["tables"]["t"], "max_groups_per_unit": 2, "columns": columns}
    policy = {**POLICY, "tables": {"t": table}}
    rows = [(i // 5, float((i * 53) % 1000), i % 3) for i in range(60)]
    database = duckdb.connect()
    database.execute("CREATE TABLE t (uid INT, x DOUBLE, g INT)")
    database.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    query = "SELECT g, MEDIAN(x) FROM t GROUP BY g" if grouped else "SELECT MEDIAN(x) FROM t"
    with dpsql.connect(database, policy=policy, ledger=":memory:", seed=1) as connection:
        sql = _explain(connection.cursor(), query)["sql"]
    full = _histogram(database, sql)
    assert sum(full.values()) > 0
    for unit in range(12):
        database.execute("CREATE OR REPLACE TABLE t AS SELECT * FROM full_t") if unit else None
        if not unit:
            database.execute("CREATE TABLE full_t AS SELECT * FROM t")
        database.execute(f"DELETE FROM t WHERE uid = {unit}")
        neighbour = _histogram(database, sql)
        moved = Counter()
        for cell in full.keys() | neighbour.keys():
            moved[cell[:-1]] += abs(full[cell] - neighbour[cell])
        assert all(m <= 3 for m in moved.values())
        assert sum(moved.values()) <= 3 * (2 if grouped else 1)


def test_duckdb_end_to_end(cursor: dpsql.Cursor) -> None:
    cursor.execute("SELECT MEDIAN(x) AS m, MIN(x) AS lo, MAX(x) AS hi FROM t")
    ((median, low, high),) = cursor.fetchall()
    assert abs(median - 500) < 60 and low < 100 and high > 900
    accuracy = cursor.accuracy["m"]
    assert accuracy.mechanism == "exponential" and accuracy.rank_interval95 > 0
    assert "rank" in accuracy.note


def test_lists_dates_and_discrete_values(cursor: dpsql.Cursor) -> None:
    cursor.execute("SELECT quantile_cont(x, [0.25, 0.5, 0.75]) AS q FROM t")
    ((quartiles,),) = cursor.fetchall()
    assert len(quartiles) == 3 and quartiles == sorted(quartiles)
    assert [abs(v - e) < 80 for v, e in zip(quartiles, (250, 500, 750), strict=True)]
    cursor.execute("SELECT MEDIAN(d) FROM t")
    ((median,),) = cursor.fetchall()
    assert isinstance(median, dt.date) and abs((median - dt.date(2020, 5, 29)).days) < 30
    cursor.execute("SELECT quantile_disc(n, 0.5) FROM t WHERE n < 100")
    ((value,),) = cursor.fetchall()
    assert isinstance(value, int) and 30 <= value <= 70


def test_per_group_over_a_public_domain(cursor: dpsql.Cursor) -> None:
    cursor.execute("SELECT g, PERCENTILE_DISC(0.9) WITHIN GROUP (ORDER BY x) FROM t GROUP BY g")
    rows = cursor.fetchall()
    assert [row[0] for row in rows] == [0, 1, 2]
    assert all(800 <= row[1] <= 1000 for row in rows)
    plan = _explain(cursor, "SELECT g, MEDIAN(x) FROM t GROUP BY g")
    assert plan["rank sensitivity"] == "9"  # 3 rows in each of 3 groups
    assert _explain(cursor, "SELECT MEDIAN(x) FROM t")["rank sensitivity"] == "3"
    assert "buckets" in plan["buckets"]


def test_the_charge_is_the_epsilon_and_repeats_are_free(cursor: dpsql.Cursor) -> None:
    connection = cursor.connection
    before = connection.budget().epsilon_spent
    cursor.execute("SELECT MEDIAN(x) FROM t")
    first = cursor.fetchall()
    assert connection.budget().epsilon_spent - before == pytest.approx(1.0)
    cursor.execute("SELECT MEDIAN(x) FROM t")
    assert cursor.fetchall() == first
    assert connection.budget().epsilon_spent - before == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("SELECT MEDIAN(free) FROM t", "lower and upper"),
        ("SELECT MEDIAN(uid) FROM t", "private"),
        ("SELECT MEDIAN(s) FROM t", "string column"),
        ("SELECT quantile_cont(x, 1.5) FROM t", "outside (0, 1)"),
        ("SELECT quantile_cont(x, 0) FROM t", "outside (0, 1)"),
        ("SELECT quantile_cont(x, n) FROM t", "not a constant"),
        ("SELECT MEDIAN(x), MEDIAN(n) FROM t", "separately"),
        ("SELECT COUNT(*) FROM t WHERE x > MEDIAN(x)", "HAVING and ORDER BY may read it"),
        ("SELECT MEDIAN(x) FROM t GROUP BY MEDIAN(n)", "a quantile in GROUP BY"),
        ("SELECT MEDIAN(x + 1) FROM t", "one bounded column"),
        ("SELECT SUM(MEDIAN(x)) FROM t", "nested"),
    ],
)
def test_refusals_say_what_to_write(cursor: dpsql.Cursor, query: str, words: str) -> None:
    with pytest.raises(QueryRefused) as refused:
        cursor.execute(query)
    assert words in str(refused.value)


def test_postgres_end_to_end(postgres_url: str) -> None:
    rows = _rows()
    spec = (
        "t (uid BIGINT, x DOUBLE PRECISION, n INTEGER, g BIGINT, h BIGINT, d DATE, s TEXT, "
        "free DOUBLE PRECISION)"
    )
    with (
        postgres_tables(postgres_url, {spec: rows}) as url,
        dpsql.connect(url, policy=POLICY, epsilon=1.0, ledger=":memory:", seed=3) as connection,
    ):
        cursor = connection.cursor()
        cursor.execute(
            "SELECT g, PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY x), MEDIAN(x) FROM t GROUP BY g"
        )
        result = cursor.fetchall()
        assert [row[0] for row in result] == [0, 1, 2]
        assert all(abs(row[1] - 500) < 120 for row in result)
        cursor.execute("SELECT PERCENTILE_DISC(0.5) WITHIN GROUP (ORDER BY d) FROM t")
        ((median,),) = cursor.fetchall()
        assert isinstance(median, dt.date)


@pytest.mark.parametrize("epsilon", [9.03442905035, 0.1, 0.3, 1.0])
def test_the_plan_states_its_sensitivity_and_spends_within_its_charge(epsilon: float) -> None:
    """The rank sensitivity is max_rows per group, times max_groups when grouped (what the
    neighbour test above measures), and the quantiles' shares, read in binary as the
    mechanism reads them, add up to no more than the epsilon charged."""
    from dpsql.policy import load_policy
    from dpsql.sql import Options, PlanContext, plan_query
    from dpsql.sql.parse import parse_statement

    policy = load_policy(POLICY)
    context = PlanContext(policy, Options(epsilon=epsilon, delta=1e-6), "duckdb", seed=1)
    for query, sensitivity, parts in (
        ("SELECT MEDIAN(x) FROM t", 3, 1),
        ("SELECT g, quantile_cont(x, [0.1, 0.5, 0.9]) FROM t GROUP BY g", 9, 3),
        ("SELECT g, MIN(n), MAX(n) FROM t GROUP BY g", 9, 2),
    ):
        plan = plan_query(parse_statement(query, "duckdb").tree, context)
        assert plan.sensitivity == sensitivity, query
        assert parts * _per_quantile(plan) <= plan.cost.epsilon, (query, epsilon)


def _per_quantile(plan) -> Fraction:
    """What a quantile plan spends per quantile, read in binary: its share, or both
    stages' shares when refined."""
    stages = [*plan.parts, plan.outer] if isinstance(plan, RefinedQuantiles) else [plan]
    return sum((Fraction(stage.share) for stage in stages), Fraction(0))


# -- quantiles beside other aggregates, and per group of keys from the data --------------

MIXED = "SELECT h, COUNT(*) AS n, MEDIAN(x) AS m FROM t GROUP BY h"


@pytest.fixture()
def rich() -> dpsql.Cursor:
    """The table t, with a delta budget for several key selections."""
    database = duckdb.connect()
    database.execute(_CREATE)
    analysts = {"default": {"epsilon": 1000.0, "delta": 1e-3}}
    policy = {**POLICY, "analysts": analysts}
    return dpsql.connect(database, policy=policy, epsilon=6.0, ledger=":memory:", seed=5).cursor()


def _stages(cursor: dpsql.Cursor, query: str) -> list[str]:
    """The SQL of each release of a staged plan, in order."""
    cursor.execute(f"EXPLAIN {query}")
    return [detail for item, detail in cursor.fetchall() if item == "  sql"]


def test_removing_a_unit_moves_each_release_of_a_data_keyed_query_by_its_sensitivity() -> None:
    """Both releases of MIXED on neighbouring databases (each of 12 units, of up to 5 rows
    over 3 keys, removed in turn): the first's COUNT per key moves by at most
    max_rows_per_unit (3), its distinct units by at most 1, over at most max_groups (2)
    keys; the histogram's buckets by at most 3 per key and 6 in all."""
    columns = {k: POLICY["tables"]["t"]["columns"][k] for k in ("uid", "x", "h")}
    table = {**POLICY["tables"]["t"], "max_groups_per_unit": 2, "columns": columns}
    policy = {**POLICY, "tables": {"t": table}}
    rows = [(i // 5, float((i * 53) % 1000), i % 3) for i in range(60)]
    database = duckdb.connect()
    database.execute("CREATE TABLE full_t (uid INT, x DOUBLE, h INT)")
    database.executemany("INSERT INTO full_t VALUES (?, ?, ?)", rows)
    database.execute("CREATE TABLE t AS SELECT * FROM full_t")
    with dpsql.connect(database, policy=policy, ledger=":memory:", seed=1) as connection:
        first, histogram = _stages(connection.cursor(), MIXED)
    # each key's COUNT(*) and count of units (the bounding note's totals follow: their
    # neighbours are checked in tests/test_sensitivity.py)
    counts = {row[0]: row[1:3] for row in database.execute(first).fetchall()}
    full = _histogram(database, histogram)
    assert sum(full.values()) > 0 and len(counts) == 3
    for unit in range(12):
        database.execute(f"CREATE OR REPLACE TABLE t AS SELECT * FROM full_t WHERE uid <> {unit}")
        near = {row[0]: row[1:3] for row in database.execute(first).fetchall()}
        moved = [
            [abs(a - b) for a, b in zip(counts[k], near.get(k, (0, 0)), strict=True)]
            for k in counts
        ]
        assert all(count <= 3 and units <= 1 for count, units in moved)
        assert sum(count > 0 or units > 0 for count, units in moved) <= 2
        neighbour = _histogram(database, histogram)
        per_key = Counter()
        for cell in full.keys() | neighbour.keys():
            per_key[cell[:-1]] += abs(full[cell] - neighbour[cell])
        assert all(m <= 3 for m in per_key.values()) and sum(per_key.values()) <= 6


def _rank_tolerance(
    epsilon: float, sensitivity: int, buckets: int, beta: float, q: float = 0.5
) -> float:
    return rank_error_bound(Fraction(epsilon), sensitivity, buckets, beta, Fraction(q))


def test_data_keys_with_counts_release_every_group_and_medians_within_their_rank_bound(
    rich: dpsql.Cursor,
) -> None:
    """MIXED at epsilon 6 (2 each for COUNT, the key selection and the median): every key
    of h (500 rows each, far above the threshold) is released, each count within 6 noise
    scales, and each median's rank in its group's data within the rank bound at
    beta 1e-4 plus the largest bucket's count (the grid's own error), over the buckets
    EXPLAIN states."""
    rich.execute(f"EXPLAIN {MIXED}")
    buckets = int(dict(rich.fetchall())["  buckets"].split()[0])
    rich.execute(MIXED)
    result = rich.fetchall()
    assert [row[0] for row in result] == list(range(6))
    values = _rows()
    count_scale = rich.accuracy["n"].scale
    for h, count, median in result:
        group = np.sort([row[1] for row in values if row[4] == h])
        assert abs(count - len(group)) <= 6 * count_scale
        width = 1000 / buckets
        largest = np.max(np.histogram(group, bins=np.arange(0, 1000 + width, width))[0])
        rank = np.searchsorted(group, median, side="right")
        assert abs(rank - len(group) / 2) <= _rank_tolerance(2, 9, buckets, 1e-4) + largest
    assert rich.accuracy["m"].mechanism == "exponential"
    assert "noisy count of distinct units" in " ".join(rich.notes)


def test_having_order_by_and_limit_read_the_released_quantiles(rich: dpsql.Cursor) -> None:
    rich.execute(
        "SELECT h, AVG(x) AS a, MEDIAN(x) AS m FROM t GROUP BY h "
        "HAVING MEDIAN(x) > 300 ORDER BY m DESC LIMIT 4"
    )
    rows = rich.fetchall()
    assert 0 < len(rows) <= 4 and all(m > 300 for _, _, m in rows)
    assert [m for _, _, m in rows] == sorted((m for _, _, m in rows), reverse=True)
    # AVG's per-row intervals follow their rows through HAVING, ORDER BY and LIMIT
    intervals = rich.accuracy["a"].intervals
    assert len(intervals) == len(rows)
    assert all(low <= a <= high for (low, high), (_, a, _) in zip(intervals, rows, strict=True))
    rich.execute("SELECT g, 2 * MEDIAN(n) AS twice, COUNT(*) AS c FROM t GROUP BY g ORDER BY g")
    assert [(row[0], row[1] % 2) for row in rich.fetchall()] == [(0, 0), (1, 0), (2, 0)]


def test_explain_shows_each_measurement_of_both_releases(rich: dpsql.Cursor) -> None:
    rich.execute(f"EXPLAIN {MIXED}")
    lines = rich.fetchall()
    items = [item for item, _ in lines]
    assert items.index("release 1") < items.index("  measure count(*)") < items.index("release 2")
    assert items.index("release 2") < items.index('  measure MEDIAN("x")')
    costs = [detail for item, detail in lines if item == "  cost"]
    # the first release sets a tenth of its 4 aside for the bounding note: 1.8 each
    assert "key selection, epsilon 1.8 each + bounding note" in costs[0]
    assert costs[1] == "epsilon 2 (pure)"
    assert "total epsilon=6" in dict(lines)["budget"]


def test_data_keys_without_delta_are_refused_before_the_charge(rich: dpsql.Cursor) -> None:
    connection = rich.connection
    rich.execute("SET dpsql.delta = 0")
    before = connection.budget().epsilon_spent
    with pytest.raises(QueryRefused) as refused:
        rich.execute("SELECT h, MEDIAN(x) FROM t GROUP BY h")
    assert "delta" in str(refused.value)
    assert connection.budget().epsilon_spent == before


@pytest.mark.parametrize("epsilon", [9.03442905035, 0.1, 1.0])
def test_a_staged_plan_spends_within_its_charge(epsilon: float) -> None:
    """Every measurement of both releases, read in binary, adds up to no more than the
    epsilon charged, which is no more than the query's."""
    from dpsql.policy import load_policy
    from dpsql.sql import Options, PlanContext, plan_query
    from dpsql.sql.parse import parse_statement

    context = PlanContext(load_policy(POLICY), Options(epsilon, 1e-6), "duckdb", seed=1)
    for query, first_parts, parts in (
        (MIXED, 2, 1),
        ("SELECT g, AVG(x), quantile_cont(x, [0.1, 0.9]) FROM t GROUP BY g", 2, 2),
        ("SELECT h, MIN(x), MAX(x) FROM t GROUP BY h", 1, 2),
    ):
        plan = plan_query(parse_statement(query, "duckdb").tree, context)
        (first,) = plan.parts
        # the first release spends its portion (a tenth of it on the bounding note)
        assert first_parts * Fraction(first.share) <= first.cost.epsilon
        per_quantile = _per_quantile(plan.outer)
        spent = first.cost.epsilon + parts * per_quantile
        assert spent <= plan.cost.epsilon <= Fraction(repr(epsilon)), (query, epsilon)
        assert first.share == pytest.approx(float(per_quantile) * 0.9)


# -- timestamps -------------------------------------------------------------------------

EVENTS = {
    "analysts": {"default": {"epsilon": 100.0, "delta": 1e-6}},
    "tables": {
        "e": {
            "privacy_unit": "uid",
            "max_rows_per_unit": 2,
            "columns": {
                "uid": {"type": "int", "private": True},
                "k": {"type": "int", "lower": 0, "upper": 1, "public": True},
                "ts": {"type": "timestamp", "lower": "2024-01-01 00:00", "upper": "2024-12-31"},
            },
        }
    },
}
# 2000 rows 3 hours apart from 2024-01-01 (two per unit), and one outside the bounds
_EVENT_ROWS = [
    (i // 2, i % 2, dt.datetime(2024, 1, 1) + dt.timedelta(hours=3 * i)) for i in range(2000)
] + [(5000, 0, dt.datetime(2031, 5, 1, 12))]


def _check_events(cursor: dpsql.Cursor) -> None:
    """The median (row 1000 of 2001: 2024-05-05 00:00) and p90 (2024-08-13) within the
    rank bound at beta 1e-4 (3 hours a rank) plus one bucket, released as timestamps."""
    query = "SELECT MEDIAN(ts) AS m, PERCENTILE_DISC(0.9) WITHIN GROUP (ORDER BY ts) FROM e"
    cursor.execute(f"EXPLAIN {query}")
    plan = dict(cursor.fetchall())
    buckets, width = plan["buckets"].split()[0], float(plan["buckets"].split()[4])
    assert "seconds from 2024-01-01 00:00:00" in plan["buckets"]
    cursor.execute(query)
    ((median, p90),) = cursor.fetchall()
    share = float(plan["epsilon per quantile"])  # the second stage's, when refined
    candidates = int(buckets) + FINE_CANDIDATES  # the most a refined grid has
    rank = _rank_tolerance(share, 2, candidates, 1e-4, 0.9)
    slack = dt.timedelta(hours=3 * rank, seconds=width)
    assert isinstance(median, dt.datetime)
    assert abs(median - dt.datetime(2024, 5, 5)) <= slack
    assert abs(p90 - dt.datetime(2024, 8, 13, 21)) <= slack
    cursor.execute("SELECT k, COUNT(*) AS n, MEDIAN(ts) AS m FROM e GROUP BY k ORDER BY k")
    assert [type(row[2]) for row in cursor.fetchall()] == [dt.datetime, dt.datetime]


def test_timestamps_on_duckdb() -> None:
    database = duckdb.connect()
    database.execute("CREATE TABLE e (uid INT, k INT, ts TIMESTAMP)")
    database.executemany("INSERT INTO e VALUES (?, ?, ?)", _EVENT_ROWS)
    with dpsql.connect(database, policy=EVENTS, epsilon=1.0, ledger=":memory:", seed=2) as c:
        _check_events(c.cursor())
        # neighbours: each of 30 units removed, the histogram moves by at most 2 rows
        sql = _explain(c.cursor(), "SELECT MEDIAN(ts) FROM e")["sql"]
    full = _histogram(database, sql)
    database.execute("CREATE TABLE all_e AS SELECT * FROM e")
    for unit in (*range(0, 1000, 37), 5000):
        database.execute(f"CREATE OR REPLACE TABLE e AS SELECT * FROM all_e WHERE uid <> {unit}")
        near = _histogram(database, sql)
        assert sum(abs(full[c] - near[c]) for c in full.keys() | near.keys()) <= 2


def test_timestamps_on_postgres(postgres_url: str) -> None:
    spec = "e (uid BIGINT, k BIGINT, ts TIMESTAMP)"
    with (
        postgres_tables(postgres_url, {spec: _EVENT_ROWS}) as url,
        dpsql.connect(url, policy=EVENTS, epsilon=1.0, ledger=":memory:", seed=2) as c,
    ):
        _check_events(c.cursor())


# -- quantiles over relations (sql/relations.py) ----------------------------------------

RELATIONAL = [
    # a private table joined with a public one, keys from the data
    "SELECT n.n_name, COUNT(*) AS c, MEDIAN(c.c_acctbal) AS m FROM customer c "
    "JOIN nation n ON c.c_nationkey = n.n_nationkey GROUP BY n.n_name",
    # rows whose unit comes through a reference, beside a count
    "SELECT MEDIAN(l.l_quantity) AS m, COUNT(*) AS c FROM lineitem l",
    # a CTE, and a subquery of one row per unit
    "WITH big AS (SELECT * FROM orders WHERE o_totalprice > 1000) "
    "SELECT MEDIAN(o_totalprice) AS m FROM big",
    "SELECT MEDIAN(t) AS m FROM (SELECT o_custkey, SUM(o_totalprice) AS t FROM orders "
    "GROUP BY o_custkey) s",
]


@pytest.fixture(scope="module")
def warehouse() -> duckdb.DuckDBPyConnection:
    import tpch

    connection = duckdb.connect()
    tpch.generate(connection, 0.001)
    return connection


def _warehouse_policy(connection: duckdb.DuckDBPyConnection):
    import tpch

    from dpsql.adapters import open_adapter
    from dpsql.policy import load_policy

    loaded = load_policy(tpch.policy())
    adapter = open_adapter(connection)
    return loaded.with_public_columns(
        {k: adapter.table_columns(k) for k in loaded.tables}, "duckdb"
    )


@pytest.mark.parametrize("sql", RELATIONAL)
def test_quantiles_over_relations_are_answered_and_bounded(warehouse, sql: str) -> None:
    """Each query over a relation at epsilon 8: answered, with the relation in its notes;
    its histogram, on the database without each of 8 customers (with their orders and
    lineitems), moves by at most the rank sensitivity EXPLAIN states, in all groups."""
    policy = _warehouse_policy(warehouse)
    with dpsql.connect(warehouse, policy=policy, epsilon=8.0, ledger=":memory:", seed=4) as c:
        cursor = c.cursor()
        cursor.execute(f"EXPLAIN {sql}")
        lines = cursor.fetchall()
        histogram = [d for item, d in lines if item.strip() == "sql"][-1]
        sensitivity = int(next(d for item, d in lines if item.strip() == "rank sensitivity"))
        cursor.execute(sql)
        rows = cursor.fetchall()
        assert rows and any("the relation" in note for note in cursor.notes)
    full = _histogram(warehouse, histogram)
    customers = [row[0] for row in warehouse.execute("SELECT c_custkey FROM customer").fetchall()]
    changes = []
    for customer in customers[:: len(customers) // 8][:8]:
        near = _histogram(_without(warehouse, customer), histogram)
        changes.append(sum(abs(full[cell] - near[cell]) for cell in full.keys() | near.keys()))
    assert max(changes) <= sensitivity and max(changes) > 0, (sql, changes)


@pytest.mark.parametrize(
    ("epsilon", "query", "buckets"),
    [
        (1.0, "SELECT MEDIAN(x) FROM t", "4096 buckets of width 0.244141 from 0.0"),
        (0.01, "SELECT MEDIAN(x) FROM t", "256 buckets of width 3.90625 from 0.0"),
        (100.0, "SELECT MEDIAN(x) FROM t", "16384 buckets of width 0.0610352 from 0.0"),
        (1.0, "SELECT MEDIAN(n) FROM t", "500 buckets of width 1 from 0"),  # one per value
        (1.0, "SELECT MEDIAN(d) FROM t", "366 buckets of width 1 days from 2020-01-01"),
    ],
)
def test_the_buckets_follow_epsilon_and_the_domain(cursor, epsilon, query, buckets) -> None:
    """About 4096 buckets per unit of a quantile's epsilon, within [256, 16384], never
    more than an integer or date domain has values; EXPLAIN states them."""
    cursor.execute(f"SET dpsql.epsilon = {epsilon}")
    assert _explain(cursor, query)["buckets"] == buckets
