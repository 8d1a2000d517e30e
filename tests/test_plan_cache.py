"""The plan cache (dpsql/sql/plan_cache.py): the cached path plans exactly as the cold path.

Differential: random query shapes, constants and options over a small table
of units with several rows each (so the rewrite bounds them by the keyed
hash); for each, a session whose plans go through one cache shared by every
example and a session without a cache, drawing the same secrets, give the
same plan type, SQL, cost, explanation (sensitivities, scales) and, run on
the same rows with the same noise, the same release, on DuckDB and on
PostgreSQL (whose SQL keys the hash differently). Then the cases the key
exists for: a constant that tightens a clamp or filters public keys, an
option, the policy, the unique keys; and a fresh secret per release.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json

import duckdb
import numpy as np
import pytest
from conftest import postgres_server_url, postgres_tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpsql.session
from dpsql.errors import QueryRefused
from dpsql.ledger import Ledger
from dpsql.policy import load_policy
from dpsql.session import Session, open_session
from dpsql.sql.parse import parse_statement
from dpsql.sql.plan_cache import OFFSETS, SMALLEST_SECRET, PlanCache, _cut

POLICY = {
    "version": 1,
    "defaults": {"epsilon_per_query": 1.0, "delta": 1.0e-6, "mechanism": "laplace"},
    "analysts": {
        "default": {"epsilon": 1e6, "delta": 0.5},
        "other": {"epsilon": 1e6, "delta": 0.5},
    },
    "tables": {
        "visits": {
            "privacy_unit": "pid",
            "max_groups_per_unit": 2,
            "max_rows_per_unit": 2,
            "columns": {
                "pid": {"type": "int", "private": True},
                "age": {"type": "int", "lower": 0, "upper": 100},
                "sex": {"type": "int", "values": [0, 1]},
                "educ": {"type": "int", "lower": 1, "upper": 16, "public": True},
                "income": {"type": "float", "lower": 0, "upper": 100_000},
                "city": {"type": "string"},
                "day": {"type": "date"},
            },
        }
    },
}


ROWS = [
    (i % 60, (i * 37) % 101, i % 2, 1 + (i * 7) % 16, float((i * 7919) % 100_000),
     ("north", "south", "east")[i % 3], dt.date(2020, 1, 1) + dt.timedelta(days=(i * 13) % 366))
    for i in range(240)
]  # fmt: skip
TABLE = "visits (pid INT, age INT, sex INT, educ INT, income DOUBLE PRECISION, city TEXT, day DATE)"


@pytest.fixture(scope="module", params=["duckdb", "postgres"])
def database(request):
    """The table on each backend: DuckDB in memory, PostgreSQL in a schema of its own."""
    if request.param == "postgres":
        with postgres_tables(postgres_server_url(), {TABLE: ROWS}) as url:
            yield url
        return
    connection = duckdb.connect(":memory:")
    # one thread: a GROUP BY's rows then come in one order run after run. Noise is drawn
    # per result row as it streams in, so with keys from the data two runs of one seed
    # release alike only when the database returns the groups in the same order
    connection.execute("SET threads = 1")
    connection.execute(f"CREATE TABLE {TABLE}")
    connection.executemany("INSERT INTO visits VALUES (?, ?, ?, ?, ?, ?, ?)", ROWS)
    yield connection  # closed with the session on it


@pytest.fixture(scope="module")
def base(database):
    """A session on the table, its policy checked against the schema as always."""
    with open_session(database, POLICY, ledger=":memory:") as session:
        yield session


@pytest.fixture(scope="module")
def adapter(base):
    return base.adapter


@pytest.fixture(scope="module")
def policy(base):
    return base.policy


def sessions(adapter, policy, plans: PlanCache, seed: int, options=()) -> tuple[Session, Session]:
    """A session planning through `plans` and one without a cache, drawing the same secrets."""
    cached = Session(adapter, policy, Ledger(":memory:"), seed=seed)
    cached.plans = plans
    cold = Session(adapter, policy, Ledger(":memory:"), seed=seed)
    cold.plans = PlanCache(0)
    for name, value in options:
        cached.set_option(name, value)
        cold.set_option(name, value)
    return cached, cold


def planned(session: Session, sql: str):
    """The plan of `sql` through the session's cache, or the refusal it raised."""
    statement = parse_statement(sql, session.adapter.dialect)
    try:
        return session.plan(statement.tree, statement.key)
    except QueryRefused as refusal:
        return refusal


def assert_same(adapter, cached, cold) -> None:
    """Same refusal, or the same plan: SQL, cost, explanation, and release of the same rows."""
    if isinstance(cold, QueryRefused):
        assert isinstance(cached, QueryRefused) and str(cached) == str(cold)
        return
    assert type(cached) is type(cold)
    assert cached.sql == cold.sql
    assert cached.cost == cold.cost
    assert cached.explain() == cold.explain()
    sensitivities = [
        [m.noise.sensitivity * m.step for m in plan.measures] for plan in (cached, cold)
    ]
    assert sensitivities[0] == sensitivities[1]
    columns, rows = adapter.execute(cold.sql)
    one, two = (plan.release(columns, rows, np.random.default_rng(7)) for plan in (cached, cold))
    assert (one.columns, one.rows, one.notes) == (two.columns, two.rows, two.notes)
    assert one.accuracy == two.accuracy


AGGREGATES = ["COUNT(*)", "SUM(income)", "AVG(age)", "SUM(age)", "COUNT(DISTINCT pid)",
              "SUM(income / 1000)", "STDDEV(age)", "SUM(age * {})", "AVG(income / {})"]  # fmt: skip
GROUPS = ["", "sex", "educ", "city", "sex, educ", "DATE_TRUNC('month', day)"]
NUMBER = st.one_of(st.integers(-10, 120), st.floats(-10, 120).map(lambda x: round(x, 2)))
# One value written as each type: 1, 1.5 and '1' are different statements to the analysis
TYPED = st.one_of(
    NUMBER.map(str),
    st.integers(0, 120).map(lambda x: f"{x}.5"),
    st.integers(0, 120).map(lambda x: f"'{x}'"),
    st.integers(0, 120).map(lambda x: f"{x}e0"),
)
DAY = st.dates(dt.date(2019, 6, 1), dt.date(2021, 6, 1))
CONDITIONS = [
    "age > {}", "age < {}", "age BETWEEN {} AND {}", "income < {}000", "educ >= {}",
    "sex = {}", "city = '{}'", "educ IN ({}, {})", "age >= {typed}", "educ < {typed}",
    "CAST(age AS DOUBLE) < {}", "CAST(income AS INT) > {}000", "day >= DATE '{day}'",
    "day < '{day}'", "day BETWEEN DATE '{day}' AND DATE '{day}'",
]  # fmt: skip


def _filled(draw, template: str) -> str:
    """`template` with constants drawn for its holes: numbers, typed values, days."""
    while "{typed}" in template:
        template = template.replace("{typed}", draw(TYPED), 1)
    while "{day}" in template:
        template = template.replace("{day}", draw(DAY).isoformat(), 1)
    if "city" in template:
        return template.format(draw(st.sampled_from(["north", "south", "west"])))
    return template.format(*[draw(NUMBER) for _ in range(template.count("{}"))])


@st.composite
def queries(draw) -> str:
    """A query of a random shape with random constants over `visits`: constants that
    tighten clamps, filter public keys, scale bounds, bound LIMIT, cast, compare dates,
    and the same value written as an integer, a decimal, an exponent or a string."""
    group = draw(st.sampled_from(GROUPS))
    aggregates = draw(st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=2, unique=True))
    aggregates = [
        a.format(draw(st.sampled_from(["2", "3", "0.5", "1.5", "10"]))) for a in aggregates
    ]
    conditions = draw(st.lists(st.sampled_from(CONDITIONS), max_size=3))
    filled = [_filled(draw, condition) for condition in conditions]
    select = ", ".join([*filter(None, [group]), *aggregates])
    sql = f"SELECT {select} FROM visits"
    if draw(st.booleans()) and filled:  # the same as a relation: a subquery's WHERE
        sql = f"SELECT {select} FROM (SELECT * FROM visits WHERE {filled.pop()}) AS v"
    if filled:
        sql += " WHERE " + " AND ".join(filled)
    if group:
        sql += f" GROUP BY {group}"
        if draw(st.booleans()):
            sql += f" ORDER BY 1 LIMIT {draw(st.integers(1, 5))}"
    return sql


OPTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("epsilon"), st.sampled_from([0.5, 1.0, 3.0])),
        st.tuples(st.just("mechanism"), st.sampled_from(["laplace", "gaussian", "auto"])),
        st.tuples(st.just("max_rows_per_unit"), st.sampled_from(["policy", 1, 3])),
        st.tuples(st.just("max_groups_per_unit"), st.sampled_from(["policy", 1, 4])),
    ),
    max_size=2,
)
SHARED = PlanCache()  # one cache across every example: constants and options must not mix


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sql=queries(), options=OPTIONS, seed=st.integers(0, 2**32))
def test_cached_path_plans_as_the_cold_path(adapter, policy, sql, options, seed):
    cached, cold = sessions(adapter, policy, SHARED, seed, options)
    for _ in range(2):  # the second is a hit on the first (or on an earlier example's)
        assert_same(adapter, planned(cached, sql), planned(cold, sql))


def executed(session: Session, sql: str):
    """What executing `sql` releases (columns, rows, notes, accuracy), or its refusal's text."""
    try:
        release = session.execute(sql)
    except QueryRefused as refusal:
        return str(refusal)
    return release.columns, release.rows, release.notes, release.accuracy


EXECUTED = PlanCache()  # the execute path's cache, shared by every example as SHARED is


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sql=queries(), options=OPTIONS, seed=st.integers(0, 2**32))
def test_a_statement_planned_before_releases_as_the_cold_path(adapter, policy, sql, options, seed):
    """Through execute: another analyst plans `sql` first, then a session finds the plan by
    the text's tokens (no parse) and releases what a session without a cache releases,
    drawing the same secrets and noise: the same rows, notes, accuracy and charge."""
    warm = Session(adapter, policy, Ledger(":memory:"), analyst="other")
    warm.plans = EXECUTED
    cached, cold = sessions(adapter, policy, EXECUTED, seed, options)
    for name, value in options:
        warm.set_option(name, value)
    executed(warm, sql)
    assert executed(cached, sql) == executed(cold, sql)
    assert cached.budget() == cold.budget()


def test_the_cache_is_used_and_each_hit_has_a_fresh_secret(adapter, policy):
    cached, cold = sessions(adapter, policy, PlanCache(), seed=3)
    sql = "SELECT city, SUM(income) FROM visits WHERE age > 20 GROUP BY city"
    first, second = planned(cached, sql), planned(cached, sql)
    assert second is not first and second.analysis is first.analysis  # a hit: the same analysis
    assert second.sql != first.sql  # a secret of its own: the hash that bounds units differs
    assert_same(adapter, first, planned(cold, sql))
    assert_same(adapter, second, planned(cold, sql))


def test_a_constant_that_tightens_a_clamp_is_in_the_key(adapter, policy):
    cached, cold = sessions(adapter, policy, PlanCache(), seed=4)
    wide, narrow = (
        planned(cached, f"SELECT SUM(age) FROM visits WHERE age < {c}") for c in (90, 30)
    )
    assert narrow.measures[0].noise.sensitivity < wide.measures[0].noise.sensitivity
    for plan, c in ((wide, 90), (narrow, 30)):
        assert_same(adapter, plan, planned(cold, f"SELECT SUM(age) FROM visits WHERE age < {c}"))


def test_a_constant_that_filters_public_keys_is_in_the_key(adapter, policy):
    cached, cold = sessions(adapter, policy, PlanCache(), seed=5)
    sql = "SELECT educ, COUNT(*) FROM visits WHERE educ >= {} GROUP BY educ"
    ten, fourteen = (planned(cached, sql.format(c)) for c in (10, 14))
    assert [k for (k,) in ten.public_keys] == list(range(10, 17))
    assert [k for (k,) in fourteen.public_keys] == [14, 15, 16]
    for plan, c in ((ten, 10), (fourteen, 14)):
        assert_same(adapter, plan, planned(cold, sql.format(c)))


@pytest.mark.parametrize(
    "option, value",
    [("epsilon", 0.25), ("mechanism", "gaussian"), ("max_rows_per_unit", 1), ("delta", 1e-9)],
)
def test_a_changed_option_plans_afresh(adapter, policy, option, value):
    cached, cold = sessions(adapter, policy, PlanCache(), seed=6)
    sql = "SELECT city, SUM(income) FROM visits GROUP BY city"  # keys from the data: delta too
    before = planned(cached, sql)
    cached.set_option(option, value)
    cold.set_option(option, value)
    planned(cold, sql)  # the secret the cached session drew for `before`
    after = planned(cached, sql)
    assert after.explain()[1:] != before.explain()[1:]
    assert_same(adapter, after, planned(cold, sql))


def test_a_reloaded_policy_plans_afresh(adapter, policy):
    plans = PlanCache()
    sql = "SELECT SUM(income) FROM visits"
    old, _ = sessions(adapter, policy, plans, seed=8)
    before = planned(old, sql)
    table = POLICY["tables"]["visits"] | {"max_rows_per_unit": 5}
    reloaded = load_policy(POLICY | {"tables": {"visits": table}})
    new, cold = sessions(adapter, reloaded, plans, seed=9)  # even sharing the old one's cache
    after = planned(new, sql)
    assert after.cost == before.cost
    sensitivity = [
        plan.measures[0].noise.sensitivity * plan.measures[0].step for plan in (before, after)
    ]
    assert sensitivity[1] == 5 * sensitivity[0] / 2  # 5 rows a unit, not 2
    assert_same(adapter, after, planned(cold, sql))


def test_unique_units_read_again_plan_afresh(adapter, policy):
    cached, cold = sessions(adapter, policy, PlanCache(), seed=10)
    sql = "SELECT COUNT(*) FROM visits"
    bounded = planned(cached, sql)
    for session in (cached, cold):  # as if the database now kept each unit's key unique
        _, references, proven = session.database_facts()  # read now, then replaced
        session._facts.current = (frozenset({"visits"}), references, proven)
    planned(cold, sql)
    unique = planned(cached, sql)
    assert "ROW_NUMBER" in bounded.sql.upper() and "ROW_NUMBER" not in unique.sql.upper()
    assert_same(adapter, unique, planned(cold, sql))


def test_the_fingerprint_is_the_one_earlier_releases_were_stored_under(adapter, policy):
    """The release cache's fingerprint, with its parts besides the statement encoded once
    per options (Session._fingerprint), is the sha256 of the JSON earlier versions hashed:
    a ledger's stored releases are still found, before and after a SET."""
    session, _ = sessions(adapter, policy, PlanCache(), seed=12)
    key = 'tokens:[["SELECT", "select"], ["STRING", "caf\u00e9 \\"]]'

    def stored_under() -> str:
        parts = [key, adapter.identity, policy.digest, policy.data_version]
        text = json.dumps([*parts, vars(session.options)])
        return hashlib.sha256(text.encode()).hexdigest()

    assert session._fingerprint(key) == stored_under()
    session.set_option("epsilon", 0.3)
    assert session._fingerprint(key) == stored_under()
    session.execute("RESET ALL")
    assert session._fingerprint(key) == stored_under()


def test_another_analyst_reuses_the_plan_and_is_charged(adapter, policy, monkeypatch):
    calls = []
    plan_query = dpsql.session.plan_query
    monkeypatch.setattr(dpsql.session, "plan_query", lambda *a: calls.append(a) or plan_query(*a))
    first = Session(adapter, policy, Ledger(":memory:"))
    second = first.for_analyst("other")
    sql = "SELECT city, COUNT(*) FROM visits GROUP BY city"
    first.execute(sql)
    second.execute(sql)
    assert len(calls) == 1  # planned once, for both analysts
    assert first.budget().epsilon_spent == second.budget().epsilon_spent == 1.0
    assert second.execute(sql).rows == second.execute(sql).rows  # its own release, kept


def test_a_statement_planned_before_is_charged_and_released_without_a_parse(
    adapter, policy, monkeypatch
):
    parses = []
    parse = dpsql.session.parse_statement
    monkeypatch.setattr(
        dpsql.session, "parse_statement", lambda *a, **k: parses.append(a) or parse(*a, **k)
    )
    shared = PlanCache()
    sql = "SELECT city, SUM(income) FROM visits WHERE age > 20 GROUP BY city"
    warm = Session(adapter, policy, Ledger(":memory:"))
    warm.plans = shared
    warm.execute(sql)
    assert len(parses) == 1
    hit, cold = (Session(adapter, policy, Ledger(":memory:"), seed=11) for _ in range(2))
    hit.plans, cold.plans = shared, PlanCache(0)
    one = hit.execute(sql)
    assert len(parses) == 1  # the hit: tokens, charge, release; no parse
    two = cold.execute(sql)
    assert len(parses) == 2
    assert (one.columns, one.rows, one.notes, one.accuracy) == (
        two.columns, two.rows, two.notes, two.accuracy
    )  # fmt: skip
    assert hit.budget().epsilon_spent == cold.budget().epsilon_spent == 1.0
    assert hit.execute(sql).rows == one.rows  # stored: a repeat is the release cache's


@pytest.mark.parametrize("sql", [
    "SELECT SUM(age) FROM visits WHERE age < {}",
    "SELECT educ, COUNT(*) FROM visits WHERE educ >= {} GROUP BY educ",
    "SELECT SUM(age * {}) FROM visits",
])  # fmt: skip
def test_a_constant_written_as_another_type_is_another_key(adapter, policy, sql):
    """1, 1.5, '1' and 1e0 are different statements to the analysis (casts, bounds,
    kinds of comparison): each gets the plan planning builds for it, never another's."""
    cached, cold = sessions(adapter, policy, PlanCache(), seed=12)
    texts = [sql.format(c) for c in ("14", "14.5", "'14'", "14e0")]
    measured = set()
    for _ in range(2):  # the second round: each a hit on its own plan, none on another's
        for text in texts:
            plan = planned(cached, text)
            assert_same(adapter, plan, planned(cold, text))
            measured.add(str(plan) if isinstance(plan, QueryRefused) else tuple(plan.explain()[1:]))
    assert len(measured) > 1  # the types do change the plan


@pytest.mark.parametrize("seed", [SMALLEST_SECRET, 2**62 - OFFSETS])
def test_a_kept_plan_takes_a_new_secret_in_every_place_of_the_old_and_nowhere_else(seed):
    """The secret, the smallest kept (13 digits) and the largest drawn, at each offset the
    rewrite adds: each is replaced by the new secret's; constants, the digits beside the
    offsets and the secret's digits inside a longer run are left as written."""
    secrets = [seed + offset for offset in range(OFFSETS)]
    beside = [seed - 1, seed + OFFSETS, 10**12 - 1, 7]
    sql = " ".join(f"h({s}) + {b}" for s, b in zip(secrets, beside * 2, strict=True))
    sql += f" AND x = 9{seed}"
    new = seed + 12345 if seed == SMALLEST_SECRET else seed - 12345
    written = "".join(p if isinstance(p, str) else str(new + p) for p in _cut(sql, seed))
    expected = " ".join(
        f"h({new + o}) + {b}" for o, b in zip(range(OFFSETS), beside * 2, strict=True)
    )
    assert written == expected + f" AND x = 9{seed}"
