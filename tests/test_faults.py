"""Faults under load: the proxy killed mid-query, and a ledger that can no longer be written.

* `dpsql serve` is SIGKILLed while clients run distinct private queries; after a
  restart on the same ledger, every answer a client received is in the release
  cache (the repeat returns it, identical and free) and charged, and the log
  is intact. Charges whose answers never arrived are allowed: budget lost,
  never privacy.
* A full disk for the ledger (SQLite's page limit, which fails a write with
  SQLITE_FULL exactly as a full disk does): queries are refused with an error
  and never answered uncharged.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import yaml
from conftest import pums_policy
from test_ledger import assert_log_consistent

import dpsql
from dpsql.errors import OperationalError
from dpsql.ledger import Ledger


def _serve(database: Path, policy: Path, ledger: Path) -> tuple[subprocess.Popen, int]:
    server = subprocess.Popen(
        [sys.executable, "-m", "dpsql.cli", "serve", "--database", str(database),
         "--policy", str(policy), "--ledger", str(ledger), "--trust", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = server.stdout.readline()
    if "listening on" not in line:
        server.kill()
        raise AssertionError(f"dpsql serve did not start: {line}{server.stderr.read()}")
    return server, int(line.rsplit(":", 1)[1])


def _client(port: int, worker: int, answered: dict, stop: threading.Event) -> None:
    """Distinct queries until the server dies; record each answer received."""
    try:
        with psycopg.connect(f"host=127.0.0.1 port={port} user=default", autocommit=True) as conn:
            for i in range(10_000):
                if stop.is_set():
                    return
                sql = f"SELECT COUNT(*) FROM pums WHERE age > {i % 90} AND income > {worker}{i}"
                answered[sql] = conn.execute(sql).fetchone()[0]
    except psycopg.Error:
        return  # the server was killed


def test_sigkill_under_load_loses_no_charge_and_no_answer(pums_db: Path, tmp_path: Path) -> None:
    database = tmp_path / "pums.duckdb"
    shutil.copy(pums_db, database)  # the server process opens it; the test session may too
    policy, ledger = tmp_path / "policy.yaml", tmp_path / "ledger.sqlite"
    policy.write_text(yaml.safe_dump(pums_policy(analysts={"default": {"epsilon": 1e6}})))
    server, port = _serve(database, policy, ledger)
    answered: dict[str, int] = {}
    stop = threading.Event()
    clients = [
        threading.Thread(target=_client, args=(port, w, answered, stop)) for w in range(1, 5)
    ]
    try:
        for client in clients:
            client.start()
        deadline = time.monotonic() + 30
        while len(answered) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        server.send_signal(signal.SIGKILL)  # mid-flight: queries are in every stage
        server.wait(timeout=30)
    finally:
        stop.set()
        server.kill()
        for client in clients:
            client.join(timeout=30)
    assert len(answered) >= 40, "the load did not get going"
    charges = assert_log_consistent(str(ledger))
    assert charges >= len(answered)  # no answer without its charge
    server, port = _serve(database, policy, ledger)
    try:
        with psycopg.connect(f"host=127.0.0.1 port={port} user=default", autocommit=True) as conn:
            for sql, value in answered.items():  # the cached release is what the client got
                assert conn.execute(sql).fetchone()[0] == value
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    # the repeats were free: not one charge more
    assert assert_log_consistent(str(ledger)) == charges
    with Ledger(ledger) as book:
        assert book.spent("default").epsilon == charges  # 1.0 each


def test_a_full_ledger_disk_refuses_queries_instead_of_answering_uncharged(
    pums_db: Path, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.sqlite"
    connection = dpsql.connect(pums_db, policy=pums_policy(), ledger=ledger)
    with connection:
        cursor = connection.cursor()
        cursor.execute("SELECT COUNT(*) FROM pums")
        store = connection.session.ledger._store
        (pages,) = store._conn.execute("PRAGMA page_count").fetchone()
        # the file may grow by no page: the next new row needs one, sooner or later
        store._conn.execute(f"PRAGMA max_page_count = {pages}")
        answered = refused = 0
        for i in range(400):
            try:
                cursor.execute(f"SELECT COUNT(*) FROM pums WHERE age > {i % 90} AND educ > {i}")
                cursor.fetchall()
                answered += 1
            except OperationalError as error:
                assert "full" in str(error)
                refused += 1
                if refused == 5:
                    break
        assert refused == 5, "the ledger never filled up"
        spent = connection.session.ledger.spent("default").epsilon
        assert spent >= 1 + answered  # every answer charged (a charge may lack its answer)
        store._conn.execute("PRAGMA max_page_count = 1073741823")  # space again: it recovers
        cursor.execute("SELECT SUM(age) FROM pums")
    assert assert_log_consistent(str(ledger)) == int(spent) + 1
