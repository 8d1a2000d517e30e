"""Clamps the database proves redundant are left out (sql/proofs.py, clamps.needed_sides):
the proofs each backend gives (enforced CHECK constraints; DuckDB statistics of a file
dpsql opened read-only) and only those, exact aggregates bit-identical to the clamped
query's at the same secret, and EXPLAIN saying which clamps were left out and why."""

from __future__ import annotations

import copy
from dataclasses import replace

import duckdb
import pytest
from conftest import postgres_tables

import dpsql.session as sessions
from dpsql.adapters.duckdb import LOCKED, DuckDBAdapter
from dpsql.adapters.postgres import PostgresAdapter
from dpsql.errors import PolicyError
from dpsql.ledger import Ledger
from dpsql.policy import load_policy
from dpsql.sql import PlanContext, plan_query
from dpsql.sql.parse import parse_statement
from dpsql.sql.proofs import proven_ranges

POLICY = {
    "version": 1,
    "analysts": {"default": {"epsilon": 1e6, "delta": 0.5}},
    "tables": {
        "people": {
            "columns": {
                "pid": {"type": "int", "private": True},
                "age": {"type": "int", "lower": 0, "upper": 100},
                "income": {"type": "float", "lower": 0, "upper": 1000},
                "grp": {"type": "int", "values": [0, 1, 2, 3]},
            },
        }
    },
}
USER_LEVEL = {"privacy_unit": "pid", "max_groups_per_unit": 2, "max_rows_per_unit": 2}

# Values on the bounds, NULLs, and several rows per unit (user-level bounding drops some)
ROWS = [
    (i // 3, [0, 100, 37, None][i % 4], [0.0, 1000.0, 0.1 * i, None, 999.75][i % 5], i % 4)
    for i in range(120)
]
CHECKED = (
    "people (pid bigint, age bigint CHECK (age BETWEEN 0 AND 100), "
    "income double precision CHECK (income >= 0 AND income <= 1000), grp bigint)"
)
PLAIN = "people (pid bigint, age bigint, income double precision, grp bigint)"

QUERIES = [
    "SELECT SUM(age) FROM people",
    "SELECT grp, COUNT(*), AVG(age), AVG(income) FROM people GROUP BY grp",
    "SELECT SUM(income) FROM people WHERE income < 500",
    "SELECT grp, SUM(age * 2), SUM(income / 4) FROM people GROUP BY grp",
    "SELECT COUNT(*) FROM people WHERE age * 2 > 60",
]


def _policy(user_level: bool, trust: bool = True) -> dict:
    document = copy.deepcopy(POLICY)
    document["tables"]["people"]["trust_statistics"] = trust
    if user_level:
        document["tables"]["people"].update(USER_LEVEL)
    return document


def _duckdb_file(tmp_path, spec: str = PLAIN) -> str:
    path = str(tmp_path / "people.duckdb")
    with duckdb.connect(path) as connection:
        connection.execute(f"CREATE TABLE {spec.replace('double precision', 'DOUBLE')}")
        _insert(connection, ROWS)
    return path


def _insert(connection: duckdb.DuckDBPyConnection, rows: list[tuple]) -> None:
    """One INSERT of all `rows` (executemany costs DuckDB a statement per row)."""
    values = ", ".join(
        "(" + ", ".join("NULL" if v is None else repr(v) for v in r) + ")" for r in rows
    )
    connection.execute(f"INSERT INTO people VALUES {values}")


def _session(adapter, tmp_path, user_level: bool = False, trust: bool = True):
    """A session at a fixed seed, under a policy that trusts the statistics (`trust`)."""
    ledger = Ledger(tmp_path / f"ledger-{id(adapter)}-{trust}.sqlite")
    return sessions.Session(adapter, load_policy(_policy(user_level, trust)), ledger, seed=7)


def _plans(session: sessions.Session, sql: str, seed: int = 12345):
    """The plan of `sql` with the database's proofs and without, at one secret."""
    tree = parse_statement(sql, session.adapter.dialect).tree
    context = PlanContext(
        session.policy,
        session.options,
        session.adapter.dialect,
        seed,
        session.unique_units,
        proven=session.proven,
    )
    return plan_query(tree, context), plan_query(tree, replace(context, proven={}))


def _clamps(sql: str) -> int:
    """How many tests the SQL's clamps make (a clamp with one side left out makes one)."""
    return sql.count(" WHEN ")


def _assert_identical(session: sessions.Session, queries: list[str] = QUERIES) -> int:
    """Each query's exact bounded aggregates, proofs used or not, are the same; returns
    how many clamps (CASE) the proofs left out over all of them."""
    left_out = 0
    for sql in queries:
        proven, clamped = _plans(session, sql)
        assert session.adapter.execute(proven.sql)[1] == session.adapter.execute(clamped.sql)[1]
        left_out += _clamps(clamped.sql) - _clamps(proven.sql)
    return left_out


@pytest.mark.parametrize("user_level", [False, True])
def test_duckdb_statistics_of_a_read_only_file_leave_out_clamps(tmp_path, user_level):
    path = _duckdb_file(tmp_path)
    session = _session(DuckDBAdapter(path), tmp_path, user_level)
    proofs = {p.column: (p.lower, p.upper) for p in session.proven["people"]}
    assert proofs == {"age": (0, 100), "income": (0, 1000), "grp": (0, 3)}
    assert _assert_identical(session) >= len(QUERIES)
    proven, _ = _plans(session, "SELECT SUM(age) FROM people")
    if not user_level:  # an integer SUM of a proven column is the raw SUM
        assert 'SUM("age")' in proven.sql and _clamps(proven.sql) == 0
    # the released values too: same seed, one session reading a connection it was handed
    # (its statistics prove nothing), the other the file it opened read-only
    handed = duckdb.connect(path, read_only=True, config=LOCKED)
    unproven = _session(DuckDBAdapter(handed), tmp_path, user_level)
    assert unproven.proven == {}
    for sql in QUERIES:
        assert session.execute(sql).rows == unproven.execute(sql).rows


def test_float_sum_keeps_its_grid_cast(tmp_path):
    session = _session(DuckDBAdapter(_duckdb_file(tmp_path)), tmp_path)
    proven, clamped = _plans(session, "SELECT SUM(income) FROM people")
    assert _clamps(proven.sql) == 0 < _clamps(clamped.sql)
    assert 'CAST("income" * CAST(' in proven.sql and "AS BIGINT" in proven.sql


def test_statistics_prove_only_when_trusted_and_show_only_the_bounds(tmp_path):
    path = str(tmp_path / "some.duckdb")
    with duckdb.connect(path) as connection:
        connection.execute(f"CREATE TABLE {PLAIN.replace('double precision', 'DOUBLE')}")
        _insert(connection, [(1, 3, 12.5, 1), (2, 140, 7.25, 2)])  # age beyond its bounds
    adapter = DuckDBAdapter(path)
    assert adapter.value_facts("people", statistics=True).statistics
    assert adapter.value_facts("people").statistics == {}  # not asked for
    assert _session(adapter, tmp_path, trust=False).proven == {}  # the policy does not trust
    session = _session(DuckDBAdapter(path), tmp_path)
    proofs = {p.column: (p.lower, p.upper) for p in session.proven["people"]}
    assert proofs == {"age": (0, float("inf")), "income": (0, 1000), "grp": (0, 3)}
    rows = session.execute("EXPLAIN SELECT SUM(age), SUM(income) FROM people").rows
    said = " ".join(detail for item, detail in rows if item == "clamps")
    assert "[0, 1000]" in said and "[0, inf]" in said
    for stored in ("12.5", "7.25", "140"):  # the data's own minima and maxima stay unsaid
        assert stored not in said
    proven, clamped = _plans(session, "SELECT SUM(age) FROM people")
    assert '"age" > 100' in proven.sql and '"age" < 0' not in proven.sql
    assert session.adapter.execute(proven.sql)[1] == session.adapter.execute(clamped.sql)[1]


def test_writable_duckdb_statistics_prove_nothing(tmp_path):
    path = _duckdb_file(tmp_path)
    writable = duckdb.connect(path)  # a read-write connection handed to dpsql
    adapter = DuckDBAdapter(writable)
    assert adapter.value_facts("people", statistics=True).statistics == {}
    session = _session(adapter, tmp_path)
    assert session.proven == {}
    proven, clamped = _plans(session, "SELECT SUM(age) FROM people")
    assert proven.sql == clamped.sql and '"age" > 100' in proven.sql
    memory = duckdb.connect()
    memory.execute("CREATE TABLE people (pid BIGINT, age BIGINT, income DOUBLE, grp BIGINT)")
    assert DuckDBAdapter(memory).value_facts("people", statistics=True).statistics == {}


def test_nan_and_null_statistics_prove_nothing(tmp_path):
    path = str(tmp_path / "nan.duckdb")
    with duckdb.connect(path) as connection:
        connection.execute(
            "CREATE TABLE people (pid BIGINT, age BIGINT, income DOUBLE, grp BIGINT)"
        )
        connection.execute("INSERT INTO people VALUES (1, NULL, 'nan', 0), (2, NULL, 5, 1)")
    session = _session(DuckDBAdapter(path), tmp_path)
    proofs = {p.column: (p.lower, p.upper) for p in session.proven["people"]}
    # income: NaN max, only its lower side proven; age: all NULL, nothing; grp: within
    # its declared [0, 3], which is all a proof from statistics says
    assert proofs == {"income": (0, float("inf")), "grp": (0, 3)}
    proven, clamped = _plans(session, "SELECT SUM(income), SUM(age) FROM people")
    assert '"income" > CAST(1000.0' in proven.sql and '"income" < ' not in proven.sql
    assert '"age" > 100' in proven.sql and '"age" < 0' in proven.sql
    assert session.adapter.execute(proven.sql)[1] == session.adapter.execute(clamped.sql)[1]


def test_duckdb_check_constraints(tmp_path):
    path = _duckdb_file(tmp_path, CHECKED)
    handed = duckdb.connect(path, read_only=True, config=LOCKED)  # no statistics: checks alone
    session = _session(DuckDBAdapter(handed), tmp_path)
    proofs = {p.column: (p.lower, p.upper, p.by) for p in session.proven["people"]}
    assert proofs["age"][:2] == (0, 100) and "CHECK constraint" in proofs["age"][2]
    assert proofs["income"][:2] == (0, 1000)
    assert _assert_identical(session) >= len(QUERIES)


def test_trust_statistics_is_a_yes_or_no():
    document = _policy(False)
    document["tables"]["people"]["trust_statistics"] = "yes"
    with pytest.raises(PolicyError, match="trust_statistics"):
        load_policy(document)
    assert not load_policy(POLICY).tables["people"].trust_statistics


def test_proofs_read_only_what_they_can_be_sure_of():
    table = load_policy(POLICY).tables["people"]
    checks = [
        ("wide", "age BETWEEN -5 AND 200"),
        ("either", "(income >= 0) OR (income IS NULL)"),
        ("function", "abs(income) <= 1000"),
        ("garbage", "income <= ((("),
        ("mixed", '("Income" >= 0)'),
        ("float4", "(income <= (10.5)::real)"),
    ]
    proofs = proven_ranges(checks, {}, table, "postgres")
    assert [(p.column, p.lower, p.upper) for p in proofs] == [("age", -5, 200)]
    exact = [("c", "((income >= (0)::double precision) AND (income <= (1000)::double precision))")]
    (proof,) = proven_ranges(exact, {}, table, "postgres")
    assert (proof.lower, proof.upper, proof.by) == (0, 1000, "CHECK constraint c")


def test_a_check_wider_than_the_bounds_keeps_its_side(tmp_path):
    spec = (
        "people (pid bigint, age bigint CHECK (age BETWEEN 0 AND 200), income double, grp bigint)"
    )
    handed = duckdb.connect(_duckdb_file(tmp_path, spec), read_only=True, config=LOCKED)
    session = _session(DuckDBAdapter(handed), tmp_path)
    proven, _ = _plans(session, "SELECT SUM(age) FROM people")
    assert '"age" > 100' in proven.sql and '"age" < 0' not in proven.sql
    explained = [d for item, d in proven.explain() if item == "clamps"]
    assert explained == [
        "age: the database proves every value within [0, 200] (CHECK constraint people_age_check); "
        'the clamp of sum("age") to [0, 100]: lower side left out. A side left out would change '
        "no value; the sensitivity still comes from the policy's bounds"
    ]
    assert _assert_identical(session) > 0


def test_explain_says_which_clamps_were_left_out(tmp_path):
    session = _session(DuckDBAdapter(_duckdb_file(tmp_path)), tmp_path)
    rows = session.execute("EXPLAIN SELECT SUM(age * 2), SUM(income) FROM people").rows
    said = [detail for item, detail in rows if item == "clamps"]
    assert len(said) == 2
    age, income = sorted(said)
    assert "DuckDB's column statistics of a file dpsql opened read-only" in age
    assert "its clamp to [0, 100] as the table is read: left out" in age
    assert 'the clamp of sum("income") to [0, 1000]: left out' in income
    plain = session.execute("EXPLAIN SELECT COUNT(*) FROM people").rows
    assert not [item for item, _ in plain if item == "clamps"]  # nothing clamped, nothing said


def test_neighbouring_databases_move_within_the_sensitivity(tmp_path):
    """Removing one unit with all its rows moves each proven query's exact aggregate by at
    most the stated sensitivity: the proofs change no bound."""
    sql = "SELECT SUM(age), SUM(income) FROM people"
    session = _session(DuckDBAdapter(_duckdb_file(tmp_path)), tmp_path, user_level=True)
    plan, clamped = _plans(session, sql)
    assert _clamps(plan.sql) < _clamps(clamped.sql)
    whole = session.adapter.execute(plan.sql)[1][0]
    moves = []
    for unit in range(6):
        path = str(tmp_path / f"without-{unit}.duckdb")
        with duckdb.connect(path) as connection:
            connection.execute(f"CREATE TABLE {PLAIN.replace('double precision', 'DOUBLE')}")
            _insert(connection, [row for row in ROWS if row[0] != unit])
        neighbour = _session(DuckDBAdapter(path), tmp_path, user_level=True)
        assert {p.column for p in neighbour.proven["people"]} >= {"age", "income"}
        smaller, _ = _plans(neighbour, sql)
        assert smaller.sql == plan.sql
        row = neighbour.adapter.execute(smaller.sql)[1][0]
        for i, measure in enumerate(plan.measures):
            moves.append(abs(whole[i] - row[i]))
            assert moves[-1] <= measure.noise.sensitivity
    assert max(moves) > 0


def test_postgres_checks(postgres_url, tmp_path, monkeypatch):
    import psycopg

    with postgres_tables(postgres_url, {CHECKED: ROWS}) as url:
        adapter = PostgresAdapter(url, pool_size=1)
        try:
            session = _session(adapter, tmp_path)
            proofs = {p.column: (p.lower, p.upper) for p in session.proven["people"]}
            assert proofs == {"age": (0, 100), "income": (0, 1000)}
            assert _assert_identical(session) >= len(QUERIES)
            user = _session(adapter, tmp_path, user_level=True)
            assert _assert_identical(user) >= len(QUERIES)
            # the plan cache keeps the plan without the age clamp while the proof holds
            summed = parse_statement("SELECT SUM(age) FROM people", adapter.dialect)
            cached = session.plan(summed.tree, summed.key)
            assert '"age" > 100' not in cached.sql
            # dropped, the constraint proves nothing once the schema facts are read again
            monkeypatch.setattr(sessions, "UNITS_READ_AGAIN", 0.0)
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute("ALTER TABLE people DROP CONSTRAINT people_age_check")
            assert [p.column for p in session.proven["people"]] == ["income"]
            proven, _ = _plans(session, "SELECT SUM(age) FROM people")
            assert '"age" > 100' in proven.sql and '"age" < 0' in proven.sql
            # and the cached plan is not handed out again: its key held the proof
            again = session.plan(summed.tree, summed.key)
            assert '"age" > 100' in again.sql and '"age" < 0' in again.sql
        finally:
            adapter.close()


def test_postgres_not_valid_and_unreadable_checks_prove_nothing(postgres_url, tmp_path):
    spec = PLAIN.replace("age bigint", "age bigint CHECK (age >= 0 OR age IS NULL)")
    with postgres_tables(postgres_url, {spec: ROWS}) as url:
        import psycopg

        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(
                "ALTER TABLE people ADD CONSTRAINT capped CHECK (income <= 1000) NOT VALID"
            )
            admin.execute("ALTER TABLE people ADD CONSTRAINT odd CHECK (abs(income) < 2000)")
        adapter = PostgresAdapter(url, pool_size=1)
        try:
            session = _session(adapter, tmp_path)
            assert session.proven == {}
            proven, clamped = _plans(session, "SELECT SUM(age), SUM(income) FROM people")
            assert proven.sql == clamped.sql
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute("ALTER TABLE people VALIDATE CONSTRAINT capped")
            fresh = _session(adapter, tmp_path)
            assert [(p.column, p.upper) for p in fresh.proven["people"]] == [("income", 1000)]
        finally:
            adapter.close()
