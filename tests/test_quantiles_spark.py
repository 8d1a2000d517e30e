"""Quantiles on the local Spark backend (sql/quantiles.py): the checks of the SQLite file
(rank-approximate releases of a median, a grouped percentile beside a count, and keys
from the data) on the shared SparkSession's PUMS views; skipped, with the reason, where
Spark cannot start."""

from __future__ import annotations

import duckdb
from conftest import load_pums
from test_quantiles_sqlalchemy import check_quantiles, pums_only

import dpsql


def test_quantiles_on_spark(spark_session, tmp_path) -> None:
    truth = duckdb.connect()
    load_pums(truth)  # the CSV the session's views were written from
    with dpsql.connect(
        spark_session, policy=pums_only(), epsilon=1.0, ledger=tmp_path / "l.sqlite", seed=6
    ) as connection:
        check_quantiles(connection.cursor(), truth)


def test_timestamps_on_spark(spark_session) -> None:
    """The timestamp checks of test_quantiles (epoch seconds by UNIX_TIMESTAMP)."""
    from test_quantiles import _EVENT_ROWS, EVENTS, _check_events

    frame = spark_session.createDataFrame(_EVENT_ROWS, "uid long, k long, ts timestamp")
    frame.createOrReplaceTempView("e")
    try:
        with dpsql.connect(spark_session, policy=EVENTS, epsilon=1.0, ledger=":memory:") as c:
            _check_events(c.cursor())
    finally:
        spark_session.catalog.dropTempView("e")
