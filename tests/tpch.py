"""A TPC-H-shaped database, generated deterministically in DuckDB, and its policy.

customer, orders and lineitem are private with one unit, the customer (orders
by `o_custkey`, lineitem through its order: `privacy_unit: {via: l_orderkey,
references: orders.o_orderkey}`); region, nation, part and supplier are public.
Each customer has 1 to 15 orders, each order 1 to 7 lineitems, so the policy's
bounds (orders: 15 rows, lineitem: 105) clip nothing and noisy answers at a
large epsilon read near the raw query's. A few orders have no customer (a NULL
unit), which every release leaves out.

`scale` is TPC-H's: 1 is 150,000 customers, 1.5 million orders and about 6
million lineitems; the tests use small fractions of it.
"""

from __future__ import annotations

import duckdb

SEGMENTS = ("AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY")
PRIORITIES = ("1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW")
MAX_ORDERS = 15
MAX_LINES = 7

# Each statement reads {customers}, {parts}, {suppliers}; hash(i, salt) makes the values.
_TABLES = {
    "region": "SELECT i AS r_regionkey, ['AFRICA', 'AMERICA', 'ASIA', 'EUROPE', "
    "'MIDDLE EAST'][CAST(i + 1 AS BIGINT)] AS r_name FROM range(5) t(i)",
    "nation": "SELECT i AS n_nationkey, 'NATION' || lpad(CAST(i AS VARCHAR), 2, '0') AS n_name, "
    "i % 5 AS n_regionkey FROM range(25) t(i)",
    "part": "SELECT i AS p_partkey, 'part ' || i AS p_name, 'Brand#' || (1 + i % 5) AS p_brand, "
    "['SMALL', 'MEDIUM', 'LARGE', 'ECONOMY', 'PROMO'][CAST(1 + hash(i, 1) % 5 AS BIGINT)] "
    "|| ' BRASS' AS p_type, "
    "CAST(1 + hash(i, 2) % 50 AS INTEGER) AS p_size, "
    "CAST(900 + (hash(i, 3) % 110000) / 100.0 AS DOUBLE) AS p_retailprice "
    "FROM range(1, {parts} + 1) t(i)",
    "supplier": "SELECT i AS s_suppkey, 'Supplier#' || i AS s_name, "
    "CAST(hash(i, 4) % 25 AS INTEGER) AS s_nationkey, "
    "CAST(-999 + (hash(i, 5) % 1100000) / 100.0 AS DOUBLE) AS s_acctbal "
    "FROM range(1, {suppliers} + 1) t(i)",
    "customer": "SELECT i AS c_custkey, 'Customer#' || i AS c_name, "
    "CAST(hash(i, 6) % 25 AS INTEGER) AS c_nationkey, "
    "CAST(-999 + (hash(i, 7) % 1100000) / 100.0 AS DOUBLE) AS c_acctbal, "
    f"{list(SEGMENTS)!r}[CAST(1 + hash(i, 8) % 5 AS BIGINT)] AS c_mktsegment "
    "FROM range(1, {customers} + 1) t(i)",
    # each customer's orders: 1 + hash % MAX_ORDERS of them, keys numbered densely
    "orders": "SELECT row_number() OVER (ORDER BY c, j) AS o_orderkey, "
    "CASE WHEN hash(c, j, 9) % 500 = 0 THEN NULL ELSE c END AS o_custkey, "
    "CASE WHEN hash(c, j, 10) % 2 = 0 THEN 'F' ELSE 'O' END AS o_orderstatus, "
    "CAST(1000 + (hash(c, j, 11) % 4000000) / 100.0 AS DOUBLE) AS o_totalprice, "
    "DATE '1992-01-01' + CAST(hash(c, j, 12) % 2400 AS INTEGER) AS o_orderdate, "
    f"{list(PRIORITIES)!r}[CAST(1 + hash(c, j, 13) % 5 AS BIGINT)] AS o_orderpriority "
    f"FROM range(1, {{customers}} + 1) a(c), range({MAX_ORDERS}) b(j) "
    f"WHERE j <= hash(c, 14) % {MAX_ORDERS}",
    "lineitem": "SELECT o_orderkey AS l_orderkey, k + 1 AS l_linenumber, "
    "CAST(1 + hash(o_orderkey, k, 15) % {parts} AS BIGINT) AS l_partkey, "
    "CAST(1 + hash(o_orderkey, k, 16) % {suppliers} AS BIGINT) AS l_suppkey, "
    "CAST(1 + hash(o_orderkey, k, 17) % 50 AS INTEGER) AS l_quantity, "
    "CAST(900 + (hash(o_orderkey, k, 18) % 10000000) / 100.0 AS DOUBLE) AS l_extendedprice, "
    "CAST((hash(o_orderkey, k, 19) % 11) / 100.0 AS DOUBLE) AS l_discount, "
    "CAST((hash(o_orderkey, k, 20) % 9) / 100.0 AS DOUBLE) AS l_tax, "
    "['A', 'N', 'R'][CAST(1 + hash(o_orderkey, k, 21) % 3 AS BIGINT)] AS l_returnflag, "
    "o_orderdate + CAST(1 + hash(o_orderkey, k, 22) % 120 AS INTEGER) AS l_shipdate "
    f"FROM orders, range({MAX_LINES}) b(k) WHERE k <= hash(o_orderkey, 23) % {MAX_LINES}",
}
_KEYS = {"region": "r_regionkey", "nation": "n_nationkey", "part": "p_partkey",
         "supplier": "s_suppkey", "customer": "c_custkey", "orders": "o_orderkey"}  # fmt: skip


def generate(connection: duckdb.DuckDBPyConnection, scale: float = 0.001) -> None:
    """The eight-table-shaped database (seven tables) at `scale`, with primary keys."""
    sizes = {
        "customers": max(20, round(150_000 * scale)),
        "parts": max(20, round(200_000 * scale)),
        "suppliers": max(5, round(10_000 * scale)),
    }
    for name, select in _TABLES.items():
        connection.execute(f"CREATE TABLE __{name} AS {select.format(**sizes)}")
        key = _KEYS.get(name)
        columns = connection.execute(f"DESCRIBE __{name}").fetchall()
        spec = ", ".join(
            f"{column} {kind}{' PRIMARY KEY' if column == key else ''}"
            for column, kind, *_ in columns
        )
        connection.execute(f"CREATE TABLE {name} ({spec})")
        connection.execute(f"INSERT INTO {name} SELECT * FROM __{name}")
        connection.execute(f"DROP TABLE __{name}")


def policy(epsilon: float = 1.0, budget: float = 1e6, delta: float = 1e-6) -> dict:
    """The policy: three private tables of one unit (the customer), four public ones."""
    money = {"type": "float", "lower": -1000, "upper": 10000}
    day = {"type": "date", "lower": "1992-01-01", "upper": "1999-12-31"}
    return {
        "version": 1,
        "defaults": {"epsilon_per_query": epsilon, "delta": delta},
        "analysts": {"default": {"epsilon": budget, "delta": 0.5}},
        "tables": {
            "region": {"public": True},
            "nation": {"public": True},
            "part": {"public": True},
            "supplier": {"public": True},
            "customer": {
                "privacy_unit": "c_custkey",
                "columns": {
                    "c_custkey": {"type": "int", "private": True},
                    "c_name": {"type": "string", "private": True},
                    "c_nationkey": {"type": "int"},
                    "c_acctbal": money,
                    "c_mktsegment": {"type": "string", "values": list(SEGMENTS)},
                },
            },
            "orders": {
                "privacy_unit": "o_custkey",
                "max_rows_per_unit": MAX_ORDERS,
                "max_groups_per_unit": 10,
                "columns": {
                    "o_orderkey": {"type": "int", "private": True},
                    "o_custkey": {"type": "int", "private": True},
                    "o_orderstatus": {"type": "string", "values": ["F", "O"]},
                    "o_totalprice": {"type": "float", "lower": 0, "upper": 50000},
                    "o_orderdate": day,
                    "o_orderpriority": {"type": "string", "values": list(PRIORITIES)},
                },
            },
            "lineitem": {
                "privacy_unit": {"via": "l_orderkey", "references": "orders.o_orderkey"},
                "max_rows_per_unit": MAX_ORDERS * MAX_LINES,
                "max_groups_per_unit": 10,
                "columns": {
                    "l_orderkey": {"type": "int", "private": True},
                    "l_linenumber": {"type": "int", "lower": 1, "upper": MAX_LINES},
                    "l_partkey": {"type": "int"},
                    "l_suppkey": {"type": "int"},
                    "l_quantity": {"type": "int", "lower": 1, "upper": 50},
                    "l_extendedprice": {"type": "float", "lower": 0, "upper": 110000},
                    "l_discount": {"type": "float", "lower": 0, "upper": 0.1},
                    "l_tax": {"type": "float", "lower": 0, "upper": 0.08},
                    "l_returnflag": {"type": "string", "values": ["A", "N", "R"]},
                    "l_shipdate": day,
                },
            },
        },
    }
