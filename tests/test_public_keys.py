"""Public key domains: every key is released, except those the query's own conditions exclude."""

from __future__ import annotations

import re
from decimal import Decimal

import duckdb
import pytest

import dpsql
from dpsql.errors import TooManyGroups
from dpsql.sql.plan import _fill_domain, _Fixed, _normal

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
        with pytest.raises(dpsql.QueryRefused, match="8,120,601 keys"):  # the keys alone too
            connection.execute("SELECT DISTINCT grade, score, extra FROM t")
        assert connection.budget().epsilon_spent == 0


# -- the keys alone: the domain itself, answered free ---------------------------------


def _keys_alone(connection: dpsql.Connection, sql: str) -> list[tuple]:
    """The rows of `sql`, checking that it read nothing and cost nothing: the database
    is never asked, and the budget is as before."""
    adapter = connection.session.adapter
    before = connection.budget()
    asked = []
    stream = adapter.stream
    adapter.stream = lambda sql, *a, **k: asked.append(sql) or stream(sql, *a, **k)
    try:
        cursor = connection.cursor()
        cursor.execute(sql)
        rows = cursor.fetchall()
    finally:
        adapter.stream = stream
    assert asked == [] and connection.budget() == before
    assert any("nothing was charged" in note for note in cursor.notes)
    return rows


@pytest.mark.parametrize(
    ("sql", "keys"),
    [
        ("SELECT grade FROM t GROUP BY grade", [(g,) for g in range(1, 7)]),
        ("SELECT DISTINCT grade FROM t", [(g,) for g in range(1, 7)]),
        ("SELECT DISTINCT kind FROM t", [("a",), ("b",), ("c",)]),  # 'c' has no rows
        ("SELECT grade FROM t WHERE grade >= 5 GROUP BY grade", [(5,), (6,)]),
        ("SELECT DISTINCT grade AS g FROM t WHERE grade IN (2, 3, 9) ORDER BY g DESC",
         [(3,), (2,)]),
        ("SELECT kind, grade FROM t WHERE kind <> 'a' AND grade < 3 GROUP BY kind, grade",
         [("b", 1), ("b", 2), ("c", 1), ("c", 2)]),
        ("SELECT grade * 10 AS tens FROM t GROUP BY grade HAVING grade > 4", [(50,), (60,)]),
        ("SELECT grade FROM t WHERE grade > 100 GROUP BY grade", []),
    ],
)  # fmt: skip
def test_the_keys_of_public_domains_alone_are_the_domain_for_free(sql, keys):
    """The answer is the policy's (the keys its conditions on them allow), whatever the
    data holds: no statement runs and the budget is unchanged."""
    with _connect() as connection:
        assert _keys_alone(connection, sql) == keys


def test_the_keys_alone_follow_the_release_limit():
    database = duckdb.connect(":memory:")
    database.execute("CREATE TABLE t (grade INT, kind VARCHAR, score INT)")
    with dpsql.connect(database, policy=POLICY, ledger=":memory:", max_groups=5) as connection:
        with pytest.raises(TooManyGroups):
            connection.execute("SELECT DISTINCT grade FROM t")
        assert connection.budget().epsilon_spent == 0


@pytest.mark.parametrize(
    ("sql", "refused"),
    [
        # which public keys have rows passing a condition on another column is the data's
        ("SELECT grade FROM t WHERE score > 5 GROUP BY grade",
         "add COUNT(*) to see which groups have rows"),
        ("SELECT DISTINCT grade FROM t WHERE grade > 3 OR score > 5",
         "add COUNT(*) to see which groups have rows"),
        # a key without a public domain would come from the data, raw
        ("SELECT score FROM t GROUP BY score", "score has no public domain"),
        ("SELECT DISTINCT grade, score FROM t", "SELECT score, COUNT(*) FROM t GROUP BY score"),
        ("SELECT grade FROM t", "neither grouped nor aggregated"),
        ("SELECT DISTINCT grade, COUNT(*) FROM t GROUP BY grade", "drop DISTINCT"),
    ],
)  # fmt: skip
def test_keys_alone_that_the_data_would_decide_are_refused_saying_what_to_write(sql, refused):
    with _connect() as connection:
        with pytest.raises(dpsql.QueryRefused, match=re.escape(refused)):
            connection.execute(sql)
        assert connection.budget().epsilon_spent == 0


@pytest.mark.parametrize("kinds", [["int", "string"], ["bool", "string"], ["float", "string"]])
def test_a_remembered_place_is_the_place_found_afresh(kinds):
    """A public key's place is remembered by the key as the database returned it
    (sql/plan.py, _Fixed.places): every release, the first or a later one, puts each
    row's counts where canonical_value and _normal alone would, for keys that Python's
    equality conflates across types (1, True, 1.0, Decimal 1) or that lie outside."""
    domain = [(0, "a"), (1, "a"), (1, "b"), (2, "b")]

    def fixed() -> _Fixed:
        position = {_normal(key): place for place, key in enumerate(domain)}
        return _Fixed((), {}, list(domain), position)

    # the conflated values before the plain ones: only a plain key may be remembered
    raw = [True, 1.0, Decimal("1"), 1, False, -0.0, 0, 2.0, 2, 3, "1", None]
    rows = [(value, text, 7 + n) for n, value in enumerate(raw) for text in ("a", "b", "c")]
    remembering = fixed()
    for _ in range(3):  # the first release fills the places, the later ones read them
        for row in rows:
            kept = _fill_domain(remembering, [[row]], kinds, 3)
            afresh = _fill_domain(fixed(), [[row]], kinds, 3)
            assert kept.tolist() == afresh.tolist(), row
    assert all(all(type(v) is int or type(v) is str for v in key) for key in remembering.places)
    assert remembering.places  # plain keys in the domain were remembered
