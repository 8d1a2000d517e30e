"""Date parts through dpsql mean what they mean on the backend: DuckDB, PostgreSQL, Spark.

One table of dates and timestamps (a week of days, fractions of a second, the
first days of 2000 and 2001, the year 1) is loaded into each backend. For each
date part dpsql accepts, `SELECT <part> AS k, COUNT(*) ... GROUP BY 1` is
rewritten by dpsql and the rewritten query's exact groups (no noise: the
backend's own answer) must be the keys the backend gives for `<part>` run
directly. PostgreSQL lacks YEAR, MONTH, DAY, DAYOFWEEK, DAYOFYEAR and
QUARTER, which sqlglot and dpsql spell for it: there they must give DuckDB's
keys. "Directly" is through the backend's adapter, which runs any SQL and
only converts the values (Spark's timestamps in UTC). What a backend cannot run
(an error, which came after the charge) or runs to NULL for every row must be
refused, before any charge: on Spark, sqlglot's reading of YEAR(d) and its
kin was refused outright, and EXTRACT and DATE_TRUNC units Spark lacks failed
or gave NULL. A truncation to a decade, century or millennium is NULL for the
years it would take before the year 1: on PostgreSQL, fetching the decade of
the year 1 (1 BC) failed after the charge, revealing that such a row exists.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import duckdb
import pytest
from conftest import _with_search_path

import dpsql
from dpsql.adapters import open_adapter
from dpsql.ledger import Ledger
from dpsql.policy import load_policy
from dpsql.session import Session
from dpsql.sql.arguments import _PART_UNITS, _TIME_UNITS, _TRUNC_UNITS
from dpsql.sql.spellings import _FIRST_YEAR_KEPT

_START = dt.datetime(2000, 3, 5, 0, 0, 0)  # a Sunday
_STEP = dt.timedelta(days=1, hours=5, minutes=7, seconds=11, microseconds=123457)
ROWS = [_START + i * _STEP for i in range(40)]
ROWS += [dt.datetime(1, 1, 1, 0, 0, 0, 500000), dt.datetime(2000, 1, 1), dt.datetime(2001, 1, 1)]
VALUES = ", ".join(
    f"(DATE '{t.year:04d}-{t:%m-%d}', TIMESTAMP '{t.year:04d}-{t:%m-%d %H:%M:%S.%f}')" for t in ROWS
)
POLICY = {
    "analysts": {"default": {"epsilon": 1e6, "delta": 0.5}},
    "tables": {"dates": {"columns": {"d": {"type": "date"}, "ts": {"type": "timestamp"}}}},
}
NOT_IN_POSTGRES = ("YEAR(", "MONTH(", "DAY(", "DAYOFWEEK(", "DAYOFYEAR(", "QUARTER(")
PARTS = [
    "YEAR(d)", "MONTH(ts)", "DAY(d)", "DAYOFWEEK(d)", "DAYOFWEEK(ts)", "DAYOFYEAR(d)",
    "QUARTER(ts)",
    *(f"EXTRACT({unit} FROM ts)" for unit in sorted(_PART_UNITS)),
    *(f"EXTRACT({unit} FROM d)" for unit in sorted(_PART_UNITS - _TIME_UNITS)),
    *(f"DATE_TRUNC('{unit}', ts)" for unit in sorted(_TRUNC_UNITS)),
]  # fmt: skip


def _session(database: Any) -> Session:
    return Session(open_adapter(database), load_policy(POLICY), Ledger(":memory:"), seed=1)


def _through_dpsql(session: Session, part: str) -> list:
    """The keys of dpsql's rewritten query, as the backend answers it exactly."""
    query = f"SELECT {part} AS k, COUNT(*) AS n FROM dates GROUP BY 1"
    (sql,) = [detail for item, detail in session.execute(f"EXPLAIN {query}").rows if item == "sql"]
    return _keys(row[0] for row in session.adapter.execute(sql)[1])


def _keys(values: Any) -> list:
    # numbers compared as numbers (PostgreSQL's EXTRACT is NUMERIC), times without zone
    return sorted({float(v) if isinstance(v, int | float) or type(v).__name__ == "Decimal"
                   else v.replace(tzinfo=None) if isinstance(v, dt.datetime) else v
                   for v in values}, key=repr)  # fmt: skip


@pytest.fixture(scope="module")
def duckdb_dates() -> Iterator[duckdb.DuckDBPyConnection]:
    database = duckdb.connect()
    database.execute(f"CREATE TABLE dates AS SELECT * FROM (VALUES {VALUES}) t(d, ts)")
    yield database
    database.close()


@pytest.fixture(params=["duckdb", "postgres", pytest.param("spark", marks=pytest.mark.spark)])
def backend(request: pytest.FixtureRequest, duckdb_dates) -> Iterator[tuple[str, Session]]:
    """The table on a backend: its name and a Session on it."""
    if request.param == "duckdb":
        yield "duckdb", _session(duckdb_dates)
    elif request.param == "spark":
        spark = request.getfixturevalue("spark_session")
        spark.sql(f"CREATE OR REPLACE TEMP VIEW dates AS SELECT * FROM VALUES {VALUES} AS t(d, ts)")
        yield "spark", _session(spark)
        spark.catalog.dropTempView("dates")
    else:
        import psycopg

        url = request.getfixturevalue("postgres_url")
        schema = f"dates_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(_with_search_path(url, schema), autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
            admin.execute(f"CREATE TABLE dates AS SELECT * FROM (VALUES {VALUES}) t(d, ts)")
            session = _session(_with_search_path(url, schema))
            try:
                yield "postgres", session
            finally:
                session.adapter.close()
                admin.execute(f"DROP SCHEMA {schema} CASCADE")


def _meant(part: str) -> str:
    """What dpsql means by `part`: the backend's meaning, except that a truncation to a
    decade, century or millennium is NULL for the years it would take before the year 1
    (PostgreSQL's 1 BC, DuckDB's year 0: Python holds neither; fetching one failed)."""
    unit = part.split("'")[1] if part.startswith("DATE_TRUNC") else ""
    first = _FIRST_YEAR_KEPT.get(unit)
    return f"CASE WHEN EXTRACT(year FROM ts) >= {first} THEN {part} END" if first else part


def test_date_parts_mean_what_the_backend_means(backend, duckdb_dates) -> None:
    name, session = backend
    refused = []
    for part in PARTS:
        try:
            rows = session.adapter.execute(f"SELECT {_meant(part)} FROM dates")[1]
            native: Any = _keys(row[0] for row in rows)
        except Exception as exc:  # the backend cannot run it as written
            native = exc
        try:
            found = _through_dpsql(session, part)
        except dpsql.QueryRefused:
            refused.append(part)
            # refused only what the backend fails on or turns into NULL everywhere
            assert isinstance(native, Exception) or native == [None], (name, part, native)
            continue
        if name == "postgres" and part.startswith(NOT_IN_POSTGRES):
            native = _keys(
                r[0] for r in duckdb_dates.execute(f"SELECT {part} FROM dates").fetchall()
            )
        assert not isinstance(native, Exception), f"{part} accepted, but {name} fails on it"
        assert found == native, f"{part} on {name}"
    assert (refused == []) == (name != "spark"), refused
    assert session.ledger.spent("default").epsilon == 0  # nothing was charged


@pytest.mark.spark
def test_parts_of_an_interval_are_refused_on_spark_before_the_charge(spark_session) -> None:
    """Spark truncates no interval and extracts only the fields an interval type holds:
    these failed after their charge, for every row alike."""
    spark_session.sql(
        f"CREATE OR REPLACE TEMP VIEW dates AS SELECT * FROM VALUES {VALUES} AS t(d, ts)"
    )
    session = _session(spark_session)
    try:
        for part in (
            "DATE_TRUNC('quarter', INTERVAL '3' DAY)",
            "EXTRACT(second FROM INTERVAL '3' DAY)",
        ):
            with pytest.raises(dpsql.QueryRefused, match="of an INTERVAL on Spark"):
                session.execute(f"SELECT COUNT(*) FROM dates WHERE {part} IS NULL")
        assert session.ledger.spent("default").epsilon == 0
    finally:
        spark_session.catalog.dropTempView("dates")
