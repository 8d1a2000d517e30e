"""The budget is enforced end to end: exhaustion, free identical repeats, races, crashes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import on_every_backend, pums_policy
from test_ledger import STORES, assert_log_consistent, fresh_location

import dpsql

WORKER = Path(__file__).with_name("budget_worker.py")


def small_budget(epsilon: float, per_query: float = 1.0) -> dict:
    return pums_policy(
        analysts={"default": {"epsilon": epsilon, "delta": 1e-5}},
        defaults={"epsilon_per_query": per_query, "delta": 1e-6},
    )


@on_every_backend
def test_exhausted_budget_is_refused_and_says_what_remains(connect):
    connection = connect(small_budget(2.5))
    connection.execute("SELECT COUNT(*) FROM pums")
    connection.execute("SELECT SUM(income) FROM pums")
    with pytest.raises(dpsql.BudgetExhausted) as raised:
        connection.execute("SELECT AVG(age) FROM pums")
    message = str(raised.value)
    assert "epsilon=0.5" in message and "remains" in message and "SET dpsql.epsilon" in message
    connection.execute("SET dpsql.epsilon = 0.5")
    connection.execute("SELECT AVG(age) FROM pums")  # exactly what remains
    budget = connection.budget()
    assert budget.epsilon_spent == pytest.approx(2.5) and budget.epsilon_remaining == 0


@on_every_backend
def test_identical_repeat_is_identical_and_free_also_after_restart(connect, tmp_path):
    first = connect(small_budget(3.0))
    query = "SELECT sex, COUNT(*), AVG(income) FROM pums GROUP BY sex"
    answer = first.execute(query).fetchall()
    assert first.execute(query).fetchall() == answer
    assert (
        first.execute("select  sex, count(*), avg(income) from PUMS group by sex").fetchall()
        == answer
    )
    assert first.budget().epsilon_spent == pytest.approx(1.0)
    first.close()
    again = connect(small_budget(3.0), seed=99)  # same ledger file, other noise
    assert again.execute(query).fetchall() == answer
    assert again.budget().epsilon_spent == pytest.approx(1.0)
    # other options are another release, charged afresh
    again.execute("SET dpsql.epsilon = 0.5")
    assert again.execute(query).fetchall() != answer
    assert again.budget().epsilon_spent == pytest.approx(1.5)


def test_a_repeat_is_answered_from_its_tokens_without_parsing(connect, monkeypatch):
    connection = connect(small_budget(3.0))
    query = "SELECT sex, COUNT(*) FROM pums WHERE age > 30 GROUP BY sex"
    answer = connection.execute(query).fetchall()

    def no_parsing(*args, **kwargs):
        raise AssertionError("a repeat was parsed")

    monkeypatch.setattr("dpsql.session.parse_statement", no_parsing)
    spelled_otherwise = "select sex, count(*)  FROM pums -- again\n where AGE > 30 group by SEX;"
    assert connection.execute(spelled_otherwise).fetchall() == answer
    # a new query, a statement with parameters, a SET: each is parsed
    for statement, parameters in (
        ("SELECT sex, COUNT(*) FROM pums WHERE age > 31 GROUP BY sex", None),
        ("SELECT sex, COUNT(*) FROM pums WHERE age > ? GROUP BY sex", [30]),
        ("SET dpsql.epsilon = 0.5", None),
    ):
        with pytest.raises(AssertionError, match="a repeat was parsed"):
            connection.execute(statement, parameters)
    monkeypatch.undo()
    # parameters bound to the same values share their own release, charged once
    bound = connection.execute("SELECT COUNT(*) FROM pums WHERE age > ?", [30]).fetchall()
    assert connection.execute("SELECT COUNT(*) FROM pums WHERE age > $1", [30]).fetchall() == bound
    assert connection.budget().epsilon_spent == pytest.approx(2.0)


@on_every_backend
def test_data_version_invalidates_the_cache(connect):
    query = "SELECT COUNT(*) FROM pums"
    connect(small_budget(3.0)).execute(query).fetchall()
    changed = connect(small_budget(3.0) | {"data_version": "2026-11-22"}, seed=3)
    changed.execute(query).fetchall()
    assert changed.budget().epsilon_spent == pytest.approx(2.0)


def _spawn(pums_db: Path, policy: dict, ledger: str, worker: int, count: int):
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(pums_db), json.dumps(policy), str(ledger), str(worker),
         str(count)],
        stdout=subprocess.PIPE, text=True, cwd=WORKER.parent,
    )  # fmt: skip


def test_every_name_of_a_database_file_shares_its_default_ledger(pums_db, tmp_path):
    """The default ledger sits beside the database file itself: named after the path as
    written, a symbolic link to the file had a ledger, and a budget, of its own (found
    by an audit: 3 + 3 queries of epsilon 1 on a budget of 3)."""
    database = tmp_path / "pums.duckdb"
    database.write_bytes(pums_db.read_bytes())
    alias = tmp_path / "alias.duckdb"
    alias.symlink_to(database)
    for first, name in ((20, database), (40, alias)):
        with dpsql.connect(str(name), policy=small_budget(3.0)) as connection:
            for age in range(first, first + 2 - (name == alias)):
                connection.execute(f"SELECT COUNT(*) FROM pums WHERE age > {age}")
    with dpsql.connect(str(alias), policy=small_budget(3.0)) as connection:
        assert connection.budget().epsilon_spent == pytest.approx(3.0)
        with pytest.raises(dpsql.BudgetExhausted):
            connection.execute("SELECT COUNT(*) FROM pums")
    assert not (tmp_path / "alias.duckdb.ledger.sqlite").exists()
    # a ledger kept under the other name before is refused, not left behind
    other = tmp_path / "other.duckdb"
    other.symlink_to(database)
    (tmp_path / "other.duckdb.ledger.sqlite").write_bytes(b"")
    with pytest.raises(dpsql.InterfaceError, match="must share one ledger"):
        dpsql.connect(str(other), policy=small_budget(3.0))


@pytest.fixture(params=STORES)
def ledger_location(request: pytest.FixtureRequest, tmp_path: Path):
    """The ledger-level tests run on each store: an SQLite file, a PostgreSQL schema
    that the processes share as several proxies would."""
    with fresh_location(request.param, tmp_path) as location:
        yield location


def test_processes_racing_never_overspend(pums_db, ledger_location):
    policy = small_budget(25.0, per_query=0.1)  # room for exactly 250 of 400 queries
    ledger = ledger_location
    workers = [_spawn(pums_db, policy, ledger, worker, 100) for worker in range(4)]
    results = []
    for process in workers:
        output, _ = process.communicate(timeout=240)
        assert process.returncode == 0
        results.append(json.loads(output.strip().splitlines()[-1]))
    assert sum(r["answered"] for r in results) == 250
    assert sum(r["refused"] for r in results) == 150
    with dpsql.connect(str(pums_db), policy=policy, ledger=ledger) as connection:
        budget = connection.budget()
    assert budget.epsilon_spent == pytest.approx(25.0) and budget.epsilon_remaining == 0
    assert assert_log_consistent(ledger) == 250


def test_killed_process_leaves_a_consistent_ledger(pums_db, ledger_location):
    policy = small_budget(1000.0, per_query=0.5)
    ledger = ledger_location
    for attempt in range(3):
        process = _spawn(pums_db, policy, ledger, attempt, 10_000)
        assert process.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 0.2 + 0.15 * attempt
        while time.monotonic() < deadline:
            process.stdout.readline()
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    logged = assert_log_consistent(ledger)
    with dpsql.connect(str(pums_db), policy=policy, ledger=ledger) as connection:
        charges = connection.session.ledger.charges("default")
        assert charges, "the children charged nothing before they were killed"
        assert len(charges) == logged
        assert connection.budget().epsilon_spent == pytest.approx(0.5 * len(charges))
        connection.execute("SELECT COUNT(*) FROM pums WHERE age < 3")  # still usable
        assert connection.budget().epsilon_spent == pytest.approx(0.5 * (len(charges) + 1))
