"""Choosing the noise per query: SET dpsql.mechanism, 'auto', and how each is charged."""

from __future__ import annotations

import math

import pytest

import dpsql
from dpsql import demo
from dpsql.accounting import zcdp_epsilon, zcdp_rho
from dpsql.errors import QueryRefused


def _connect(delta: float = 1e-3, epsilon: float = 1000.0, **options: object):
    policy = demo.DEMO_POLICY | {"analysts": {"default": {"epsilon": epsilon, "delta": delta}}}
    return dpsql.connect(
        demo.demo_connection(), policy=policy, ledger=":memory:", seed=5, **options
    )


@pytest.mark.parametrize("mechanism", ["laplace", "staircase", "gaussian"])
def test_each_mechanism_answers_and_says_so(mechanism):
    with _connect(mechanism=mechanism) as connection:
        cursor = connection.execute("SELECT SUM(income) AS total, COUNT(*) AS n FROM census")
        _, n = cursor.fetchone()
        assert {a.mechanism for a in cursor.accuracy.values()} == {mechanism}
        # within 6 noise scales of the truth: fails with probability below 1e-5
        (true_n,) = demo.demo_connection().execute("SELECT COUNT(*) FROM census").fetchone()
        assert abs(n - true_n) <= 6 * cursor.accuracy["n"].scale
        explain = dict(connection.execute("EXPLAIN SELECT COUNT(*) FROM census").fetchall())
        assert explain["measure count(*)"].startswith(mechanism)


def test_gaussian_is_charged_in_rho_and_the_budget_converts_it():
    with _connect(delta=1e-3) as connection:
        connection.execute("SET dpsql.mechanism = 'gaussian'")
        connection.execute("SELECT COUNT(*) FROM census").fetchall()
        (charge,) = connection.session.ledger.charges()
        assert charge.cost.epsilon == 0 and charge.cost.delta == 0
        # one measurement with the whole query epsilon (1.0) at the query delta (1e-6)
        assert float(charge.cost.rho) == pytest.approx(zcdp_rho(1.0, 1e-6), rel=1e-9)
        budget = connection.budget()
        assert budget.rho_spent == pytest.approx(float(charge.cost.rho), rel=1e-9)
        converted = float(zcdp_epsilon(charge.cost.rho, 1e-3))
        assert budget.epsilon_spent == pytest.approx(converted, rel=1e-9)
        assert converted < 1.0  # converted at the analyst's larger delta it costs less


def test_gaussian_needs_delta():
    with _connect(mechanism="gaussian") as connection:
        connection.execute("SET dpsql.delta = 0")
        with pytest.raises(QueryRefused, match="delta"):
            connection.execute("SELECT COUNT(*) FROM census")


def test_zcdp_charges_stop_when_the_converted_epsilon_would_exceed_the_budget():
    with _connect(delta=1e-5, epsilon=3.0, mechanism="gaussian") as connection:
        answered = 0
        with pytest.raises(dpsql.OperationalError, match="budget"):
            for income in range(1000):  # distinct queries, so none is served from the cache
                connection.execute(f"SELECT COUNT(*) FROM census WHERE income > {income}")
                answered += 1
        rho = zcdp_rho(1.0, 1e-6)
        # k queries fit exactly while the conversion of k * rho stays within epsilon 3
        fits = max(k for k in range(1, 1000) if zcdp_epsilon(k * rho, 1e-5) <= 3.0)
        assert answered == fits
        assert answered > 3  # zCDP composes better than adding epsilons


def test_auto_picks_staircase_for_large_sums_and_laplace_for_counts():
    # a count's sensitivity is 1: the staircase is then the geometric mechanism, a tie
    with _connect(mechanism="auto") as connection:
        cursor = connection.execute("SELECT COUNT(*) AS n, SUM(income) AS s FROM census")
        cursor.fetchall()
        assert cursor.accuracy["n"].mechanism == "laplace"
        assert cursor.accuracy["s"].mechanism == "staircase"
        assert cursor.accuracy["s"].note.startswith("chosen by auto: staircase")


def test_auto_picks_gaussian_when_a_unit_spans_many_groups():
    database = demo.demo_connection()
    database.execute("CREATE TABLE visits AS SELECT * FROM census")  # no key: units may repeat
    table = demo.DEMO_POLICY["tables"]["census"] | {"max_groups_per_unit": 50}
    policy = demo.DEMO_POLICY | {
        "analysts": {"default": {"epsilon": 100.0, "delta": 1e-3}},
        "tables": {"visits": table},
    }
    with dpsql.connect(database, policy=policy, ledger=":memory:", seed=5) as connection:
        connection.execute("SET dpsql.mechanism = 'auto'")
        cursor = connection.execute("SELECT race, COUNT(*) AS n FROM visits GROUP BY race")
        cursor.fetchall()
        accuracy = cursor.accuracy["n"]
        assert accuracy.mechanism == "gaussian"
        assert "L2 sensitivity" in accuracy.note
        assert math.isfinite(accuracy.interval95)


def test_gaussian_noise_is_calibrated_to_the_l2_sensitivity_across_groups():
    # a unit keeps at most 2 rows in each of at most 4 groups: its change to the count
    # vector has L2 norm at most 2 * sqrt(4) = 4 (L1 would be 8)
    database = demo.demo_connection()
    database.execute("CREATE TABLE visits AS SELECT * FROM census")
    table = demo.DEMO_POLICY["tables"]["census"] | {
        "max_groups_per_unit": 4,
        "max_rows_per_unit": 2,
    }
    policy = demo.DEMO_POLICY | {
        "analysts": {"default": {"epsilon": 100.0, "delta": 1e-3}},
        "tables": {"visits": table},
    }
    with dpsql.connect(
        database, policy=policy, ledger=":memory:", seed=5, mechanism="gaussian"
    ) as connection:
        connection.execute("SET dpsql.bounding_note = off")  # its one measurement only
        cursor = connection.execute("SELECT race, COUNT(*) AS n FROM visits GROUP BY race")
        cursor.fetchall()
        accuracy = cursor.accuracy["n"]
        assert accuracy.sensitivity == pytest.approx(4.0)
        # sigma = Delta2 / sqrt(2 rho), rho the whole query's for its one measurement
        assert accuracy.scale == pytest.approx(4.0 / math.sqrt(2 * zcdp_rho(1.0, 1e-6)), rel=1e-6)


def test_gaussian_without_delta_left_says_to_use_noise_that_needs_none():
    policy = demo.DEMO_POLICY | {"analysts": {"default": {"epsilon": 10.0}}}
    with dpsql.connect(
        demo.demo_connection(), policy=policy, ledger=":memory:", mechanism="gaussian"
    ) as connection:
        with pytest.raises(dpsql.OperationalError, match=r"SET dpsql\.mechanism = 'laplace'"):
            connection.execute("SELECT COUNT(*) FROM census")
        assert connection.budget().epsilon_spent == 0


def test_plans_sharing_prepared_noise_are_each_calibrated_to_their_own_options():
    """Plans reuse prepared mechanisms (a cache keyed by mechanism, sensitivity, epsilon
    and delta): switching back and forth, each count gets exactly its own noise."""
    with _connect(delta=1e-3) as connection:
        for run, (mechanism, epsilon) in enumerate(
            [("laplace", 0.5), ("laplace", 2.0), ("staircase", 0.5), ("gaussian", 0.5)] * 3
        ):
            connection.execute(f"SET dpsql.mechanism = '{mechanism}'")
            connection.execute(f"SET dpsql.epsilon = {epsilon}")
            cursor = connection.execute(f"SELECT COUNT(*) AS n FROM census AS run{run}")
            accuracy = cursor.accuracy["n"]
            assert accuracy.mechanism == mechanism
            if mechanism == "laplace":  # sensitivity 1: scale 1 / epsilon
                assert accuracy.scale == pytest.approx(1 / epsilon)
            if mechanism == "gaussian":  # sigma = 1 / sqrt(2 rho), rho within (epsilon, delta)
                rho = zcdp_rho(epsilon, connection.session.options.delta)
                assert accuracy.scale == pytest.approx(1 / math.sqrt(2 * rho), rel=1e-6)
        explained = dict(connection.execute("EXPLAIN SELECT COUNT(*) FROM census").fetchall())
        assert explained["measure count(*)"].startswith("gaussian")
