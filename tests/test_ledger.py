"""The privacy-budget ledger on both stores (an SQLite file, a PostgreSQL schema):
exact arithmetic, rho composed as zCDP, atomic charges under threads, processes
and several proxies, survival of SIGKILL, first-writer-wins cached releases,
and the upgrade of version-1 SQLite files.

The PostgreSQL cases use the server DPSQL_TEST_POSTGRES_URL names (else one the
test process starts itself, see conftest.py), each in a schema of its own that
is dropped afterwards.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import UTC
from fractions import Fraction
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from conftest import postgres_server_url
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

import dpsql
from dpsql import demo
from dpsql.accounting import Cost, zcdp_epsilon
from dpsql.errors import BudgetExhausted, InterfaceError, NotSupportedError, OperationalError
from dpsql.ledger import (
    DELTA_QUANTUM,
    EPSILON_QUANTUM,
    RHO_QUANTUM,
    Charge,
    Ledger,
    open_ledger,
)
from dpsql.ledger.book import _admit, _as_cost, _budget_cost
from dpsql.ledger.postgres import split_location
from dpsql.ledger.store import Units

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("ledger_worker.py")
TENTH = Cost(Fraction(1, 10))
ONE = Cost.of(1.0)
STORES = ["sqlite", "postgresql"]
# What a database driver raises when a trigger or constraint refuses a statement.
REFUSED = (sqlite3.DatabaseError, psycopg.Error)


def postgres_location(schema: str) -> str:
    url = postgres_server_url()
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


@contextmanager
def fresh_location(store: str, tmp_path: Path) -> Iterator[str]:
    """A ledger location in `store` that does not exist yet, removed afterwards."""
    if store == "sqlite":
        yield str(tmp_path / "ledger.sqlite")
        return
    location = postgres_location(f"h3b_ledger_{uuid.uuid4().hex[:12]}")
    try:
        yield location
    finally:
        conninfo, schema, _ = split_location(location)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture(params=STORES)
def ledger_location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_location(request.param, tmp_path) as location:
        yield location


@pytest.fixture
def ledger(ledger_location: str) -> Iterator[Ledger]:
    with Ledger(ledger_location) as led:
        yield led


def is_postgres(location: str) -> bool:
    return location.startswith("postgresql://")


@contextmanager
def raw(location: str) -> Iterator[Any]:
    """A plain connection outside the Ledger, to look at what is really stored."""
    if is_postgres(location):
        conninfo, schema, _ = split_location(location)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            yield conn
    else:
        with closing(sqlite3.connect(location, isolation_level=None)) as conn:
            yield conn


def raw_spent_units(location: str, analyst: str = "alice") -> tuple[int, int, int]:
    """The analyst's spend as an independent SUM over the log."""
    placeholder = "%s" if is_postgres(location) else "?"
    with raw(location) as conn:
        row = conn.execute(
            "SELECT COALESCE(SUM(epsilon_units), 0), COALESCE(SUM(delta_units), 0), "
            f"COALESCE(SUM(rho_units), 0) FROM charges WHERE analyst = {placeholder}",
            (analyst,),
        ).fetchone()
    return tuple(int(v) for v in row)  # type: ignore[return-value]


def await_session_end(location: str, application: str) -> None:
    """Wait until the PostgreSQL server has ended every session named `application`."""
    deadline = time.monotonic() + 30
    with raw(location) as conn:
        query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        while conn.execute(query, (application,)).fetchone()[0]:
            assert time.monotonic() < deadline, f"the server kept {application}'s session"
            time.sleep(0.01)


def assert_log_consistent(location: str) -> int:
    """The store is intact and every analyst's running totals equal the SUM of the log.

    Returns the number of charges.
    """
    with raw(location) as conn:
        if not is_postgres(location):
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        mismatches = conn.execute(
            """SELECT analyst FROM (
                   SELECT analyst, seq, total_epsilon_units, total_delta_units, total_rho_units,
                          ROW_NUMBER() OVER w AS n, SUM(epsilon_units) OVER w AS eps,
                          SUM(delta_units) OVER w AS delta, SUM(rho_units) OVER w AS rho
                   FROM charges WINDOW w AS (PARTITION BY analyst ORDER BY id)) AS log
               WHERE seq <> n OR total_epsilon_units <> eps OR total_delta_units <> delta
                  OR total_rho_units <> rho"""
        ).fetchall()
        (count,) = conn.execute("SELECT COUNT(*) FROM charges").fetchone()
    assert mismatches == []
    return count


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


def test_a_refused_charge_writes_nothing(ledger: Ledger, ledger_location: str) -> None:
    ledger.charge("alice", Cost.of(0.6), ONE, "a")
    before = (ledger.charges(), ledger.spent("alice"), raw_spent_units(ledger_location))
    for cost in (Cost.of(0.5), Cost.of(0.1, 1e-9), Cost.of(rho=0.01)):  # over on each part
        with pytest.raises(BudgetExhausted):
            ledger.charge("alice", cost, ONE, "refused")
    after = (ledger.charges(), ledger.spent("alice"), raw_spent_units(ledger_location))
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


# -- zCDP rho ---------------------------------------------------------------------


def test_rho_charges_stop_exactly_when_the_converted_epsilon_would_exceed(ledger: Ledger) -> None:
    # A Gaussian-like sequence: every query costs rho; zCDP composes by adding
    # rho, and the total is converted with the budget's delta.
    budget, step = Cost.of(1.0, 1e-6), Cost.of(rho=0.0005)
    answered = 0
    while True:
        try:
            ledger.charge("alice", step, budget, f"gauss-{answered}")
        except BudgetExhausted:
            break
        answered += 1
    rho = step.rho * answered
    assert zcdp_epsilon(rho, budget.delta) <= budget.epsilon
    assert zcdp_epsilon(rho + step.rho, budget.delta) > budget.epsilon
    # Independent bounds: the conversion is at least as tight as the classic
    # rho + 2 sqrt(rho log(1/delta)), and never grants more rho than epsilon.
    classic = (math.sqrt(math.log(1e6) + 1) - math.sqrt(math.log(1e6))) ** 2
    assert classic <= rho < 1
    assert ledger.spent("alice") == Cost(rho=rho)
    assert len(ledger.charges("alice")) == answered


def test_rho_and_epsilon_are_checked_together_not_per_component(ledger: Ledger) -> None:
    budget = Cost.of(1.0, 1e-6)
    ledger.charge("alice", Cost.of(rho=0.02), budget, "gauss")
    converted = zcdp_epsilon(Fraction(2, 100), budget.delta)
    left = ledger.remaining("alice", budget)
    assert left.epsilon == Fraction(
        math.floor((budget.epsilon - converted) * EPSILON_QUANTUM), EPSILON_QUANTUM
    )
    assert left.delta == budget.delta and left.rho == 0
    # Per component, 0.7 more epsilon would fit (none spent); converted, it does not.
    assert converted > Fraction(3, 10)
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge("alice", Cost.of(0.7), budget, "laplace")
    assert info.value.remaining == left
    # Spending delta too raises the converted epsilon: refused even below `left`.
    with pytest.raises(BudgetExhausted):
        ledger.charge("alice", Cost(left.epsilon, Fraction(1, 2 * 10**6)), budget, "delta")
    # What `remaining` reports is exactly usable by a pure-epsilon charge.
    assert ledger.charge("alice", Cost(left.epsilon), budget, "laplace") == Cost(
        Fraction(0), budget.delta
    )
    with pytest.raises(BudgetExhausted):
        ledger.charge("alice", Cost(Fraction(1, EPSILON_QUANTUM)), budget, "one more quantum")


def test_rho_is_rounded_up_to_its_quantum_and_a_rho_budget_is_refused(ledger: Ledger) -> None:
    budget = Cost.of(10.0, 1e-6)
    ledger.charge("alice", Cost(rho=Fraction(1, 3)), budget, "third")
    assert ledger.charges()[0].cost.rho == Fraction(333_333_333_334, RHO_QUANTUM)
    with pytest.raises(ValueError, match=r"budget is \(epsilon, delta\)"):
        ledger.charge("alice", Cost.of(0.1), Cost.of(1.0, 1e-6, rho=1.0), "q")
    with pytest.raises(ValueError):
        ledger.charge("alice", Cost(rho=Fraction(-1, 10)), budget, "negative")


def test_threads_racing_with_rho_never_overspend(ledger_location: str) -> None:
    budget, step = Cost.of(1.0, 1e-6), Cost.of(0.01, rho=0.0005)
    allowed = 0
    while Cost(step.epsilon * (allowed + 1), Fraction(0), step.rho * (allowed + 1)).fits_within(
        budget
    ):
        allowed += 1
    ledgers = [Ledger(ledger_location) for _ in range(4)]
    barrier = threading.Barrier(len(ledgers))
    outcomes: list[bool] = []

    def work(led: Ledger, name: str) -> None:
        barrier.wait()
        for i in range(allowed // 2):
            try:
                led.charge("alice", step, budget, f"{name}-{i}")
                outcomes.append(True)
            except BudgetExhausted:
                outcomes.append(False)

    threads = [threading.Thread(target=work, args=(led, f"t{i}")) for i, led in enumerate(ledgers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(outcomes) == allowed and len(outcomes) == 4 * (allowed // 2)
    assert ledgers[0].spent("alice") == Cost(
        step.epsilon * allowed, Fraction(0), step.rho * allowed
    )
    for led in ledgers:
        led.close()
    assert assert_log_consistent(ledger_location) == allowed


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


def test_log_is_append_only(ledger: Ledger, ledger_location: str) -> None:
    ledger.charge("alice", TENTH, ONE, "q")
    statements = ["UPDATE charges SET epsilon_units = 0", "DELETE FROM charges"]
    if is_postgres(ledger_location):
        statements.append("TRUNCATE charges")
    with raw(ledger_location) as conn:
        for statement in statements:
            with pytest.raises(REFUSED, match="append-only"):
                conn.execute(statement)
    assert ledger.spent("alice") == TENTH


def test_an_append_must_continue_the_running_totals(ledger: Ledger, ledger_location: str) -> None:
    # The database itself refuses a row that would let the balance disagree
    # with the log, or a second row with the same number (a lost race).
    ledger.charge("alice", TENTH, ONE, "q")
    insert = (
        "INSERT INTO charges (analyst, charged_at, fingerprint, epsilon_units, delta_units, "
        "rho_units, seq, total_epsilon_units, total_delta_units, total_rho_units) VALUES "
        "('alice', '2026-01-01T00:00:00+00:00', 'forged', {}, 0, 0, {}, {}, 0, 0)"
    )
    tenth = EPSILON_QUANTUM // 10
    with raw(ledger_location) as conn:
        for values in [(tenth, 2, tenth), (tenth, 1, 2 * tenth), (0, 3, tenth)]:
            with pytest.raises(REFUSED, match=r"running totals|UNIQUE|unique"):
                conn.execute(insert.format(*values))
        conn.execute(insert.format(tenth, 2, 2 * tenth))  # a correct continuation is accepted
    assert ledger.spent("alice") == Cost(Fraction(2, 10))
    assert assert_log_consistent(ledger_location) == 2


def test_schema_is_versioned(ledger_location: str) -> None:
    Ledger(ledger_location).close()
    Ledger(ledger_location).close()  # reopening is idempotent
    with raw(ledger_location) as conn:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        assert meta == {
            "schema_version": "2",
            "epsilon_quantum": str(EPSILON_QUANTUM),
            "delta_quantum": str(DELTA_QUANTUM),
            "rho_quantum": str(RHO_QUANTUM),
        }
        if not is_postgres(ledger_location):
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(OperationalError, match=r"schema_version='99'.*understands only 2"):
        Ledger(ledger_location)


# What dpsql's first ledger (schema version 1) wrote, as it wrote it.
V1_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE charges (
        id INTEGER PRIMARY KEY AUTOINCREMENT, analyst TEXT NOT NULL, charged_at TEXT NOT NULL,
        fingerprint TEXT NOT NULL, epsilon_units INTEGER NOT NULL CHECK (epsilon_units >= 0),
        delta_units INTEGER NOT NULL CHECK (delta_units >= 0))""",
    "CREATE INDEX charges_by_analyst ON charges (analyst, epsilon_units, delta_units)",
    """CREATE TRIGGER charges_no_update BEFORE UPDATE ON charges
        BEGIN SELECT RAISE(ABORT, 'the charges log is append-only'); END""",
    """CREATE TRIGGER charges_no_delete BEFORE DELETE ON charges
        BEGIN SELECT RAISE(ABORT, 'the charges log is append-only'); END""",
    """CREATE TABLE releases (analyst TEXT NOT NULL, fingerprint TEXT NOT NULL,
        payload TEXT NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY (analyst, fingerprint))""",
    """INSERT INTO meta (key, value) VALUES ('schema_version', '1'),
        ('epsilon_quantum', '1000000000000'), ('delta_quantum', '1000000000000000000')""",
)


def test_a_version_1_file_is_upgraded_in_place(tmp_path: Path) -> None:
    path = str(tmp_path / "v1.sqlite")
    with raw(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        for statement in V1_SCHEMA:
            conn.execute(statement)
        conn.executemany(
            "INSERT INTO charges (analyst, charged_at, fingerprint, epsilon_units, delta_units) "
            "VALUES (?, '2026-01-01T00:00:00.000000+00:00', ?, ?, ?)",
            [("alice", "a1", 10**11, 10**12), ("bob", "b1", 3 * 10**11, 0),
             ("alice", "a2", 2 * 10**11, 0)],
        )  # fmt: skip
        conn.execute("INSERT INTO releases VALUES ('alice', 'a1', '{}', '2026-01-01')")
    with Ledger(path) as led:
        assert led.spent("alice") == Cost(Fraction(3, 10), Fraction(1, 10**6))
        assert led.spent("bob") == Cost(Fraction(3, 10))
        assert [c.fingerprint for c in led.charges()] == ["a1", "b1", "a2"]
        assert all(c.cost.rho == 0 for c in led.charges())
        assert led.cached_release("alice", "a1") == "{}"
        led.charge("alice", Cost.of(rho=0.01), Cost.of(10.0, 1e-5), "a3")
        assert led.spent("alice").rho == Fraction(1, 100)
    Ledger(path).close()  # the upgrade happens once
    assert assert_log_consistent(path) == 4
    with raw(path) as conn:
        assert dict(conn.execute("SELECT key, value FROM meta").fetchall())["schema_version"] == "2"
        indexes = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        }
        assert "charges_by_analyst" not in indexes and "charges_by_analyst_seq" in indexes
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute("UPDATE charges SET rho_units = 0")


def test_a_cached_release_skips_the_disk_wait_but_charges_do_not(
    ledger: Ledger, ledger_location: str
) -> None:
    if is_postgres(ledger_location):
        # Reads the store's own connection: the setting is per connection, and a
        # charge after a non-durable release must wait for the disk again.
        conn = ledger._store._connection()
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
    with fsyncs_of_the_wal(ledger) as synced:
        ledger.charge("alice", TENTH, ONE, "q")
        assert synced() or is_postgres(ledger_location)  # SQLite: the store's own fsync
        before = synced()
        assert ledger.store_release("alice", "q", "cached", durable=False) == "cached"
        with pytest.raises(TypeError):
            ledger.store_release("alice", "q2", None, durable=False)  # type: ignore[arg-type]
        assert synced() == before
        ledger.charge("alice", TENTH, ONE, "q2")
        assert synced() > before or is_postgres(ledger_location)
    if is_postgres(ledger_location):
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
    assert ledger.cached_release("alice", "q") == "cached"


@contextmanager
def fsyncs_of_the_wal(ledger: Ledger, gate: threading.Event | None = None) -> Iterator[Any]:
    """Count the fsyncs of an SQLite ledger's WAL file that cover everything written to it
    before they began (the file's size when each began); `gate`: each waits for it first.

    Yields synced(): how many fsyncs, or, given a size, how many began at or past it."""
    wal = os.path.realpath(ledger.location) + "-wal"
    starts: list[int] = []
    real_fsync = os.fsync

    def spy(descriptor: int) -> None:
        if os.path.realpath(f"/proc/self/fd/{descriptor}") == wal:
            if gate is not None:
                gate.wait()
            starts.append(os.fstat(descriptor).st_size)
        real_fsync(descriptor)

    def synced(size: int = 0) -> int:
        return sum(start >= size for start in starts)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", spy)
        yield synced


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
def test_a_deferred_charge_is_committed_at_once_and_durable_after_durable(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger, Ledger(path) as other:
        gate = threading.Event()
        with fsyncs_of_the_wal(ledger, gate) as synced:
            ledger.charge("alice", TENTH, ONE, "q", sync=False)
            # Committed: another connection sees it and counts it against the budget.
            assert other.spent("alice") == TENTH
            written = os.path.getsize(str(path) + "-wal")
            waiter = threading.Thread(target=ledger.durable)
            waiter.start()
            waiter.join(0.3)
            assert waiter.is_alive()  # the sync is held at the gate: durable() must wait
            gate.set()
            waiter.join()
            # The sync that durable() waited for began after everything the charge wrote.
            assert synced(written) >= 1
        assert ledger.spent("alice") == TENTH


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
def test_a_query_is_released_only_once_its_charge_is_on_disk(tmp_path: Path) -> None:
    # The pipeline commits the charge, lets its fsync overlap the query, and must
    # not hand the answer over before that fsync is done.
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    gate = threading.Event()
    answers: list[Any] = []
    with dpsql.connect(demo.demo_connection(), policy=demo.DEMO_POLICY, ledger=ledger) as con:
        with fsyncs_of_the_wal(ledger, gate) as synced:
            query = threading.Thread(
                target=lambda: answers.append(
                    con.cursor().execute("SELECT COUNT(*) FROM census").fetchall()
                )
            )
            query.start()
            query.join(0.5)
            assert query.is_alive() and not answers
            assert len(ledger.charges("default")) == 1  # charged (committed) already
            written = os.path.getsize(str(path) + "-wal")
            gate.set()
            query.join()
            assert synced(written) >= 1
        assert len(answers) == 1


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
def test_a_failed_sync_releases_nothing_and_keeps_failing(tmp_path: Path) -> None:
    # A disk that fails fsync (EIO): the answer must not be released on a charge the
    # disk may not hold, and after one failure no later charge is taken as durable
    # (the kernel may have dropped the pages that failed: PostgreSQL stops too).
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    wal = os.path.realpath(path) + "-wal"
    real_fsync = os.fsync

    def failing(descriptor: int) -> None:
        if os.path.realpath(f"/proc/self/fd/{descriptor}") == wal:
            raise OSError(5, "Input/output error")
        real_fsync(descriptor)

    with dpsql.connect(demo.demo_connection(), policy=demo.DEMO_POLICY, ledger=ledger) as con:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(os, "fsync", failing)
            with pytest.raises(OperationalError, match="cannot sync to disk"):
                con.cursor().execute("SELECT COUNT(*) FROM census").fetchall()
            assert ledger.cached_release("default", "x") is None  # reads still work
        with pytest.raises(OperationalError, match="cannot sync to disk"):
            ledger.charge("default", TENTH, Cost.of(10.0), "later")  # failed once: no more
    ledger.close()
    with Ledger(path) as reopened:  # a new connection starts afresh
        reopened.charge("default", TENTH, Cost.of(10.0), "after")


def test_concurrent_deferred_charges_share_syncs_and_never_overspend(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    charged: list[int] = []
    with Ledger(path) as ledger:

        def spend(thread: int) -> None:
            for i in range(25):
                try:
                    ledger.charge("alice", TENTH, Cost.of(5.0), f"{thread}-{i}", sync=False)
                except BudgetExhausted:
                    continue
                ledger.durable()
                charged.append(thread)

        threads = [threading.Thread(target=spend, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(charged) == 50  # 5.0 / 0.1, exactly
        assert ledger.spent("alice") == Cost(Fraction(5))
    assert assert_log_consistent(str(path)) == 50


def test_creates_parent_directories_and_memory_ledgers(tmp_path: Path) -> None:
    with Ledger(tmp_path / "a" / "b" / "ledger.sqlite") as led:
        led.charge("alice", TENTH, ONE, "q")
    with Ledger(":memory:") as mem:
        mem.charge("alice", TENTH, ONE, "q")
        assert mem.spent("alice") == TENTH


def test_a_ledger_that_cannot_be_opened_says_where_and_what_to_give(tmp_path: Path) -> None:
    # these raised a raw FileNotFoundError or sqlite3 error, a traceback in the CLI
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    not_sqlite = tmp_path / "policy.yaml"
    not_sqlite.write_text("version: 1\n" * 200)
    for location in (not_a_folder / "ledger.sqlite", tmp_path, not_sqlite):
        with pytest.raises(
            OperationalError, match=rf"cannot open the ledger {location}: .*--ledger"
        ):
            Ledger(location)


def test_open_ledger_and_closing(tmp_path: Path) -> None:
    with open_ledger(f"sqlite:///{tmp_path}/x.sqlite") as led:
        led.charge("alice", TENTH, ONE, "q")
    assert (tmp_path / "x.sqlite").exists()
    with open_ledger(tmp_path / "x.sqlite") as led:
        assert led.spent("alice") == TENTH
    with pytest.raises(NotSupportedError, match=r"use an SQLite file path.*postgresql://"):
        open_ledger("mysql://localhost/db")
    with pytest.raises(NotSupportedError, match="sqlite:///path"):
        open_ledger("sqlite://relative.sqlite")
    for empty in ("", "  "):  # SQLite's temporary database: a budget reset at every restart
        with pytest.raises(NotSupportedError, match=r"location is empty.*budget would reset"):
            open_ledger(empty)
    with pytest.raises(InterfaceError):
        led.spent("alice")


def test_postgres_location_names_a_schema_and_hides_the_password() -> None:
    conninfo, schema, shown = split_location(
        "postgresql://bob:s3cret@db.example:5432/prod?sslmode=require&schema=budget"
    )
    assert schema == "budget"
    assert conninfo == "postgresql://bob:s3cret@db.example:5432/prod?sslmode=require"
    assert "s3cret" not in shown and "bob:***@db.example" in shown
    assert split_location("postgresql://h/db")[1] == "dpsql"
    with pytest.raises(ValueError, match="schema"):
        split_location("postgresql://h/db?schema=")


def test_an_unreachable_postgres_ledger_says_what_to_check() -> None:
    parts = urlsplit(postgres_location("h3b_never_created"))
    url = urlunsplit(parts._replace(path="/h3b_no_such_database"))
    with pytest.raises(
        OperationalError, match=r"cannot connect to the ledger.*Check the ledger URL"
    ):
        Ledger(url)


def test_a_lost_postgres_connection_fails_one_call_then_reconnects(tmp_path: Path) -> None:
    with fresh_location("postgresql", tmp_path) as location, Ledger(location) as ledger:
        ledger.charge("alice", TENTH, ONE, "q")
        pid = ledger._store._connection().info.backend_pid
        with raw(location) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(OperationalError, match="ledger postgresql://"):
            ledger.charge("alice", TENTH, ONE, "q2")
        ledger.charge("alice", TENTH, ONE, "q3")
        assert [c.fingerprint for c in ledger.charges()] == ["q", "q3"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_gets_its_own_connection(ledger_location: str) -> None:
    # The parent keeps using its connection after the child is done with its own.
    job = {"mode": "fork", "path": ledger_location, "cost": ["1/10", "0"], "budget": ["1", "0"]}
    proc = spawn_worker(job)
    wait_ready(proc)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"child": 0}
    with Ledger(ledger_location) as ledger:
        assert [c.fingerprint for c in ledger.charges()] == ["parent", "child", "parent again"]
        assert ledger.spent("alice") == Cost(Fraction(3, 10))


# -- cached releases --------------------------------------------------------------


def test_release_store_get_and_first_writer_wins(ledger: Ledger) -> None:
    assert ledger.cached_release("alice", "q") is None
    assert ledger.store_release("alice", "q", '{"v": 1}') == '{"v": 1}'
    assert ledger.store_release("alice", "q", '{"v": 2}') == '{"v": 1}'
    assert ledger.cached_release("alice", "q") == '{"v": 1}'
    assert ledger.cached_release("bob", "q") is None  # per analyst


def test_release_survives_restart_and_clear_cache_keeps_charges(ledger_location: str) -> None:
    path = ledger_location
    with Ledger(path) as led:
        led.charge("alice", TENTH, ONE, "q")
        led.store_release("alice", "q", '{"v": 1}')
    with Ledger(path) as led:
        assert led.cached_release("alice", "q") == '{"v": 1}'
        assert led.clear_cache() == 1
        assert led.cached_release("alice", "q") is None
        assert led.spent("alice") == TENTH
        assert led.store_release("alice", "q", '{"v": 2}') == '{"v": 2}'


def test_clear_cache_by_analyst_and_fingerprint_prefix(ledger: Ledger) -> None:
    stored = {"alice": ["q1", "q2", "a_b:1", "a_b:2", "axb:1", "a%:1"], "bob": ["q1", "a_b:1"]}
    for analyst, fingerprints in stored.items():
        for fingerprint in fingerprints:
            ledger.store_release(analyst, fingerprint, "{}")
    counts = {a: n for a, n, _ in ledger.release_counts()}
    assert counts == {"alice": 6, "bob": 2}
    # LIKE's wildcards in a prefix are matched as themselves
    assert [n for _, n, _ in ledger.release_counts("alice", prefix="a_b:")] == [2]
    assert [n for _, n, _ in ledger.release_counts("alice", prefix="a%")] == [1]
    answers = {"excluding": ("a_b:", "axb:", "a%:")}
    assert [(a, n) for a, n, _ in ledger.release_counts(**answers)] == [("alice", 2), ("bob", 1)]
    assert ledger.clear_cache("alice", prefix="a_b:") == 2
    assert ledger.cached_release("bob", "a_b:1") == "{}"  # another analyst's stays
    assert ledger.cached_release("alice", "axb:1") == "{}"
    assert ledger.clear_cache(**answers) == 3
    assert {(a, n) for a, n, _ in ledger.release_counts()} == {("alice", 2), ("bob", 1)}
    assert ledger.clear_cache() == 3
    assert ledger.release_counts() == []


def test_release_first_writer_wins_across_threads(ledger: Ledger, ledger_location: str) -> None:
    others = [Ledger(ledger_location) for _ in range(4)]
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


def test_processes_racing_charge_exactly_the_budget(ledger_location: str) -> None:
    # Each process is a proxy of its own; the store does not exist yet, so
    # they also race to create it.
    path = ledger_location
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
    assert assert_log_consistent(path) == allowed


def test_threads_racing_charge_exactly_the_budget(ledger_location: str) -> None:
    path = ledger_location
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


def test_release_first_writer_wins_across_processes(ledger_location: str) -> None:
    path = ledger_location
    jobs = [{"mode": "release", "path": str(path), "payload": f'{{"w": {i}}}'} for i in range(4)]
    stored = {r["stored"] for r in run_race(jobs)}
    assert len(stored) == 1
    with Ledger(path) as led:
        assert led.cached_release("alice", "q") == stored.pop()


def test_sigkill_never_leaves_log_and_balance_disagreeing(ledger_location: str) -> None:
    path = ledger_location
    rng = random.Random(20261121)
    cost = Cost(Fraction(1, 1000), Fraction(1, 10**12))
    budget = Cost(Fraction(10**6), Fraction(1))
    acknowledged = 0
    for round_ in range(6):
        # On PostgreSQL the child's session is named, so that its end can be awaited below
        child = f"{path}&application_name=dpsql-sigkill-{round_}" if is_postgres(path) else path
        job = {"mode": "forever", "path": str(child), "name": f"r{round_}",
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
        if is_postgres(path):
            # the server still runs a COMMIT the child sent before it died: count after it
            await_session_end(path, f"dpsql-sigkill-{round_}")

        rows = assert_log_consistent(path)
        # Every charge the child was told about survived; at most one more
        # per kill was committed but not yet reported.
        assert acknowledged <= rows <= acknowledged + 1
        with Ledger(path) as led:
            log = led.charges("alice")
            assert len(log) == rows
            eps_units, delta_units, _ = raw_spent_units(path)
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


@settings(max_examples=300, deadline=None)
@given(
    spent=st.tuples(st.integers(0, 10**13), st.integers(0, 10**13)),
    charge=st.tuples(st.integers(0, 10**13), st.integers(0, 10**13)),
    slack=st.tuples(st.integers(-2, 2), st.integers(-2, 2)),
)
def test_pure_charges_are_admitted_in_integers_exactly_as_in_rationals(
    spent: tuple[int, int], charge: tuple[int, int], slack: tuple[int, int]
) -> None:
    """A charge without rho is checked on integer quanta; it must agree with the rational
    check on the budget rounded down to the quantum, at the boundary and around it."""
    total = Units(*spent).plus(Units(*charge))
    budget = Cost(
        Fraction(max(0, total.epsilon + slack[0]), EPSILON_QUANTUM),
        Fraction(max(0, total.delta + slack[1]), DELTA_QUANTUM),
    )
    rounded = _budget_cost(budget)
    admit = _admit("alice", Cost(), Units(*charge), rounded)
    try:
        admit(Units(*spent))
        admitted = True
    except BudgetExhausted:
        admitted = False
    assert admitted == _as_cost(total).fits_within(rounded)
    limit = (max(0, total.epsilon + slack[0]), max(0, total.delta + slack[1]))
    assert admitted == (total.epsilon <= limit[0] and total.delta <= limit[1])


# -- one file, one name ------------------------------------------------------------


def test_a_ledger_with_a_second_name_is_refused(tmp_path: Path) -> None:
    """SQLite keeps its log beside the name it opened: two proxies, one per hard link,
    each counted only its own charges and together spent the budget twice (found by
    an audit). A symbolic link is the same name to SQLite and stays allowed."""
    path = tmp_path / "ledger.sqlite"
    first = Ledger(path)
    first.charge("alice", TENTH, ONE, "q0")
    os.symlink(path, tmp_path / "symlink.sqlite")
    with closing(Ledger(tmp_path / "symlink.sqlite")) as through_symlink:
        assert through_symlink.spent("alice") == TENTH
    os.link(path, tmp_path / "hardlink.sqlite")
    with pytest.raises(OperationalError, match="2 names"):
        Ledger(tmp_path / "hardlink.sqlite")
    with pytest.raises(OperationalError, match="hard links"):
        first.charge("alice", TENTH, ONE, "q1")  # open before the link: refused now
    assert first.spent("alice") == TENTH
    first.close()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_ledger_deleted_or_replaced_while_open_takes_no_more_charges(tmp_path, how) -> None:
    """The open ledger kept charging the unlinked file while a new proxy started a fresh
    one at its path: both budgets were spent (found by an audit)."""
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    ledger.charge("alice", TENTH, ONE, "q0")
    if how == "deleted":
        path.unlink()
    else:
        with closing(Ledger(tmp_path / "other.sqlite")):
            pass
        os.replace(tmp_path / "other.sqlite", path)
    with pytest.raises(OperationalError, match="deleted or replaced"):
        ledger.charge("alice", TENTH, ONE, "q1")
    ledger.close()
