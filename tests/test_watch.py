"""`dpsql watch` and Session.watch: how many ticks and how often, checked before anything runs.

`--ticks` is a whole number of at least 1 (0 would print nothing; leaving it out
watches until stopped) and `--every` a positive interval of at most 365 days, both
refused by the parser with a line saying what to write; `watch(ticks=...)` takes None
or a whole number of at least 0 (0: no tick), and a bad `ticks` or `every` is a
ProgrammingError at the call, before a query runs or is charged.
"""

from __future__ import annotations

import datetime as dt
import math

import duckdb
import pytest

import dpsql
from dpsql.cli import main
from dpsql.sql import running

RUNNING = "SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) AS so_far FROM events GROUP BY day"
POLICY = {
    "version": 1,
    "defaults": {"epsilon_per_query": 1.0, "delta": 1e-6},
    "analysts": {"default": {"epsilon": 100.0, "delta": 1e-5}},
    "tables": {"events": {"columns": {
        "day": {"type": "date", "lower": "2024-01-01", "upper": "2024-01-31",
                "continual": {"step": "1 day", "epsilon": 1.0}},
    }}},
}  # fmt: skip


@pytest.fixture
def con(tmp_path, monkeypatch):
    monkeypatch.setattr(running, "clock", lambda: dt.datetime(2024, 1, 4, tzinfo=dt.UTC))
    db = duckdb.connect()
    db.execute("CREATE TABLE events AS SELECT DATE '2024-01-01' + (i % 5)::INT AS day "
               "FROM range(100) t(i)")  # fmt: skip
    connection = dpsql.connect(db, policy=POLICY, ledger=tmp_path / "ledger.sqlite", seed=1)
    yield connection
    connection.close()


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        (
            "--ticks",
            "-1",
            "argument --ticks: must be at least 1, got -1 (leave --ticks out to "
            "watch until stopped)",
        ),
        ("--ticks", "0", "argument --ticks: must be at least 1, got 0 (leave --ticks out"),
        ("--ticks", "two", "argument --ticks: expected a whole number, got 'two'"),
        ("--ticks", "1.5", "argument --ticks: expected a whole number, got '1.5'"),
        ("--every", "0.5x", "argument --every: takes an interval like 30s, 15m, 1h or 1d"),
        ("--every=-1h", None, "argument --every: takes an interval like 30s, 15m, 1h or 1d"),
        ("--every", "0s", "argument --every: takes an interval like 30s, 15m, 1h or 1d"),
        ("--every", "soon", "got 'soon'"),
        ("--every", "366d", "(more than 0, at most 365d), got '366d'"),
        ("--every", "99999999999d", "at most 365d"),
    ],
)
def test_the_command_line_refuses_a_bad_tick_count_or_interval(option, value, says, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["watch", "--demo", *([option] if value is None else [option, value]), RUNNING])
    assert exit.value.code == 2  # argparse's: nothing was opened, run or charged
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("dpsql watch: error: ") and says in error


def test_the_command_line_reads_every_as_seconds():
    from dpsql.cli import _parser

    args = _parser().parse_args(["watch", "--demo", "--every", "15m", "--ticks", "3", RUNNING])
    assert (args.every, args.ticks) == (900.0, 3)
    assert _parser().parse_args(["watch", "--demo", RUNNING]).every == 3600.0  # the default, 1h


@pytest.mark.parametrize("ticks", [-1, -100, 1.5, "2", True])
def test_watch_refuses_a_bad_tick_count_at_the_call(con, ticks):
    with pytest.raises(dpsql.ProgrammingError, match=r"ticks.*whole number.*at least 0"):
        con.watch(RUNNING, every=1, ticks=ticks)
    assert con.budget().epsilon_spent == 0


@pytest.mark.parametrize("every", [0, -1, math.nan, math.inf, 1e12, "1h", None])
def test_watch_refuses_a_bad_interval_at_the_call(con, every):
    with pytest.raises(dpsql.ProgrammingError, match="interval of more than 0"):
        con.watch(RUNNING, every=every, ticks=1)
    assert con.budget().epsilon_spent == 0


def test_zero_ticks_run_nothing_and_charge_nothing(con):
    assert list(con.watch(RUNNING, every=1, ticks=0)) == []
    assert con.budget().epsilon_spent == 0
    slept = []
    ticks = list(con.session.watch(RUNNING, every=60, ticks=2, sleep=slept.append))
    assert [len(t.rows) for t in ticks] == [3, 0] and slept == [60]  # Jan 1-3 are complete
    assert con.budget().epsilon_spent == 1.0
