"""The bounding note: its measurement's sensitivity on neighbouring databases, its share of
the query's epsilon, and when it is shown (sql/bounding.py).

The data is sales-like: 5,000 rows of about 714 customers, 7 rows each, so
max_rows_per_unit = 1 keeps one row in seven.
"""

from __future__ import annotations

import copy
import random
from fractions import Fraction

import numpy as np
import pytest
from conftest import on_every_backend, pums_policy
from test_sensitivity import note_change

import dpsql
from dpsql.accounting import Cost, _as_written
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.policy import load_policy
from dpsql.sql import Options, PlanContext, plan_query
from dpsql.sql.bounding import CAP, BoundingNote, cut_share_low
from dpsql.sql.parse import parse_statement

ROWS_PER_CUSTOMER = 7
# Five copies of the 1,000 PUMS rows, numbered, each run of 7 one customer's.
_SALES = (
    "SELECT CAST(FLOOR((ROW_NUMBER() OVER (ORDER BY copy, age, income, educ, sex, race, "
    f"married) - 1) / {ROWS_PER_CUSTOMER}.0) AS BIGINT) AS customer, income AS amount, sex "
    "FROM base_pums CROSS JOIN (SELECT 1 AS copy UNION ALL SELECT 2 UNION ALL SELECT 3 "
    "UNION ALL SELECT 4 UNION ALL SELECT 5) AS copies"
)
_COLUMNS = {
    "customer": {"type": "int", "private": True},
    "amount": {"type": "float", "lower": 0, "upper": 500000},
    "sex": {"type": "int", "values": [0, 1]},
}
SHAPES = [
    "SELECT COUNT(*) FROM sales",
    "SELECT COUNT(*), SUM(amount) FROM sales WHERE amount < 100000",
    "SELECT sex, COUNT(*), AVG(amount) FROM sales GROUP BY sex",
    "SELECT amount, COUNT(*) FROM sales GROUP BY amount",  # keys from the data
]


def _policy(max_rows: int = 1, max_groups: int = 1) -> dict:
    policy = pums_policy()
    policy["tables"]["sales"] = {
        "privacy_unit": "customer",
        "max_rows_per_unit": max_rows,
        "max_groups_per_unit": max_groups,
        "columns": copy.deepcopy(_COLUMNS),
    }
    return policy


def _plan(shape: str, dialect: str, policy: dict | None = None, **options: object):
    chosen = Options(**{"epsilon": 1.0, "delta": 1e-6, **options})
    context = PlanContext(load_policy(policy or _policy()), chosen, dialect, seed=5)
    return plan_query(parse_statement(shape, dialect).tree, context)


@pytest.fixture(scope="module")
def sales(backend):
    scratch = backend.scratch({"base_pums": "pums"})
    scratch.replace_table("base_sales", _SALES)
    scratch.replace_table("sales", "SELECT * FROM base_sales")
    scratch.dialect = backend.dialect
    yield scratch
    scratch.close()


@on_every_backend
@pytest.mark.parametrize("bounds", [(1, 1), (2, 2)])
def test_the_notes_totals_change_at_most_by_their_sensitivity(sales, bounds):
    """Removing a customer with all their rows moves (rows cut, rows kept) by at most the
    note's sensitivity, CAP x max_rows x max_groups, and by exactly that for a customer
    with at least that many rows under max_rows = max_groups = 1."""
    max_rows, max_groups = bounds
    plans = [_plan(s, sales.dialect, _policy(max_rows, max_groups)) for s in SHAPES]
    assert all(plan.bounding is not None for plan in plans)
    sales.replace_table("sales", "SELECT * FROM base_sales")
    full = [sales.rows(plan.sql) for plan in plans]
    reached = False
    for customer in (0, 1, 350, 713):
        sales.replace_table("sales", f"SELECT * FROM base_sales WHERE customer <> {customer}")
        for plan, before in zip(plans, full, strict=True):
            moved = note_change(before, sales.rows(plan.sql))
            assert 0 < moved <= plan.bounding.noise.sensitivity, (plan.sql, customer, moved)
            reached |= moved == plan.bounding.noise.sensitivity
    assert plans[0].bounding.noise.sensitivity == CAP * max_rows  # ungrouped: one group
    assert plans[2].bounding.noise.sensitivity == CAP * max_rows * max_groups
    assert reached == (CAP * max_rows <= ROWS_PER_CUSTOMER)
    sales.replace_table("sales", "SELECT * FROM base_sales")


@on_every_backend
def test_tight_bounds_give_the_note_and_enough_bounds_none(sales):
    sales.replace_table("sales", "SELECT * FROM base_sales")
    for shape in SHAPES:
        rng = np.random.default_rng(3)
        plan = _plan(shape, sales.dialect)
        release = plan.release([], sales.rows(plan.sql), rng)
        (note,) = [n for n in release.notes if n.startswith("contribution bounding cut")]
        assert "max_rows_per_unit = 1" in note and "SET dpsql.max_rows_per_unit" in note
        # the capped share: 3 of every 4 counted rows were cut (the true share is 6 in 7)
        low = int(note.split("at least ")[1].split("%")[0])
        assert 40 <= low <= 75, note
        # a customer's 7 rows may be in 7 groups (GROUP BY amount): max_groups 1 cut them too
        enough = _plan(
            shape, sales.dialect, max_rows_per_unit=ROWS_PER_CUSTOMER,
            max_groups_per_unit=ROWS_PER_CUSTOMER,
        )  # fmt: skip
        release = enough.release([], sales.rows(enough.sql), rng)
        assert not [n for n in release.notes if n.startswith("contribution bounding")]


def test_the_note_rarely_raises_a_false_alarm_and_finds_a_real_cut():
    """At fixed seeds, over 2,000 draws each: with nothing cut the note shows at most as
    often as one total leaves its 97.5% interval (2.5%, plus 4 standard errors); with
    6 rows in 7 cut (about 700 units, epsilon 0.1 for the note) it always shows."""
    note = BoundingNote(DiscreteLaplace(CAP, 0.1), rows=1, groups=1, grouped=False)
    rng = np.random.default_rng(11)
    draws = 2000
    kept = 700
    alarms = sum(bool(note.notes([kept, kept], rng)) for _ in range(draws))
    assert alarms <= draws * (0.025 + 4 * (0.025 * 0.975 / draws) ** 0.5)
    found = sum(bool(note.notes([CAP * kept, kept], rng)) for _ in range(draws))
    assert found == draws


def test_the_capped_share_never_exceeds_the_true_share():
    """The note's "at least": whatever each unit's rows, the share the capped totals give
    is at most the share of rows actually cut."""
    rng = random.Random(4)
    for _ in range(3000):
        keep, cap = rng.randint(1, 3), rng.randint(1, 4)
        units = [rng.choice([1, 2, 5, 40, 1000]) * rng.randint(1, 3) for _ in range(20)]
        kept = [min(rows, keep) for rows in units]
        counted = [min(rows, cap * keep) for rows in units]
        capped = Fraction(sum(counted) - sum(kept), sum(counted))
        true = Fraction(sum(units) - sum(kept), sum(units))
        assert capped <= true
        assert cut_share_low(float(sum(counted) - sum(kept)), float(sum(kept)), 0) <= true + 1e-12


def test_its_epsilon_comes_from_the_querys_and_the_total_is_unchanged():
    for epsilon in (1.0, 0.3, 9.03442905035, 0.017):
        for shape in SHAPES:
            on = _plan(shape, "duckdb", epsilon=epsilon)
            off = _plan(shape, "duckdb", epsilon=epsilon, bounding_note="off")
            assert on.cost == off.cost == Cost.of(epsilon, on.cost.delta)
            assert off.bounding is None and "bounding" not in off.sql
            spent = sum((m.noise.cost for m in on.measures), on.bounding.cost)
            if on.selection is not None:  # its noise reads the share in binary
                spent += Cost(Fraction(on.selection.epsilon), on.selection.cost.delta)
            assert spent.epsilon <= _as_written(epsilon), (epsilon, shape)
            # a tenth to the note, the rest to the measurements
            assert on.bounding.cost.epsilon <= _as_written(epsilon) / 10
            assert float(on.bounding.cost.epsilon) == pytest.approx(epsilon / 10, rel=1e-12)
            assert float(spent.epsilon) == pytest.approx(epsilon, rel=1e-12)
            assert on.share == pytest.approx(off.share * 0.9, rel=1e-12)


def test_no_note_where_nothing_is_bounded():
    # row-level tables, and units the database keeps unique, cut nothing: no measurement
    assert _plan("SELECT COUNT(*) FROM pums", "duckdb").bounding is None
    policy = load_policy(_policy())
    context = PlanContext(
        policy, Options(epsilon=1.0, delta=1e-6), "duckdb", seed=5, unique_units={"sales"}
    )
    plan = plan_query(parse_statement("SELECT COUNT(*) FROM sales", "duckdb").tree, context)
    assert plan.bounding is None and "ROW_NUMBER" not in plan.sql


def test_a_session_shows_the_note_explains_it_and_turns_it_off(tmp_path):
    import duckdb
    from conftest import PUMS_TABLES, load_pums

    connection = duckdb.connect()
    load_pums(connection, {"base_pums": PUMS_TABLES["pums"]})
    connection.execute(f"CREATE TABLE sales AS {_SALES}")
    policy = _policy()
    policy["tables"] = {"sales": policy["tables"]["sales"]}
    con = dpsql.connect(connection, policy=policy, ledger=tmp_path / "l.sqlite", seed=2)
    cur = con.cursor()
    cur.execute("SELECT COUNT(*) FROM sales")
    assert any(n.startswith("contribution bounding cut at least") for n in cur.notes)
    # a scalar subquery's own note says which subquery it is about
    cur.execute("SELECT COUNT(*) FROM sales WHERE amount > (SELECT AVG(amount) FROM sales)")
    assert any(
        n.startswith("in the scalar subquery (SELECT AVG(amount) FROM sales): contribution")
        for n in cur.notes
    )
    cur.execute("EXPLAIN SELECT COUNT(*) FROM sales")
    explained = dict(cur.fetchall())
    assert "bounding note" in explained["cost"]
    assert "sensitivity 4" in explained["measure bounding note"]
    cur.execute("SET dpsql.bounding_note = off")
    cur.execute("SHOW dpsql.bounding_note")
    assert cur.fetchall() == [("off",)]
    cur.execute("SELECT COUNT(*) FROM sales WHERE amount >= 0")
    assert not any(n.startswith("contribution bounding") for n in cur.notes)
    assert con.budget().epsilon_spent == pytest.approx(3.0)  # one epsilon each, on or off
    with pytest.raises(dpsql.ProgrammingError, match="on or off"):
        cur.execute("SET dpsql.bounding_note = maybe")
    cur.execute("RESET dpsql.bounding_note")
    cur.execute("SHOW dpsql.bounding_note")
    assert cur.fetchall() == [("on",)]
