"""Accepted SQL on the PUMS sample: answers near the truth, post-processing, keys, NULLs."""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pytest
from conftest import on_every_backend, pums_policy

import dpsql
from dpsql.ledger import Ledger
from dpsql.policy import load_policy

# Each query is compared with the same SQL on the raw data; noisy values must lie
# within 6 noise scales of the truth plus the clamping bias, which is zero here.
ACCEPTED = [
    "SELECT COUNT(*) FROM pums",
    "SELECT COUNT(*) FROM pums WHERE age > 30 AND sex = 1",
    "SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 40 OR NOT married = 1",
    "SELECT COUNT(*) FROM pums WHERE race IN (1, 2) AND income IS NOT NULL",
    "SELECT COUNT(*) FROM pums WHERE CAST(age AS VARCHAR) LIKE '3%'",
    "SELECT COUNT(age) FROM pums WHERE educ >= 12",
    "SELECT SUM(income) FROM pums",
    "SELECT SUM(income / 1000) FROM pums",
    "SELECT SUM(income) FROM pums WHERE income < 100000",
    "SELECT AVG(age) FROM pums",
    "SELECT sex, COUNT(*) FROM pums GROUP BY sex",
    "SELECT educ, SUM(income) FROM pums GROUP BY educ",
    "SELECT race, married, COUNT(*) FROM pums GROUP BY race, married",
    'SELECT "sex", COUNT(*) AS "N" FROM "pums" GROUP BY "sex"',
    "SELECT p.sex, COUNT(*) FROM pums AS p GROUP BY p.sex",
    "SELECT pums.married, AVG(pums.age) FROM pums GROUP BY pums.married",
    "SELECT COUNT(DISTINCT pid) FROM pums_pid",
    "SELECT COUNT(*) FILTER (WHERE age > 30) AS n, COUNT(income) FILTER (WHERE sex = 1) AS m "
    "FROM pums",
    "SELECT sex, SUM(income) FILTER (WHERE age > 30) AS s FROM pums GROUP BY sex",
]


@pytest.fixture
def raw(backend):
    connection = backend.raw()
    yield connection
    connection.close()


@on_every_backend
@pytest.mark.parametrize("sql", ACCEPTED)
def test_answer_is_near_the_truth(connect, raw, sql):
    cursor = connect(epsilon=2.0).execute(sql)
    noisy = cursor.fetchall()
    truth = raw.rows(sql)
    names = [d[0] for d in cursor.description]
    keys = sum(1 for name in names if name not in cursor.accuracy)
    exact_by_key = {row[:keys]: row for row in truth}
    assert set(exact_by_key) <= {row[:keys] for row in noisy}
    for noisy_row in noisy:
        true_row = exact_by_key.get(noisy_row[:keys], noisy_row[:keys] + (0,) * (len(names) - keys))
        for name, value, exact in zip(names, noisy_row, true_row, strict=True):
            accuracy = cursor.accuracy.get(name)
            if accuracy is None:
                assert value == exact  # a public key
            elif accuracy.interval95 is not None:
                assert abs(value - (exact or 0)) <= 6 * accuracy.scale, (name, value, exact)
            else:  # AVG: noisy SUM over noisy COUNT
                assert value == pytest.approx(exact, rel=0.2)


@on_every_backend
def test_remainders_of_whole_doubles_are_answered(connect, raw):
    """PostgreSQL has no % of double precision: `ROUND(income) % 7` (whole numbers, which
    the analysis lets % take) failed there for every row, after the charge (found by an
    audit)."""
    cursor = connect(epsilon=2.0).execute(
        "SELECT COUNT(*) FROM pums WHERE ROUND(income) % 7 = 0 AND FLOOR(age / 2) % 2 = 1"
    )
    truth = raw.rows(
        "SELECT COUNT(*) FROM pums WHERE CAST(ROUND(income) AS BIGINT) % 7 = 0 "
        "AND CAST(FLOOR(age / 2.0) AS BIGINT) % 2 = 1"
    )[0][0]
    scale = cursor.accuracy[cursor.description[0][0]].scale
    assert abs(cursor.fetchone()[0] - truth) <= 6 * scale


@on_every_backend
def test_user_level_counts_people_not_rows(connect):
    # PUMS_dup holds 1,948 rows of 1,000 people; with one row per person kept, the
    # noisy row count estimates people, and the distinct count too.
    policy = pums_policy()
    policy["tables"]["pums_dup"]["max_rows_per_unit"] = 1
    cursor = connect(policy, epsilon=2.0).execute(
        "SELECT COUNT(*) AS n, COUNT(DISTINCT pid) AS people FROM pums_dup"
    )
    rows, people = cursor.fetchone()
    assert abs(people - 1000) <= 6 * cursor.accuracy["people"].scale
    assert abs(rows - 1000) <= 6 * cursor.accuracy["n"].scale


@on_every_backend
def test_having_order_by_and_limit_act_on_the_noisy_release(connect):
    cursor = connect().execute(
        "SELECT educ, COUNT(*) AS n FROM pums GROUP BY educ HAVING COUNT(*) > 50 "
        "ORDER BY n DESC LIMIT 3"
    )
    rows = cursor.fetchall()
    assert len(rows) == 3
    counts = [n for _, n in rows]
    assert counts == sorted(counts, reverse=True) and min(counts) > 50


def _rows_charged_once(connect, sql: str, epsilon: float) -> list[tuple]:
    """The rows of `sql` on a new connection, which must have cost exactly `epsilon`."""
    connection = connect(epsilon=epsilon)
    before = connection.budget().epsilon_spent  # the test's connections share one ledger
    rows = connection.execute(sql).fetchall()
    assert connection.budget().epsilon_spent - before == pytest.approx(epsilon)
    return rows


@on_every_backend
def test_having_reads_select_aliases_as_their_expressions(connect):
    """HAVING n > 50 for COUNT(*) AS n filters the released n, at no extra cost; an alias
    that is also a column of the table is the column."""
    connection = connect(epsilon=1.0)
    by_alias = connection.execute(
        "SELECT educ AS e, COUNT(*) AS n FROM pums GROUP BY educ HAVING n > 50 AND e > 8"
    ).fetchall()
    assert by_alias and all(n > 50 and e > 8 for e, n in by_alias)
    assert connection.budget().epsilon_spent == pytest.approx(1.0)  # n is measured once
    with pytest.raises(dpsql.QueryRefused, match="the column age in HAVING"):
        connection.execute("SELECT sex, COUNT(*) AS age FROM pums GROUP BY sex HAVING age > 3")


@on_every_backend
def test_group_by_all_groups_by_the_select_items_without_aggregates(connect):
    """DuckDB's GROUP BY ALL: the keys are the items that read a column outside an
    aggregate; the SQL sent names them, so every backend runs it."""
    rows = _rows_charged_once(
        connect, "SELECT sex, married AS m, COUNT(*) AS n, 'x' AS tag FROM pums GROUP BY ALL", 2.0
    )
    assert sorted((sex, m) for sex, m, _, _ in rows) == [(s, m) for s in (0, 1) for m in (0, 1)]
    assert all(tag == "x" for *_, tag in rows)
    assert len(_rows_charged_once(connect, "SELECT COUNT(*) FROM pums GROUP BY ALL", 1.0)) == 1


@on_every_backend
def test_constant_group_keys_are_answered(connect):
    """`SELECT 5 AS k ... GROUP BY 1`: a bare integer in the SQL sent's GROUP BY is a
    position to every backend (and PostgreSQL refuses other bare constants), so these
    failed after their charge; the rewrite groups by COALESCE(key, key)."""
    for constant in ("5", "'all'", "2.5"):
        rows = _rows_charged_once(
            connect, f"SELECT {constant} AS k, sex, COUNT(*) AS n FROM pums GROUP BY 1, 2", 1.0
        )
        assert sorted(sex for _, sex, _ in rows) == [0, 1], constant
        assert all(str(k).strip("'") == constant.strip("'") for k, _, _ in rows), constant


@on_every_backend
def test_windows_over_the_release_are_post_processing(connect):
    """SUM(COUNT(*)) OVER () adds up the released counts: shares of the total, free,
    computed after the release (the database is never sent the window)."""
    sql = (
        "SELECT educ, COUNT(*) AS n, COUNT(*) * 1.0 / SUM(COUNT(*)) OVER () AS share, "
        "SUM(COUNT(*)) OVER () AS total FROM pums GROUP BY educ HAVING COUNT(*) > 20"
    )
    sent = dict(connect().execute(f"EXPLAIN {sql}").fetchall())["sql"]
    assert "OVER" not in sent.upper()
    rows = _rows_charged_once(connect, sql, 1.0)  # COUNT(*) is measured once
    assert rows and all(n > 20 for _, n, _, _ in rows)
    assert {total for *_, total in rows} == {sum(n for _, n, _, _ in rows)}  # after HAVING
    assert sum(share for _, _, share, _ in rows) == pytest.approx(1.0)
    within = _rows_charged_once(  # PARTITION BY a group key: shares within each sex
        connect,
        "SELECT sex, married, COUNT(*) * 1.0 / SUM(COUNT(*)) OVER (PARTITION BY sex) AS share "
        "FROM pums GROUP BY sex, married",
        1.0,
    )
    for sex in (0, 1):
        assert sum(share for s, _, share in within if s == sex) == pytest.approx(1.0)
    keys = [(s, m) for s, m, _ in within]
    assert keys == sorted(keys)  # in key order, as a release without a window


@on_every_backend
def test_expressions_over_aggregates_are_post_processing(connect):
    rows = _rows_charged_once(
        connect,
        "SELECT sex, SUM(income) / COUNT(*) AS mean, COUNT(*) * 2 AS twice, 'x' AS tag "
        "FROM pums GROUP BY sex ORDER BY sex",
        3.0,
    )
    assert [r[0] for r in rows] == [0, 1] and all(r[3] == "x" for r in rows)
    assert all(r[2] % 2 == 0 for r in rows)


@on_every_backend
def test_group_by_expression_keys_pass_the_threshold(connect):
    cursor = connect().execute(
        "SELECT CASE WHEN age < 30 THEN 'young' WHEN age < 60 THEN 'middle' ELSE 'old' END "
        "AS band, COUNT(*) FROM pums GROUP BY band"
    )
    assert sorted(r[0] for r in cursor.fetchall()) == ["middle", "old", "young"]
    assert any("suppressed" in note for note in cursor.notes)


@on_every_backend
def test_rare_keys_from_the_data_are_suppressed(connect, raw):
    # incomes held by very few people must not appear: their existence is private
    cursor = connect().execute("SELECT income, COUNT(*) FROM pums_pid GROUP BY income")
    released = {row[0] for row in cursor.fetchall()}
    rare = {r[0] for r in raw.rows(
        "SELECT income FROM pums_pid GROUP BY income HAVING COUNT(*) <= 2"
    )}  # fmt: skip
    assert rare and not released & rare


@on_every_backend
def test_public_domain_releases_empty_groups(connect):
    connection = connect()
    # few people are over 90: most education levels have no row, all are released
    rows = connection.execute(
        "SELECT educ, COUNT(*) FROM pums WHERE age > 90 GROUP BY educ"
    ).fetchall()
    assert [r[0] for r in rows] == list(range(1, 17))
    # a condition on the key alone decides which public keys can match: free to apply
    rows = connection.execute(
        "SELECT educ, COUNT(*) FROM pums WHERE educ > 14 GROUP BY educ"
    ).fetchall()
    assert [r[0] for r in rows] == [15, 16]


@on_every_backend
def test_keys_from_data_need_delta(connect):
    policy = pums_policy(defaults={"epsilon_per_query": 1.0, "delta": 0.0})
    with pytest.raises(dpsql.QueryRefused, match="delta > 0"):
        connect(policy).execute("SELECT age, COUNT(*) FROM pums GROUP BY age")


@on_every_backend
def test_nulls_are_skipped_by_sum_and_avg(connect):
    cursor = connect(epsilon=4.0).execute("SELECT AVG(income), COUNT(income) FROM pums_null")
    mean, count = cursor.fetchone()
    assert count == pytest.approx(980 - 45, abs=60)  # one row per pid kept; some NULL
    assert 0 <= mean <= 500000


@on_every_backend
def test_range_predicate_tightens_the_clamp(connect):
    cursor = connect().execute("SELECT SUM(income) AS s FROM pums WHERE income <= 20000")
    assert cursor.accuracy["s"].sensitivity == pytest.approx(20000)


def test_sum_outputs_fall_on_one_grid_whatever_the_data(tmp_path):
    # Neighbouring values v and v + 1: every output is a whole number of grid steps,
    # so the set of possible outputs does not depend on the data.
    policy = {
        "analysts": {"default": {"epsilon": 1000.0}},
        "tables": {"t": {"columns": {"x": {"type": "float", "lower": 0, "upper": 1000}}}},
    }
    outputs = {}
    for shift in (0.0, 1.0):
        path = tmp_path / f"grid{shift}.duckdb"
        with duckdb.connect(str(path)) as connection:
            connection.execute("CREATE TABLE t AS SELECT 0.1 * range + ? AS x FROM range(100)",
                               [shift])  # fmt: skip
        with dpsql.connect(str(path), policy=policy, seed=5) as connection:
            explained = dict(connection.execute("EXPLAIN SELECT SUM(x) FROM t").fetchall())
            step = float(next(v for k, v in explained.items() if k.startswith("measure"))
                         .rsplit("grid of ", 1)[1])  # fmt: skip
            values = []
            for i in range(20):
                connection.execute(f"SET dpsql.epsilon = {1 + i / 100}")
                values.append(connection.execute("SELECT SUM(x) FROM t").fetchone()[0])
        outputs[shift] = (np.array(values), step)
    for values, step in outputs.values():
        assert step == 2.0 ** round(math.log2(step))
        multiples = values / step
        assert np.all(multiples == np.round(multiples))


def test_a_unit_the_database_keeps_unique_needs_no_bounding(tmp_path):
    from dpsql import demo

    database = tmp_path / "census.duckdb"
    with duckdb.connect(str(database)) as connection:
        demo.create_census(connection, rows=2000)
        connection.execute("CREATE TABLE copy AS SELECT * FROM census")  # no key
    policy = demo.DEMO_POLICY | {"tables": {
        "census": demo.DEMO_POLICY["tables"]["census"] | {"max_rows_per_unit": 3},
        "copy": demo.DEMO_POLICY["tables"]["census"] | {"max_rows_per_unit": 3},
    }}  # fmt: skip
    with dpsql.connect(str(database), policy=policy, ledger=tmp_path / "l.sqlite") as connection:
        keyed = dict(connection.execute("EXPLAIN SELECT COUNT(*) FROM census").fetchall())
        plain = dict(connection.execute("EXPLAIN SELECT COUNT(*) FROM copy").fetchall())
        answer = connection.execute("SELECT COUNT(*) AS n FROM census")
        assert answer.accuracy["n"].sensitivity == 1  # one row per unit, guaranteed
    assert "ROW_NUMBER" not in keyed["sql"] and "keeps unique" in keyed["privacy"]
    assert "ROW_NUMBER" in plain["sql"] and "3 rows per group" in plain["privacy"]


def test_a_dropped_key_stops_making_a_unit_unique_within_a_session(tmp_path, monkeypatch):
    """Which units the database keeps unique was read once per session: a table whose key
    the owner replaced by duplicates went on being read without bounding, for as long
    as the connection (a `dpsql serve` client's, say) lasted (found by an audit)."""
    from dpsql import session as sessions

    database = duckdb.connect()
    database.execute("CREATE TABLE t (pid INTEGER PRIMARY KEY, age INTEGER)")
    database.execute("INSERT INTO t SELECT i, i % 90 FROM range(100) r(i)")
    policy = {"version": 1, "analysts": {"default": {"epsilon": 10.0}},
              "tables": {"t": {"privacy_unit": "pid", "max_rows_per_unit": 2, "columns": {
                  "pid": {"type": "int", "private": True},
                  "age": {"type": "int", "lower": 0, "upper": 100}}}}}  # fmt: skip
    with dpsql.connect(database, policy=policy, ledger=tmp_path / "l.sqlite") as connection:
        assert (
            "keeps unique" in dict(connection.execute("EXPLAIN SELECT COUNT(*) FROM t"))["privacy"]
        )
        database.execute("CREATE TABLE u AS SELECT 7 AS pid, age FROM t")  # no key
        database.execute("DROP TABLE t")
        database.execute("ALTER TABLE u RENAME TO t")
        monkeypatch.setattr(sessions, "UNITS_READ_AGAIN", 0.0)  # no wait for the clock
        plan = dict(connection.execute("EXPLAIN SELECT COUNT(*) FROM t"))
        assert "ROW_NUMBER" in plan["sql"] and "2 rows per group" in plan["privacy"]


def test_sessions_for_other_analysts_share_one_reading_of_the_database_facts(tmp_path, monkeypatch):
    """A `dpsql serve` client's Session is opened by the server's for each connection: each
    read the unique keys and proofs for itself on its first query, about ten catalog
    queries. They share the opening Session's reading, as old as it may be, and a key
    dropped is noticed by every one of them once the reading is old."""
    from dpsql import session as sessions
    from dpsql.adapters.duckdb import DuckDBAdapter

    database = duckdb.connect()
    database.execute("CREATE TABLE t (pid INTEGER PRIMARY KEY, age INTEGER)")
    database.execute("INSERT INTO t SELECT i, i % 90 FROM range(100) r(i)")
    budget = {"epsilon": 100.0}
    policy = load_policy(
        {"version": 1, "analysts": {"default": budget, "a": budget, "b": budget},
         "tables": {"t": {"privacy_unit": "pid", "max_rows_per_unit": 2, "columns": {
             "pid": {"type": "int", "private": True},
             "age": {"type": "int", "lower": 0, "upper": 100}}}}}
    )  # fmt: skip
    reads = []
    adapter = DuckDBAdapter(database)
    unique_columns = adapter.unique_columns
    monkeypatch.setattr(adapter, "unique_columns", lambda t: reads.append(t) or unique_columns(t))
    opener = sessions.Session(adapter, policy, Ledger(tmp_path / "l.sqlite"))
    opener.execute("SELECT COUNT(*) FROM t")
    first = len(reads)
    assert first > 0
    unique = "keeps unique"
    for analyst in ("a", "b"):
        session = opener.for_analyst(analyst)
        assert unique in dict(session.execute("EXPLAIN SELECT COUNT(*) FROM t").rows)["privacy"]
    assert len(reads) == first  # read once, by the opener
    database.execute("CREATE TABLE u AS SELECT 7 AS pid, age FROM t")  # no key
    database.execute("DROP TABLE t")
    database.execute("ALTER TABLE u RENAME TO t")
    monkeypatch.setattr(sessions, "UNITS_READ_AGAIN", 0.0)  # no wait for the clock
    for analyst in ("a", "b"):
        plan = dict(opener.for_analyst(analyst).execute("EXPLAIN SELECT COUNT(*) FROM t").rows)
        assert "ROW_NUMBER" in plan["sql"] and unique not in plan["privacy"]
    assert len(reads) > first


def test_a_key_on_a_same_named_table_elsewhere_does_not_make_a_unit_unique(tmp_path):
    """DuckDB's catalog was searched by table name alone: a PRIMARY KEY on archive.census
    made main.census's unit, with 501 rows for one person, "unique" (sensitivity 1;
    found by an audit). A view of the name elsewhere may be what it reads, too."""
    from dpsql.adapters.duckdb import DuckDBAdapter

    database = tmp_path / "two.duckdb"
    with duckdb.connect(str(database)) as connection:
        connection.execute("CREATE TABLE census AS SELECT 7 AS pid, i AS age FROM range(501) t(i)")
        connection.execute("CREATE SCHEMA archive")
        connection.execute("CREATE TABLE archive.census (pid BIGINT PRIMARY KEY, age BIGINT)")
        connection.execute("CREATE TABLE keyed (pid BIGINT PRIMARY KEY, age BIGINT)")
        connection.execute("CREATE VIEW archive.keyed AS SELECT 7 AS pid, 1 AS age")
        connection.execute("CREATE TABLE alone (pid BIGINT PRIMARY KEY, age BIGINT)")
    adapter = DuckDBAdapter(str(database))
    try:
        assert adapter.unique_columns("census") == set()
        assert adapter.unique_columns("archive.census") == {"pid"}
        assert adapter.unique_columns("keyed") == set()
        assert adapter.unique_columns("alone") == {"pid"}
    finally:
        adapter.close()
    policy = {
        "analysts": {"default": {"epsilon": 10.0}},
        "tables": {"census": {"privacy_unit": "pid", "max_rows_per_unit": 1, "columns": {
            "pid": {"type": "int", "private": True},
            "age": {"type": "int", "lower": 0, "upper": 600}}}},
    }  # fmt: skip
    with dpsql.connect(str(database), policy=policy, ledger=tmp_path / "l.sqlite") as connection:
        explained = dict(connection.execute("EXPLAIN SELECT COUNT(*) FROM census").fetchall())
    assert "ROW_NUMBER" in explained["sql"]


@on_every_backend
def test_a_test_of_a_predicate_runs_on_every_backend(connect):
    """sqlglot wrote `(age IN (30, 40)) IS NULL` for Spark without its parentheses,
    which Spark could not parse (after the charge); the rewrite keeps them."""
    connection = connect()
    for condition in ("age IN (30, 40) IS NOT NULL", "age BETWEEN 30 AND 40 IS NOT NULL",
                      "CAST(age AS TEXT) LIKE '3!%' ESCAPE '!' IS NOT NULL"):  # fmt: skip
        (count,) = connection.execute(f"SELECT COUNT(*) FROM pums WHERE {condition}").fetchone()
        assert count > 900  # every row: the test is never NULL


def test_each_unit_keeps_groups_of_its_own(tmp_path):
    """max_groups_per_unit keeps, for each unit, groups chosen by a hash keyed by the unit
    too: every person has a row in each of five groups and keeps one, so each group
    keeps about a fifth of the people (keyed by the group alone, one group kept all)."""
    people = 400
    connection = duckdb.connect()
    connection.execute(
        f"CREATE TABLE visits AS SELECT p AS pid, g FROM range({people}) a(p), range(5) b(g)"
    )
    policy = {
        "version": 1,
        "defaults": {"epsilon_per_query": 1000.0, "delta": 1e-6},
        "analysts": {"default": {"epsilon": 1e6, "delta": 0.5}},
        "tables": {
            "visits": {
                "privacy_unit": "pid",
                "max_groups_per_unit": 1,
                "max_rows_per_unit": 2,  # 1 and 1: one window keeps one row
                "columns": {
                    "pid": {"type": "int", "private": True},
                    "g": {"type": "int", "lower": 0, "upper": 4, "public": True},
                },
            }
        },
    }
    with dpsql.connect(connection, policy=policy, ledger=tmp_path / "l.sqlite", seed=5) as con:
        counts = dict(con.execute("SELECT g, COUNT(*) FROM visits GROUP BY g").fetchall())
    # binomial(400, 1/5): mean 80, sd 8; six sd either way
    assert all(32 <= counts[g] <= 128 for g in range(5)), counts
    assert sum(counts.values()) == pytest.approx(people, abs=5)
