"""The PEP 249 surface of dpsql.connect."""

from __future__ import annotations

import pytest

import dpsql


def test_module_globals():
    assert dpsql.apilevel == "2.0"
    assert dpsql.threadsafety in (0, 1, 2, 3)
    assert dpsql.paramstyle == "qmark"
    for name in ("Warning", "Error", "InterfaceError", "DatabaseError", "DataError",
                 "OperationalError", "IntegrityError", "InternalError", "ProgrammingError",
                 "NotSupportedError"):  # fmt: skip
        assert issubclass(getattr(dpsql, name), Exception)
    assert issubclass(dpsql.QueryRefused, dpsql.ProgrammingError)
    assert issubclass(dpsql.BudgetExhausted, dpsql.OperationalError)
    assert issubclass(dpsql.ProgrammingError, dpsql.DatabaseError)
    assert issubclass(dpsql.DatabaseError, dpsql.Error)


def test_cursor_description_rowcount_and_fetching(connect):
    connection = connect()
    cursor = connection.cursor()
    assert cursor.description is None and cursor.rowcount == -1
    cursor.execute("SELECT sex, COUNT(*) AS n, AVG(income) AS mean FROM pums GROUP BY sex")
    assert [d[0] for d in cursor.description] == ["sex", "n", "mean"]
    assert cursor.description[1][1] == dpsql.NUMBER
    assert cursor.rowcount == 2
    first = cursor.fetchone()
    assert first[0] == 0
    assert cursor.fetchmany(5) == [cursor._release.rows[1]]
    assert cursor.fetchone() is None and cursor.fetchall() == []
    cursor.execute("SELECT educ, COUNT(*) FROM pums GROUP BY educ")
    assert len(list(cursor)) == 16  # public domain: every key, empty groups included
    cursor.arraysize = 3
    cursor.execute("SELECT educ, COUNT(*) FROM pums GROUP BY educ")
    assert len(cursor.fetchmany()) == 3


def test_accuracy_reports_mechanism_scale_and_interval(connect):
    connection = connect(epsilon=0.5)
    cursor = connection.execute("SELECT COUNT(*) AS n, SUM(income) AS total FROM pums")
    accuracy = cursor.accuracy
    assert accuracy["n"].mechanism == "laplace"
    assert accuracy["n"].scale == pytest.approx(4.0)  # two measurements at 0.25 each
    assert accuracy["n"].interval95 > accuracy["n"].scale
    assert accuracy["total"].scale == pytest.approx(500000 / 0.25, rel=1e-5)


def test_parameters_are_bound(connect):
    connection = connect()
    cursor = connection.cursor()
    cursor.execute("SELECT COUNT(*) FROM pums WHERE age > ? AND sex = ?", (30, 1))
    named = connection.cursor().execute(
        "SELECT COUNT(*) FROM pums WHERE age > :age AND sex = :sex", {"age": 30, "sex": 1}
    )
    numbered = connection.cursor().execute(
        "SELECT COUNT(*) FROM pums WHERE age > $1 AND sex = $2", [30, 1]
    )
    # the same bound query is the same release: identical and charged once
    assert cursor.fetchall() == named.fetchall() == numbered.fetchall()
    assert connection.budget().epsilon_spent == pytest.approx(1.0)
    with pytest.raises(dpsql.InterfaceError, match="needs parameter 2"):
        connection.cursor().execute("SELECT COUNT(*) FROM pums WHERE age > ? AND sex = ?", [1])
    # a value no placeholder takes was silently ignored (psycopg refuses it too)
    with pytest.raises(dpsql.InterfaceError, match="2 parameters were given but the statement"):
        connection.cursor().execute("SELECT COUNT(*) FROM pums WHERE age > ?", [30, 1])
    assert connection.budget().epsilon_spent == pytest.approx(1.0)


def test_fetch_sizes_must_be_row_counts(connect):
    cursor = connect().cursor()
    cursor.execute("SELECT sex, COUNT(*) FROM pums GROUP BY sex")
    # fetchmany(-1) sliced from the end: every row but the last
    with pytest.raises(dpsql.InterfaceError, match="fetchmany's size must be a whole number"):
        cursor.fetchmany(-1)
    cursor.arraysize = "2"
    with pytest.raises(dpsql.InterfaceError, match="arraysize must be a whole number"):
        cursor.fetchmany()
    cursor.arraysize = 1
    assert len(cursor.fetchmany()) == 1 and len(cursor.fetchmany(5)) == 1


def test_context_managers_and_closing(connect):
    with connect() as connection:
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM pums")
        with pytest.raises(dpsql.InterfaceError):
            cursor.fetchall()
    assert connection.closed
    with pytest.raises(dpsql.InterfaceError):
        connection.cursor()


def test_fetch_before_execute_is_an_error(connect):
    with pytest.raises(dpsql.InterfaceError, match="no statement"):
        connect().cursor().fetchall()


def test_constant_statements_are_answered_for_free(connect):
    connection = connect()
    assert connection.execute("SELECT 1").fetchall() == [(1,)]
    assert connection.execute("SELECT version()").fetchone()[0]
    assert connection.budget().epsilon_spent == 0


def test_set_show_and_explain(connect):
    connection = connect()
    connection.execute("SET dpsql.epsilon = 0.25")
    assert connection.execute("SHOW dpsql.epsilon").fetchone() == (0.25,)
    plan = dict(connection.execute(
        "EXPLAIN SELECT SUM(income) FROM pums WHERE income < 100000"
    ).fetchall())  # fmt: skip
    assert "LIMIT" not in plan["sql"] and "100000" in plan["sql"]
    assert "epsilon=0.25" in plan["cost"]
    measure = next(v for k, v in plan.items() if k.startswith("measure"))
    assert "tightened income to [0, 100000]" in measure
    assert "sensitivity 100000" in measure
    assert connection.budget().epsilon_spent == 0  # EXPLAIN runs nothing and charges nothing
    budget = connection.execute("SHOW dpsql.budget").fetchone()
    assert budget[0] == "default"
    with pytest.raises(dpsql.ProgrammingError, match="positive"):
        connection.execute("SET dpsql.epsilon = -1")
    with pytest.raises(dpsql.ProgrammingError, match="below 1e"):
        connection.execute("SET dpsql.epsilon = 1e300")  # would not fit the ledger
    with pytest.raises(dpsql.ProgrammingError, match="unknown option"):
        connection.execute("SET dpsql.colour = 'red'")


def test_spellings_of_one_query_share_its_release(connect):
    # The release cache's key folds what the parser ignores: whitespace, comments
    # and the case of keywords and unquoted names.
    connection = connect()
    first = connection.cursor().execute("SELECT COUNT(*) FROM pums WHERE age > 30").fetchall()
    again = (
        connection.cursor()
        .execute("select  count(*)\n  FROM PUMS /* the same query */ where AGE > 30;")
        .fetchall()
    )
    assert again == first
    assert connection.budget().epsilon_spent == pytest.approx(1.0)
    connection.cursor().execute("SELECT COUNT(*) FROM pums WHERE age > 31")
    assert connection.budget().epsilon_spent == pytest.approx(2.0)


def test_release_keys_keep_what_changes_the_query():
    from dpsql.sql.parse import parse_statement

    def key(sql: str) -> str:
        return parse_statement(sql, "duckdb").key

    assert key("SELECT COUNT(*) FROM t") == key("select count ( * )  from T -- note")
    # quoted names and strings are case-sensitive; numbers are spelled as written
    assert key('SELECT COUNT(*) FROM t GROUP BY "A"') != key('SELECT COUNT(*) FROM t GROUP BY "a"')
    assert key("SELECT COUNT(*) FROM t WHERE s = 'A'") != key(
        "SELECT COUNT(*) FROM t WHERE s = 'a'"
    )
    assert key("SELECT COUNT(*) FROM t WHERE x > 1") != key("SELECT COUNT(*) FROM t WHERE x > 1.5")
    # bound values are part of the key, whichever placeholder style binds them
    bound = parse_statement("SELECT COUNT(*) FROM t WHERE x > ?", "duckdb", [1]).key
    assert bound == parse_statement("SELECT COUNT(*) FROM t WHERE x > $1", "duckdb", [1]).key
    assert bound != parse_statement("SELECT COUNT(*) FROM t WHERE x > ?", "duckdb", [2]).key


def test_closing_leaves_a_duckdb_connection_the_caller_opened_open():
    # it closed the caller's connection, which the caller may still be using
    from dpsql import demo

    database = demo.demo_connection()
    with dpsql.connect(database, policy=demo.DEMO_POLICY, ledger=":memory:") as connection:
        connection.execute("SELECT COUNT(*) FROM census").fetchall()
    assert database.execute("SELECT COUNT(*) FROM census").fetchone() == (50_000,)
