"""Group keys read from public tables joined in (sql/join_domains.py), on the TPC-H-shaped
database: every key of the public table released (empty groups included, no delta),
the key set a function of public data alone (identical on neighbouring databases, and
read the same from a database holding only the public tables), a cap above which the
keys come from partition selection, and mixed keys."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator

import duckdb
import pytest
import sqlglot
import tpch
from conftest import fuzz_examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_relations import (
    ACCEPTED,
    UNIQUE,
    _check_neighbours,
    _copy,
    _copy_to_postgres,
    _heaviest,
    _loaded_policy,
    _options,
    _without,
)

import dpsql
from dpsql.errors import QueryRefused
from dpsql.sql import PlanContext, join_domains, plan_query
from dpsql.sql.parse import parse_statement

SCALE = 0.001
PUBLIC = ("region", "nation", "part", "supplier")
Q5 = (
    "SELECT n.n_name, COUNT(*), SUM(l.l_extendedprice * (1 - l.l_discount)) AS revenue "
    "FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
    "JOIN lineitem l ON l.l_orderkey = o.o_orderkey "
    "JOIN nation n ON c.c_nationkey = n.n_nationkey "
    "JOIN region r ON n.n_regionkey = r.r_regionkey "
    "WHERE r.r_name = 'ASIA' AND o.o_orderdate >= DATE '1994-01-01' GROUP BY n.n_name"
)
ASIA = "SELECT n_name FROM nation JOIN region ON n_regionkey = r_regionkey WHERE r_name = 'ASIA'"
PER_NATION = [
    Q5,
    "SELECT n_name, COUNT(*) FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey "
    "GROUP BY n_name",
    "SELECT n.n_regionkey, c.c_mktsegment, SUM(c.c_acctbal) FROM customer c "
    "JOIN nation n ON c.c_nationkey = n.n_nationkey WHERE n.n_regionkey < 3 GROUP BY 1, 2",
    "SELECT s.s_nationkey, COUNT(*) FROM lineitem l JOIN supplier s ON l.l_suppkey = s.s_suppkey "
    "GROUP BY s.s_nationkey",
]


@pytest.fixture(scope="module")
def warehouse() -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect()
    tpch.generate(connection, SCALE)
    # one nation without any customer: its group is released, empty
    connection.execute("UPDATE customer SET c_nationkey = 3 WHERE c_nationkey = 2")
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def public_only(warehouse) -> Iterator[duckdb.DuckDBPyConnection]:
    """The public tables alone: what a key domain may be read from."""
    copy = _copy(warehouse)
    for table in ("lineitem", "orders", "customer"):
        copy.execute(f"DROP TABLE {table}")
    yield copy
    copy.close()


def _reader(connection, seen: list[str] | None = None):
    def read(sql: str) -> list[tuple]:
        if seen is not None:
            seen.append(sql)
        return connection.execute(sql).fetchall()

    return read


def _plan(sql: str, policy, read):
    context = PlanContext(
        policy, _options(), "duckdb", seed=11, unique_references=UNIQUE, read_public=read
    )
    return plan_query(parse_statement(sql, "duckdb").tree, context)


def test_every_key_of_the_public_table_is_released_without_delta(warehouse, tmp_path):
    policy = tpch.policy(epsilon=1e5, delta=0)  # no delta: partition selection impossible
    with dpsql.connect(warehouse, policy=policy, ledger=tmp_path / "l.sqlite", seed=3) as con:
        cursor = con.execute(Q5)
        released = {row[0]: row[1:] for row in cursor.fetchall()}
        explained = dict(con.execute("EXPLAIN " + Q5).fetchall())
    truth = {row[0]: row[1:] for row in warehouse.execute(Q5).fetchall()}
    asia = {name for (name,) in warehouse.execute(ASIA).fetchall()}
    assert set(released) == asia and "NATION02" in asia and "NATION02" not in truth
    for name, (count, revenue) in released.items():
        exact_count, exact_revenue = truth.get(name, (0, 0.0))
        assert abs(count - exact_count) <= 1
        assert math.isclose(revenue, exact_revenue, rel_tol=0.01, abs_tol=2e4)
    assert "delta=0" in explained["cost"]
    assert "the 5 values of nation" in explained["note"]


@pytest.mark.parametrize("sql", PER_NATION)
def test_the_keys_are_read_from_public_tables_alone(warehouse, public_only, sql):
    policy = _loaded_policy(warehouse)
    seen: list[str] = []
    plan = _plan(sql, policy, _reader(warehouse, seen))
    assert plan.selection is None and plan.public_keys
    # each domain query names public tables only, and reads the same where only they are
    for query in seen:
        tables = {
            t.name for t in sqlglot.parse_one(query, read="duckdb").find_all(sqlglot.exp.Table)
        }
        assert tables <= set(PUBLIC), query
    alone = _plan(sql, policy, _reader(public_only))
    assert alone.public_keys == plan.public_keys and alone.sql == plan.sql


def test_the_released_keys_are_the_same_on_neighbours(warehouse):
    policy = _loaded_policy(warehouse)
    plans = [_plan(sql, policy, _reader(warehouse)) for sql in PER_NATION]
    full = [warehouse.execute(plan.sql).fetchall() for plan in plans]
    for customer in _heaviest(warehouse, 2):
        neighbour = _without(warehouse, customer)
        again = [_plan(sql, policy, _reader(neighbour)) for sql in PER_NATION]
        assert [p.public_keys for p in again] == [p.public_keys for p in plans]
        _check_neighbours(plans, full, [neighbour.execute(p.sql).fetchall() for p in plans])
        neighbour.close()


def test_domain_queries_over_the_corpus_read_public_tables_only(warehouse):
    policy = _loaded_policy(warehouse)
    seen: list[str] = []
    for sql in ACCEPTED:
        _plan(sql, policy, _reader(warehouse, seen))
    assert seen
    for query in seen:
        tables = {
            t.name for t in sqlglot.parse_one(query, read="duckdb").find_all(sqlglot.exp.Table)
        }
        assert tables <= set(PUBLIC), query


def test_a_large_public_table_falls_back_to_partition_selection(warehouse, monkeypatch):
    monkeypatch.setattr(join_domains, "MAX_JOIN_DOMAIN", 100)  # part has 200 names
    policy = _loaded_policy(warehouse)
    sql = (
        "SELECT p.p_name, COUNT(*) FROM lineitem l JOIN part p ON l.l_partkey = p.p_partkey "
        "GROUP BY p.p_name"
    )
    plan = _plan(sql, policy, _reader(warehouse))
    assert plan.selection is not None and plan.public_keys is None
    assert "part has more than 100 of them" in " ".join(plan.notes)
    small = _plan(sql.replace("GROUP BY", "WHERE p.p_partkey <= 50 GROUP BY"), policy,
                  _reader(warehouse))  # fmt: skip
    assert small.selection is None and len(small.public_keys) == 50


def test_a_public_key_beside_a_key_from_the_data(warehouse, tmp_path):
    """The pair is found by partition selection, and only pairs whose public part is in
    the public table's domain are candidates."""
    sql = (
        "SELECT n.n_name, EXTRACT(year FROM o.o_orderdate) AS y, COUNT(*) FROM customer c "
        "JOIN nation n ON c.c_nationkey = n.n_nationkey JOIN orders o "
        "ON o.o_custkey = c.c_custkey WHERE n.n_regionkey = 1 GROUP BY 1, 2"
    )
    policy = _loaded_policy(warehouse)
    plan = _plan(sql, policy, _reader(warehouse))
    assert plan.selection is not None
    domain = {k for (k,) in warehouse.execute(
        "SELECT n_name FROM nation WHERE n_regionkey = 1").fetchall()}  # fmt: skip
    assert plan.analysis.keys[0].domain == tuple(sorted(domain))
    with dpsql.connect(warehouse, policy=tpch.policy(epsilon=1e5), ledger=tmp_path / "l.sqlite",
                       seed=3) as con:  # fmt: skip
        released = con.execute(sql).fetchall()
    assert released and {row[0] for row in released} <= domain


def test_an_outer_joined_public_table_is_read_without_its_on(warehouse, tmp_path):
    """A LEFT JOIN's condition does not filter the relation's rows, so it does not narrow
    the domain: every nation the relation can hold is released, none is lost."""
    sql = (
        "SELECT n.n_name, COUNT(*) FROM customer c LEFT JOIN nation n "
        "ON c.c_nationkey = n.n_nationkey AND n.n_regionkey = 1 GROUP BY n.n_name"
    )
    with dpsql.connect(warehouse, policy=tpch.policy(epsilon=1e5), ledger=tmp_path / "l.sqlite",
                       seed=3) as con:  # fmt: skip
        released = dict(con.execute(sql).fetchall())
    truth = {k: v for k, v in warehouse.execute(sql).fetchall() if k is not None}
    assert len(released) == 25 and truth.keys() <= released.keys()
    for name, count in released.items():
        assert abs(count - truth.get(name, 0)) <= 1


def test_keys_from_a_public_table_on_postgres(warehouse, postgres_url, tmp_path):
    """The domain query on PostgreSQL: text read as grouped (CAST AS TEXT, COLLATE "C")."""
    import psycopg

    schema = f"domains_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(postgres_url, autocommit=True)
    admin.execute(f"CREATE SCHEMA {schema}")
    try:
        _copy_to_postgres(warehouse, admin, schema, tmp_path)
        url = f"{postgres_url}?options=-csearch_path%3D{schema}"
        policy = tpch.policy(epsilon=1e5, delta=0)
        with dpsql.connect(url, policy=policy, ledger=tmp_path / "l.sqlite", seed=3) as con:
            released = {row[0] for row in con.execute(Q5).fetchall()}
    finally:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()
    assert released == {name for (name,) in warehouse.execute(ASIA).fetchall()}


def test_generated_queries_read_domains_from_public_tables_alone(warehouse, public_only):
    """Generated joins of private and public tables grouped by public columns (inner
    and outer joins, conditions on public and private columns): each domain is read
    where only the public tables exist (a query naming a private table would fail
    there), is the same from the whole database and from a neighbour's, and the
    bounded SQL moves by at most its sensitivity on the neighbour."""
    policy = _loaded_policy(warehouse)
    customer = _heaviest(warehouse, 1)[0]
    neighbour = _without(warehouse, customer)
    seen = {"public keys": 0, "selected": 0}

    @settings(max_examples=fuzz_examples(120, 1200), derandomize=True, deadline=None,
              database=None, suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    @given(sql=_domain_queries())
    def run(sql):
        try:
            plan = _plan(sql, policy, _reader(public_only))
        except QueryRefused as refused:
            assert refused.hint, sql
            return
        again = _plan(sql, policy, _reader(neighbour))
        assert again.sql == plan.sql and again.public_keys == plan.public_keys, sql
        assert "values of" in " ".join(plan.notes), sql
        seen["public keys" if plan.selection is None else "selected"] += 1
        before = warehouse.execute(plan.sql).fetchall()
        _check_neighbours([plan], [before], [neighbour.execute(plan.sql).fetchall()])

    run()
    neighbour.close()
    assert seen["public keys"] > 20 and seen["selected"] > 2, seen


# what each private relation may join, and how: (public table, condition)
_PRIVATE = {
    "customer c": ["nation"],
    "customer c JOIN orders o ON c.c_custkey = o.o_custkey": ["nation"],
    "lineitem l": ["part", "supplier"],
    "lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey": ["part", "supplier"],
}
_PUBLIC = {
    "nation": ("nation n", "c.c_nationkey = n.n_nationkey", "region"),
    "part": ("part p", "l.l_partkey = p.p_partkey", None),
    "supplier": ("supplier s", "l.l_suppkey = s.s_suppkey", None),
    "region": ("region r", "n.n_regionkey = r.r_regionkey", None),
}
_KEYS = {"nation": ["n.n_name", "n.n_regionkey"], "region": ["r.r_name"],
         "part": ["p.p_brand", "p.p_size"], "supplier": ["s.s_nationkey"]}  # fmt: skip
_FILTERS = {
    "nation": ["n.n_regionkey < 3", "n.n_name <> 'NATION04'"],
    "region": ["r.r_name = 'ASIA'"],
    "part": ["p.p_size > 20", "p.p_brand = 'Brand#2'"],
    "supplier": ["s.s_acctbal > 0"],
}


@st.composite
def _domain_queries(draw) -> str:
    private = draw(st.sampled_from(sorted(_PRIVATE)))
    text, joined, where = private, [], []
    for name in draw(st.lists(st.sampled_from(_PRIVATE[private]), min_size=1, unique=True)):
        chain = [name] + ([_PUBLIC[name][2]] if _PUBLIC[name][2] and draw(st.booleans()) else [])
        for table in chain:
            source, on, _ = _PUBLIC[table]
            if draw(st.booleans()):
                on += f" AND {draw(st.sampled_from(_FILTERS[table]))}"
            kind = draw(st.sampled_from(["JOIN", "JOIN", "LEFT JOIN"]))
            text += f" {kind} {source} ON {on}"
            joined.append(table)
    for table in joined:
        if draw(st.booleans()):
            where.append(draw(st.sampled_from(_FILTERS[table])))
    if draw(st.booleans()):
        where.append("o.o_totalprice > 20000" if "orders" in private else "c.c_acctbal > 0"
                     if "customer" in private else "l.l_quantity < 20")  # fmt: skip
    keys = [draw(st.sampled_from([k for t in joined for k in _KEYS[t]]))]
    if draw(st.integers(0, 3)) == 0:  # beside a key from the data (or the policy)
        keys.append("c.c_mktsegment" if "customer" in private else "l.l_partkey")
    value = draw(st.sampled_from(["COUNT(*)", "SUM(o.o_totalprice)" if "orders" in private
                                  else "COUNT(*)"]))  # fmt: skip
    condition = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {', '.join(keys)}, {value} FROM {text}{condition} GROUP BY {', '.join(keys)}"
