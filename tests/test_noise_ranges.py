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


def _outcome(connection: dpsql.Connection, sql: str, instead: str = "SET dpsql.") -> str:
    charges = len(connection.session.ledger.charges())
    try:
        connection.execute(sql).fetchall()
    except QueryRefused as refused:
        assert len(connection.session.ledger.charges()) == charges, "refused after the charge"
        assert "cannot be drawn exactly" in str(refused)
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
    # closed forms of enormous scales are infinite, not an error
    huge = DiscreteLaplace.with_scale(Fraction(10) ** 400, 1.0)
    assert huge.scale == huge.expected_abs_error() == huge.variance() == math.inf


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
