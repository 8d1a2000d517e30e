"""Running totals over sources whose history changes: detected by default, bounded by a
record of each unit's use under `history: mutable` (docs/continual.md).

The audit's shapes, on DuckDB and PostgreSQL: a `last_seen` day moved forward each tick,
a retention job deleting released days, a backdated insert, a row moved between units.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import pytest
from conftest import postgres_tables

import dpsql
from dpsql.errors import PolicyError, QueryRefused
from dpsql.policy import load_policy
from dpsql.sql import running

DAY0 = dt.date(2024, 1, 1)
MAX_GROUPS = 3  # max_rows_per_unit 1: one unit moves the whole stream by at most 3
QUERY = "SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) AS n FROM visits GROUP BY day"
TICKS = range(5, 13)  # the clock's days: the first tick releases 5 steps, each later one 1
TARGET = 0  # the unit whose rows change


def _policy(history: str | None = None) -> dict:
    continual: dict[str, Any] = {"step": "1 day", "epsilon": 1e4}  # noise ~1e-3: exact
    if history is not None:
        continual["history"] = history
    return {
        "version": 1,
        "defaults": {"epsilon_per_query": 1.0, "delta": 1e-6},
        "analysts": {"default": {"epsilon": 1e5, "delta": 1e-5}},
        "tables": {"visits": {
            "privacy_unit": "uid", "max_groups_per_unit": MAX_GROUPS, "max_rows_per_unit": 1,
            "columns": {
                "uid": {"type": "int", "private": True},
                "day": {"type": "date", "lower": "2024-01-01", "upper": "2024-01-30",
                        "continual": continual},
            }}},
    }  # fmt: skip


def _others() -> list[tuple[int, dt.date]]:
    """Units 1..199, each on two days (one, when both are the same) of 30."""
    days = {(i, (i * k) % 30) for i in range(1, 200) for k in (1, 7)}
    return [(i, DAY0 + dt.timedelta(days=d)) for i, d in sorted(days)]


def _days(*days: int) -> list[tuple[int, dt.date]]:
    return [(TARGET, DAY0 + dt.timedelta(days=d)) for d in days]


def _day(c: int) -> str:
    return f"DATE '2024-01-01' + {c}"


# shape: (the target's rows, the change before the tick at clock day c, the first step it
# changes before the fourth tick, c = 8). The first three let a stream without a record
# count the target once a tick.
SHAPES: dict[str, tuple[list, Callable[[int], str], int]] = {
    "last_seen moved forward": (
        _days(4), lambda c: f"UPDATE visits SET day = day + 1 WHERE uid = {TARGET}", 4),
    "retention deletes released days": (
        _days(*range(30)), lambda c: f"DELETE FROM visits WHERE day < {_day(c - 3)}", 0),
    # the earliest of the target's released rows given to another unit: every released
    # step keeps its total (the other unit counts the row), only its digest tells
    "row moved between units": (
        _days(0, 1, 2, *range(9, 30)),
        lambda c: f"UPDATE visits SET uid = {1000 + c} WHERE uid = {TARGET} AND day = "
                  f"(SELECT MIN(day) FROM visits WHERE uid = {TARGET}) AND day < {_day(c - 1)}",
        0),
    "backdated insert": (
        _days(*range(8, 30)), lambda c: f"INSERT INTO visits VALUES ({TARGET}, {_day(c - 6)})", 2),
}  # fmt: skip


@pytest.fixture(params=["duckdb", "postgres"])
def backend(request: pytest.FixtureRequest) -> Callable:
    """Opens a `visits` table holding some rows: (what dpsql connects to, run SQL)."""
    if request.param == "duckdb":

        @contextlib.contextmanager
        def duck(rows: list[tuple]) -> Iterator[tuple[Any, Callable[[str], Any]]]:
            db = duckdb.connect()
            db.execute("CREATE TABLE visits (uid INT, day DATE)")
            db.executemany("INSERT INTO visits VALUES (?, ?)", rows)
            yield db, lambda sql: db.execute(sql).fetchall()

        return duck
    url = request.getfixturevalue("postgres_url")
    import psycopg

    @contextlib.contextmanager
    def postgres(rows: list[tuple]) -> Iterator[tuple[Any, Callable[[str], Any]]]:
        with (
            postgres_tables(url, {"visits (uid INT, day DATE)": rows}) as database,
            psycopg.connect(database, autocommit=True) as raw,
        ):

            def run(sql: str) -> Any:
                cursor = raw.execute(sql)
                return cursor.fetchall() if cursor.description else None

            yield database, run

    return postgres


def _at(monkeypatch: pytest.MonkeyPatch, c: int) -> None:
    now = dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(days=c)
    monkeypatch.setattr(running, "clock", lambda: now)


def _new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget the stream's ticks decoded in this process, as a new process starts."""
    monkeypatch.setattr(running, "_decoded", running.WeightedLru(running._RELEASED_VALUES))


def _connect(database: Any, tmp_path, history: str | None, name: str = "ledger"):
    return dpsql.connect(
        database, policy=_policy(history), ledger=tmp_path / f"{name}.sqlite", seed=3
    )


@pytest.mark.parametrize("shape", SHAPES)
def test_a_changed_history_ends_the_stream_at_the_next_tick(backend, tmp_path, monkeypatch, shape):
    """Each change touches the steps released before: the next tick ends the stream, charges
    nothing more, says what to do and nothing of which step changed; the data owner finds
    that in the ledger; and the stream stays ended, also once the change is undone or in a
    new process."""
    rows, change, first_changed = SHAPES[shape]
    with backend(_others() + rows) as (database, run):
        con = _connect(database, tmp_path, None)
        for c in TICKS[:3]:  # ticks over an unchanged history go on
            _at(monkeypatch, c)
            assert len(con.execute(QUERY).fetchall()) == c
        run(change(TICKS[3]))
        _at(monkeypatch, TICKS[3])
        with pytest.raises(dpsql.IntegrityError, match="has ended") as ended:
            con.execute(QUERY)
        message = str(ended.value)
        assert "history: mutable" in message and "data_version" in message
        assert "2024" not in message  # no step named
        assert con.budget().epsilon_spent == pytest.approx(1e4)
        stored = con.session.ledger.stored_releases("default", running.STATE_PREFIX)
        (record,) = [json.loads(v) for k, v in stored.items() if k.endswith(running._ENDED)]
        assert record["first_changed_step"] == first_changed
        assert record["released_steps"] == TICKS[2]
        run("DELETE FROM visits")  # whatever the table holds now, nothing is read
        run("INSERT INTO visits VALUES (1, DATE '2024-01-01')")
        for again in (con, _connect(database, tmp_path, None)):
            _new_process(monkeypatch)
            with pytest.raises(dpsql.IntegrityError, match="has ended"):
                again.execute(QUERY)
        assert con.budget().epsilon_spent == pytest.approx(1e4)


def _steps(released: list[tuple]) -> np.ndarray:
    """The per-step values under released running totals."""
    return np.diff([0, *[n for _, n in released]])


def _naive(run: Callable[[str], Any], done: int, c: int) -> dict[int, int]:
    """The new steps' totals a stream without a record or a check counts: each unit's
    earliest steps in the table as it is now (dpsql before the check)."""
    rows = run(
        "SELECT day, COUNT(*) FROM (SELECT day, DENSE_RANK() OVER (PARTITION BY uid "
        "ORDER BY day) AS g FROM (SELECT DISTINCT uid, day FROM visits) s) r "
        f"WHERE g <= {MAX_GROUPS} AND day >= {_day(done)} AND day < {_day(c)} GROUP BY day"
    )
    return {(day - DAY0).days: n for day, n in rows}


def _ticked(backend, tmp_path, monkeypatch, rows, change, history, name):
    """The steps released by a stream ticked at each of TICKS, `change` run before each
    tick but the first, and the steps a stream without a record would have counted."""
    with backend(rows) as (database, run):
        con = _connect(database, tmp_path, history, name)
        naive, released, done = np.zeros(TICKS[-1], dtype=np.int64), [], 0
        for i, c in enumerate(TICKS):
            if i:
                run(change(c))
            for step, n in _naive(run, done, c).items():
                naive[step] = n
            _at(monkeypatch, c)
            released = con.execute(QUERY).fetchall()
            done = c
        assert [d for d, _ in released] == [DAY0 + dt.timedelta(days=i) for i in range(done)]
        return _steps(released), naive, con


@pytest.mark.parametrize("shape", SHAPES)
def test_under_a_mutable_history_a_unit_moves_the_stream_by_its_sensitivity_at_most(
    backend, tmp_path, monkeypatch, shape
):
    """Neighbouring databases (with and without the target's rows) under the same schedule
    of changes: the released steps differ by at most max_groups * max_rows over all ticks,
    where a stream without the record lets the first three shapes' target count again at
    every tick. (Equal seeds: both streams draw the same noise.)"""
    rows, change, _ = SHAPES[shape]
    with_unit, naive, con = _ticked(
        backend, tmp_path, monkeypatch, _others() + rows, change, "mutable", "with"
    )
    without, naive_without, _ = _ticked(
        backend, tmp_path, monkeypatch, _others(), change, "mutable", "without"
    )
    moved = int(np.abs(with_unit - without).sum())
    assert moved <= MAX_GROUPS
    naive_moved = int(np.abs(naive - naive_without).sum())
    if shape == "backdated insert":  # moving a unit's groups earlier frees none
        assert naive_moved <= MAX_GROUPS
    else:  # the audit's finding: counted again at each tick
        assert naive_moved > MAX_GROUPS
    if shape == "last_seen moved forward":  # its one row is counted on 3 days, then never
        assert moved == MAX_GROUPS
        assert np.array_equal((with_unit - without)[4:7], [1, 1, 1])
    assert con.budget().epsilon_spent == pytest.approx(1e4)


def test_the_record_holds_keyed_hashes_of_units_and_what_each_used(tmp_path, monkeypatch):
    """What a mutable stream stores of a unit: the first 8 bytes of HMAC-SHA256 of the unit
    under the stream's own secret (kept in its meta, drawn from the OS), and the groups it
    used; no raw identifier, and the record is read back by a new process."""
    rows, change, _ = SHAPES["last_seen moved forward"]
    db = duckdb.connect()
    db.execute("CREATE TABLE visits (uid INT, day DATE)")
    db.executemany("INSERT INTO visits VALUES (?, ?)", _others() + rows)
    con = _connect(db, tmp_path, "mutable")
    for i, c in enumerate(TICKS[:4]):
        if i:
            db.execute(change(c))
        _at(monkeypatch, c)
        con.execute(QUERY).fetchall()
    ledger = con.session.ledger
    stored = ledger.stored_releases("default", running.STATE_PREFIX)
    ((name, meta),) = [(k, json.loads(v)) for k, v in stored.items() if k.endswith(":meta")]
    secret = bytes.fromhex(meta["units"])
    assert len(secret) == 32
    _new_process(monkeypatch)
    past = running._released(_State(ledger), name.removesuffix("meta"), meta["key"], 1)
    target = running._unit_key(secret, TARGET)
    assert past.record.used(np.array([target])).tolist() == [MAX_GROUPS]
    # every unit with a row on the 8 days released, the target too
    units = {i for i, day in _others() if (day - DAY0).days < TICKS[3]} | {TARGET}
    assert sorted(past.record.keys.tolist()) == sorted(running._unit_key(secret, u) for u in units)
    assert past.record.keys.tolist() == sorted(past.record.keys.tolist())


@dataclass
class _State:
    """The analyst's stored state, read as a planner reads it."""

    ledger: Any

    @property
    def owner(self) -> tuple[str, str]:
        return (self.ledger.location, "default")

    def find(self, prefix: str, after: str = "") -> dict[str, str]:
        return self.ledger.stored_releases("default", prefix, after=after)


def test_a_record_adds_each_ticks_groups_to_the_units_seen_before():
    base = running._Record(np.array([-5, 3, 9]), np.array([1, 2, 3]))
    later = base.plus(running._Record(np.array([-7, 3, 10]), np.array([1, 1, 2])))
    assert later.keys.tolist() == [-7, -5, 3, 9, 10]
    assert later.groups.tolist() == [1, 1, 3, 3, 2]
    assert later.used(np.array([3, 4, -7, 10, 11])).tolist() == [3, 0, 1, 2, 0]
    assert base.groups.tolist() == [1, 2, 3]  # shared with other ticks: never changed
    assert running._NO_UNITS.used(np.array([1])).tolist() == [0]


def test_history_is_checked_by_the_policy_and_mutable_needs_a_unit(tmp_path):
    policy = _policy("sometimes")
    with pytest.raises(PolicyError, match="append-only, mutable"):
        load_policy(policy)
    row_level = _policy("mutable")
    for key in ("privacy_unit", "max_groups_per_unit", "max_rows_per_unit"):
        del row_level["tables"]["visits"][key]
    db = duckdb.connect()
    db.execute("CREATE TABLE visits (uid INT, day DATE)")
    con = dpsql.connect(db, policy=row_level, ledger=tmp_path / "l.sqlite")
    with pytest.raises(QueryRefused, match="privacy_unit") as refused:
        con.execute(QUERY)
    assert "history: mutable" in str(refused.value)
    assert con.budget().epsilon_spent == 0


@pytest.mark.parametrize(
    "query",
    [
        "SELECT day, shop, SUM(COUNT(*)) OVER (PARTITION BY shop ORDER BY day) AS n "
        "FROM visits GROUP BY day, shop",
        "SELECT day, SUM(SUM(amount)) OVER (ORDER BY day) AS s FROM visits GROUP BY day",
    ],
)
def test_over_an_unchanged_source_both_rules_release_the_same_totals(tmp_path, monkeypatch, query):
    """Each unit's earliest groups (steps, then partitions) up to max_groups_per_unit: by
    ranking every step from the start, or by the record, tick after tick; the same."""
    policy = {**_policy(), "tables": {"visits": {
        "privacy_unit": "uid", "max_groups_per_unit": 4, "max_rows_per_unit": 2,
        "columns": {
            "uid": {"type": "int", "private": True},
            "day": _policy()["tables"]["visits"]["columns"]["day"],
            "shop": {"type": "int", "values": [0, 1, 2]},
            "amount": {"type": "float", "lower": 0, "upper": 10},
        }}}}  # fmt: skip
    db = duckdb.connect()
    db.execute("CREATE TABLE visits (uid INT, day DATE, shop INT, amount DOUBLE)")
    # 300 units, rows on up to 9 (day, shop) groups each, at most 2 rows a group
    db.execute("INSERT INTO visits SELECT i % 300, DATE '2024-01-01' + ((i * 13) % 23)::INT, "
               "(i // 300) % 3, (i % 7) * 1.5 FROM range(2400) t(i)")  # fmt: skip
    released = {}
    for history in ("append-only", "mutable"):
        mutable = json.loads(json.dumps(policy))
        mutable["tables"]["visits"]["columns"]["day"]["continual"]["history"] = history
        con = dpsql.connect(db, policy=mutable, ledger=tmp_path / f"{history}.sqlite", seed=3)
        for c in (3, 7, 8, 15, 23):
            _at(monkeypatch, c)
            released[history] = con.execute(query).fetchall()
    assert released["mutable"] == released["append-only"]
    assert len(released["mutable"]) == 23 * (3 if "shop" in query else 1)


@pytest.mark.parametrize("history", ["append-only", "mutable"])
def test_explain_shows_neither_the_streams_secret_nor_its_record(tmp_path, monkeypatch, history):
    """EXPLAIN of a stream ticked before: its SQL carries a secret no release uses (the
    stream's keys which rows count and the digest; a writer who knew it could aim a change
    at the digest), and what it says of the history is the same whatever the data."""
    shown = []
    for units in (50, 150):
        db = duckdb.connect()
        db.execute("CREATE TABLE visits (uid INT, day DATE)")
        db.executemany("INSERT INTO visits VALUES (?, ?)", _others()[: 2 * units])
        con = _connect(db, tmp_path, history, name=f"{history}{units}")
        _at(monkeypatch, 5)
        con.execute(QUERY).fetchall()
        _at(monkeypatch, 9)
        explained = dict(con.execute(f"EXPLAIN {QUERY}").fetchall())
        stored = con.session.ledger.stored_releases("default", running.STATE_PREFIX)
        (meta,) = [json.loads(v) for k, v in stored.items() if k.endswith(":meta")]
        for secret in (meta["rows"], meta["rows"] + 1, meta["rows"] + 2):
            assert str(secret) not in explained["sql"]
        shown.append(explained["history"])
    assert shown[0] == shown[1]


@pytest.mark.parametrize(
    ("unit", "query", "change"),
    [  # a row-level stream (totals only: no unit to digest) and a running SUM
        (False, QUERY, "UPDATE visits SET day = DATE '2024-01-06' WHERE uid = 1 AND "
                       "day = DATE '2024-01-02'"),
        (True, QUERY.replace("COUNT(*)", "SUM(amount)"),
         "UPDATE visits SET amount = amount + 1 WHERE uid = 1"),
    ],
)  # fmt: skip
def test_a_row_level_count_and_a_running_sum_end_on_a_changed_history(
    tmp_path, monkeypatch, unit, query, change
):
    policy = _policy()
    table = policy["tables"]["visits"]
    table["columns"]["amount"] = {"type": "float", "lower": 0, "upper": 10}
    if not unit:
        for key in ("privacy_unit", "max_groups_per_unit", "max_rows_per_unit"):
            del table[key]
        table["columns"]["uid"] = {"type": "int"}
    db = duckdb.connect()
    db.execute("CREATE TABLE visits (uid INT, day DATE, amount DOUBLE)")
    db.executemany("INSERT INTO visits VALUES (?, ?, ?)", [(i, d, 2.0) for i, d in _others()])
    con = dpsql.connect(db, policy=policy, ledger=tmp_path / "l.sqlite", seed=3)
    _at(monkeypatch, 5)
    assert len(con.execute(query).fetchall()) == 5
    db.execute(change)  # unit 1's rows: day 1, released, and day 7
    _at(monkeypatch, 6)
    with pytest.raises(dpsql.IntegrityError, match="has ended"):
        con.execute(query)
