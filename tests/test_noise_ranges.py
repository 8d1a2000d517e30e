"""Options at the edges of what the samplers can draw: every query is answered, or refused
before the charge saying what to set instead; never a raw error after the charge.

An epsilon of 1e-20 asks for discrete Laplace noise of scale 1e20, beyond the
exact sampler's 2^48; the staircase's tables cannot be built from an epsilon of
about 100 up; a tiny epsilon and delta leave no zCDP rho. Each used to fail
only once the noise was drawn, after the budget was charged, with a
ValueError, OverflowError, ZeroDivisionError or InternalError, or (partition
selection's threshold) to loop for ever.
"""

from __future__ import annotations

import math
from fractions import Fraction

import duckdb
import pytest

import dpsql
from dpsql import demo
from dpsql.accounting import zcdp_epsilon, zcdp_rho
from dpsql.errors import QueryRefused
from dpsql.mechanisms.base import OutOfRange
from dpsql.mechanisms.choice import choose
from dpsql.mechanisms.continual import Factorization
from dpsql.mechanisms.gaussian import DiscreteGaussian, GridGaussian
from dpsql.mechanisms.laplace import DiscreteLaplace, GridLaplace
from dpsql.mechanisms.staircase import Staircase

EPSILONS = [1e-300, 1e-20, 1e-13, 1e-9, 100.0, 1000.0, 99_999.0]
QUERIES = [
    "SELECT COUNT(*), SUM(income) FROM census",
    "SELECT AVG(age) FROM census WHERE sex = 1",
    "SELECT state, COUNT(*) FROM census GROUP BY state",  # keys from the data: selection
]


def _connect(policy: dict | None = None, database=None) -> dpsql.Connection:
    policy = policy or demo.DEMO_POLICY | {"analysts": {"default": {"epsilon": 5e5, "delta": 0.1}}}
    return dpsql.connect(
        database or demo.demo_connection(), policy=policy, ledger=":memory:", seed=5
    )


def _outcome(
    connection: dpsql.Connection,
    sql: str,
    instead: str = "SET dpsql.",
    reasons: tuple[str, ...] = ("cannot be drawn exactly",),
) -> str:
    charges = len(connection.session.ledger.charges())
    try:
        connection.execute(sql).fetchall()
    except QueryRefused as refused:
        assert len(connection.session.ledger.charges()) == charges, "refused after the charge"
        assert any(reason in str(refused) for reason in reasons), str(refused)
        assert f"Instead: {instead}" in str(refused)
        return "refused"
    return "answered"


@pytest.mark.parametrize("mechanism", ["laplace", "staircase", "gaussian", "auto"])
def test_every_epsilon_is_answered_or_refused_before_the_charge(mechanism):
    with _connect() as connection:
        connection.execute(f"SET dpsql.mechanism = '{mechanism}'")
        outcomes = set()
        for epsilon in EPSILONS:
            connection.execute(f"SET dpsql.epsilon = {epsilon!r}")
            outcomes |= {_outcome(connection, sql) for sql in QUERIES}
        assert outcomes == {"answered", "refused"}  # both paths are exercised


def test_synopses_and_running_totals_refuse_a_declared_epsilon_beyond_the_sampler():
    database = duckdb.connect()
    database.execute(
        "CREATE TABLE events AS SELECT i % 100 AS uid, DATE '2024-01-01' + (i % 20)::INT AS day, "
        "i % 90 AS age FROM range(2000) t(i)"
    )
    columns = {
        "uid": {"type": "int", "private": True},
        "day": {"type": "date", "lower": "2024-01-01", "upper": "2024-02-09",
                "continual": {"step": "1 day", "epsilon": 1e-20}},
        "age": {"type": "int", "lower": 0, "upper": 100, "synopsis": {"bin": 1, "epsilon": 1e-20}},
    }  # fmt: skip
    policy = {
        "version": 1,
        "analysts": {"default": {"epsilon": 10.0, "delta": 1e-6}},
        "tables": {"events": {"privacy_unit": "uid", "max_groups_per_unit": 40,
                              "max_rows_per_unit": 3, "columns": columns}},
    }  # fmt: skip
    with _connect(policy, database) as connection:
        for sql, declared in (
            ("SELECT COUNT(*) FROM events WHERE age BETWEEN 10 AND 50", "synopsis"),
            ("SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) FROM events GROUP BY day", "continual"),
        ):
            instead = f"declare a larger {declared} epsilon for events."
            assert _outcome(connection, sql, instead) == "refused"


def _events() -> duckdb.DuckDBPyConnection:
    """100 units of 20 rows, one a day and one an age: within every bound the policy sets."""
    database = duckdb.connect()
    database.execute(
        "CREATE TABLE events AS SELECT i // 20 AS uid, DATE '2024-01-01' + (i % 20)::INT AS day, "
        "i % 90 AS age, (i % 11)::DOUBLE AS amount FROM range(2000) t(i)"
    )
    return database


def _stream_policy(continual: dict, synopsis: dict | None = None) -> dict:
    columns = {
        "uid": {"type": "int", "private": True},
        "day": {"type": "date", "lower": "2024-01-01", "upper": "2024-02-09",
                "continual": {"step": "1 day", **continual}},
        "age": {"type": "int", "lower": 0, "upper": 100},
        "amount": {"type": "float", "lower": 0, "upper": 10},
    }  # fmt: skip
    if synopsis is not None:
        columns["age"]["synopsis"] = synopsis
    return {
        "version": 1,
        "analysts": {"default": {"epsilon": 1e6, "delta": 0.5}},
        "tables": {"events": {"privacy_unit": "uid", "max_groups_per_unit": 40,
                              "max_rows_per_unit": 3, "columns": columns}},
    }  # fmt: skip


RUNNING_TOTALS = {
    "count": "SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) AS total FROM events "
    "WHERE day < '2024-01-09' GROUP BY day",
    "sum": "SELECT day, SUM(SUM(amount)) OVER (ORDER BY day) AS total FROM events "
    "WHERE day < '2024-01-09' GROUP BY day",
}
NO_RHO = "no zCDP rho converts"


def _running_truth(database: duckdb.DuckDBPyConnection, kind: str) -> list[float]:
    value = "COUNT(*)" if kind == "count" else "SUM(amount)"
    return [float(total) for (total,) in database.execute(
        f"SELECT SUM({value}) OVER (ORDER BY day) FROM events WHERE day < '2024-01-09' "
        "GROUP BY day ORDER BY day"
    ).fetchall()]  # fmt: skip


@pytest.mark.parametrize(
    "continual",
    [{}, {"mechanism": "factorization", "delta": 1e-9},
     {"mechanism": "factorization", "delta": 1e-300}],
    ids=["binary", "factorization", "factorization-tiny-delta"],
)  # fmt: skip
@pytest.mark.parametrize("kind", ["count", "sum"])
def test_running_totals_are_finite_and_calibrated_or_refused_before_the_charge(continual, kind):
    """At every epsilon, each counter releases finite totals within the noise it reports,
    or is refused before the charge. At a tiny delta too, the factorization's running
    COUNT released int64's minimum (noise beyond int64), and with no rho at all it
    raised ZeroDivisionError; for its running SUM at epsilon 1e-300 see the next test."""
    database = _events()
    truth = _running_truth(database, kind)
    outcomes = set()
    for epsilon in [*EPSILONS[:-1], 1e-6, 1e-3, 1.0, 1e4]:
        policy = _stream_policy({"epsilon": epsilon, **continual})
        with _connect(policy, database) as connection:
            instead = "declare a larger continual epsilon for events.day"
            outcome = _outcome(connection, RUNNING_TOTALS[kind], instead,
                               ("cannot be drawn exactly", NO_RHO))  # fmt: skip
            outcomes.add(outcome)
            if outcome == "refused":
                continue
            cursor = connection.execute(RUNNING_TOTALS[kind])  # the same stream: free
            released = [float(total) for _, total in cursor.fetchall()]
            scale = cursor.accuracy["total"].scale  # the largest standard deviation
            assert math.isfinite(scale), epsilon
            assert all(math.isfinite(value) for value in released), (epsilon, released)
            # the noise the release reports is the noise it has (no overflow, no
            # saturation at int64): 8 standard deviations, or a rounded count
            assert all(abs(v - t) <= 8 * scale + 0.5 for v, t in zip(released, truth, strict=True))
            assert len(connection.session.ledger.charges()) == 1
    assert "answered" in outcomes


def test_a_factorization_running_sum_at_a_tiny_epsilon_is_noised_as_its_sigma_says():
    """Below the epsilon where delta limits the conversion, rho no longer shrinks, and
    neither does the running SUM's noise: at epsilon 1e-300 it is what it is at 1e-20.
    It released 1e308 and inf: its grid step came from epsilon (2^986), not its sigma."""
    database = _events()
    scales = {}
    for epsilon in (1e-300, 1e-20, 1e-3):
        policy = _stream_policy({"epsilon": epsilon, "mechanism": "factorization",
                                 "delta": 1e-9})  # fmt: skip
        with _connect(policy, database) as connection:
            cursor = connection.execute(RUNNING_TOTALS["sum"])
            assert all(math.isfinite(total) for _, total in cursor.fetchall())
            scales[epsilon] = cursor.accuracy["total"].scale
    assert scales[1e-300] == pytest.approx(scales[1e-20], rel=1e-6)
    assert scales[1e-3] < scales[1e-20] < 1e20


GAUSSIAN_SYNOPSES = [  # (epsilon, delta, max_groups_per_unit)
    (1e-300, 1e-300, 40), (1e-300, 1e-9, 40), (1e-300, 1e-9, 4000), (1e-20, 1e-100, 40),
    (1e-9, 1e-300, 40), (1e-3, 1e-300, 4000), (1.0, 1e-300, 40), (1e6, 1e-300, 40),
    (1e6, 0.5, 4000),
]  # fmt: skip


def test_gaussian_synopses_at_extreme_epsilon_and_delta_answer_or_refuse_before_the_charge():
    """No rho within (epsilon, delta), or a sigma beyond the discrete Gaussian's 2^40, is
    refused before the charge saying what to declare; anything else is answered with a
    finite count and interval."""
    database = _events()
    sql = "SELECT COUNT(*) FROM events WHERE age BETWEEN 10 AND 50"
    (truth,) = database.execute(sql).fetchone()
    outcomes = set()
    for epsilon, delta, groups in GAUSSIAN_SYNOPSES:
        synopsis = {"bin": 1, "epsilon": epsilon, "delta": delta, "mechanism": "gaussian"}
        policy = _stream_policy({"epsilon": 1.0}, synopsis)
        policy["tables"]["events"]["max_groups_per_unit"] = groups
        with _connect(policy, database) as connection:
            instead = "declare a larger synopsis epsilon for events.age in the policy"
            outcome = _outcome(connection, sql, instead, ("cannot be drawn exactly", NO_RHO))
            outcomes.add(outcome)
            if outcome == "answered":
                cursor = connection.execute(sql)  # from the stored synopsis: free
                ((count,),) = cursor.fetchall()
                (accuracy,) = cursor.accuracy.values()
                assert math.isfinite(accuracy.scale) and math.isfinite(accuracy.interval95)
                assert abs(count - truth) <= 8 * accuracy.scale + 0.5
                assert len(connection.session.ledger.charges()) == 1
    assert outcomes == {"answered", "refused"}


def test_mechanisms_say_out_of_range_when_built_or_prepared():
    DiscreteLaplace(1, 1.0).prepare()  # an ordinary one prepares
    with pytest.raises(OutOfRange, match="scale must be in"):
        DiscreteLaplace(1, 1e-20).prepare()
    with pytest.raises(OutOfRange):
        GridLaplace(1.0, 1e-300)
    with pytest.raises(OutOfRange, match="scale inf"):  # its message's float overflowed
        GridLaplace(1e300, 1e-300)
    with pytest.raises(OutOfRange, match="sigma inf"):
        GridGaussian(1e300, 1e-300)
    with pytest.raises(OutOfRange):  # e^epsilon overflows its closed forms
        Staircase(1000, 1e5)
    with pytest.raises(OutOfRange):  # probabilities too close for its tables
        Staircase(1000, 1000.0).prepare()
    with pytest.raises(OutOfRange, match="sigma is above"):
        DiscreteGaussian(1, 1e-30)
    Factorization(1024, 1.0, 1.0, _no_draws).prepare()  # an ordinary one prepares
    with pytest.raises(OutOfRange, match=r"standard deviation \S+e\+24 cannot be drawn exactly"):
        Factorization(1024, 1e-48, 1.0, _no_draws).prepare()  # a count's noise beyond int64
    with pytest.raises(OutOfRange, match="standard deviation inf"):
        Factorization(1024, 0.0, 1.0, _no_draws).prepare()  # no rho: it divided by zero
    # closed forms of enormous scales are infinite, not an error
    huge = DiscreteLaplace.with_scale(Fraction(10) ** 400, 1.0)
    assert huge.scale == huge.expected_abs_error() == huge.variance() == math.inf


def _no_draws(size, sigma, rng):
    raise AssertionError("prepared, not drawn")


def test_the_automatic_choice_never_fails_and_never_picks_what_cannot_be_drawn():
    for epsilon in [1e-300, 1e-20, 1e-9, 0.01, 1.0, 100.0, 1000.0, 99_999.0, 999_999.0]:
        for l1 in [1, 3, 1000]:
            name, reason = choose(l1, l1, epsilon, 1e-6, 1)
            assert reason.startswith(name)
            if name == "staircase":
                Staircase(l1, epsilon).prepare()


def test_zcdp_conversions_of_vanishing_parameters_stay_finite_and_conservative():
    assert zcdp_rho(1e-300, 1e-300) == 0.0  # no rho fits: the planners refuse
    tiny = zcdp_epsilon(Fraction(1, 2**1100), Fraction(1, 10**6))
    assert tiny == zcdp_epsilon(Fraction(1, 2**1000), Fraction(1, 10**6))  # a larger rho's
    rho = zcdp_rho(1e-12, 1e-300)
    assert rho > 0 and zcdp_epsilon(rho, 1e-300) <= Fraction(1, 10**12)
