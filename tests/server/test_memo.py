"""The wire server's memo of the release cache: which repeats skip the worker, and which
statements always reach the Session."""

from __future__ import annotations

import psycopg
import pytest
import sqlglot

from dpsql.results import Release
from dpsql.server.memo import Answer, ReleaseMemo
from dpsql.session import CachedRelease

COUNT = "SELECT COUNT(*) FROM pums WHERE age > 45"


@pytest.fixture
def trips(duck, monkeypatch) -> list[str]:
    """The statements that reached a worker thread (the Session), in order."""
    backend = duck.server.server.backend
    execute, seen = backend.execute, []

    def counting(session, sql, parameters, job=None):
        seen.append(sql)
        return execute(session, sql, parameters, job)

    monkeypatch.setattr(backend, "execute", counting)
    return seen


def _run(duck, sql: str, parameters: tuple = (), analyst: str = "alice") -> list[tuple]:
    with psycopg.connect(duck.dsn(analyst), autocommit=True) as conn:
        return conn.execute(sql, parameters or None).fetchall()


def test_a_repeat_on_any_connection_is_answered_without_a_worker(duck, trips) -> None:
    before = duck.spent("alice")
    first = _run(duck, COUNT)
    assert duck.spent("alice") == pytest.approx(before + 1.0) and trips == [COUNT]
    with psycopg.connect(duck.dsn(), autocommit=True) as conn:
        again = [conn.execute(COUNT).fetchall() for _ in range(8)]  # psycopg prepares it at 5
    assert again == [first] * 8
    assert trips == [COUNT] and duck.spent("alice") == pytest.approx(before + 1.0)


def test_the_memo_holds_the_ledger_release(duck, trips) -> None:
    sql = "SELECT COUNT(*) FROM pums WHERE age < 25"
    in_process = duck.connection.cursor()  # alice too, on the server's own ledger
    expected = in_process.execute(sql).fetchall()
    assert _run(duck, sql) == expected and _run(duck, sql) == expected
    assert trips == [sql]  # the first from the ledger's cache (free), then from the memo


def test_options_analysts_and_parameters_each_have_their_own_release(duck, trips) -> None:
    _run(duck, COUNT)
    before = duck.spent("alice")
    with psycopg.connect(duck.dsn(), autocommit=True) as conn:
        conn.execute("SET dpsql.epsilon = 0.5")
        conn.execute(COUNT).fetchall()
    assert duck.spent("alice") == pytest.approx(before + 0.5)
    carol = duck.spent("carol")
    _run(duck, COUNT, analyst="carol")
    assert duck.spent("carol") == pytest.approx(carol + 1.0)
    before = duck.spent("alice")
    by_age = "SELECT COUNT(*) FROM pums WHERE age > %s"
    for age in (60, 60.0, 60, 60.0):  # equal values, different literals
        _run(duck, by_age, (age,))
    assert duck.spent("alice") == pytest.approx(before + 2.0)
    bound = [sql for sql in trips if "$1" in sql]
    assert len(bound) == 2  # 60 and 60.0 once each; their repeats from the memo


def test_statements_the_cache_does_not_keep_always_reach_the_session(duck, trips) -> None:
    with psycopg.connect(duck.dsn(), autocommit=True) as conn:
        spent = [conn.execute("SHOW dpsql.budget").fetchone()[2]]
        conn.execute("SELECT COUNT(*) FROM pums WHERE age > 33").fetchall()
        spent.append(conn.execute("SHOW dpsql.budget").fetchone()[2])
    assert spent[1] == pytest.approx(spent[0] + 1.0)
    assert trips.count("SHOW dpsql.budget") == 2


def test_a_statement_with_parameters_is_parsed_once(duck, monkeypatch) -> None:
    parse, parsed = sqlglot.parse_one, []

    def counting(sql, *args, **kwargs):
        parsed.append(sql)
        return parse(sql, *args, **kwargs)

    monkeypatch.setattr(sqlglot, "parse_one", counting)
    by_sex = "SELECT COUNT(*) AS n FROM pums WHERE sex = %s"
    counts = [_run(duck, by_sex, (sex,)) for sex in (0, 1, 0)]  # a Parse on each connection
    assert counts[0] == counts[2] and isinstance(counts[1][0][0], int)
    assert parsed == ["SELECT COUNT(*) AS n FROM pums WHERE sex = $1"]


def _cached(rows: int) -> Answer:
    return Answer(CachedRelease(["n"], [(i,) for i in range(rows)]), None, b"")


def _key(sql: str) -> tuple:
    return "alice", None, sql, "[]"


def test_memo_keeps_only_cached_releases_and_drops_the_least_recently_used() -> None:
    memo = ReleaseMemo(limit=16 * 20_000)
    memo.keep(_key("plain"), Answer(Release(["n"], [(1,)]), None, b""))
    assert memo.get(_key("plain")) is None
    memo.keep(_key("huge"), _cached(200))  # over a sixteenth of the capacity
    assert memo.get(_key("huge")) is None
    for name in "abcdefghij":
        memo.keep(_key(name), _cached(1))  # about 1,600 bytes each: 199 fit
    assert memo.get(_key("a")).release.rows == [(0,)]  # now the most recently used
    for number in range(190):
        memo.keep(_key(str(number)), _cached(1))
    assert memo.get(_key("a")) is not None and memo.get(_key("b")) is None
    assert memo.get(_key("c")) is not None and memo.total <= memo.limit
