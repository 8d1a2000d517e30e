"""The two-stage quantile (sql/quantile_grids.py, RefinedQuantiles): the refined grid's
SQL puts each value in its candidate, its histogram moves by at most the rank
sensitivity on neighbouring databases, the sampler with a prior on the exponents'
lattice is the closed form, and the release is as close as the stated bound."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction

import duckdb
import numpy as np
import pytest
from test_quantiles import assert_draws_follow

import dpsql
from dpsql.mechanisms.quantiles import (
    exponent_rate,
    exponential_quantile,
    lattice_prior,
    quantile_weights,
)
from dpsql.sql.quantile_grids import RINGS, WINDOW, lattice
from dpsql.sql.quantiles import RefinedQuantiles

POLICY = {
    "analysts": {"default": {"epsilon": 1e6, "delta": 1e-6}},
    "tables": {
        "t": {
            "privacy_unit": "uid",
            "max_rows_per_unit": 2,
            "columns": {
                "uid": {"type": "int", "private": True},
                "x": {"type": "float", "lower": 0, "upper": 1000},
                "n": {"type": "int", "lower": 0, "upper": 1_000_000},
            },
        }
    },
}


def _plan(connection: dpsql.Connection, query: str) -> RefinedQuantiles:
    session = connection.session
    plan = session.plan(dpsql.sql.parse.parse_statement(query, "duckdb").tree)
    assert isinstance(plan, RefinedQuantiles), type(plan)
    return plan


def test_a_prior_on_the_lattice_is_the_closed_form() -> None:
    """RatePrior's exponents equal the Fraction prior's they stand for, and the draws
    follow mu(i) e^-x(i) / sum (chi-square)."""
    counts, q, epsilon, s = [3, 0, 9, 4, 1, 0, 6, 2], Fraction(1, 2), Fraction(3, 2), 2
    logs = np.array([0.0, -math.log(4)] * 4)
    prior = lattice_prior(logs, q, epsilon, s)
    rate = exponent_rate(q, epsilon, s)
    assert prior.rate == rate
    with pytest.raises(ValueError, match="rate"):  # a prior for another epsilon
        exponential_quantile(counts, q, epsilon * 2, np.random.default_rng(1), prior, s)
    as_fractions = [rate * int(m) for m in prior.multiples]
    assert quantile_weights(counts, q, epsilon, prior, s) == quantile_weights(
        counts, q, epsilon, as_fractions, s
    )
    # the rounding moves each log-measure by at most half a step
    assert all(
        abs(float(f) + log) <= float(rate) / 2 for f, log in zip(as_fractions, logs, strict=True)
    )
    closed = quantile_weights(counts, q, epsilon, as_fractions, s)
    rng = np.random.default_rng(5)
    assert_draws_follow(closed, lambda: exponential_quantile(counts, q, epsilon, rng, prior, s))


def test_a_prior_on_the_lattice_past_int64_is_the_same_closed_form() -> None:
    """Counts whose D n passes 2^61 take the exact Python-int path: the same exponents as
    the Fraction prior they stand for."""
    counts, q, epsilon = [2**59, 3, 2**59, 1], Fraction(1, 2), Fraction(1, 3)
    prior = lattice_prior(np.array([0.0, -1.0, 0.0, -2.0]), q, epsilon)
    as_fractions = [prior.rate * int(m) for m in prior.multiples]
    assert quantile_weights(counts, q, epsilon, prior) == quantile_weights(
        counts, q, epsilon, as_fractions
    )


@pytest.mark.parametrize("kind", ["float", "int", "timestamp"])
def test_the_refined_grid_is_ordered_and_nested(kind: str) -> None:
    """Candidates' values increase; a refined group's parts end where the group ends,
    as many as its ring around the nearest pick gives; every other group is one
    candidate; the count is within `most`."""
    domain = {"float": (0.0, 1000.0, kind), "int": (0, 1_000_000, kind)}.get(
        kind, (0.0, 86_400.0 * 365, kind)
    )
    found = lattice(domain, Fraction(1), 3)
    assert found is not None
    refined = found.refined({40, 41, 200}, 3)  # three picks at most
    values = [refined.value(i) for i in range(refined.size)]
    assert all(a < b for a, b in itertools.pairwise(values))
    assert refined.size <= refined.most
    coarse = found.coarse
    assert values[-1] == coarse.value(coarse.size - 1)
    groups = set(refined.groups)
    assert groups == set(range(40 - WINDOW, 41 + WINDOW + 1)) | set(
        range(200 - WINDOW, 200 + WINDOW + 1)
    )
    for group, count in refined.split:
        distance = min(abs(group - pick) for pick in (40, 41, 200))
        _, divisor = next(ring for ring in RINGS if distance <= ring[0])
        assert count == found.factor // divisor, (group, count)
    assert refined.size == coarse.size + sum(count - 1 for _, count in refined.split)


def test_an_integer_grid_of_one_value_a_bucket_is_not_refined() -> None:
    assert lattice((0, 500, "int"), Fraction(1), 1) is None
    assert lattice((0.0, 1.0, "float"), Fraction(1), 10_000) is None  # too many windows


@pytest.fixture(scope="module")
def neighbours():
    """t with 400 units of 1-4 rows, and the same without unit 7 (four rows)."""
    rows = [(u, (u * 37 + r * 131) % 1000 + 0.5, u * 2477 % 1_000_001) for u in range(400)
            for r in range(u % 4 + 1)]  # fmt: skip
    databases = []
    for drop in (None, 7):
        database = duckdb.connect()
        database.execute("CREATE TABLE t (uid INT, x DOUBLE, n BIGINT)")
        database.executemany("INSERT INTO t VALUES (?, ?, ?)", [r for r in rows if r[0] != drop])
        databases.append(database)
    return databases


@pytest.mark.parametrize("column", ["x", "n"])
def test_each_stage_moves_by_at_most_the_rank_sensitivity(neighbours, column: str) -> None:
    """Both stages' SQL (stage 2's for picks in several places) on neighbouring databases:
    every histogram moves by at most max_rows_per_unit in total."""
    full, without = neighbours
    with dpsql.connect(full, policy=POLICY, ledger=":memory:", seed=3) as connection:
        plan = _plan(connection, f"SELECT MEDIAN({column}) FROM t")
        texts = [plan.parts[0].sql] + [
            plan.finish_outer(picks).sql for picks in ({0}, {100, 2000}, {4095})
        ]
    for text in texts:
        one = Counter(dict(full.execute(text).fetchall()))
        two = Counter(dict(without.execute(text).fetchall()))
        assert sum(one.values()) > sum(two.values())  # the unit was in the histogram
        assert sum(abs(one[k] - two[k]) for k in one.keys() | two.keys()) <= 2, text


def test_the_sql_puts_each_value_in_its_candidate(neighbours) -> None:
    """Stage 2's key for each row names the candidate whose interval holds the value:
    the candidate before it ends below the value, the candidate itself at or above."""
    full, _ = neighbours
    with dpsql.connect(full, policy=POLICY, ledger=":memory:", seed=3) as connection:
        plan = _plan(connection, "SELECT MEDIAN(x) FROM t")
        fine = plan.finish_outer({100, 130})
    grid, table = fine.grid, fine.analysis.table
    expression = grid.bucket(fine.column, table).sql("duckdb")
    for value, key in full.execute(f"SELECT x, {expression} FROM t").fetchall():
        (index,) = grid.indexes(np.array([key]))
        assert grid.value(index) >= value - 1e-9
        assert index == 0 or grid.value(index - 1) < value + 1e-9


def test_the_release_is_within_the_stated_bound_and_finer_than_one_stage() -> None:
    """100,000 values of 1000 U^2 at epsilon 1, row-level: over 40 seeded releases, each
    median's rank is within the EXPLAIN's 95% bound (beta 0.05: at most 5 of 40 outside,
    a binomial tail below 1e-3 would be 9) and the mean rank error is below a
    quarter of one coarse bucket's rows, which a single stage's release cannot beat."""
    policy = {
        "analysts": POLICY["analysts"],
        "tables": {"u": {"columns": {"x": {"type": "float", "lower": 0, "upper": 1000}}}},
    }
    database = duckdb.connect()
    database.execute("SELECT setseed(0.5)")
    database.execute("CREATE TABLE u AS SELECT 1000 * random() ** 2 AS x FROM range(100000)")
    ordered = np.sort(database.execute("SELECT x FROM u").fetchnumpy()["x"])
    with dpsql.connect(database, policy=policy, epsilon=1.0, ledger=":memory:", seed=9) as c:
        cursor = c.cursor()
        cursor.execute("EXPLAIN SELECT MEDIAN(x) FROM u")
        explained = dict(cursor.fetchall())
        bound = float(explained["95% rank error"].split()[1])
        errors = []
        for i in range(40):
            cursor.execute(f"SELECT MEDIAN(x) FROM u WHERE x >= -{i + 1}")
            value = cursor.fetchall()[0][0]
            errors.append(abs(np.searchsorted(ordered, value, side="right") - 50_000))
    width = float(explained["buckets"].split()[4])
    rows_per_bucket = np.sum((ordered > 250 - width / 2) & (ordered <= 250 + width / 2))
    assert sum(e > bound for e in errors) <= 9, errors
    assert np.mean(errors) < rows_per_bucket / 4, (np.mean(errors), rows_per_bucket)
