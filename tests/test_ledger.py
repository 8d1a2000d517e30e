"""The privacy-budget ledger: exact arithmetic, atomic charges under threads and
processes, survival of SIGKILL, and first-writer-wins cached releases."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from datetime import UTC
from fractions import Fraction
from pathlib import Path

import pytest

from dpsql.accounting import Cost
from dpsql.errors import BudgetExhausted, InterfaceError, NotSupportedError, OperationalError
from dpsql.ledger import DELTA_QUANTUM, EPSILON_QUANTUM, Charge, Ledger, open_ledger

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("ledger_worker.py")
TENTH = Cost(Fraction(1, 10))
ONE = Cost.of(1.0)


@pytest.fixture
def ledger(tmp_path: Path):
    with Ledger(tmp_path / "ledger.sqlite") as led:
        yield led


def raw(path: Path) -> closing[sqlite3.Connection]:
    # A plain connection, outside the Ledger, to look at what is really on disk.
    return closing(sqlite3.connect(path, isolation_level=None))


def raw_spent_units(path: Path, analyst: str = "alice") -> tuple[int, int]:
    with raw(path) as conn:
        return conn.execute(
            "SELECT COALESCE(SUM(epsilon_units), 0), COALESCE(SUM(delta_units), 0) "
            "FROM charges WHERE analyst = ?",
            (analyst,),
        ).fetchone()


# -- arithmetic -------------------------------------------------------------------


def test_ten_tenths_fit_exactly_and_the_eleventh_is_refused(ledger: Ledger) -> None:
    for i in range(10):
        remaining = ledger.charge("alice", TENTH, ONE, f"q{i}")
        assert remaining == Cost(Fraction(9 - i, 10))
    assert ledger.spent("alice") == ONE
    assert ledger.remaining("alice", ONE) == Cost()
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge("alice", TENTH, ONE, "q10")
    assert info.value.analyst == "alice"
    assert info.value.remaining == Cost()
    assert "only epsilon=0, delta=0 remains" in str(info.value)


def test_refusal_message_says_what_remains(ledger: Ledger) -> None:
    ledger.charge("alice", Cost.of(0.75), ONE, "big")
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge("alice", Cost.of(0.5), ONE, "too big")
    assert info.value.remaining == Cost.of(0.25)
    assert "costs epsilon=0.5, delta=0 but only epsilon=0.25, delta=0 remains" in str(info.value)


def test_a_refused_charge_writes_nothing(ledger: Ledger, tmp_path: Path) -> None:
    ledger.charge("alice", Cost.of(0.6), ONE, "a")
    before = (ledger.charges(), ledger.spent("alice"), raw_spent_units(tmp_path / "ledger.sqlite"))
    for cost in (Cost.of(0.5), Cost.of(0.1, 1e-9)):  # over on epsilon; over on delta
        with pytest.raises(BudgetExhausted):
            ledger.charge("alice", cost, ONE, "refused")
    after = (ledger.charges(), ledger.spent("alice"), raw_spent_units(tmp_path / "ledger.sqlite"))
    assert after == before


def test_a_written_tenth_is_charged_as_exactly_a_tenth(ledger: Ledger) -> None:
    # Cost.of(0.1) is the decimal the user wrote (1/10), not the binary float, so
    # ten charges of 0.1 spend exactly 1.0 and the eleventh is refused.
    for i in range(10):
        ledger.charge("alice", Cost.of(0.1), ONE, f"q{i}")
    assert ledger.spent("alice").epsilon == 1
    with pytest.raises(BudgetExhausted):
        ledger.charge("alice", Cost.of(0.1), ONE, "q10")


def test_amounts_are_rounded_up_to_the_quantum(ledger: Ledger) -> None:
    third = Cost(Fraction(1, 3), Fraction(1, 3) * Fraction(1, 10**9))
    ledger.charge("alice", third, ONE + Cost(delta=Fraction(1)), "third")
    logged = ledger.charges()[0].cost
    assert logged.epsilon == Fraction(333_333_333_334, EPSILON_QUANTUM) > third.epsilon
    assert logged.delta >= third.delta
    assert logged.delta - third.delta < Fraction(1, DELTA_QUANTUM)
    # A cost below one quantum is still charged one quantum, never zero.
    ledger.charge("bob", Cost(Fraction(1, 10**15)), ONE, "tiny")
    assert ledger.spent("bob") == Cost(Fraction(1, EPSILON_QUANTUM))


def test_budget_is_rounded_down_so_remaining_never_overstates(ledger: Ledger) -> None:
    budget = Cost(Fraction(1, 3))
    assert ledger.remaining("alice", budget).epsilon == Fraction(333_333_333_333, EPSILON_QUANTUM)
    assert ledger.remaining("alice", budget).epsilon <= budget.epsilon


def test_remaining_is_zero_when_budget_was_lowered_below_spent(ledger: Ledger) -> None:
    ledger.charge("alice", Cost.of(0.5), ONE, "q")
    assert ledger.remaining("alice", Cost.of(0.25)) == Cost()
    with pytest.raises(BudgetExhausted):
        ledger.charge("alice", Cost.of(0.001), Cost.of(0.25), "q2")


@pytest.mark.parametrize(
    "bad",
    [
        Cost(float("nan")),
        Cost(float("inf")),
        Cost(Fraction(0), float("-inf")),
        Cost(Fraction(-1, 10)),
        Cost(Fraction(0), Fraction(-1, 10**9)),
    ],
)
def test_nan_inf_and_negative_costs_are_rejected(ledger: Ledger, bad: Cost) -> None:
    with pytest.raises(ValueError):
        ledger.charge("alice", bad, ONE, "bad")
    with pytest.raises(ValueError):
        ledger.charge("alice", TENTH, bad, "bad budget")
    assert ledger.charges() == []


def test_wrong_types_are_rejected(ledger: Ledger) -> None:
    with pytest.raises(TypeError):
        ledger.charge("alice", 0.1, ONE, "q")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ledger.charge(None, TENTH, ONE, "q")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ledger.store_release("alice", "q", {"not": "text"})  # type: ignore[arg-type]


def test_absurdly_large_cost_is_rejected_not_overflowed(ledger: Ledger) -> None:
    with pytest.raises(ValueError):
        ledger.charge("alice", Cost.of(1e10), Cost.of(1e12), "huge")
    # A huge budget is capped at what the log can sum, so it still works.
    assert ledger.charge("alice", Cost.of(1.0), Cost.of(1e12), "fine").epsilon > 0


def test_analysts_have_separate_accounts(ledger: Ledger) -> None:
    ledger.charge("alice", Cost.of(1.0), ONE, "q")
    assert ledger.remaining("bob", ONE) == ONE
    ledger.charge("bob", Cost.of(0.5), ONE, "q")
    assert ledger.spent("alice") == ONE
    assert ledger.spent("bob") == Cost.of(0.5)
    assert ledger.spent("nobody") == Cost()


# -- the log ----------------------------------------------------------------------


def test_log_records_fingerprint_and_utc_time_oldest_first(ledger: Ledger) -> None:
    ledger.charge("alice", TENTH, ONE, "fp-1")
    ledger.charge("bob", Cost.of(0.2, 1e-6), Cost.of(1.0, 1e-5), "fp-2")
    ledger.charge("alice", TENTH, ONE, "fp-3")
    log = ledger.charges()
    assert [c.fingerprint for c in log] == ["fp-1", "fp-2", "fp-3"]
    assert [c.id for c in log] == sorted(c.id for c in log)
    assert all(isinstance(c, Charge) and c.time.tzinfo == UTC for c in log)
    assert log[0].time <= log[1].time <= log[2].time
    assert [c.fingerprint for c in ledger.charges("alice")] == ["fp-1", "fp-3"]
    assert ledger.charges("bob")[0].cost.delta >= Fraction(1e-6)
    with pytest.raises(AttributeError):
        log[0].fingerprint = "changed"  # type: ignore[misc]


def test_log_is_append_only(ledger: Ledger, tmp_path: Path) -> None:
    ledger.charge("alice", TENTH, ONE, "q")
    with raw(tmp_path / "ledger.sqlite") as conn:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute("UPDATE charges SET epsilon_units = 0")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute("DELETE FROM charges")
    assert ledger.spent("alice") == TENTH


def test_schema_is_versioned_and_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    Ledger(path).close()
    Ledger(path).close()  # reopening is idempotent
    with raw(path) as conn:
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        assert meta["schema_version"] == "1"
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(OperationalError, match="schema_version"):
        Ledger(path)


def test_creates_parent_directories_and_memory_ledgers(tmp_path: Path) -> None:
    with Ledger(tmp_path / "a" / "b" / "ledger.sqlite") as led:
        led.charge("alice", TENTH, ONE, "q")
    with Ledger(":memory:") as mem:
        mem.charge("alice", TENTH, ONE, "q")
        assert mem.spent("alice") == TENTH


def test_open_ledger_and_closing(tmp_path: Path) -> None:
    with open_ledger(f"sqlite:///{tmp_path}/x.sqlite") as led:
        led.charge("alice", TENTH, ONE, "q")
    assert (tmp_path / "x.sqlite").exists()
    with open_ledger(tmp_path / "x.sqlite") as led:
        assert led.spent("alice") == TENTH
    with pytest.raises(NotSupportedError):
        open_ledger("postgresql://localhost/db")
    with pytest.raises(InterfaceError):
        led.spent("alice")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_gets_its_own_connection(ledger: Ledger) -> None:
    ledger.charge("alice", TENTH, ONE, "parent")
    pid = os.fork()
    if pid == 0:  # child: must not reuse the parent's SQLite connection
        code = 1
        try:
            ledger.charge("alice", TENTH, ONE, "child")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [c.fingerprint for c in ledger.charges()] == ["parent", "child"]
    assert ledger.spent("alice") == Cost(Fraction(2, 10))


# -- cached releases --------------------------------------------------------------


def test_release_store_get_and_first_writer_wins(ledger: Ledger) -> None:
    assert ledger.cached_release("alice", "q") is None
    assert ledger.store_release("alice", "q", '{"v": 1}') == '{"v": 1}'
    assert ledger.store_release("alice", "q", '{"v": 2}') == '{"v": 1}'
    assert ledger.cached_release("alice", "q") == '{"v": 1}'
    assert ledger.cached_release("bob", "q") is None  # per analyst


def test_release_survives_restart_and_clear_cache_keeps_charges(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as led:
        led.charge("alice", TENTH, ONE, "q")
        led.store_release("alice", "q", '{"v": 1}')
    with Ledger(path) as led:
        assert led.cached_release("alice", "q") == '{"v": 1}'
        assert led.clear_cache() == 1
        assert led.cached_release("alice", "q") is None
        assert led.spent("alice") == TENTH
        assert led.store_release("alice", "q", '{"v": 2}') == '{"v": 2}'


def test_release_first_writer_wins_across_threads(ledger: Ledger, tmp_path: Path) -> None:
    others = [Ledger(tmp_path / "ledger.sqlite") for _ in range(4)]
    ledgers = [ledger, ledger, ledger, ledger, *others]
    barrier = threading.Barrier(len(ledgers))
    results: list[str] = []

    def store(led: Ledger, i: int) -> None:
        barrier.wait()
        results.append(led.store_release("alice", "q", f'{{"writer": {i}}}'))

    threads = [threading.Thread(target=store, args=(led, i)) for i, led in enumerate(ledgers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for other in others:
        other.close()
    assert len(results) == len(ledgers)
    assert len(set(results)) == 1
    assert ledger.cached_release("alice", "q") == results[0]


# -- concurrency ------------------------------------------------------------------


def spawn_worker(job: dict) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(job)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if line.strip() != "ready":
        proc.kill()
        pytest.fail(f"worker did not start: {line}{proc.communicate()[1]}")


def run_race(jobs: list[dict]) -> list[dict]:
    procs = [spawn_worker(job) for job in jobs]  # imports run in parallel
    for proc in procs:
        wait_ready(proc)
    for proc in procs:  # every worker is waiting on stdin: start them together
        proc.stdin.write("go\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "locked" not in err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_processes_racing_charge_exactly_the_budget(tmp_path: Path) -> None:
    path = tmp_path / "race.sqlite"  # not created yet: the workers race to create it
    procs, per_proc, allowed = 4, 100, 250
    cost = ["1/100", "1/1000000000"]
    budget = [f"{allowed}/100", f"{allowed}/1000000000"]
    jobs = [
        {"mode": "charges", "path": str(path), "name": f"w{i}", "n": per_proc, "cost": cost,
         "budget": budget, "pause": 0.002}
        for i in range(procs)
    ]  # fmt: skip
    results = run_race(jobs)
    assert sum(r["ok"] for r in results) == allowed
    assert sum(r["refused"] for r in results) == procs * per_proc - allowed
    with Ledger(path) as led:
        assert led.spent("alice") == Cost(Fraction(allowed, 100), Fraction(allowed, 10**9))
        assert len(led.charges("alice")) == allowed
    with raw(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_threads_racing_charge_exactly_the_budget(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    shared = Ledger(path)
    # Half the threads share one Ledger, half have their own connection.
    ledgers = [shared] * 4 + [Ledger(path) for _ in range(4)]
    cost, budget, allowed, per_thread = TENTH, Cost(Fraction(25)), 250, 50
    barrier = threading.Barrier(len(ledgers))
    counts = {"ok": 0, "refused": 0}
    errors: list[BaseException] = []
    count_lock = threading.Lock()

    def work(led: Ledger, name: str) -> None:
        barrier.wait()
        for i in range(per_thread):
            try:
                led.charge("alice", cost, budget, f"{name}-{i}")
                outcome = "ok"
            except BudgetExhausted:
                outcome = "refused"
            except BaseException as exc:  # any other error fails the test below
                errors.append(exc)
                return
            with count_lock:
                counts[outcome] += 1

    threads = [threading.Thread(target=work, args=(led, f"t{i}")) for i, led in enumerate(ledgers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert counts == {"ok": allowed, "refused": len(ledgers) * per_thread - allowed}
    assert shared.spent("alice") == Cost(Fraction(allowed, 10))
    for led in ledgers:
        led.close()


def test_release_first_writer_wins_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "releases.sqlite"
    jobs = [{"mode": "release", "path": str(path), "payload": f'{{"w": {i}}}'} for i in range(4)]
    stored = {r["stored"] for r in run_race(jobs)}
    assert len(stored) == 1
    with Ledger(path) as led:
        assert led.cached_release("alice", "q") == stored.pop()


def test_sigkill_never_leaves_log_and_balance_disagreeing(tmp_path: Path) -> None:
    path = tmp_path / "killed.sqlite"
    rng = random.Random(20261121)
    cost = Cost(Fraction(1, 1000), Fraction(1, 10**12))
    budget = Cost(Fraction(10**6), Fraction(1))
    acknowledged = 0
    for round_ in range(6):
        job = {"mode": "forever", "path": str(path), "name": f"r{round_}",
               "cost": ["1/1000", "1/1000000000000"], "budget": ["1000000", "1"]}  # fmt: skip
        proc = spawn_worker(job)
        wait_ready(proc)
        # Let it commit a seeded number of charges, then kill it at a seeded
        # moment, usually inside a transaction or an fsync.
        reported = 0  # the child's own count of charges that charge() returned
        for _ in range(rng.randint(1, 40)):
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line.startswith("ok "), line
            reported = int(line.split()[1])
        time.sleep(rng.uniform(0, 0.02))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        for line in out.splitlines():
            if line.startswith("ok ") and line.split()[1].isdigit():
                reported = int(line.split()[1])
        acknowledged += reported

        with raw(path) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            (rows,) = conn.execute("SELECT COUNT(*) FROM charges").fetchone()
        # Every charge the child was told about survived; at most one more
        # per kill was committed but not yet reported.
        assert acknowledged <= rows <= acknowledged + 1
        with Ledger(path) as led:
            log = led.charges("alice")
            assert len(log) == rows
            eps_units, delta_units = raw_spent_units(path)
            spent = led.spent("alice")
            assert spent == Cost(
                Fraction(eps_units, EPSILON_QUANTUM), Fraction(delta_units, DELTA_QUANTUM)
            )
            assert spent == Cost(cost.epsilon * rows, cost.delta * rows)
            assert led.remaining("alice", budget) == budget - spent
        acknowledged = rows  # the next round's bound starts from what is logged

    with Ledger(path) as led:  # a new ledger can charge again
        before = led.spent("alice")
        led.charge("alice", cost, budget, "after")
        assert led.spent("alice") == before + cost
