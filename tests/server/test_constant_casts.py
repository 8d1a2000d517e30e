"""Casts of constants (`$1::INTEGER`), decided while planning: every cast dpsql accepts
converts without an error in real PostgreSQL and DuckDB, and the ones it refuses are
refused before anything is charged.
"""

from __future__ import annotations

import itertools

import duckdb
import psycopg
import pytest
import sqlglot

import dpsql
from dpsql.sql.casts import constant_cast_converts

from .conftest import _policy

CONSTANTS = [
    "40", "-7", "40.5", "2147483647", "2147483647.5", "32768", "-32768", "9223372036854775807",
    "1e38", "1e39", "1e-30", "1e-40", "1e300", "123456789012345.678", "1234567890123456",
    "'40'", "'40.5'", "' 12 '", "'x'", "'1e3'", "'2020-01-31'", "'2020-02-30'",
    "'2020-01-31 10:11:12'", "DATE '2021-03-04'", "CAST('2021-03-04' AS DATE)", "''",
]  # fmt: skip
TYPES = [
    "SMALLINT", "INTEGER", "BIGINT", "REAL", "DOUBLE PRECISION", "NUMERIC", "NUMERIC(5, 2)",
    "NUMERIC(3)", "DATE", "TIMESTAMP", "BOOLEAN",
]  # fmt: skip
CASES = [f"CAST({value} AS {kind})" for value, kind in itertools.product(CONSTANTS, TYPES)]


def _accepted(cast: str, dialect: str) -> bool:
    tree = sqlglot.parse_one(f"SELECT {cast}", read="postgres")
    node = sqlglot.parse_one(tree.sql(dialect=dialect), read=dialect).expressions[0]
    return constant_cast_converts(node)


def _converts_in(run, sql: str) -> bool:
    try:
        run(sql)
    except (psycopg.Error, duckdb.Error):
        return False
    return True


def test_accepted_casts_convert_in_both_engines(postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as pg, duckdb.connect() as duck:
        accepted = 0
        for cast in CASES:
            for dialect, run in (("postgres", pg.execute), ("duckdb", duck.execute)):
                if _accepted(cast, dialect):
                    accepted += 1
                    sql = sqlglot.transpile(f"SELECT {cast}", read="postgres", write=dialect)[0]
                    assert _converts_in(run, sql), f"{cast} accepted for {dialect}, but fails"
        # and the gate is not trivially shut: most casts of numbers to numbers pass
        assert accepted > len(CASES) // 2
        for cast in ("CAST(32768 AS SMALLINT)", "CAST('40.5' AS INTEGER)", "CAST(1e39 AS REAL)",
                     "CAST(1234.5 AS NUMERIC(5, 2))", "CAST('2020-02-30' AS DATE)"):  # fmt: skip
            assert not _accepted(cast, "postgres") and not _converts_in(
                pg.execute, f"SELECT {cast}"
            )


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_a_cast_that_fails_is_refused_before_the_charge(
    backend, pums_db, tmp_path, request
) -> None:
    database = str(pums_db)
    if backend == "postgres":
        database = request.getfixturevalue("postgres_backend").database
    with dpsql.connect(
        database, policy=_policy(), analyst="alice", ledger=str(tmp_path / "l.sqlite")
    ) as con:
        cursor = con.cursor()
        cursor.execute("SELECT COUNT(*) FROM pums WHERE age > $1::SMALLINT", [30])
        assert isinstance(cursor.fetchone()[0], int)
        spent = con.budget().epsilon_spent
        with pytest.raises(dpsql.ProgrammingError, match="SMALLINT"):
            cursor.execute("SELECT COUNT(*) FROM pums WHERE age > $1::SMALLINT", [40000])
        with pytest.raises(dpsql.ProgrammingError, match="INT"):
            cursor.execute("SELECT COUNT(*) FROM pums WHERE age > $1::INTEGER", ["40.5"])
        assert con.budget().epsilon_spent == spent
