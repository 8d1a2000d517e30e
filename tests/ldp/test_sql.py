"""SQL over tables of local-DP reports: estimates, post-processing, no central charge."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql import ldp
from dpsql.errors import PolicyError, QueryRefused

CITIES = [f"city{i}" for i in range(8)]
PEOPLE = 40_000


def _true_values(rng: np.random.Generator) -> np.ndarray:
    weights = np.array([0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.05, 0.0])
    return rng.choice(CITIES, size=PEOPLE, p=weights)


def _report_table(name: str, oracle: ldp.FrequencyOracle, values: np.ndarray, seed: int):
    reports = oracle.perturb(values, rng=seed)
    database = duckdb.connect(":memory:")
    fields = np.array(oracle.format_reports(reports), dtype=object)
    database.register("fields", {"id": np.arange(len(fields)), "report": fields})
    database.execute(f"CREATE TABLE {name} AS SELECT id, report::VARCHAR AS report FROM fields")
    database.unregister("fields")
    return database, reports


def _policy(name: str, mechanism: str, domain: list | dict, **extra: object) -> dict:
    return {
        "analysts": {"default": {"epsilon": 1.0, "delta": 1e-6}},
        "tables": {name: {"local": {"mechanism": mechanism, "epsilon": 2.0, "domain": domain}}}
        | extra,
    }


@pytest.fixture(scope="module")
def cities():
    values = _true_values(np.random.default_rng(1))
    oracle = ldp.mechanism("oue", 2.0, CITIES)
    database, reports = _report_table("reports", oracle, values, seed=2)
    connection = dpsql.connect(database, policy=_policy("reports", "oue", CITIES), seed=3)
    yield connection, oracle, reports, values
    connection.close()


def test_group_by_value_is_the_oracle_estimate_for_every_domain_value(cities):
    connection, oracle, reports, values = cities
    cursor = connection.execute("SELECT value, COUNT(*) AS n FROM reports GROUP BY value")
    rows = dict(cursor.fetchall())
    assert list(rows) == sorted(CITIES)  # every public value, the empty one too
    expected = dict(zip(CITIES, oracle.estimate(reports), strict=True))
    for city in CITIES:
        assert rows[city] == pytest.approx(expected[city], rel=1e-12, abs=1e-9)
        truth = int(np.sum(values == city))
        # 5 standard deviations of the closed-form variance: fails with probability < 1e-6
        assert abs(rows[city] - truth) < 5 * np.sqrt(oracle.variance(PEOPLE, truth))
    accuracy = cursor.accuracy["n"]
    assert accuracy.mechanism == "local oue"
    assert accuracy.interval95 == pytest.approx(
        1.96 * np.sqrt(oracle.variance(PEOPLE, 0.3 * PEOPLE)), rel=0.05
    )


def test_where_in_sums_the_selected_estimates_and_nothing_is_charged(cities):
    connection, oracle, reports, _ = cities
    before = connection.budget()
    (total,) = connection.execute(
        "SELECT COUNT(*) FROM reports WHERE value IN ('city0', 'city2')"
    ).fetchone()
    estimate = oracle.estimate(reports)
    assert total == pytest.approx(estimate[0] + estimate[2], rel=1e-12)
    assert connection.budget() == before


def test_group_by_an_expression_of_the_value_and_order_limit(cities):
    connection, oracle, reports, _ = cities
    rows = connection.execute(
        "SELECT value LIKE '%0' OR value LIKE '%1' AS top, COUNT(*) AS n "
        "FROM reports GROUP BY top ORDER BY n DESC LIMIT 1"
    ).fetchall()
    estimate = oracle.estimate(reports)
    assert rows == [(True, pytest.approx(estimate[0] + estimate[1], rel=1e-12))]


def test_postprocessing_is_chosen_per_session(cities):
    connection, _, reports, _ = cities
    connection.execute("SET dpsql.ldp_postprocess = 'norm-sub'")
    try:
        counts = [n for _, n in connection.execute(
            "SELECT value, COUNT(*) AS n FROM reports GROUP BY value"
        ).fetchall()]  # fmt: skip
        assert min(counts) >= 0
        assert sum(counts) == pytest.approx(len(reports), rel=1e-9)
        assert connection.execute("SHOW dpsql.ldp_postprocess").fetchone() == ("norm-sub",)
    finally:
        connection.execute("SET dpsql.ldp_postprocess = 'none'")
    with pytest.raises(dpsql.ProgrammingError, match="norm-sub"):
        connection.execute("SET dpsql.ldp_postprocess = 'magic'")


def test_explain_says_no_central_budget_is_charged(cities):
    connection = cities[0]
    detail = dict(connection.execute("EXPLAIN SELECT COUNT(*) FROM reports").fetchall())
    assert detail["cost"].startswith("none")
    assert "randomised on its owner's device" in detail["cost"]


@pytest.mark.parametrize(
    ("sql", "refused"),
    [
        ("SELECT report, COUNT(*) FROM reports GROUP BY report", "report"),
        ("SELECT COUNT(DISTINCT value) FROM reports", "COUNT(DISTINCT"),
        ("SELECT value FROM reports", "raw values"),
        ("SELECT COUNT(*) FROM reports WHERE id = 3", "id"),
    ],
)
def test_raw_reports_and_other_columns_are_refused(cities, sql, refused):
    with pytest.raises(QueryRefused, match=refused.replace("(", r"\(")):
        cities[0].execute(sql)


def test_range_counts_on_a_local_hierarchy_use_the_consistent_tree():
    rng = np.random.default_rng(5)
    ages = np.clip(rng.normal(45, 15, size=PEOPLE).round(), 0, 99).astype(np.int64)
    oracle = ldp.mechanism("hh", 2.0, range(100), branching=4)
    database, reports = _report_table("ages", oracle, ages, seed=6)
    policy = _policy("ages", "hh", {"lower": 0, "upper": 99})
    with dpsql.connect(database, policy=policy, seed=7) as connection:
        (count,) = connection.execute(
            "SELECT COUNT(*) FROM ages WHERE value BETWEEN 30 AND 59"
        ).fetchone()
        levels = oracle.consistent(oracle.aggregate(reports), len(reports))
        assert count == pytest.approx(oracle.range_count(levels, 30, 60), rel=1e-9)
        truth = int(np.sum((ages >= 30) & (ages <= 59)))
        assert abs(count - truth) < 0.05 * PEOPLE
        (mean,) = connection.execute("SELECT AVG(value) FROM ages").fetchone()
        assert abs(mean - ages.mean()) < 2.0


def test_policy_errors_for_local_tables():
    database = duckdb.connect(":memory:")
    database.execute("CREATE TABLE reports (report VARCHAR)")
    with pytest.raises(PolicyError, match="domain"):
        dpsql.connect(database, policy=_policy("reports", "oue", ["only"]))
    with pytest.raises(PolicyError, match="mechanism"):
        dpsql.connect(database, policy=_policy("reports", "magic", CITIES))
    bad = _policy("reports", "oue", CITIES)
    bad["tables"]["reports"]["local"]["report"] = "answer"
    with pytest.raises(PolicyError, match="report column 'answer'"):
        dpsql.connect(database, policy=bad)
    bad = _policy("reports", "oue", CITIES)
    bad["tables"]["reports"]["privacy_unit"] = "id"
    with pytest.raises(PolicyError, match="only 'local"):
        dpsql.connect(database, policy=bad)
    bad = _policy("reports", "olh", CITIES)
    bad["tables"]["reports"]["local"]["epsilon"] = 100.0  # OLH's hash range overflowed
    with pytest.raises(PolicyError, match=r"local\.epsilon.*between 1e-12 and 40"):
        dpsql.connect(database, policy=bad)


@pytest.mark.parametrize(
    "mechanism, malformed",
    [("grr", ["alice@example.org lives in nice"]), ("oue", ["alice"]), ("olh", ["alice:nice"]),
     ("grr", ["99"]), ("grr", ["-1"]), ("dse", ["8"]),
     # two reports in one field; a seed that makes a = 0 (one row supporting one value
     # P / g times), negative or beyond the seeds drawn; a bucket beyond g or negative
     # (counting allocated without bound); a level beyond the hierarchy's; two fields of
     # wrong lengths that, joined, read as two reports (found by a review)
     ("olh", ["1:2:3:4"]), ("olh", ["-11:0"]), ("olh", ["110:0"]), ("olh", ["3:999"]),
     ("olh", ["3:-4000000000"]), ("hh", ["1:0:0:1:0:0"]), ("hh", ["0:1:0"]),
     ("hh", ["9:1:0"]), ("hh", ["1:1:5"]), ("oue", ["abc", "d"])],
)  # fmt: skip
def test_a_row_that_is_no_report_is_left_out(mechanism, malformed):
    """The parser's message quoted the cell, for free: a client that uploaded its true
    value unrandomised had it read back by any analyst. Then the table was refused as a
    whole, which told whether such a row existed, for free; an index beyond the domain
    failed with a raw ValueError or a DataError (found by audits). Such a row is no
    report: the estimate is the one over the reports alone."""
    oracle = ldp.mechanism(mechanism, 2.0, CITIES)
    database, _ = _report_table("reports", oracle, _true_values(np.random.default_rng(4))[:50], 5)
    policy = _policy("reports", mechanism, CITIES)
    query = "SELECT value, COUNT(*) AS n FROM reports GROUP BY value"
    with dpsql.connect(database, policy=policy, seed=3) as connection:
        clean = connection.execute(query).fetchall()
    for i, field in enumerate(malformed):
        database.execute(f"INSERT INTO reports VALUES ({50 + i}, '{field}')")
    with dpsql.connect(database, policy=policy, seed=3) as connection:
        cursor = connection.execute(query)
        assert cursor.fetchall() == clean
        assert "50 local reports" in cursor.notes[0] and "left out" in cursor.notes[0]
        assert "alice" not in " ".join(cursor.notes)
        assert connection.budget().epsilon_spent == 0


@pytest.mark.parametrize("mechanism", sorted(ldp.MECHANISMS))
def test_every_report_a_randomiser_sends_is_valid(mechanism):
    """The server leaves out what no randomiser sends (FrequencyOracle.valid_reports): it
    must never leave out a report one did, whatever the domain's size (13 values: unary
    rows with spare bits, hierarchies of several levels, OLH's and Hadamard's ranges)."""
    domain = [f"v{i}" for i in range(13)]
    epsilon = 2.0 if mechanism != "dse" else 3.0
    oracle = ldp.mechanism(mechanism, epsilon, domain)
    values = np.random.default_rng(9).choice(domain, size=3_000)
    fields = oracle.format_reports(oracle.perturb(values, rng=10))
    parsed = oracle.parse_reports(fields)
    assert len(parsed) == len(fields)
    assert oracle.valid_reports(parsed).all()
