"""Joins, subqueries and CTEs over a TPC-H-shaped database (sql/relations.py).

- Acceptance: realistic multi-table analyst queries, answered at a large epsilon
  near what the raw query returns (the policy's bounds clip nothing here).
- Neighbouring databases: remove one customer with all their orders and
  lineitems; every measurement of every accepted query moves by at most its
  stated sensitivity, on DuckDB and PostgreSQL.
- Refusals: hostile multi-table queries, each refused before the database runs.
- Public tables: answered exactly and free.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections import Counter
from collections.abc import Iterator

import duckdb
import numpy as np
import pytest
import sqlglot
import tpch
from conftest import fuzz_examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sensitivity import _l1_change

import dpsql
from dpsql.errors import QueryRefused
from dpsql.policy import load_policy
from dpsql.sql import Options, PlanContext, plan_query, rewrite
from dpsql.sql.parse import parse_statement
from dpsql.sql.rewrite import in_dialect

SCALE = 0.001  # 150 customers, about 1,200 orders and 4,800 lineitems
UNIQUE = frozenset({"orders.o_orderkey"})

ACCEPTED = [
    "SELECT COUNT(*) FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey",
    "SELECT COUNT(*), SUM(l_quantity) FROM lineitem",
    # TPC-H Q1, as aggregates per return flag
    "SELECT l_returnflag, SUM(l_quantity), SUM(l_extendedprice), AVG(l_discount), COUNT(*) "
    "FROM lineitem WHERE l_shipdate <= DATE '1998-09-01' GROUP BY l_returnflag",
    # Q3: revenue of one market segment's early orders, per priority
    "SELECT o.o_orderpriority, SUM(l.l_extendedprice * (1 - l.l_discount)) AS revenue "
    "FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
    "JOIN lineitem l ON l.l_orderkey = o.o_orderkey "
    "WHERE c.c_mktsegment = 'BUILDING' AND o.o_orderdate < DATE '1995-03-15' "
    "GROUP BY o.o_orderpriority",
    # Q5: revenue per nation of one region
    "SELECT n.n_name, SUM(l.l_extendedprice * (1 - l.l_discount)) AS revenue "
    "FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
    "JOIN lineitem l ON l.l_orderkey = o.o_orderkey "
    "JOIN nation n ON c.c_nationkey = n.n_nationkey "
    "JOIN region r ON n.n_regionkey = r.r_regionkey "
    "WHERE r.r_name = 'ASIA' AND o.o_orderdate >= DATE '1994-01-01' GROUP BY n.n_name",
    # Q6
    "SELECT SUM(l_extendedprice * l_discount) FROM lineitem WHERE l_shipdate >= DATE "
    "'1994-01-01' AND l_shipdate < DATE '1995-01-01' AND l_discount BETWEEN 0.05 AND 0.07 "
    "AND l_quantity < 24",
    # Q10: customers per nation
    "SELECT n_name, COUNT(*) FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey "
    "GROUP BY n_name",
    # Q12: orders per priority with late lineitems
    "SELECT o.o_orderpriority, COUNT(*) FROM orders o JOIN lineitem l "
    "ON o.o_orderkey = l.l_orderkey WHERE l.l_shipdate >= DATE '1994-01-01' "
    "GROUP BY o.o_orderpriority",
    # Q14: promotion revenue and all revenue of a month
    "SELECT SUM(CASE WHEN p.p_type LIKE 'PROMO%' THEN l.l_extendedprice * (1 - l.l_discount) "
    "ELSE 0 END) AS promo, SUM(l.l_extendedprice * (1 - l.l_discount)) AS total "
    "FROM lineitem l JOIN part p ON l.l_partkey = p.p_partkey "
    "WHERE l.l_shipdate >= DATE '1995-09-01' AND l.l_shipdate < DATE '1996-09-01'",
    # Q19-like: one brand's small quantities
    "SELECT SUM(l.l_extendedprice * (1 - l.l_discount)) FROM lineitem l JOIN part p "
    "ON p.p_partkey = l.l_partkey WHERE p.p_brand = 'Brand#2' AND l.l_quantity BETWEEN 1 AND 11",
    "SELECT COUNT(*) FROM lineitem l JOIN supplier s ON l.l_suppkey = s.s_suppkey "
    "JOIN nation n ON s.s_nationkey = n.n_nationkey WHERE n.n_regionkey = 3",
    "SELECT o_orderstatus, COUNT(*), AVG(o_totalprice) FROM orders GROUP BY o_orderstatus",
    "WITH recent AS (SELECT * FROM orders WHERE o_orderdate >= DATE '1997-01-01') "
    "SELECT COUNT(*), AVG(o_totalprice) FROM recent",
    "SELECT COUNT(*), SUM(o_totalprice) FROM (SELECT o_custkey, o_totalprice FROM orders "
    "WHERE o_totalprice > 20000) big",
    "WITH building AS (SELECT c_custkey FROM customer WHERE c_mktsegment = 'BUILDING') "
    "SELECT COUNT(*) FROM orders o JOIN building b ON o.o_custkey = b.c_custkey",
    "SELECT COUNT(*) FROM orders o, customer c WHERE o.o_custkey = c.c_custkey "
    "AND c.c_acctbal > 5000",
    "SELECT COUNT(*) FROM customer c LEFT JOIN orders o ON o.o_custkey = c.c_custkey",
    "SELECT c_mktsegment, COUNT(*) FROM customer c LEFT JOIN nation n "
    "ON c.c_nationkey = n.n_nationkey GROUP BY c_mktsegment",
    "SELECT COUNT(DISTINCT o.o_custkey) FROM orders o JOIN lineitem l "
    "ON l.l_orderkey = o.o_orderkey WHERE l.l_returnflag = 'R'",
    "SELECT p.p_brand, SUM(l.l_quantity) FROM lineitem l JOIN part p "
    "ON l.l_partkey = p.p_partkey GROUP BY p.p_brand",
    "SELECT EXTRACT(year FROM o.o_orderdate) AS y, SUM(l.l_quantity) FROM orders o "
    "JOIN lineitem l ON l.l_orderkey = o.o_orderkey GROUP BY 1",
    "SELECT c.c_mktsegment, AVG(o.o_totalprice) FROM customer c JOIN orders o "
    "ON c.c_custkey = o.o_custkey GROUP BY c.c_mktsegment",
    "SELECT c_mktsegment, COUNT(*) AS n FROM customer c JOIN orders o "
    "ON c.c_custkey = o.o_custkey GROUP BY c_mktsegment ORDER BY n DESC LIMIT 3",
    "SELECT COUNT(*) FROM lineitem WHERE l_discount > 0.05",
    "SELECT COUNT(*) FROM (SELECT l.l_quantity FROM lineitem l JOIN orders o "
    "ON l.l_orderkey = o.o_orderkey WHERE o.o_orderstatus = 'F') t WHERE l_quantity > 25",
    "WITH o AS (SELECT * FROM orders), c AS (SELECT * FROM customer) "
    "SELECT COUNT(*) FROM o JOIN c ON o.o_custkey = c.c_custkey",
    "SELECT r.r_name, COUNT(*) FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey "
    "JOIN region r ON n.n_regionkey = r.r_regionkey GROUP BY r.r_name",
    "SELECT SUM(o.o_totalprice) FROM orders o JOIN customer c ON c.c_custkey = o.o_custkey "
    "WHERE c.c_nationkey BETWEEN 0 AND 9",
    "SELECT l.l_returnflag, o.o_orderstatus, COUNT(*) FROM lineitem l JOIN orders o "
    "ON l.l_orderkey = o.o_orderkey GROUP BY 1, 2",
    "SELECT c.c_mktsegment, COUNT(*), SUM(l.l_quantity) FROM lineitem l "
    "JOIN orders o ON l.l_orderkey = o.o_orderkey JOIN customer c ON c.c_custkey = o.o_custkey "
    "GROUP BY c.c_mktsegment",
    "SELECT COUNT(*) FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey "
    "JOIN customer c ON c.c_custkey = o.o_custkey JOIN nation n ON c.c_nationkey = n.n_nationkey "
    "JOIN region r ON n.n_regionkey = r.r_regionkey JOIN part p ON p.p_partkey = l.l_partkey "
    "WHERE r.r_name = 'EUROPE' AND p.p_size < 25",
]

ACCEPTED += [
    "SELECT COUNT(*) FROM customer WHERE c_nationkey IN (SELECT n_nationkey FROM nation "
    "WHERE n_regionkey = 1)",
    "SELECT o.o_orderpriority, COUNT(*) FROM orders o JOIN customer c ON c.c_custkey = "
    "o.o_custkey WHERE c.c_nationkey NOT IN (SELECT n.n_nationkey FROM nation n JOIN region r "
    "ON n.n_regionkey = r.r_regionkey WHERE r.r_name = 'EUROPE') GROUP BY 1",
    "SELECT SUM(l_quantity) FROM lineitem WHERE l_partkey IN (SELECT p_partkey FROM part "
    "WHERE p_size > 45)",
]

# subqueries that aggregate per unit (sql/per_unit.py)
ACCEPTED += [
    "SELECT AVG(n) FROM (SELECT o_custkey, COUNT(*) AS n FROM orders GROUP BY o_custkey) t",
    "WITH per AS (SELECT o_custkey, SUM(o_totalprice) AS s FROM orders GROUP BY 1) "
    "SELECT COUNT(*) FROM per WHERE s > 100",
    # how many customers placed n orders: n's public domain is 1..max_rows_per_unit
    "SELECT n, COUNT(*) FROM (SELECT o_custkey, COUNT(*) AS n FROM orders "
    "WHERE o_orderstatus = 'F' GROUP BY o_custkey) t GROUP BY n",
    "WITH per AS (SELECT o_custkey, COUNT(*) AS n, SUM(o_totalprice) AS s FROM orders "
    "GROUP BY o_custkey) SELECT c.c_mktsegment, AVG(per.s), AVG(per.n) FROM customer c "
    "JOIN per ON per.o_custkey = c.c_custkey GROUP BY c.c_mktsegment",
    "SELECT AVG(m), AVG(low) FROM (SELECT o_custkey, MAX(o_totalprice) AS m, "
    "MIN(o_totalprice) AS low FROM orders WHERE o_orderstatus = 'O' GROUP BY o_custkey) t",
    # lineitems per order, per customer's orders (several rows per unit)
    "SELECT AVG(k) FROM (SELECT l.l_orderkey, o.o_custkey, COUNT(*) AS k FROM lineitem l "
    "JOIN orders o ON l.l_orderkey = o.o_orderkey GROUP BY l.l_orderkey, o.o_custkey) t",
    "SELECT c.c_mktsegment, AVG(t.parts) FROM customer c JOIN (SELECT o.o_custkey, "
    "COUNT(DISTINCT l.l_partkey) AS parts FROM lineitem l JOIN orders o "
    "ON l.l_orderkey = o.o_orderkey GROUP BY o.o_custkey) t ON t.o_custkey = c.c_custkey "
    "GROUP BY 1",
    "SELECT COUNT(*) FROM (SELECT o_custkey, SUM(o_totalprice) AS s FROM orders "
    "GROUP BY o_custkey) t WHERE t.s BETWEEN 50000 AND 200000",
]

# UNION ALL of relations of one unit (sql/unions.py)
ACCEPTED += [
    "SELECT COUNT(*), SUM(v) FROM (SELECT o_custkey AS u, o_totalprice AS v FROM orders "
    "WHERE o_orderstatus = 'F' UNION ALL SELECT o_custkey, o_totalprice FROM orders "
    "WHERE o_totalprice > 90000) t",
    "WITH touched AS (SELECT c.c_custkey AS u, c.c_mktsegment AS seg FROM customer c "
    "WHERE c.c_acctbal > 5000 UNION ALL SELECT o.o_custkey, c.c_mktsegment FROM orders o "
    "JOIN customer c ON o.o_custkey = c.c_custkey) SELECT seg, COUNT(*) FROM touched "
    "GROUP BY seg",
    "SELECT AVG(n) FROM (SELECT o_custkey AS u, n FROM (SELECT o_custkey, COUNT(*) AS n "
    "FROM orders GROUP BY o_custkey) a UNION ALL SELECT c_custkey, c_acctbal FROM customer) t",
    "SELECT COUNT(*) FROM (SELECT o_custkey FROM orders UNION ALL SELECT c_custkey "
    "FROM customer) u",
]

REFUSED = [
    # set operations other than UNION ALL of relations of one unit
    "SELECT COUNT(*) FROM (SELECT o_custkey FROM orders UNION SELECT c_custkey FROM customer) t",
    "SELECT COUNT(*) FROM (SELECT o_custkey FROM orders INTERSECT SELECT c_custkey "
    "FROM customer) t",
    "SELECT COUNT(*) FROM (SELECT o_custkey FROM orders EXCEPT SELECT c_custkey FROM customer) t",
    "SELECT COUNT(*) FROM (SELECT o_custkey, o_totalprice FROM orders UNION ALL "
    "SELECT c_acctbal, c_custkey FROM customer) t",
    "SELECT COUNT(*) FROM (SELECT o_custkey, o_totalprice * 2 FROM orders UNION ALL "
    "SELECT c_custkey, c_acctbal FROM customer) t",
    "SELECT COUNT(*) FROM (SELECT n_nationkey FROM nation UNION ALL SELECT c_custkey "
    "FROM customer) t",
    "SELECT COUNT(*) FROM (SELECT o_custkey FROM orders WHERE o_totalprice / 0 > 1 "
    "UNION ALL SELECT c_custkey FROM customer) t",
    "SELECT COUNT(*) FROM (SELECT o_custkey, o_orderstatus FROM orders UNION ALL "
    "SELECT c_custkey, c_acctbal FROM customer) t",
    "SELECT COUNT(*) FROM (SELECT o_custkey FROM orders UNION ALL SELECT c_custkey "
    "FROM customer ORDER BY 1 LIMIT 10) t",
    "SELECT * FROM (SELECT o_custkey AS u FROM orders UNION ALL SELECT c_custkey FROM customer) t",
    "SELECT COUNT(*) FROM (SELECT o_custkey, COUNT(*) FROM orders GROUP BY 1 UNION ALL "
    "SELECT c_custkey, 1 FROM customer) t",
    # subqueries that aggregate, but not per unit, or release or compute what they must not
    "SELECT AVG(s) FROM (SELECT c_nationkey, SUM(c_acctbal) AS s FROM customer "
    "GROUP BY c_nationkey) t",
    "SELECT SUM(n) FROM (SELECT o_orderstatus, COUNT(*) AS n FROM orders GROUP BY o_orderstatus) t",
    "SELECT * FROM (SELECT o_custkey, COUNT(*) AS n FROM orders GROUP BY o_custkey) t",
    "SELECT t.o_custkey, AVG(n) FROM (SELECT o_custkey, COUNT(*) AS n FROM orders "
    "GROUP BY o_custkey) t GROUP BY 1",
    "SELECT AVG(n) FROM (SELECT o_custkey, COUNT(*) AS n FROM orders GROUP BY o_custkey "
    "HAVING COUNT(*) > 2) t",
    "SELECT AVG(n) FROM (SELECT o_custkey, COUNT(*) AS n FROM orders GROUP BY o_custkey "
    "ORDER BY n LIMIT 5) t",
    "SELECT AVG(m) FROM (SELECT o_custkey, MAX(o_totalprice * 2) AS m FROM orders "
    "GROUP BY o_custkey) t",
    "SELECT AVG(n) FROM (SELECT o_custkey, COUNT(*) AS n FROM orders "
    "WHERE o_totalprice / 0 > 1 GROUP BY o_custkey) t",
    "SELECT AVG(n) FROM (SELECT c_custkey, COUNT(c_name) AS n FROM customer GROUP BY c_custkey) t",
    "SELECT AVG(n) FROM (SELECT c_custkey, COUNT(*) AS n FROM customer "
    "WHERE c_name = 'x' GROUP BY c_custkey) t",
    "SELECT AVG(n) FROM (SELECT COUNT(*) AS n FROM orders GROUP BY o_custkey) t",
    "SELECT AVG(n) FROM (SELECT o_custkey, o_totalprice, COUNT(*) AS n FROM orders "
    "GROUP BY o_custkey) t",
    "SELECT AVG(x) FROM (SELECT o_custkey, SUM(o_orderdate) AS x FROM orders GROUP BY o_custkey) t",
    "SELECT COUNT(*) FROM customer c JOIN (SELECT o_custkey, COUNT(*) AS n FROM orders "
    "GROUP BY o_custkey) t ON t.n = c.c_nationkey",
    "SELECT AVG(n) FROM (SELECT c.c_custkey, COUNT(*) AS n FROM customer c JOIN orders o "
    "ON c.c_acctbal < o.o_totalprice GROUP BY c.c_custkey) t",
    # scalar subqueries that are not one released value (sql/scalars.py)
    "SELECT COUNT(*) FROM orders o WHERE o.o_totalprice > (SELECT AVG(c.c_acctbal) "
    "FROM customer c WHERE c.c_custkey = o.o_custkey)",
    "SELECT COUNT(*) FROM orders WHERE o_totalprice > (SELECT AVG(c_acctbal) FROM customer "
    "WHERE c_custkey = o_custkey)",
    "SELECT COUNT(*) FROM orders WHERE o_totalprice > (SELECT AVG(o_totalprice) FROM orders "
    "GROUP BY o_orderstatus)",
    "SELECT COUNT(*) FROM orders WHERE o_totalprice > (SELECT AVG(o_totalprice), COUNT(*) "
    "FROM orders)",
    "SELECT COUNT(*) FROM orders WHERE o_totalprice > (SELECT o_totalprice FROM orders LIMIT 1)",
    "SELECT COUNT(*) FROM orders WHERE o_custkey = (SELECT c_custkey FROM customer "
    "WHERE c_name = 'Customer#000000001')",
    "SELECT o_totalprice > (SELECT AVG(o_totalprice) FROM orders) FROM orders",
    "SELECT COUNT(*) FROM orders WHERE o_totalprice > (SELECT AVG(o_totalprice) FROM orders "
    "WHERE o_custkey IN (SELECT c_custkey FROM customer))",
    "SELECT COUNT(*) FROM orders WHERE o_totalprice > (SELECT AVG(x) FROM read_csv('/etc/passwd'))",
    "SELECT COUNT(*) FROM orders WHERE o_totalprice > (SELECT quantile_cont(o_totalprice, "
    "[0.25, 0.5]) FROM orders)",
    "SELECT COUNT(*) FROM orders WHERE o_totalprice > (SELECT AVG(o_totalprice) FROM orders a "
    "JOIN orders b ON a.o_totalprice = b.o_totalprice)",
    # private with private on anything but the unit
    "SELECT COUNT(*) FROM orders a JOIN orders b ON a.o_totalprice = b.o_totalprice",
    "SELECT COUNT(*) FROM customer c JOIN orders o ON c.c_acctbal < o.o_totalprice",
    "SELECT COUNT(*) FROM customer c CROSS JOIN orders o",
    "SELECT COUNT(*) FROM customer c, orders o",
    "SELECT COUNT(*) FROM customer c, orders o WHERE c.c_nationkey = 3",
    "SELECT COUNT(*) FROM lineitem l JOIN orders o ON l.l_linenumber = o.o_orderkey",
    "SELECT COUNT(*) FROM lineitem a JOIN lineitem b ON a.l_partkey = b.l_partkey",
    "SELECT COUNT(*) FROM customer c JOIN orders o ON o.o_custkey = c.c_custkey OR 1 = 1",
    # outer joins that keep rows for absent people
    "SELECT COUNT(*) FROM nation n LEFT JOIN customer c ON c.c_nationkey = n.n_nationkey",
    "SELECT COUNT(*) FROM nation n LEFT JOIN customer c ON c.c_nationkey = n.n_nationkey "
    "WHERE c.c_custkey IS NULL",
    "SELECT COUNT(*) FROM customer c RIGHT JOIN nation n ON c.c_nationkey = n.n_nationkey",
    "SELECT COUNT(*) FROM customer c FULL JOIN orders o ON o.o_custkey = c.c_custkey",
    "SELECT COUNT(*) FROM nation n FULL JOIN customer c ON c.c_nationkey = n.n_nationkey",
    # private columns in join conditions
    "SELECT COUNT(*) FROM customer c JOIN nation n ON c.c_name = n.n_name",
    "SELECT COUNT(*) FROM customer c JOIN nation n ON c.c_custkey = n.n_nationkey",
    "SELECT COUNT(*) FROM orders o JOIN nation n ON o.o_orderkey = n.n_nationkey",
    # computed join conditions (they run on the stored values)
    "SELECT COUNT(*) FROM customer c JOIN nation n ON c.c_nationkey + 1 = n.n_nationkey",
    "SELECT COUNT(*) FROM customer c JOIN nation n ON c.c_acctbal / 0 > n.n_nationkey",
    "SELECT COUNT(*) FROM customer c JOIN nation n ON c.c_mktsegment = n.n_nationkey",
    "SELECT COUNT(*) FROM customer c JOIN nation n ON LN(c.c_acctbal) > n.n_nationkey",
    "SELECT COUNT(*) FROM customer c JOIN nation n USING (c_nationkey)",
    # raw rows, keys and per-unit rows
    "SELECT c.c_mktsegment FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey",
    "SELECT * FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey",
    "SELECT o.o_custkey, COUNT(*) FROM orders o JOIN customer c ON o.o_custkey = c.c_custkey "
    "GROUP BY 1",
    "SELECT c.c_name, COUNT(*) FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey "
    "GROUP BY 1",
    "WITH t AS (SELECT * FROM customer) SELECT * FROM t",
    "SELECT l_orderkey, COUNT(*) FROM lineitem GROUP BY l_orderkey",
    # subqueries and CTEs that aggregate, recurse or reach out
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 5) "
    "SELECT COUNT(*) FROM r JOIN customer c ON c.c_nationkey = r.n",
    "SELECT COUNT(*) FROM (SELECT DISTINCT o_custkey FROM orders) t",
    "SELECT COUNT(*) FROM (SELECT * FROM orders LIMIT 10) t",
    "SELECT COUNT(*) FROM orders o JOIN LATERAL (SELECT * FROM lineitem l "
    "WHERE l.l_orderkey = o.o_orderkey) x ON TRUE",
    "SELECT COUNT(*) FROM orders o JOIN read_csv('/etc/passwd') f ON TRUE",
    "SELECT COUNT(*) FROM orders o JOIN pg_catalog.pg_class k ON k.oid = o.o_orderkey",
    "SELECT COUNT(*) FROM orders o JOIN secret_table s ON s.id = o.o_custkey",
    "SELECT COUNT(*) FROM orders WHERE o_custkey IN (SELECT c_custkey FROM customer "
    "WHERE c_acctbal > 9000)",
    "SELECT (SELECT COUNT(*) FROM customer) FROM orders",
    "SELECT COUNT(*) FROM customer WHERE c_mktsegment IN (SELECT n_nationkey FROM nation)",
    "SELECT COUNT(*) FROM customer WHERE c_custkey IN (SELECT n_nationkey FROM nation)",
    "SELECT COUNT(*) FROM customer WHERE c_nationkey IN (SELECT n_nationkey + 1 FROM nation)",
    "SELECT COUNT(*) FROM customer WHERE c_nationkey IN (SELECT n_nationkey FROM nation "
    "WHERE n_name IN (SELECT c_mktsegment FROM customer))",
    "SELECT COUNT(*) FROM customer WHERE c_nationkey IN (SELECT n_nationkey FROM nation, "
    "read_csv('/etc/passwd'))",
    "SELECT COUNT(*) FROM orders o JOIN (SELECT o_custkey, ROW_NUMBER() OVER () AS r "
    "FROM orders) x ON x.o_custkey = o.o_custkey",
    "SELECT COUNT(*) FROM orders TABLESAMPLE 10 PERCENT JOIN customer c "
    "ON c.c_custkey = orders.o_custkey",
    # public tables cannot carry a private query's raw values out
    "SELECT n.n_name FROM nation n JOIN customer c ON c.c_nationkey = n.n_nationkey "
    "GROUP BY n.n_name",
    "SELECT COUNT(*) FROM nation WHERE n_nationkey IN (SELECT c_nationkey FROM customer)",
    "SELECT n_name FROM nation WHERE EXISTS (SELECT 1 FROM customer WHERE c_acctbal > 9999)",
    "SELECT * FROM nation WHERE n_nationkey = (SELECT c_nationkey FROM customer LIMIT 1)",
    "SELECT pg_read_file('/etc/passwd') FROM nation",
    "SELECT * FROM nation, read_parquet('x.parquet')",
]


# Scalar subqueries, each its own measurement (sql/scalars.py): in WHERE, in the select
# list, in HAVING, over public tables, inside a CTE, in a query over public tables only
SCALAR = [
    "SELECT COUNT(*) FROM customer WHERE c_acctbal > (SELECT AVG(c_acctbal) FROM customer)",
    "SELECT c_mktsegment, COUNT(*) * 1.0 / (SELECT COUNT(*) FROM customer) AS share "
    "FROM customer GROUP BY c_mktsegment",
    "SELECT (SELECT COUNT(*) FROM orders WHERE o_orderstatus = 'F') * 1.0 / "
    "(SELECT COUNT(*) FROM orders) AS finished",
    "SELECT COUNT(*) FROM orders WHERE o_totalprice > (SELECT MAX(p_retailprice) FROM part)",
    "SELECT n_name FROM nation WHERE n_nationkey < (SELECT COUNT(*) FROM customer) / 10",
    "WITH big AS (SELECT * FROM orders WHERE o_totalprice > 1000) SELECT COUNT(*) FROM big "
    "WHERE o_totalprice > (SELECT AVG(o_totalprice) FROM big)",
    "SELECT c.c_mktsegment, SUM(o.o_totalprice) FROM orders o JOIN customer c "
    "ON o.o_custkey = c.c_custkey JOIN nation n ON c.c_nationkey = n.n_nationkey "
    "WHERE o.o_totalprice > (SELECT AVG(o_totalprice) FROM orders) AND n.n_regionkey < 3 "
    "GROUP BY c.c_mktsegment",
    "SELECT o_orderstatus, COUNT(*) FROM orders GROUP BY o_orderstatus "
    "HAVING COUNT(*) > (SELECT COUNT(*) FROM orders) / 10",
    "SELECT COUNT(*) FROM orders WHERE o_orderdate > (SELECT MEDIAN(o_orderdate) FROM orders)",
    "SELECT SUM(l_quantity) FROM lineitem WHERE l_quantity > (SELECT AVG(l_quantity) "
    "FROM lineitem WHERE l_discount > (SELECT AVG(l_discount) FROM lineitem))",
]


def _options() -> Options:
    return Options(epsilon=1.0, delta=1e-6)


def _plan(sql: str, policy, dialect: str = "duckdb"):
    context = PlanContext(policy, _options(), dialect, seed=11, unique_references=UNIQUE)
    return plan_query(parse_statement(sql, dialect).tree, context)


@pytest.fixture(scope="module")
def warehouse() -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect()
    tpch.generate(connection, SCALE)
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def owned(warehouse) -> Iterator[duckdb.DuckDBPyConnection]:
    """The database without the rows that belong to nobody (orders with no customer, and
    their lineitems), which every release leaves out: what the truth is computed on."""
    copy = _copy(warehouse)
    copy.execute(
        "DELETE FROM lineitem WHERE l_orderkey IN "
        "(SELECT o_orderkey FROM orders WHERE o_custkey IS NULL)"
    )
    copy.execute("DELETE FROM orders WHERE o_custkey IS NULL")
    yield copy
    copy.close()


def _loaded_policy(connection: duckdb.DuckDBPyConnection, dialect: str = "duckdb"):
    from dpsql.adapters import open_adapter

    loaded = load_policy(tpch.policy())
    adapter = open_adapter(connection) if dialect == "duckdb" else connection
    columns = {key: adapter.table_columns(key) for key in loaded.tables}
    return loaded.with_public_columns(columns, dialect)


# -- acceptance -----------------------------------------------------------------


def _by_key(rows: list[tuple], width: int) -> dict:
    return {tuple(row[:width]): row[width:] for row in rows}


@pytest.mark.parametrize("sql", ACCEPTED)
def test_analyst_queries_are_answered_near_the_truth(warehouse, owned, tmp_path, sql):
    policy = tpch.policy(epsilon=1e5)
    with dpsql.connect(warehouse, policy=policy, ledger=tmp_path / "l.sqlite", seed=3) as con:
        cursor = con.execute(sql)
        released = cursor.fetchall()
        accuracy = cursor.accuracy
        names = [column[0] for column in cursor.description]
    truth = owned.execute(sql).fetchall()
    width = sum(1 for name in names if name not in accuracy and not _is_average(sql, name))
    if "LIMIT" in sql:
        released, truth = sorted(released), sorted(truth)
    released_by, truth_by = _by_key(released, width), _by_key(truth, width)
    assert len(released_by.keys() & truth_by.keys()) >= 0.9 * len(truth_by), sql
    for key, values in released_by.items():
        # a key of a public domain the data lacks is released as an empty group
        empty = [0] * len(values) if "GROUP BY n" in sql else None
        for name, value, exact in zip(names[width:], values, truth_by.get(key, empty), strict=True):
            exact = float(exact or 0)
            item = accuracy.get(name)
            room = 3 * item.interval95 if item is not None and item.interval95 else 0
            assert math.isclose(value, exact, rel_tol=0.01, abs_tol=room + 1e-6), (
                sql,
                key,
                name,
                value,
                exact,
            )


@pytest.mark.parametrize("sql", SCALAR)
def test_scalar_subqueries_are_answered_near_the_truth(warehouse, owned, tmp_path, sql):
    policy = tpch.policy(epsilon=1e5)
    with dpsql.connect(warehouse, policy=policy, ledger=tmp_path / "l.sqlite", seed=3) as con:
        cursor = con.execute(sql)
        released = sorted(cursor.fetchall())
        notes = cursor.notes
    truth = sorted(owned.execute(sql).fetchall())
    assert len(released) == len(truth), (sql, released, truth)
    for row, exact in zip(released, truth, strict=True):
        for value, expected in zip(row, exact, strict=True):
            if isinstance(expected, str):
                assert value == expected, sql
            else:
                assert math.isclose(value, expected, rel_tol=0.01, abs_tol=1e-6), (sql, row, exact)
    subqueries = sql.count("(SELECT") - sql.count("AS (SELECT")  # not the CTEs
    assert sum("the scalar subquery" in note for note in notes) == subqueries, notes


def test_scalar_subqueries_share_the_querys_budget(warehouse, tmp_path):
    """The query's epsilon is split over its releases that read private tables, charged
    once before the database runs; a subquery over public tables is exact and free; a
    repeat is free."""
    two = SCALAR[0]
    public_part = SCALAR[3]
    with dpsql.connect(warehouse, policy=tpch.policy(), ledger=tmp_path / "l.sqlite") as con:
        explained = dict(con.execute(f"EXPLAIN {two}").fetchall())
        assert explained["  cost"].startswith("epsilon=0.5,"), explained
        assert "split evenly" in explained["budget"]
        con.execute(two)
        assert con.budget().epsilon_spent == pytest.approx(1.0)
        con.execute(two)
        assert con.budget().epsilon_spent == pytest.approx(1.0)
        outer = [v for k, v in con.execute(f"EXPLAIN {public_part}").fetchall() if "cost" in k]
        assert outer[-1].startswith("epsilon=1,"), outer  # the whole epsilon: part is free
        con.execute(public_part)
        assert con.budget().epsilon_spent == pytest.approx(2.0)


def test_scalar_subqueries_hold_on_neighbours(warehouse):
    """Every stage of a staged plan (each subquery, the outer query with a placeholder and
    with the exact values in their place) moves by at most its stated sensitivity."""
    from dpsql.sql.scalars import StagedPlan

    policy = _loaded_policy(warehouse)
    stages = []
    for sql in SCALAR:
        plan = _plan(sql, policy)
        assert isinstance(plan, StagedPlan), sql
        stages.extend(_stages(plan, warehouse, sql))
    measured = [stage for stage in stages if hasattr(stage, "measures")]
    assert len(measured) >= len(SCALAR)
    full = [warehouse.execute(stage.sql).fetchall() for stage in measured]
    for customer in _heaviest(warehouse, 2):
        neighbour = _without(warehouse, customer)
        _check_neighbours(measured, full, [neighbour.execute(s.sql).fetchall() for s in measured])
        neighbour.close()


def _with_ctes(text: str, sql: str) -> str:
    """A subquery's text with the CTEs of the query it stands in."""
    ctes = sqlglot.parse_one(sql, read="duckdb").args.get("with_")
    return f"{ctes.sql('duckdb')} {text}" if ctes is not None else text


def _stages(plan, connection, sql: str) -> list:
    """A staged plan's parts (their own stages too), its outer query as planned before
    the charge, and as planned with each part's exact value in its place."""
    from dpsql.sql.scalars import StagedPlan

    if not isinstance(plan, StagedPlan):
        return [plan]
    parts = [stage for part in plan.parts for stage in _stages(part, connection, sql)]
    try:
        exact = [connection.execute(_with_ctes(text, sql)).fetchone()[0] for text in plan.texts]
    except duckdb.Error:  # a subquery over public tables that fails whatever the data
        return [*parts, plan.outer]
    return [*parts, plan.outer, *_stages(plan.finish_outer(exact), connection, sql)]


def _is_average(sql: str, name: str) -> bool:
    return "AVG" in sql.upper() and name.lower().startswith("avg")


def test_explain_shows_the_relation(warehouse, tmp_path):
    sql = (
        "SELECT COUNT(*) FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey "
        "JOIN customer c ON c.c_custkey = o.o_custkey"
    )
    with dpsql.connect(warehouse, policy=tpch.policy(), ledger=tmp_path / "l.sqlite") as con:
        explained = dict(con.execute(f"EXPLAIN {sql}").fetchall())
    assert "l.l_orderkey -> orders.o_orderkey = o.o_custkey = c.c_custkey" in explained["note"]
    assert "105 rows per group" in explained["privacy"]


# -- public tables ---------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT r.r_name, COUNT(*) AS nations FROM nation n JOIN region r "
        "ON n.n_regionkey = r.r_regionkey GROUP BY r.r_name ORDER BY r.r_name",
        "SELECT * FROM part ORDER BY p_partkey",
        "WITH big AS (SELECT * FROM part WHERE p_size > 40) SELECT p_brand, MIN(p_retailprice) "
        "FROM big GROUP BY 1 ORDER BY 1",
    ],
)
def test_public_tables_are_answered_exactly_and_free(warehouse, tmp_path, sql):
    with dpsql.connect(warehouse, policy=tpch.policy(), ledger=tmp_path / "l.sqlite") as con:
        assert con.execute(sql).fetchall() == warehouse.execute(sql).fetchall()
        assert con.budget().epsilon_spent == 0


# -- refusals ----------------------------------------------------------------------


@pytest.mark.parametrize("sql", REFUSED)
def test_hostile_multi_table_queries_are_refused_before_the_database(warehouse, sql):
    """Planning reads no data: a refusal there never reaches the database."""
    policy = _loaded_policy(warehouse)
    with pytest.raises(QueryRefused) as refused:
        _plan(sql, policy)
    assert refused.value.hint, sql  # every refusal says what to write instead


def test_a_reference_needs_a_kept_key(warehouse):
    policy = _loaded_policy(warehouse)
    context = PlanContext(policy, _options(), "duckdb", seed=1)  # no unique references
    with pytest.raises(QueryRefused, match="PRIMARY KEY or UNIQUE"):
        plan_query(parse_statement("SELECT COUNT(*) FROM lineitem", "duckdb").tree, context)


# -- neighbouring databases -----------------------------------------------------------


def _copy(source: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A copy of the TPC-H tables `source` has (the quantile tests' warehouse has no part
    or supplier)."""
    copy = duckdb.connect()
    present = {
        name for (name,) in source.execute("SELECT table_name FROM duckdb_tables()").fetchall()
    }
    for table in ("region", "nation", "part", "supplier", "customer", "orders", "lineitem"):
        if table not in present:
            continue
        rows = source.sql(f"SELECT * FROM {table}").to_arrow_table()  # noqa: F841
        copy.execute(f"CREATE TABLE {table} AS SELECT * FROM rows")
    return copy


def _without(source: duckdb.DuckDBPyConnection, customer: int) -> duckdb.DuckDBPyConnection:
    """A copy of the database without one customer and all their orders and lineitems."""
    copy = _copy(source)
    copy.execute(
        "DELETE FROM lineitem WHERE l_orderkey IN "
        f"(SELECT o_orderkey FROM orders WHERE o_custkey = {customer})"
    )
    copy.execute(f"DELETE FROM orders WHERE o_custkey = {customer}")
    copy.execute(f"DELETE FROM customer WHERE c_custkey = {customer}")
    return copy


def _heaviest(connection, count: int) -> list[int]:
    """The customers with the most lineitems: each moves the aggregates most."""
    return [
        row[0]
        for row in connection.execute(
            "SELECT o_custkey FROM lineitem JOIN orders ON l_orderkey = o_orderkey "
            f"WHERE o_custkey IS NOT NULL GROUP BY 1 ORDER BY COUNT(*) DESC, 1 LIMIT {count}"
        ).fetchall()
    ]


def _check_neighbours(plans, full_rows, neighbour_rows) -> None:
    for plan, before, after in zip(plans, full_rows, neighbour_rows, strict=True):
        keys = len(plan.analysis.keys)
        width = len(plan.measures) + (plan.selection is not None)
        change = _l1_change(before, after, keys, width)
        limits = [m.noise.sensitivity for m in plan.measures]
        if plan.selection is not None:
            limits.append(plan.analysis.table.max_groups_per_unit)
        assert np.all(change <= np.array(limits)), (plan.sql, change, limits)


def _check_other_units_unchanged(plan, full, neighbour, removed: int) -> None:
    """The relation's rows of every unit but the removed one are the same on both
    neighbours: each row is one unit's and depends on that unit's rows (and public ones)
    only. This is what lets bounding on the relation bound every sensitivity."""
    table = plan.analysis.table
    if table.relation is None:
        return
    unit = table.privacy_unit
    sql = in_dialect(table.relation.copy(), "duckdb")
    query = f'SELECT * FROM ({sql}) r WHERE "{unit}" IS DISTINCT FROM {removed}'
    query += f' AND "{unit}" IS NOT NULL'
    before = Counter(map(repr, full.execute(query).fetchall()))
    after = Counter(map(repr, neighbour.execute(query).fetchall()))
    assert before == after, (sql, removed)


def test_neighbouring_databases_duckdb(warehouse):
    policy = _loaded_policy(warehouse)
    plans = [_plan(sql, policy) for sql in ACCEPTED]
    full = [warehouse.execute(plan.sql).fetchall() for plan in plans]
    for customer in _heaviest(warehouse, 3):
        neighbour = _without(warehouse, customer)
        # the copy has no primary keys: the plans were made where the key is kept
        _check_neighbours(plans, full, [neighbour.execute(p.sql).fetchall() for p in plans])
        for plan in plans:
            _check_other_units_unchanged(plan, warehouse, neighbour, customer)
        neighbour.close()


def test_neighbouring_databases_postgres(warehouse, postgres_url, tmp_path):
    import psycopg

    schema = f"tpch_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(postgres_url, autocommit=True)
    admin.execute(f"CREATE SCHEMA {schema}")
    try:
        _copy_to_postgres(warehouse, admin, schema, tmp_path)
        url = f"{postgres_url}?options=-csearch_path%3D{schema}"
        with psycopg.connect(url, autocommit=True) as pg:
            from dpsql.adapters import open_adapter

            adapter = open_adapter(url)
            loaded = load_policy(tpch.policy())
            loaded = loaded.with_public_columns(
                {key: adapter.table_columns(key) for key in loaded.tables}, "postgres"
            )
            assert "o_orderkey" in adapter.unique_columns("orders")
            adapter.close()
            plans = [_plan(sql, loaded, "postgres") for sql in ACCEPTED]
            full = [pg.execute(plan.sql).fetchall() for plan in plans]
            for customer in _heaviest(warehouse, 2):
                pg.execute("BEGIN")
                pg.execute(
                    "DELETE FROM lineitem WHERE l_orderkey IN "
                    f"(SELECT o_orderkey FROM orders WHERE o_custkey = {customer})"
                )
                pg.execute(f"DELETE FROM orders WHERE o_custkey = {customer}")
                pg.execute(f"DELETE FROM customer WHERE c_custkey = {customer}")
                after = [pg.execute(plan.sql).fetchall() for plan in plans]
                pg.execute("ROLLBACK")
                _check_neighbours(plans, full, after)
    finally:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()


_PG_TYPES = {"BIGINT": "BIGINT", "INTEGER": "INTEGER", "DOUBLE": "DOUBLE PRECISION",
             "VARCHAR": "TEXT", "DATE": "DATE"}  # fmt: skip


def _copy_to_postgres(source, admin, schema: str, tmp_path) -> None:
    for table in ("region", "nation", "part", "supplier", "customer", "orders", "lineitem"):
        columns = source.execute(f"DESCRIBE {table}").fetchall()
        spec = ", ".join(
            f"{c[0]} {_PG_TYPES[c[1]]}{' PRIMARY KEY' if c[3] == 'PRI' else ''}" for c in columns
        )
        admin.execute(f"CREATE TABLE {schema}.{table} ({spec})")
        path = tmp_path / f"{table}.csv"
        source.execute(f"COPY {table} TO '{path}' (HEADER)")
        with admin.cursor().copy(
            f"COPY {schema}.{table} FROM STDIN WITH (FORMAT csv, HEADER true)"
        ) as copy:
            copy.write(path.read_bytes())


# -- the relational gate, fuzzed ------------------------------------------------------

_ALIASES = {"customer": "c", "orders": "o", "lineitem": "l", "nation": "n", "region": "r",
            "part": "p", "supplier": "s"}  # fmt: skip
_COLUMNS = {
    "customer": ["c_custkey", "c_nationkey", "c_acctbal", "c_mktsegment", "c_name"],
    "orders": ["o_orderkey", "o_custkey", "o_totalprice", "o_orderdate", "o_orderstatus"],
    "lineitem": ["l_orderkey", "l_partkey", "l_suppkey", "l_quantity", "l_extendedprice",
                 "l_discount", "l_shipdate"],
    "nation": ["n_nationkey", "n_regionkey", "n_name"],
    "region": ["r_regionkey", "r_name"],
    "part": ["p_partkey", "p_size", "p_brand", "p_retailprice"],
    "supplier": ["s_suppkey", "s_nationkey", "s_acctbal"],
}  # fmt: skip
# join conditions an analyst would write, right and wrong, between two tables
_GOOD = {
    ("customer", "orders"): "c.c_custkey = o.o_custkey",
    ("orders", "lineitem"): "l.l_orderkey = o.o_orderkey",
    ("customer", "nation"): "c.c_nationkey = n.n_nationkey",
    ("nation", "region"): "n.n_regionkey = r.r_regionkey",
    ("lineitem", "part"): "l.l_partkey = p.p_partkey",
    ("lineitem", "supplier"): "l.l_suppkey = s.s_suppkey",
    ("supplier", "nation"): "s.s_nationkey = n.n_nationkey",
}
_NUMBERS = ["c_acctbal", "o_totalprice", "l_quantity", "l_extendedprice", "l_discount",
            "p_size", "n_regionkey"]  # fmt: skip


@st.composite
def relational_queries(draw) -> str:
    tables = draw(st.lists(st.sampled_from(sorted(_ALIASES)), min_size=1, max_size=4, unique=True))
    first, *rest = tables
    text = _source(draw, first)
    joined = [first]
    for table in rest:
        kind = draw(st.sampled_from(["JOIN", "JOIN", "LEFT JOIN", "RIGHT JOIN", "CROSS JOIN",
                                     "FULL JOIN"]))  # fmt: skip
        text += f" {kind} {_source(draw, table)}"
        if kind != "CROSS JOIN":
            good = [_GOOD.get((a, table)) or _GOOD.get((table, a)) for a in joined]
            choices = [g for g in good if g] + [_random_condition(draw, joined, table)]
            text += f" ON {draw(st.sampled_from(choices))}"
        joined.append(table)
    columns = [f"{_ALIASES[t]}.{c}" for t in joined for c in _COLUMNS[t]]
    numbers = [c for c in columns if c.split(".")[1] in _NUMBERS]
    aggregates = ["COUNT(*)"] + [f"{f}({c})" for c in numbers for f in ("SUM", "AVG")]
    aggregates += [f"COUNT(DISTINCT {c})" for c in columns if c.endswith("custkey")]
    select = draw(st.sampled_from(aggregates))
    where = ""
    if draw(st.booleans()) and numbers:
        where = f" WHERE {draw(st.sampled_from(numbers))} > {draw(st.integers(-5, 60))}"
    group = ""
    if draw(st.booleans()):
        key = draw(st.sampled_from(columns))
        select, group = f"{key}, {select}", f" GROUP BY {key}"
    sql = f"SELECT {select} FROM {text}{where}{group}"
    if draw(st.booleans()):  # the same, named in a CTE
        sql = f"WITH q AS ({sql}) SELECT * FROM q"
    return sql


# a subquery aggregating per unit: its FROM, the unit it may group by, columns to aggregate
_PER_UNIT = {
    "orders": ("orders o", "o.o_custkey", ["o.o_totalprice", "o.o_orderstatus"]),
    "lineitem": (
        "lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey",
        "o.o_custkey",
        ["l.l_quantity", "l.l_discount", "l.l_partkey", "l.l_returnflag"],
    ),
    "customer": ("customer c2", "c2.c_custkey", ["c2.c_acctbal", "c2.c_nationkey"]),
}


@st.composite
def per_unit_queries(draw) -> str:
    """An outer aggregate over a subquery aggregating per unit (or per something else),
    perhaps joined to customer on the unit (or on something else)."""
    source, unit, columns = _PER_UNIT[draw(st.sampled_from(sorted(_PER_UNIT)))]
    keys = draw(st.sampled_from([[unit], [unit], [unit, columns[-1]], [columns[-1]]]))
    column = draw(st.sampled_from(columns))
    function = draw(st.sampled_from(["SUM", "AVG", "MIN", "MAX", "COUNT"]))
    inner = [f"{keys[0]} AS u", "COUNT(*) AS n", f"{function}({column}) AS v"]
    where = ""
    if draw(st.booleans()):
        where = f" WHERE {draw(st.sampled_from(columns))} > {draw(st.integers(-5, 60))}"
    sub = f"(SELECT {', '.join(inner)} FROM {source}{where} GROUP BY {', '.join(keys)}) t"
    text = sub
    if draw(st.booleans()):
        on = draw(
            st.sampled_from(["c.c_custkey = t.u", "c.c_custkey = t.u", "c.c_nationkey = t.n"])
        )
        text = f"customer c JOIN {sub} ON {on}"
    outer = draw(st.sampled_from(["COUNT(*)", "SUM(t.n)", "AVG(t.n)", "SUM(t.v)", "AVG(t.v)"]))
    group = draw(st.sampled_from(["", "", " GROUP BY t.n", " GROUP BY t.v", " GROUP BY t.u"]))
    select = f"{group.removeprefix(' GROUP BY ')}, {outer}" if group else outer
    filtered = f" WHERE t.v > {draw(st.integers(0, 50))}" if draw(st.booleans()) else ""
    return f"SELECT {select} FROM {text}{filtered}{group}"


@st.composite
def scalar_queries(draw) -> str:
    """A relational query with a scalar subquery in its WHERE: one value or not (grouped,
    raw, correlated with the outer query), over a private or a public table."""
    outer = draw(relational_queries())
    table = draw(st.sampled_from(sorted(_ALIASES)))
    column = f"x.{draw(st.sampled_from(_COLUMNS[table]))}"
    value = draw(st.sampled_from(["COUNT(*)", f"AVG({column})", f"SUM({column})", column,
                                  f"MAX({column})", f"COUNT(*), AVG({column})"]))  # fmt: skip
    tail = draw(st.sampled_from(["", "", " GROUP BY 1", " LIMIT 1", f" WHERE {column} > 3",
                                 " WHERE x.c_custkey = c.c_custkey"]))  # fmt: skip
    numbers = [f"{_ALIASES[t]}.{c}" for t in _ALIASES for c in _COLUMNS[t]
               if c in _NUMBERS and f"{t} {_ALIASES[t]}" in outer] or ["1"]  # fmt: skip
    condition = f"{draw(st.sampled_from(numbers))} > (SELECT {value} FROM {table} x{tail})"
    if " WHERE " in outer:
        return outer.replace(" WHERE ", f" WHERE {condition} AND ", 1)
    head, group, rest = outer.partition(" GROUP BY ")
    return f"{head} WHERE {condition}{group}{rest}"


def _source(draw, table: str) -> str:
    alias = _ALIASES[table]
    if draw(st.integers(0, 3)) == 0:  # a subquery that filters
        column = draw(st.sampled_from(_COLUMNS[table]))
        return f"(SELECT * FROM {table} WHERE {column} IS NOT NULL) {alias}"
    return f"{table} {alias}"


def _random_condition(draw, joined: list[str], table: str) -> str:
    left = draw(st.sampled_from(joined))
    a = draw(st.sampled_from(_COLUMNS[left]))
    b = draw(st.sampled_from(_COLUMNS[table]))
    operator = draw(st.sampled_from(["=", "<", "<>"]))
    return f"{_ALIASES[left]}.{a} {operator} {_ALIASES[table]}.{b}"


def test_generated_relational_queries_are_refused_or_bounded(warehouse):
    """Every generated statement is refused while planning (no database reached), or its
    bounded SQL runs on both neighbours and moves by at most its sensitivity."""
    policy = _loaded_policy(warehouse)
    customer = _heaviest(warehouse, 1)[0]
    neighbour = _without(warehouse, customer)
    seen = {"refused": 0, "answered": 0}

    @settings(
        max_examples=fuzz_examples(300, 3000),
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(sql=st.one_of(relational_queries(), per_unit_queries(), scalar_queries()))
    def run(sql):
        try:
            plan = _plan(sql, policy)
        except QueryRefused as refused:
            assert refused.hint, sql
            seen["refused"] += 1
            return
        seen["answered"] += 1
        for stage in _stages(plan, warehouse, sql):
            if stage.sql is None or not hasattr(stage, "measures"):
                continue
            before = warehouse.execute(stage.sql).fetchall()
            after = neighbour.execute(stage.sql).fetchall()
            _check_neighbours([stage], [before], [after])
            _check_other_units_unchanged(stage, warehouse, neighbour, customer)

    run()
    neighbour.close()
    assert seen["refused"] > 20 and seen["answered"] > 20, seen


def test_tables_named_as_the_engine_resolves_them(warehouse, tmp_path):
    """Entries written main.customer and main.nation answer a join naming them bare."""
    policy = tpch.policy(epsilon=1e5)
    for name in ("customer", "nation"):
        policy["tables"][f"main.{name}"] = policy["tables"].pop(name)
    sql = (
        "SELECT COUNT(*) FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey "
        "WHERE n.n_nationkey IN (SELECT n_nationkey FROM main.nation WHERE n_regionkey = 2)"
    )
    with dpsql.connect(warehouse, policy=policy, ledger=tmp_path / "l.sqlite") as con:
        (released,) = con.execute(sql).fetchone()
    (truth,) = warehouse.execute(sql).fetchone()
    assert abs(released - truth) < 1


# -- bounds chosen per query -------------------------------------------------------


def test_set_bounds_choose_a_querys_contribution_bounds(warehouse, tmp_path):
    """SET dpsql.max_rows_per_unit / max_groups_per_unit replace the policy's bounds for
    the session's queries (one table, joins, per-unit subqueries): the sensitivity
    follows them, a repeat under other bounds is a new release, RESET goes back."""
    join = "SELECT COUNT(*) FROM orders o JOIN customer c ON o.o_custkey = c.c_custkey"
    per_unit = "SELECT AVG(n) FROM (SELECT o_custkey, COUNT(*) AS n FROM orders GROUP BY 1) t"
    grouped = "SELECT o_orderstatus, COUNT(*) FROM orders GROUP BY o_orderstatus"
    with dpsql.connect(warehouse, policy=tpch.policy(), ledger=tmp_path / "l.sqlite") as con:

        def sensitivities(sql: str) -> list[str]:
            explained = con.execute(f"EXPLAIN {sql}").fetchall()
            # the aggregates' measurements (the bounding note's follows the bounds too)
            return [
                v.split(",")[1]
                for k, v in explained
                if k.startswith("measure") and k != "measure bounding note"
            ]

        assert sensitivities(join) == [" sensitivity 15"]
        assert sensitivities(grouped) == [" sensitivity 150"]  # 10 groups of 15 rows
        con.execute(join)
        spent = con.budget().epsilon_spent
        con.execute("SET dpsql.max_rows_per_unit = 3")
        con.execute("SET dpsql.max_groups_per_unit = 2")
        assert con.execute("SHOW dpsql.max_rows_per_unit").fetchall() == [(3,)]
        assert sensitivities(join) == [" sensitivity 3"]
        assert sensitivities(grouped) == [" sensitivity 6"]
        # n is a per-unit count of at most 3 kept orders now
        explained = dict(con.execute(f"EXPLAIN {per_unit}").fetchall())
        assert "clamped to [1, 3]" in explained['measure sum(("n") - 2)']
        con.execute(join)  # the same SQL under other bounds: released and charged again
        assert con.budget().epsilon_spent > spent
        con.execute("RESET dpsql.max_rows_per_unit")
        assert con.execute("SHOW dpsql.max_rows_per_unit").fetchall() == [("policy",)]
        assert sensitivities(join) == [" sensitivity 15"]
        for wrong in ("0", "2.5", "'many'", "2000000"):
            with pytest.raises(dpsql.ProgrammingError, match="whole number from 1 to"):
                con.execute(f"SET dpsql.max_rows_per_unit = {wrong}")


def test_set_bounds_hold_on_neighbours(warehouse):
    """Plans under bounds chosen by SET move by at most their stated sensitivity."""
    policy = _loaded_policy(warehouse)
    options = dataclasses.replace(_options(), max_rows_per_unit=2, max_groups_per_unit=3)
    plans = [
        plan_query(
            parse_statement(sql, "duckdb").tree,
            PlanContext(policy, options, "duckdb", seed=11, unique_references=UNIQUE),
        )
        for sql in ACCEPTED
    ]
    full = [warehouse.execute(plan.sql).fetchall() for plan in plans]
    customer = _heaviest(warehouse, 1)[0]
    neighbour = _without(warehouse, customer)
    _check_neighbours(plans, full, [neighbour.execute(p.sql).fetchall() for p in plans])
    neighbour.close()


@pytest.mark.parametrize("note", ["off", "on"])
@pytest.mark.parametrize("bounds", [(1, 2), (3, 2), None])
def test_bounding_per_group_keeps_the_rows_the_windows_keep(warehouse, monkeypatch, bounds, note):
    """On DuckDB, COUNTs and SUMs are bounded per unit and group first
    (rewrite._per_group_query). At one secret its exact aggregates are the row windows'
    exactly: with most units over small bounds, and with the policy's bounds, which no
    unit exceeds; and they move on neighbours by at most the stated sensitivities. With
    the bounding note, its two totals (the last columns, summed over the groups) are the
    windows' too."""
    policy = _loaded_policy(warehouse)
    options = dataclasses.replace(_options(), bounding_note=note)
    noted = 2 if note == "on" else 0
    if bounds is not None:
        options = dataclasses.replace(
            options, max_rows_per_unit=bounds[0], max_groups_per_unit=bounds[1]
        )

    def planned(dialects: frozenset) -> list:
        monkeypatch.setattr(rewrite, "_PER_GROUP_DIALECTS", dialects)
        context = PlanContext(policy, options, "duckdb", seed=11, unique_references=UNIQUE)
        return [plan_query(parse_statement(sql, "duckdb").tree, context) for sql in ACCEPTED]

    per_group, windows = planned(frozenset({"duckdb"})), planned(frozenset())
    changed = [i for i, (a, b) in enumerate(zip(per_group, windows, strict=True)) if a.sql != b.sql]
    assert len(changed) > len(ACCEPTED) / 2
    full = [warehouse.execute(plan.sql).fetchall() for plan in per_group]
    for i in changed:
        expected = warehouse.execute(windows[i].sql).fetchall()
        width = len(expected[0]) - noted if expected else 0
        rows, expected_rows = ([row[:width] for row in r] for r in (full[i], expected))
        assert sorted(map(repr, rows)) == sorted(map(repr, expected_rows)), ACCEPTED[i]
        totals = [[sum(row[c] or 0 for row in r) for c in range(width, width + noted)]
                  for r in (full[i], expected)]  # fmt: skip
        assert totals[0] == totals[1], ACCEPTED[i]
    neighbour = _without(warehouse, _heaviest(warehouse, 1)[0])
    _check_neighbours(per_group, full, [neighbour.execute(p.sql).fetchall() for p in per_group])
    neighbour.close()


def test_the_shell_shows_public_tables_and_references(warehouse):
    """`\\policy` and completion read policy_schema: public tables and units read through
    a reference say so (they were shown as row-level tables)."""
    from dpsql.shell.connection import policy_schema

    shown = {info.name: info for info in policy_schema(_loaded_policy(warehouse))}
    assert shown["nation"].summary.startswith("public")
    assert shown["nation"].columns and all(
        c.note == "public table: read freely" for c in shown["nation"].columns
    )
    assert "through l_orderkey -> orders.o_orderkey" in shown["lineitem"].summary
    assert shown["orders"].summary.startswith("privacy unit o_custkey")
