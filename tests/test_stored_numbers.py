"""Float columns stored as exact numbers: DECIMAL/NUMERIC (money in nearly every schema),
and DuckDB's HUGEINT, UHUGEINT and UBIGINT.

DuckDB compares such a column with a constant or another column in a common type
it converts to row by row, failing for some rows; PostgreSQL fails to convert an
unconstrained numeric beyond 1e308 (or nonzero below 1e-307) to double
precision. dpsql reads them itself (rewrite.read_double): each query is answered
on ordinary data near the truth, and the same queries on a table of extreme
values run without an error on any row.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import duckdb
import pytest
from conftest import postgres_tables

import dpsql

EPSILON = 1000.0  # noise far below the tolerance: answers read near exactly
TEMPLATES = [
    "SELECT COUNT(*) FROM {t} WHERE {c} < 1",
    "SELECT COUNT(*) FROM {t} WHERE {c} > 1.5",
    "SELECT COUNT(*) FROM {t} WHERE {c} < 99999999999999999999999999999999999999",
    "SELECT COUNT(*) FROM {t} WHERE {c} > -9999999999999999999999999999999999999.5",
    "SELECT COUNT(*) FROM {t} WHERE {c} = region OR {c} IN (2, 2.5, -1)",
    "SELECT COUNT(*) FROM {t} WHERE {c} BETWEEN 1 AND 1.5 AND NOT {c} <> 1.25",
    "SELECT COUNT(*) FROM {t} WHERE {c} > 0.000000000000000001 AND {c} < 1e30",
    "SELECT SUM({c}), AVG({c}) FROM {t}",
    "SELECT SUM({c}) FROM {t} WHERE {c} > 1.5",
    "SELECT region, SUM({c}), AVG({c}) FROM {t} GROUP BY region",
    "SELECT {c}, COUNT(*) FROM {t} GROUP BY {c}",
    "SELECT SUM({c} * 2 - 1), COUNT(*) FILTER (WHERE {c} <= 1e300) FROM {t}",
]
# Two exact columns compared: DuckDB's common type of DECIMAL(38,2) and DECIMAL(38,37)
# holds neither's extremes.
CROSS = {
    "duckdb": ["price < tiny", "h = uh", "ub > tiny", "uh >= price"],
    "postgres": ["price < tiny", "x = price", "x > tiny"],
}
STORED = {
    "duckdb": ("DECIMAL(15, 2)", "region INT, price DECIMAL(38, 2), tiny DECIMAL(38, 37), "
               "h HUGEINT, uh UHUGEINT, ub UBIGINT"),
    "postgres": ("NUMERIC(15, 2)", "region INT, price NUMERIC(38, 2), tiny NUMERIC(38, 37), "
                 "x NUMERIC"),
}  # fmt: skip
BIG = "999999999999999999999999999999999999.99"
EXTREME = {
    "duckdb": [
        (0, BIG, "9.9999999999999999999999999999999999999",
         "170141183460469231731687303715884105727", "340282366920938463463374607431768211455",
         "18446744073709551615"),
        (1, f"-{BIG}", "-9.9999999999999999999999999999999999999",
         "-170141183460469231731687303715884105727", "0", "0"),
        (2, "0.01", "0.0000000000000000000000000000000000001", "1", "1", "1"),
        (3, None, None, None, None, None),
    ],
    "postgres": [
        (0, BIG, "9.9999999999999999999999999999999999999", "1e400"),
        (1, f"-{BIG}", "-9.9999999999999999999999999999999999999", "-1e400"),
        (2, "0.01", "0.0000000000000000000000000000000000001", "1e-400"),
        (3, None, None, "NaN"),
        (4, "1.5", "1.5", "Infinity"),
        (0, "2", "1", "-Infinity"),
        (1, "1", "0", None),
    ],
}  # fmt: skip


def _sales() -> list[tuple]:
    """Ordinary prices, some equal to 1, 1.25, 1.5, 2 and to their row's region."""
    return [(i % 5, (0, 1, 1.25, 1.5, 2, 3)[i % 6] if i % 4 == 0 else (i * 37 % 9000) / 100)
            for i in range(600)]  # fmt: skip


def _policy(exact_columns: list[str]) -> dict:
    number = {"type": "float", "lower": 0, "upper": 100}
    region = {"type": "int", "values": [0, 1, 2, 3, 4]}
    return {
        "version": 1,
        "defaults": {"epsilon_per_query": EPSILON, "delta": 1e-6},
        "analysts": {"default": {"epsilon": 1e6, "delta": 0.5}},
        "tables": {
            "sales": {"columns": {"region": region, "price": number}},
            "extreme": {"columns": {"region": region, **{c: number for c in exact_columns}}},
        },
    }


class Database:
    """dpsql over the sales and extreme tables, and the truth: sales read as DOUBLE."""

    def __init__(self, name: str, connection: dpsql.Connection, truth):
        self.name, self.connection, self.truth = name, connection, truth
        self.exact_columns = _columns(STORED[name][1])


def _columns(spec: str) -> list[str]:
    """The exact columns of the extreme table (all but its region)."""
    return re.findall(r", (\w+) ", spec)


@pytest.fixture(params=["duckdb", "postgres"])
def database(request, tmp_path) -> Iterator[Database]:
    price, extreme = STORED[request.param]
    policy = _policy(_columns(extreme))
    if request.param == "duckdb":
        raw = duckdb.connect()
        raw.execute(f"CREATE TABLE sales (region INT, price {price})")
        raw.executemany("INSERT INTO sales VALUES (?, ?)", _sales())
        raw.execute(f"CREATE TABLE extreme ({extreme})")
        raw.executemany(f"INSERT INTO extreme VALUES ({', '.join('?' * 6)})", EXTREME["duckdb"])
        raw.execute("CREATE VIEW truth AS SELECT region, CAST(price AS DOUBLE) AS price FROM sales")
        with dpsql.connect(raw, policy=policy, ledger=":memory:", seed=3) as connection:
            yield Database("duckdb", connection, lambda sql: raw.execute(sql).fetchall())
        raw.close()
        return
    import psycopg

    tables = {f"sales (region INT, price {price})": _sales(),
              f"extreme ({extreme})": EXTREME["postgres"]}  # fmt: skip
    url = request.getfixturevalue("postgres_url")
    with postgres_tables(url, tables) as url, psycopg.connect(url, autocommit=True) as raw:
        raw.execute(
            "CREATE VIEW truth AS SELECT region, CAST(price AS DOUBLE PRECISION) AS price "
            "FROM sales"
        )
        with dpsql.connect(url, policy=policy, ledger=":memory:", seed=3) as connection:
            yield Database("postgres", connection, lambda sql: raw.execute(sql).fetchall())


def _close(released: float, true: float | None) -> bool:
    true = 0.0 if true is None else float(true)
    return math.isclose(released, true, rel_tol=1e-3, abs_tol=1.0)


@pytest.mark.parametrize("template", TEMPLATES)
def test_exact_numbers_are_answered_near_the_truth(database, template):
    released = database.connection.execute(template.format(t="sales", c="price")).fetchall()
    keys = 1 if "GROUP BY" in template else 0
    truth = {
        row[:keys]: row[keys:] for row in database.truth(template.format(t="truth", c="price"))
    }
    assert released
    for row in released:
        expected = truth[row[:keys]]
        assert all(_close(v, t) for v, t in zip(row[keys:], expected, strict=True)), (row, expected)


@pytest.mark.parametrize("template", TEMPLATES)
def test_no_row_of_extreme_values_fails_a_query(database, template):
    """Each exact column's extremes (a DECIMAL(38, 2) beside 10^36, a DECIMAL(38, 37),
    HUGEINT, UHUGEINT and UBIGINT at their limits, PostgreSQL numerics of 1e400, 1e-400,
    NaN and infinities) in every comparison, sum and group key."""
    for column in database.exact_columns:
        rows = database.connection.execute(template.format(t="extreme", c=column)).fetchall()
        assert all(math.isfinite(v) for row in rows for v in row[1:] if isinstance(v, float))


def test_two_exact_columns_compared_fail_no_row(database):
    for condition in CROSS[database.name]:
        [(count,)] = database.connection.execute(
            f"SELECT COUNT(*) FROM extreme WHERE {condition}"
        ).fetchall()
        assert isinstance(count, int)


def test_an_exact_column_is_compared_as_a_double_on_duckdb(database):
    """Never as stored on DuckDB (its comparisons convert row by row); PostgreSQL's
    numeric(p, s) compares exactly as stored, its unconstrained numeric is read guarded."""
    [(_, sql), *_] = database.connection.execute(
        "EXPLAIN SELECT COUNT(*) FROM extreme WHERE price < 1"
    ).fetchall()
    if database.name == "duckdb":
        assert 'CAST("price" AS DOUBLE) AS "price"' in sql
    else:
        assert '"price" < 1' in sql and "CAST" not in sql
        [(_, guarded), *_] = database.connection.execute(
            "EXPLAIN SELECT COUNT(*) FROM extreme WHERE x < 1"
        ).fetchall()
        assert "1e308" in guarded and 'ELSE CAST("x" AS DOUBLE PRECISION)' in guarded
