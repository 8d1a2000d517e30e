"""Running totals in SQL: answered from a continual stream, charged once, never rewritten."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.errors import QueryRefused
from dpsql.sql import running
from dpsql.sql.parse import parse_statement

DAY0 = dt.date(2024, 1, 1)
RUNNING = "SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) AS so_far FROM running_events"


def _policy(epsilon: float, **continual: object) -> dict:
    return {
        "version": 1,
        "defaults": {"epsilon_per_query": 1.0, "delta": 1e-6},
        "analysts": {"default": {"epsilon": 1e5, "delta": 1e-5}},
        "tables": {"running_events": {
            "privacy_unit": "uid", "max_groups_per_unit": 40, "max_rows_per_unit": 3,
            "columns": {
                "uid": {"type": "int", "private": True},
                "day": {"type": "date", "lower": "2024-01-01", "upper": "2024-02-09",
                        "continual": {"step": "1 day", "epsilon": epsilon, **continual}},
                "shop": {"type": "int", "values": [0, 1, 2]},
                "city": {"type": "int", "lower": 0, "upper": 9},
                "amount": {"type": "float", "lower": 0, "upper": 10},
            }}},
    }  # fmt: skip


@pytest.fixture
def events() -> duckdb.DuckDBPyConnection:
    db = duckdb.connect()
    db.execute("CREATE TABLE running_events (uid INT, day DATE, shop INT, city INT, amount DOUBLE)")
    _add(db, 0, 2000)
    return db


def _add(db: duckdb.DuckDBPyConnection, start: int, stop: int, day: int | None = None) -> None:
    when = f"{day}" if day is not None else "(i % 20)"
    db.execute(
        f"INSERT INTO running_events SELECT i % 1000, DATE '2024-01-01' + {when}::INT, i % 3, "
        f"i % 10, (i % 11)::DOUBLE FROM range({start}, {stop}) t(i)"
    )


def _connect(db, tmp_path, epsilon: float = 1e4, **continual):
    # epsilon 1e4: node noise of scale ~1e-3 is zero with probability 1 - 1e-250,
    # so the released totals are the exact ones and can be compared
    return dpsql.connect(db, policy=_policy(epsilon, **continual),
                         ledger=tmp_path / "ledger.sqlite", seed=3)  # fmt: skip


def _truth(db, bound: str, extra: str = "") -> list[tuple]:
    return db.execute(
        f"SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) FROM running_events WHERE day < DATE "
        f"'{bound}' {extra} GROUP BY day ORDER BY day"
    ).fetchall()


def test_running_count_is_the_exact_running_count_plus_noise(events, tmp_path):
    con = _connect(events, tmp_path)
    rows = con.execute(f"{RUNNING} WHERE day < '2024-01-11' GROUP BY day").fetchall()
    assert rows == [(d, int(n)) for d, n in _truth(events, "2024-01-11")]
    window = con.execute(
        "SELECT day, COUNT(*) OVER (ORDER BY day ROWS UNBOUNDED PRECEDING) AS n "
        "FROM running_events WHERE day <= '2024-01-10'"
    ).fetchall()
    assert window == rows  # the same stream, answered again for free
    assert con.budget().epsilon_spent == pytest.approx(1e4)


def test_budget_is_charged_once_and_past_releases_never_change(events, tmp_path):
    con = _connect(events, tmp_path, epsilon=2.0, history="mutable")
    first = con.execute(f"{RUNNING} WHERE day < '2024-01-06' GROUP BY day").fetchall()
    assert [r[0] for r in first] == [DAY0 + dt.timedelta(days=i) for i in range(5)]
    _add(events, 2000, 2600)  # new rows for every day, some for days already released
    later = con.execute(f"{RUNNING} WHERE day < '2024-01-16' GROUP BY day").fetchall()
    assert later[:5] == first and len(later) == 15
    assert con.budget().epsilon_spent == pytest.approx(2.0)
    again = _connect(events, tmp_path, epsilon=2.0, history="mutable")  # same stream and noise
    assert again.execute(f"{RUNNING} WHERE day < '2024-01-16' GROUP BY day").fetchall() == later
    assert again.budget().epsilon_spent == pytest.approx(2.0)


def test_a_ledger_two_databases_share_keeps_their_streams_and_answers_apart(tmp_path):
    """One policy and one ledger over two database files: the stream (and a cached
    answer) of one was continued (served) on the other, for free; the second's rows
    added to the first's totals moved a unit twice as far as the stream was charged
    for (found by an audit)."""
    ledger, totals = tmp_path / "ledger.sqlite", {}
    for name, rows in (("a", 2000), ("b", 300)):
        with duckdb.connect(str(tmp_path / f"{name}.duckdb")) as db:
            db.execute("CREATE TABLE running_events "
                       "(uid INT, day DATE, shop INT, city INT, amount DOUBLE)")  # fmt: skip
            _add(db, 0, rows)
            totals[name] = _truth(db, "2024-01-11")
        with dpsql.connect(str(tmp_path / f"{name}.duckdb"), policy=_policy(1e4), ledger=ledger,
                           seed=3) as con:  # fmt: skip
            query = f"{RUNNING} WHERE day < '2024-01-11' GROUP BY day"
            assert con.execute(query).fetchall() == [(d, int(n)) for d, n in totals[name]]
            cursor = con.execute("SELECT COUNT(*) AS n FROM running_events")
            # 6 scales (720) tell this database's count from the other's (1,700 apart)
            assert abs(cursor.fetchone()[0] - rows) <= 6 * cursor.accuracy["n"].scale
            spent = con.budget().epsilon_spent
    assert spent == pytest.approx(2 * (1e4 + 1))  # each database its stream and its answer


def test_late_rows_for_released_steps_are_ignored_by_a_mutable_stream(events, tmp_path):
    con = _connect(events, tmp_path, history="mutable")
    before = con.execute(f"{RUNNING} WHERE day < '2024-01-06' GROUP BY day").fetchall()
    _add(events, 5000, 5030, day=2)  # late rows for a released day
    _add(events, 6000, 6010, day=7)  # rows for a day not released yet
    after = con.execute(f"{RUNNING} WHERE day < '2024-01-09' GROUP BY day").fetchall()
    truth = _truth(events, "2024-01-09")
    assert after[:5] == before
    late = 30
    assert [n for _, n in after[5:]] == [int(n) - late for _, n in truth[5:]]


def test_partitioned_running_sum(events, tmp_path):
    con = _connect(events, tmp_path)
    cur = con.execute(
        "SELECT day, shop, SUM(SUM(amount)) OVER (PARTITION BY shop ORDER BY day) AS total "
        "FROM running_events WHERE day < '2024-01-05' AND city < 5 GROUP BY day, shop"
    )
    rows = cur.fetchall()
    truth = events.execute(
        "SELECT day, shop, SUM(SUM(amount)) OVER (PARTITION BY shop ORDER BY day) "
        "FROM running_events WHERE day < DATE '2024-01-05' AND city < 5 GROUP BY day, shop "
        "ORDER BY day, shop"
    ).fetchall()
    assert [(d, s) for d, s, _ in rows] == [(d, s) for d, s, _ in truth]
    # a SUM's sensitivity is 120 rows x 10: its noise is not negligible even at this epsilon
    bound = 5 * cur.accuracy["total"].scale
    assert [t for *_, t in rows] == pytest.approx([t for *_, t in truth], abs=bound)
    assert any(t != int(t) for *_, t in rows)  # released on the SUM's fine grid


def test_explain_shows_mechanism_horizon_cost_and_error(events, tmp_path):
    con = _connect(events, tmp_path, epsilon=1.0)
    lines = dict(con.execute(f"EXPLAIN {RUNNING} WHERE day < '2024-01-06' GROUP BY day").fetchall())
    assert "Honaker" in lines["mechanism"]
    assert lines["horizon"].startswith("40 steps")
    assert "once for the whole horizon" in lines["cost"]
    assert "standard deviation" in lines["per-step error"]
    assert lines["sensitivity"].startswith("120 ")  # 40 days x 3 rows per unit
    assert con.budget().epsilon_spent == 0


def test_watch_releases_new_steps_each_tick(events, tmp_path, monkeypatch):
    noon = dt.datetime(2024, 1, 3, 12, tzinfo=dt.UTC)
    times = itertools.chain([noon, noon], itertools.repeat(noon + dt.timedelta(days=3)))
    monkeypatch.setattr(running, "clock", lambda: next(times))
    con = _connect(events, tmp_path)
    ticks = list(con.watch(f"{RUNNING} GROUP BY day", every=0.001, ticks=2))
    assert [[r[0] for r in t.rows] for t in ticks] == [
        [DAY0, DAY0 + dt.timedelta(days=1)],
        [DAY0 + dt.timedelta(days=d) for d in (2, 3, 4)],
    ]
    assert [n for t in ticks for _, n in t.rows] == [
        int(n) for _, n in _truth(events, "2024-01-06")
    ]
    assert con.budget().epsilon_spent == pytest.approx(1e4)


@pytest.mark.parametrize(
    ("sql", "match"),
    [
        (
            "SELECT city, SUM(COUNT(*)) OVER (ORDER BY city) FROM running_events GROUP BY city",
            "no continual stream",
        ),
        (
            "SELECT day, SUM(COUNT(*)) OVER "
            "(ORDER BY day ROWS BETWEEN 6 PRECEDING AND CURRENT ROW) "
            "FROM running_events GROUP BY day",
            "from the start",
        ),
        (f"{RUNNING} WHERE day > '2024-01-03' GROUP BY day", "bounded above"),
        (
            "SELECT day, city, SUM(COUNT(*)) OVER (PARTITION BY city ORDER BY day) "
            "FROM running_events GROUP BY day, city",
            "public domain",
        ),
        ("SELECT day, AVG(amount) OVER (ORDER BY day) FROM running_events", "COUNTs and SUMs"),
        ("SELECT day, uid, COUNT(*) OVER (ORDER BY day) FROM running_events", "select item"),
        ("SELECT COUNT(*) OVER () FROM running_events", "without ORDER BY.*SUM.COUNT.... OVER"),
    ],
)
def test_refusals_say_what_to_write(events, tmp_path, sql, match):
    con = _connect(events, tmp_path)
    with pytest.raises(QueryRefused, match=match):
        con.execute(sql)
    assert con.budget().epsilon_spent == 0


def test_watch_refuses_a_query_without_a_running_total(events, tmp_path):
    con = _connect(events, tmp_path)
    with pytest.raises(dpsql.ProgrammingError, match="running-total"):
        next(con.watch("SELECT shop, COUNT(*) FROM running_events GROUP BY shop", every=1))


def test_factorization_stream_is_exact_at_a_huge_budget_and_charged_as_epsilon_delta(
    events, tmp_path
):
    con = _connect(events, tmp_path, delta=1e-9, mechanism="factorization")
    cur = con.execute(f"{RUNNING} WHERE day < '2024-01-08' GROUP BY day")
    rows, truth = cur.fetchall(), _truth(events, "2024-01-08")
    assert [d for d, _ in rows] == [d for d, _ in truth]
    # 120 rows per unit keep sigma ~0.3 even at epsilon 1e4; counts are rounded
    bound = 5 * cur.accuracy["so_far"].scale + 0.5
    assert [n for _, n in rows] == pytest.approx([int(n) for _, n in truth], abs=bound)
    assert "factorization" in cur.accuracy["so_far"].mechanism
    budget = con.budget()
    assert budget.epsilon_spent == pytest.approx(1e4) and budget.delta_spent == pytest.approx(1e-9)


def test_factorization_releases_have_their_closed_form_variance():
    """The released r_t = h (L (q + z))_t minus the exact running total, over 1500 keys (the
    release path is ExactFactorization's; it replaced the float L z of lattice noise,
    whose privacy was unproven): the bias of q's rounding is below h sqrt(t), 2^-36 of
    sigma, so the sample variance is the closed form's within its sampling error."""
    from dpsql.mechanisms.continual import ExactFactorization, keyed_generator

    counter = ExactFactorization(16, 0.5, 3)
    counter.prepare()
    values = [5, 0, -2, 7, 1, 1, 0, 3, 9, 2, 0, 0, 4, 1, 6, 2]
    truth = np.cumsum(values)
    draws = np.stack(
        [
            counter.extend([], [], counter.noise(keyed_generator(k)), values)[1] - truth
            for k in range(1, 1501)
        ]
    )
    ratio = draws.var(axis=0, ddof=1) / counter.variance()
    assert np.abs(ratio - 1).max() < 5 * math.sqrt(2 / 1500)
    assert abs(draws.mean(axis=0) / np.sqrt(counter.variance())).max() < 5 / math.sqrt(1500)


def test_set_continual_picks_the_mechanism_and_makes_its_own_stream(events, tmp_path):
    con = _connect(events, tmp_path, epsilon=2.0)
    query = f"{RUNNING} WHERE day < '2024-01-06' GROUP BY day"
    assert con.execute("SHOW dpsql.continual").fetchall() == [("policy",)]
    tree = con.execute(query).fetchall()
    con.execute("SET dpsql.continual = 'factorization'")
    lines = dict(con.execute(f"EXPLAIN {query}").fetchall())
    assert "factorization" in lines["mechanism"] and "SET dpsql.continual" in lines["mechanism"]
    assert "once for the whole horizon" in lines["cost"]  # another stream: not paid for yet
    cur = con.execute(query)
    gaussian = cur.fetchall()
    assert "factorization" in cur.accuracy["so_far"].mechanism
    assert [d for d, _ in gaussian] == [d for d, _ in tree] and gaussian != tree
    budget = con.budget()  # charged twice: 2 (tree), then (2, the session's delta 1e-6)
    assert budget.epsilon_spent == pytest.approx(4.0)
    assert budget.delta_spent == pytest.approx(1e-6)
    # a restart with the same setting continues the same stream, for free
    again = dpsql.connect(events, policy=_policy(2.0), ledger=tmp_path / "ledger.sqlite",
                          continual="factorization", seed=9)  # fmt: skip
    assert again.execute(query).fetchall() == gaussian
    again.execute("SET dpsql.continual = 'policy'")
    assert again.execute(query).fetchall() == tree
    assert again.budget().epsilon_spent == pytest.approx(4.0)


def test_set_continual_binary_overrides_a_declared_factorization(events, tmp_path):
    con = _connect(events, tmp_path, epsilon=2.0, delta=1e-9, mechanism="factorization")
    con.execute("SET dpsql.continual = 'binary'")
    lines = dict(con.execute(f"EXPLAIN {RUNNING} GROUP BY day").fetchall())
    assert (
        "Honaker" in lines["mechanism"]
        and "policy's choice for day is factorization" in (lines["mechanism"])
    )
    con.execute(f"{RUNNING} WHERE day < '2024-01-03' GROUP BY day").fetchall()
    assert con.budget().epsilon_spent == pytest.approx(2.0)
    assert con.budget().delta_spent == 0  # pure epsilon


def test_factorization_is_refused_without_delta_with_what_to_do(events, tmp_path):
    policy = _policy(2.0)
    policy["analysts"]["default"]["delta"] = 0.0
    con = dpsql.connect(events, policy=policy, ledger=tmp_path / "ledger.sqlite",
                        continual="factorization")  # fmt: skip
    with pytest.raises(QueryRefused, match=r"budget has no delta.*SET dpsql.continual = 'binary'"):
        con.execute(f"{RUNNING} GROUP BY day")
    con = _connect(events, tmp_path, epsilon=2.0)
    con.execute("SET dpsql.continual = 'factorization'")
    con.execute("SET dpsql.delta = 0")
    with pytest.raises(QueryRefused, match=r"dpsql\.delta is 0.*SET dpsql\.delta = 1e-9"):
        con.execute(f"EXPLAIN {RUNNING} GROUP BY day")
    assert con.budget().epsilon_spent == 0
    with pytest.raises(dpsql.ProgrammingError, match="binary, factorization, policy"):
        con.execute("SET dpsql.continual = 'gaussian'")


def test_steps_wider_than_a_value_are_bucketed_in_sql(events, tmp_path):
    # 1-day steps group by the column itself; 2-day steps compute each row's step
    con = _connect(events, tmp_path, step="2 days")
    rows = con.execute(f"{RUNNING} WHERE day < '2024-01-11' GROUP BY day").fetchall()
    daily = dict(_truth(events, "2024-01-11"))
    assert rows == [
        (DAY0 + dt.timedelta(days=2 * i), int(daily[DAY0 + dt.timedelta(days=2 * i + 1)]))
        for i in range(5)
    ]


def test_watch_command_runs_the_chosen_mechanism(tmp_path, monkeypatch, capsys):
    import yaml

    from dpsql.cli import main

    path = tmp_path / "events.duckdb"
    db = duckdb.connect(str(path))
    db.execute("CREATE TABLE running_events (uid INT, day DATE, shop INT, city INT, amount DOUBLE)")
    _add(db, 0, 200)
    db.close()
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(_policy(1e4)))
    monkeypatch.setattr(running, "clock", lambda: dt.datetime(2024, 1, 3, tzinfo=dt.UTC))
    argv = ["watch", "--database", str(path), "--policy", str(tmp_path / "policy.yaml"),
            "--ledger", str(tmp_path / "ledger.sqlite"), "--every", "1s", "--ticks", "1",
            "--continual", "factorization", f"{RUNNING} GROUP BY day"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2024-01-01" in out and "2024-01-02" in out and "tick: 2 new rows" in out
    con = dpsql.connect(str(path), policy=_policy(1e4), ledger=tmp_path / "ledger.sqlite")
    assert con.budget().delta_spent == pytest.approx(1e-6)  # the factorization's charge


def test_a_noiseless_tree_releases_bounded_totals_not_garbage(events, tmp_path):
    """Sensitivity 2 at epsilon 1e4 rounds the tree's node variance to 0: the release must
    be the exact bounded running count (it once released int64's minimum, a NaN cast)."""
    policy = _policy(1e4)
    table = policy["tables"]["running_events"]
    table["max_groups_per_unit"], table["max_rows_per_unit"] = 2, 1
    con = dpsql.connect(events, policy=policy, ledger=tmp_path / "ledger.sqlite", seed=3)
    rows = con.execute(f"{RUNNING} WHERE day < '2024-01-11' GROUP BY day").fetchall()
    totals = [n for _, n in rows]
    unbounded = [int(n) for _, n in _truth(events, "2024-01-11")]
    assert totals == sorted(totals) and 0 < totals[-1] <= unbounded[-1]
    assert totals[-1] <= 2 * 1000  # 1,000 units, at most 2 days each


def test_a_stream_is_not_capped_by_max_groups(events, tmp_path):
    """A stream's rows are bounded by the policy (horizon x public keys), not by the data:
    a cap checked after the charge would withhold it before its noise key is stored, and
    every rerun would be charged again."""
    con = dpsql.connect(events, policy=_policy(1e4), ledger=tmp_path / "ledger.sqlite",
                        seed=3, max_groups=5)  # fmt: skip
    query = f"{RUNNING} WHERE day < '2024-01-11' GROUP BY day"
    first = con.execute(query).fetchall()
    assert len(first) == 10 and con.execute(query).fetchall() == first
    assert len(con.session.ledger.charges("default")) == 1


def test_two_analysts_in_one_process_get_their_own_streams(events, tmp_path):
    """Streams planned once per process are shared by query, not by analyst: each analyst's
    stream still has its own charge, noise key and released steps."""
    policy = _policy(1.0)
    policy["analysts"]["bob"] = {"epsilon": 10.0, "delta": 1e-5}
    ledger = tmp_path / "ledger.sqlite"
    query = f"{RUNNING} WHERE day < '2024-01-11' GROUP BY day"
    alice = dpsql.connect(events, policy=policy, ledger=ledger, analyst="default")
    bob = dpsql.connect(events, policy=policy, ledger=ledger, analyst="bob")
    mine, theirs = alice.execute(query).fetchall(), bob.execute(query).fetchall()
    assert mine != theirs  # independent noise keys: ten equal noisy totals by chance is negligible
    assert alice.execute(query).fetchall() == mine and bob.execute(query).fetchall() == theirs
    for con in (alice, bob):
        assert con.budget().epsilon_spent == pytest.approx(1.0)


def _row_level_policy(epsilon: float = 1e4) -> dict:
    continual = {"epsilon": epsilon}
    return {
        "version": 1,
        "defaults": {"epsilon_per_query": 1.0, "delta": 1e-6},
        "analysts": {"default": {"epsilon": 1e5, "delta": 1e-5}},
        "tables": {"ticks": {"columns": {
            "day": {"type": "date", "lower": "2024-01-01", "upper": "2024-12-31",
                    "continual": {"step": "1 day", **continual}},
            "week": {"type": "date", "lower": "2024-01-01", "upper": "2024-12-31",
                     "continual": {"step": "7 days", **continual}},
            "seen": {"type": "timestamp", "lower": "2024-01-01", "upper": "2024-01-31",
                   "continual": {"step": "6 hours", **continual}},
            "n": {"type": "int", "lower": -50, "upper": 49, "continual": {"step": 1, **continual}},
            "x": {"type": "float", "lower": 0, "upper": 10,
                  "continual": {"step": 0.5, **continual}},
            "tag": {"type": "string"},
        }}},
    }  # fmt: skip


@pytest.mark.parametrize(
    "dialect", ["duckdb", "postgres", "spark", "snowflake", "bigquery", "tsql"]
)
@pytest.mark.parametrize("order", ["day", "week", "seen", "n", "x"])
def test_a_row_level_step_query_is_its_template_with_the_bounds_written_in(dialect, order):
    """Without ranking, a tick writes its two bounds into the step query built once: the
    text must be the query built afresh with those bounds, in every dialect and type."""
    from dpsql.policy import load_policy
    from dpsql.sql import PlanContext
    from dpsql.sql.plan import Options

    sql = (f"SELECT {order}, SUM(COUNT(*)) OVER (ORDER BY {order}) FROM ticks "
           f"WHERE tag = 'a' GROUP BY {order}")  # fmt: skip
    options = Options(epsilon=1.0, delta=1e-6)
    context = PlanContext(load_policy(_row_level_policy()), options, dialect, seed=11)
    stream = running.plan_running(parse_statement(sql, dialect).tree, context).stream
    domain = stream.domain
    # every step from the start: the released ones are checked
    for done, steps in [(0, 1), (3, 7), (29, 52), (0, domain.horizon)]:
        bounds = [domain.literal(domain.text(domain.label(i))) for i in (0, steps)]
        query = stream._step_query(*bounds, dialect, 11)
        assert stream.step_sql(done, steps, context, 11) == query
    assert stream.templates[dialect] is not None  # the ticks above were written into it


# the text standing for a date-ordered step query's first bound in its template
MARKER = running._DATE_MARKERS[0][0]


def _ticks() -> duckdb.DuckDBPyConnection:
    db = duckdb.connect()
    db.execute(
        "CREATE TABLE ticks (day DATE, week DATE, seen TIMESTAMP, n INT, x DOUBLE, tag TEXT)"
    )
    db.execute(
        "INSERT INTO ticks SELECT DATE '2024-01-01' + (i % 40)::INT, DATE '2024-01-01', "
        "TIMESTAMP '2024-01-01' + to_hours(i % 100), i % 100 - 50, (i % 21) / 2, "
        f"CASE WHEN i % 3 = 0 THEN '{MARKER}' ELSE 'b' END FROM range(3000) t(i)"
    )
    return db


@pytest.mark.parametrize("tag", ["b", MARKER])
def test_row_level_ticks_release_the_exact_running_counts(tmp_path, monkeypatch, tag):
    """Tick after tick over a table without a privacy unit (the step query's template;
    with a marker's text in the analyst's WHERE, the query built afresh)."""
    db = _ticks()
    con = dpsql.connect(db, policy=_row_level_policy(), ledger=tmp_path / "ledger.sqlite")
    query = (f"SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) AS n FROM ticks "
             f"WHERE tag = '{tag}' GROUP BY day")  # fmt: skip
    truth = [n for _, n in _ticks().execute(
        f"SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) FROM ticks WHERE tag = '{tag}' "
        "GROUP BY day ORDER BY day").fetchall()]  # fmt: skip
    released = []
    for day in (5, 6, 17, 40):
        now = dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(days=day)
        monkeypatch.setattr(running, "clock", lambda now=now: now)
        released = con.execute(query).fetchall()
        assert [n for _, n in released] == truth[:day]
    assert [d for d, _ in released] == [DAY0 + dt.timedelta(days=i) for i in range(40)]
    stream = con.session.plan(parse_statement(query, "duckdb").tree).stream
    assert (stream.templates["duckdb"] is None) == (tag == MARKER)


def _day_query(bound: str) -> str:
    return f"SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) FROM ticks WHERE day < '{bound}'"


def test_two_sessions_ticking_at_once_release_the_steps_stored_first(tmp_path, monkeypatch):
    """Ticks built on the same released steps are stored under one name: the ledger keeps
    the first, and the second session answers from it, planned again (two releases of a
    step with one noise would leak the rows that arrived between them, and both stored
    would shift every later step). It is not withheld with an error either: whether two
    ticks' exact values differed told, without noise, whether some unit had more rows
    than it may add, with different values (each tick chose them by a fresh secret)."""
    db = _ticks()
    ledger = tmp_path / "ledger.sqlite"
    first, second = (dpsql.connect(db, policy=_row_level_policy(), ledger=ledger) for _ in "ab")
    monkeypatch.setattr(running, "clock", lambda: dt.datetime(2024, 1, 11, tzinfo=dt.UTC))
    assert len(first.execute(f"{_day_query('2024-02-01')} GROUP BY day").fetchall()) == 10
    now, interleaved = dt.datetime(2024, 2, 1, tzinfo=dt.UTC), []

    def clock() -> dt.datetime:  # read while `first` plans: `second` ticks in between
        if not interleaved:
            interleaved.append(now)  # before ticking: `second` reads the clock too
            interleaved.extend(second.execute(f"{_day_query('2024-01-26')} GROUP BY day"))
        return now

    monkeypatch.setattr(running, "clock", clock)
    racing = first.execute(f"{_day_query('2024-01-21')} GROUP BY day").fetchall()
    assert len(interleaved) == 1 + 25 and racing == interleaved[1:21]
    rows = first.execute(f"{_day_query('2024-02-01')} GROUP BY day").fetchall()
    truth = _ticks().execute(f"{_day_query('2024-02-01')} GROUP BY day ORDER BY day").fetchall()
    assert rows == [(d, int(n)) for d, n in truth]


def test_ticks_stored_by_their_last_step_continue_unless_they_overlap(tmp_path, monkeypatch):
    """Ledgers written before ticks were named by their first step: a chain of ticks
    continues; two ticks built on the same steps stop the stream with what to do. (Each
    tick stores its steps' exact values, which later ticks check.)"""
    monkeypatch.setattr(running, "clock", lambda: dt.datetime(2024, 1, 31, tzinfo=dt.UTC))
    query = f"{_day_query('2024-01-31')} GROUP BY day"
    truth = [int(n) for _, n in _ticks().execute(f"{query} ORDER BY day").fetchall()]
    exact = np.diff([0, *truth]).tolist()
    for ends, valid in [((10, 20), True), ((10, 20, 25), False)]:
        con = dpsql.connect(_ticks(), policy=_row_level_policy(), ledger=tmp_path / f"{valid}")
        plan = con.session.plan(parse_statement(query, "duckdb").tree)
        ledger, start = con.session.ledger, 0
        ledger.store_release("default", f"{plan.prefix}meta", '{"key": 7}')
        for end in ends:
            start = 10 if end == 25 else start  # the overlapping tick was built on 10 steps
            tick = {"released": [truth[start:end]], "exact": [exact[start:end]]}
            ledger.store_release("default", f"{plan.prefix}{end:08d}", json.dumps(tick))
            start = end
        if valid:
            assert [n for _, n in con.execute(query).fetchall()] == truth
        else:
            with pytest.raises(dpsql.IntegrityError, match="do not follow each other"):
                con.execute(query)


class _Stored(dict):
    """The stored-state protocol over a dict, recording what each read returned."""

    def __init__(self, owner: tuple[str, str]):
        super().__init__()
        self.owner, self.reads = owner, []

    def find(self, prefix: str, after: str = "") -> dict[str, str]:
        found = {k: v for k, v in self.items() if k.startswith(prefix) and k > after}
        self.reads.append(sorted(found))
        return found


def test_a_tick_reads_only_the_ticks_stored_since_it_last_decoded(monkeypatch):
    """The values decoded at a tick are kept by ledger, analyst, stream and key: a later
    tick reads and decodes only the ticks stored after them, another ledger all of its own."""
    decoded = []
    loads = running.json.loads
    monkeypatch.setattr(running.json, "loads", lambda text: decoded.append(text) or loads(text))
    prefix = "stream:test-decoded:"
    stored = _Stored(("ledger-a", "default"))
    stored[f"{prefix}meta"] = '{"key": 7}'
    stored[f"{prefix}from00000000"] = "[[1.0, 2.0]]"
    assert running._released(stored, prefix, 7, 1).values.tolist() == [[1.0, 2.0]]
    stored[f"{prefix}from00000002"] = "[[3.0]]"
    assert running._released(stored, prefix, 7, 1).values.tolist() == [[1.0, 2.0, 3.0]]
    assert running._released(stored, prefix, 7, 1).values.tolist() == [[1.0, 2.0, 3.0]]
    assert decoded == ["[[1.0, 2.0]]", "[[3.0]]"]
    assert stored.reads == [
        [f"{prefix}from00000000", f"{prefix}meta"],
        [f"{prefix}from00000002", f"{prefix}meta"],
        [f"{prefix}meta"],
    ]
    other = _Stored(("ledger-b", "default"))  # the same stream and key in another ledger
    other[f"{prefix}from00000000"] = "[[9.0]]"
    assert running._released(other, prefix, 7, 1).values.tolist() == [[9.0]]
    assert decoded[-1] == "[[9.0]]"


@pytest.mark.parametrize(("order", "bound"), [("n", 10), ("x", 7.5)])
def test_int_and_float_streams_release_the_exact_running_counts(tmp_path, order, bound):
    """Numeric bounds written into the step query (negative ints; float steps of 0.5,
    computed per row in SQL) count exactly the rows of each step."""
    db = _ticks()
    con = dpsql.connect(db, policy=_row_level_policy(), ledger=tmp_path / "ledger.sqlite")
    query = (
        f"SELECT {order}, SUM(COUNT(*)) OVER (ORDER BY {order}) FROM ticks WHERE {order} < {bound}"
    )
    truth = db.execute(f"{query} GROUP BY {order} ORDER BY {order}").fetchall()
    assert con.execute(f"{query} GROUP BY {order}").fetchall() == [(k, int(n)) for k, n in truth]


def test_a_stream_is_planned_again_for_any_other_tree():
    """Planned streams are kept by the parsed tree's exact image: a repeat finds its plan;
    another case of a string or quoted name, or a string for a number, does not."""
    base = "SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) FROM ticks WHERE tag = 'a' GROUP BY day"
    others = [base.replace("'a'", "'A'"), base.replace("tag", '"Tag"', 1),
              base.replace("tag = 'a'", "n = 5"), base.replace("tag = 'a'", "n = '5'"),
              base.replace("WHERE tag = 'a' ", "")]  # fmt: skip
    keys = [running._tree_key(parse_statement(sql, "duckdb").tree) for sql in [base, *others]]
    assert running._tree_key(parse_statement(base, "duckdb").tree) == keys[0]
    assert len(set(keys)) == len(keys)


def test_a_stream_planned_for_a_budget_with_delta_is_refused_to_one_without(events, tmp_path):
    """Streams planned once per process are kept by whether the budget has a delta: a
    factorization planned for one analyst is still refused to an analyst without delta."""
    policy = _policy(2.0)
    policy["analysts"]["nodelta"] = {"epsilon": 10.0, "delta": 0.0}
    ledger, query = tmp_path / "ledger.sqlite", f"{RUNNING} WHERE day < '2024-01-11' GROUP BY day"
    first = dpsql.connect(events, policy=policy, ledger=ledger, continual="factorization")
    assert len(first.execute(query).fetchall()) == 10
    other = dpsql.connect(events, policy=policy, ledger=ledger, analyst="nodelta",
                          continual="factorization")  # fmt: skip
    with pytest.raises(QueryRefused, match="budget has no delta"):
        other.execute(query)


def test_a_running_sum_on_another_grid_is_another_stream(events, tmp_path, monkeypatch):
    """Released totals are stored in whole grid steps: read under another step (a dpsql
    whose grid differs, as this session's cap on steps per row made it at large
    epsilons) they would be misread and continued wrongly, so the step is part of
    the stream's identity. A running COUNT has no grid and keeps its identity."""
    from dpsql.sql import running
    from dpsql.sql.parse import parse_statement

    session = _connect(events, tmp_path).session
    queries = {
        "sum": "SELECT day, SUM(SUM(amount)) OVER (ORDER BY day) FROM running_events "
        "WHERE day < '2024-01-05' GROUP BY day",
        "count": f"{RUNNING} WHERE day < '2024-01-05' GROUP BY day",
    }

    def identities() -> dict[str, str]:
        return {
            kind: session.plan(parse_statement(sql, "duckdb").tree).stream.identity
            for kind, sql in queries.items()
        }

    before = identities()
    original = running.sum_grid

    def coarser(*args):
        grid, steps = original(*args)
        return running.SumGrid(grid.step * 2, grid.bounds), max(1, steps // 2)

    monkeypatch.setattr(running, "sum_grid", coarser)
    # planned afresh, not from the process's cache of planned streams
    monkeypatch.setattr(running, "_planned", running.WeightedLru(running._PLANNED_STREAMS))
    after = identities()
    assert after["sum"] != before["sum"] and after["count"] == before["count"]


def test_a_factorization_sum_keeps_its_epsilons_grid_unless_coarser_than_a_row_and_sigma():
    """A running SUM's step is sum_grid's from epsilon (about Laplace's scale / 2^20), bit
    for bit, except for a factorization where that step is coarser than both a row's
    bound and its sigma / 2^20 (epsilon about delta or below): there it is sigma's. At
    epsilon 1e-300 it was 2^986, and the releases 1e308 or inf."""
    from dpsql.accounting import zcdp_rho
    from dpsql.mechanisms.continual import column_norm_squared
    from dpsql.sql.intervals import Interval
    from dpsql.sql.plan import sum_grid

    bounds, rows, horizon = Interval(0.0, 10.0), 120, 40
    for epsilon, delta in [(1e4, 1e-9), (1.0, 1e-9), (1e-4, 1e-9), (0.1, 1e-6), (1e-3, 0.5)]:
        rho = zcdp_rho(epsilon, delta)
        kept = sum_grid(bounds, rows, 1, epsilon)
        assert running._sum_grid(bounds, rows, epsilon, rho, horizon) == kept
        assert running._sum_grid(bounds, rows, epsilon, None, horizon) == kept  # the tree's
    assert sum_grid(bounds, rows, 1, 1e-300)[0].step == 2.0**986
    rho = zcdp_rho(1e-300, 1e-9)
    grid, steps = running._sum_grid(bounds, rows, 1e-300, rho, horizon)
    sigma = rows * 10 * math.sqrt(column_norm_squared(horizon) / (2 * rho))
    assert sigma / 2**21 < grid.step <= sigma / 2**20 and steps == rows


def test_a_stream_whose_unit_the_database_came_to_keep_unique_is_another_stream():
    """The sensitivity is part of the stream's identity: with a unique unit a unit moves
    the stream by 1, not 40 x 3, and one noise key drawn at either scale would be the
    noise of neither (found by an audit)."""
    from dpsql.policy import load_policy
    from dpsql.sql import PlanContext
    from dpsql.sql.plan import Options

    sql = f"{RUNNING} WHERE day < '2024-01-05' GROUP BY day"
    streams = [
        running.plan_running(
            parse_statement(sql, "duckdb").tree,
            PlanContext(load_policy(_policy(1.0)), Options(epsilon=1.0, delta=1e-6), "duckdb",
                        seed=11, unique_units=unique),
        ).stream
        for unique in (frozenset(), frozenset({"running_events"}))
    ]  # fmt: skip
    assert [stream.sensitivity for stream in streams] == [120, 1]
    assert streams[0].identity != streams[1].identity


def test_a_factorization_sum_hides_its_exact_totals_low_bits(events, tmp_path):
    """z was drawn on a lattice of 2^-20 sigma, 8 grid steps for a running SUM: the first
    total was S_1 + z_1, so every release kept S_1 modulo 8 steps, whatever the key
    (found by an audit). On a lattice of 2^-10 steps or finer, it varies with the key."""
    query = ("SELECT day, SUM(SUM(amount)) OVER (ORDER BY day) FROM running_events "
             "WHERE day < '2024-01-05' GROUP BY day")  # fmt: skip
    residues = set()
    for seed in range(6):
        con = dpsql.connect(events, policy=_policy(1.0), ledger=tmp_path / f"{seed}.sqlite",
                            continual="factorization", seed=seed)  # fmt: skip
        step = con.session.plan(parse_statement(query, "duckdb").tree).stream.grid.step
        first = con.execute(query).fetchall()[0][1]
        residues.add(first / step % 8)  # S_1 + z_1 in grid steps: z_1 took 2 values mod 8
    assert len(residues) > 2, residues


def _fresh_process(monkeypatch) -> None:
    """Empty the process's caches of planned streams, noise and decoded ticks: what a
    restarted process starts with."""
    monkeypatch.setattr(running, "_planned", running.WeightedLru(running._PLANNED_STREAMS))
    monkeypatch.setattr(running, "_noises", running.WeightedLru(running._NOISE_VALUES))
    monkeypatch.setattr(running, "_decoded", running.WeightedLru(running._RELEASED_VALUES))


def test_a_restarted_factorization_stream_continues_as_one_tick_would(
    events, tmp_path, monkeypatch
):
    """The factorization's later steps need every earlier step's exact value and q, which
    each tick stores with its releases: a stream ticked in three processes releases what
    one tick over all its steps releases under the same key (up to float rounding of the
    post-processing), and its stored past releases never change."""
    query = "SELECT day, SUM(SUM(amount)) OVER (ORDER BY day) AS s FROM running_events "

    def run(ledger: str, bound: str) -> list[tuple]:
        con = dpsql.connect(events, policy=_policy(1.0, history="mutable"), seed=5,
                            ledger=tmp_path / ledger, continual="factorization")  # fmt: skip
        return con.execute(f"{query} WHERE day < '{bound}' GROUP BY day").fetchall()

    whole = run("one.sqlite", "2024-01-15")
    first = run("three.sqlite", "2024-01-04")
    _fresh_process(monkeypatch)
    second = run("three.sqlite", "2024-01-05")
    _fresh_process(monkeypatch)
    _add(events, 5000, 5100, day=1)  # late rows for a released step: ignored
    third = run("three.sqlite", "2024-01-15")
    assert second[:3] == first and third[:4] == second and len(third) == 14
    assert [d for d, _ in third] == [d for d, _ in whole]
    assert [v for _, v in third] == pytest.approx([v for _, v in whole], rel=1e-12)
    assert [v for _, v in third] != [v for _, v in _truth_sums(events, "2024-01-15")]


def _truth_sums(db, bound: str) -> list[tuple]:
    return db.execute(
        f"SELECT day, SUM(SUM(amount)) OVER (ORDER BY day) FROM running_events "
        f"WHERE day < DATE '{bound}' GROUP BY day ORDER BY day"
    ).fetchall()


def test_a_factorization_stream_longer_than_exact_arithmetic_affords_is_refused_uncharged(
    events, tmp_path
):
    """The factorization is computed exactly over at most 2^16 steps: a longer stream is
    refused before its charge, saying to use the binary tree or a coarser step; the
    binary tree keeps it."""
    policy = _policy(1.0, delta=1e-9, mechanism="factorization")
    policy["tables"]["running_events"]["columns"]["day"]["upper"] = "2204-01-01"
    con = dpsql.connect(events, policy=policy, ledger=tmp_path / "ledger.sqlite", seed=3)
    query = f"{RUNNING} WHERE day < '2024-01-05' GROUP BY day"
    with pytest.raises(QueryRefused, match="binary") as refused:
        con.execute(query)
    assert "65,536" in str(refused.value) and "coarser" in str(refused.value)
    assert con.budget().epsilon_spent == 0
    con.execute("SET dpsql.continual = 'binary'")
    assert len(con.execute(query).fetchall()) == 4


def test_a_stream_whose_noise_is_drawn_otherwise_is_not_continued(events, tmp_path, monkeypatch):
    """On a later tick the last released step's stored q, with z drawn again from the
    key, must give back its stored release: a sampler or platform that drew other noise
    would add a second noise to q already released (found reviewing the exact
    factorization)."""
    con = _connect(events, tmp_path, epsilon=2.0, delta=1e-9, mechanism="factorization")
    con.execute(f"{RUNNING} WHERE day < '2024-01-06' GROUP BY day").fetchall()
    monkeypatch.setattr(running, "_noises", running.WeightedLru(running._NOISE_VALUES))
    monkeypatch.setattr(
        running.ExactFactorization, "noise", lambda self, rng: np.zeros(self.horizon, np.int64)
    )
    with pytest.raises(dpsql.IntegrityError, match="drawn again"):
        con.execute(f"{RUNNING} WHERE day < '2024-01-08' GROUP BY day").fetchall()


def test_a_factorization_streams_identity_is_versioned_and_the_trees_is_not(monkeypatch):
    """A factorization stream stored by the earlier noise path (float L z of lattice noise)
    is not continued by the exact one: what its identity hashes carries a version, and
    the tree's (whose streams go on) does not."""
    from dpsql.policy import load_policy
    from dpsql.sql import PlanContext
    from dpsql.sql.plan import Options

    hashed = []
    sha256 = running.hashlib.sha256
    monkeypatch.setattr(running.hashlib, "sha256", lambda data: hashed.append(data) or sha256(data))
    sql = f"{RUNNING} WHERE day < '2024-01-05' GROUP BY day"
    for mechanism in ("binary", "factorization"):
        stream = running.plan_running(
            parse_statement(sql, "duckdb").tree,
            PlanContext(load_policy(_policy(1.0)), Options(epsilon=1.0, delta=1e-6,
                        continual=mechanism), "duckdb", seed=11),
        ).stream  # fmt: skip
        assert isinstance(stream.counter, running.ExactFactorization) == (
            mechanism == "factorization"
        )
    identities = [data for data in hashed if data.startswith(b'["running_events"')]
    tree, factorization = (running.json.loads(data) for data in identities)
    # the version, and the noise's parameters: z drawn at another variance or lattice
    # would be other noise beside the q already released
    counter = stream.counter
    assert factorization[-4:] == [
        "factorization: exact, lattice-rounded", str(counter.sigma2), counter.exponent,
        running.PRECISION_BITS,
    ]  # fmt: skip
    assert len(tree) == len(factorization) - 4 and tree[-1] != factorization[-1]
