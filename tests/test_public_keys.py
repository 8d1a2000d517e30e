"""Public key domains: every key is released, except those the query's own conditions exclude."""

from __future__ import annotations

import duckdb
import pytest

import dpsql

POLICY = {
    "analysts": {"default": {"epsilon": 100.0}},
    "tables": {
        "t": {
            "columns": {
                "grade": {"type": "int", "lower": 1, "upper": 6, "public": True},
                "kind": {"type": "string", "values": ["a", "b", "c"]},
                "score": {"type": "int", "lower": 0, "upper": 10},
            }
        }
    },
}


def _connect() -> dpsql.Connection:
    database = duckdb.connect(":memory:")
    database.execute("CREATE TABLE t (grade INT, kind VARCHAR, score INT)")
    # grade 6 and kind 'c' never occur: their groups are released as (noisy) zeros
    database.execute("INSERT INTO t SELECT 1 + i % 5, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END, "
                     "i % 11 FROM range(1000) r(i)")  # fmt: skip
    return dpsql.connect(database, policy=POLICY, ledger=":memory:", seed=3)


def test_every_key_of_the_domain_is_released_including_empty_ones():
    with _connect() as connection:
        keys = [row[0] for row in connection.execute(
            "SELECT grade, COUNT(*) FROM t GROUP BY grade").fetchall()]  # fmt: skip
        assert keys == [1, 2, 3, 4, 5, 6]


def test_conditions_on_the_keys_alone_restrict_the_released_keys():
    with _connect() as connection:
        rows = connection.execute(
            "SELECT grade, kind, COUNT(*) FROM t "
            "WHERE grade >= 4 AND kind IN ('b', 'c') AND score > 2 GROUP BY grade, kind"
        ).fetchall()
        # score > 2 involves a private-data column: it filters rows, not keys
        assert [row[:2] for row in rows] == [
            (4, "b"), (4, "c"), (5, "b"), (5, "c"), (6, "b"), (6, "c"),
        ]  # fmt: skip
        assert (
            connection.execute(
                "SELECT grade, COUNT(*) FROM t WHERE grade > 100 GROUP BY grade"
            ).fetchall()
            == []
        )


def test_a_condition_mixing_keys_and_other_columns_keeps_every_key():
    with _connect() as connection:
        keys = [row[0] for row in connection.execute(
            "SELECT grade, COUNT(*) FROM t WHERE grade > 3 OR score > 5 GROUP BY grade"
        ).fetchall()]  # fmt: skip
        assert keys == [1, 2, 3, 4, 5, 6]


def test_a_domain_too_large_to_release_is_refused_before_any_charge():
    policy = {
        "analysts": {"default": {"epsilon": 100.0}},
        "tables": {"t": {"columns": {
            name: {"type": "int", "lower": 0, "upper": 200, "public": True}
            for name in ("grade", "score", "extra")
        }}},
    }  # fmt: skip
    database = duckdb.connect(":memory:")
    database.execute("CREATE TABLE t (grade INT, score INT, extra INT)")
    with dpsql.connect(database, policy=policy, ledger=":memory:", seed=3) as connection:
        with pytest.raises(dpsql.QueryRefused, match="8,120,601 keys"):
            connection.execute("SELECT grade, score, extra, COUNT(*) FROM t GROUP BY 1, 2, 3")
        assert connection.budget().epsilon_spent == 0
