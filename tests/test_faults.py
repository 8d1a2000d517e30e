"""Faults under load: the proxy killed mid-query, a ledger that can no longer be written,
and the backend database restarted.

* `dpsql serve` is SIGKILLed while clients run distinct private queries; after a
  restart on the same ledger, every answer a client received is in the release
  cache (the repeat returns it, identical and free) and charged, and the log
  is intact. Charges whose answers never arrived are allowed: budget lost,
  never privacy.
* A full disk for the ledger (SQLite's page limit, which fails a write with
  SQLITE_FULL exactly as a full disk does): queries are refused with an error
  and never answered uncharged.
* PostgreSQL restarted (pg_ctl restart -m fast, a cluster of the test's own)
  while wire clients run distinct queries: a query the restart hits fails with
  58000 saying the connection was lost and to retry; dpsql reconnects by itself
  (queries after the restart are answered without restarting it); and the
  ledger holds exactly one charge per answered or failed query: a failed
  query's charge is lost budget, counted, never a second charge.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import yaml
from conftest import pums_policy
from test_ledger import assert_log_consistent

import dpsql
from dpsql.errors import OperationalError
from dpsql.ledger import Ledger
from dpsql.server import BackgroundServer, build

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def serve_process(
    database: Path | str, policy: Path, ledger: Path, *options: str
) -> tuple[subprocess.Popen, int]:
    """`dpsql serve --trust` as a process on a free port, with more command-line `options`."""
    return start_serve(
        "--database", str(database), "--policy", str(policy), "--ledger", str(ledger), *options
    )


def start_serve(*options: str) -> tuple[subprocess.Popen, int]:
    """`dpsql serve --trust --port 0` with `options`, once it listens, and its port."""
    server = subprocess.Popen(
        [sys.executable, "-m", "dpsql.cli", "serve", "--trust", "--port", "0", *options],
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
    server, port = serve_process(database, policy, ledger)
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
    server, port = serve_process(database, policy, ledger)
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


# -- the backend database restarted under load -----------------------------------------


class Cluster:
    """A PostgreSQL cluster of the test's own (initdb, pg_ctl) in a temporary directory."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.data = folder / "data"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *command: str) -> None:
        # initdb and pg_ctl refuse to run as root: run them as the postgres user then
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *command], check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "--no-sync")  # fmt: skip

    def pg_ctl(self, *action: str) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.folder / "log"),
                  "-o", options, "-w", "-t", "60", *action)  # fmt: skip


@pytest.fixture()
def cluster() -> Iterator[Cluster]:
    if not (PG_BIN / "pg_ctl").exists():
        pytest.skip(f"no PostgreSQL binaries in {PG_BIN}")
    folder = Path(tempfile.mkdtemp(prefix="dpsql-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    server = Cluster(folder)
    try:
        server.init()
        server.pg_ctl("start")
    except (subprocess.CalledProcessError, LookupError) as exc:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"cannot start a PostgreSQL cluster of the test's own: {exc}")
    try:
        yield server
    finally:
        server.pg_ctl("stop", "-m", "immediate")
        shutil.rmtree(folder, ignore_errors=True)


class Record:
    """What the clients saw: answers, and the errors of failed queries, before and after."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answered: list[float] = []  # when each answer arrived
        self.failed: list[psycopg.Error] = []


def _restart_client(port: int, worker: int, record: Record, stop: threading.Event) -> None:
    with psycopg.connect(f"host=127.0.0.1 port={port} user=default", autocommit=True) as conn:
        for i in range(100_000):
            if stop.is_set():
                return
            sql = f"SELECT COUNT(*) FROM people WHERE age > {i % 90} AND income > {worker}{i}"
            try:
                conn.execute(sql).fetchone()
            except psycopg.Error as error:
                with record.lock:
                    record.failed.append(error)
                continue
            with record.lock:
                record.answered.append(time.monotonic())


def test_a_backend_restart_under_load_fails_cleanly_reconnects_and_charges_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    with psycopg.connect(cluster.url, autocommit=True) as admin:
        admin.execute(
            "CREATE TABLE people AS SELECT g AS id, g % 90 AS age, (g * 37) % 100000 AS income "
            "FROM generate_series(1, 20000) g"
        )
    policy = {
        "version": 1,
        "defaults": {"epsilon_per_query": 1.0, "delta": 1e-6},
        "analysts": {"default": {"epsilon": 1e6, "delta": 1e-3}},
        "tables": {"people": {"columns": {
            "age": {"type": "int", "lower": 0, "upper": 100},
            "income": {"type": "int", "lower": 0, "upper": 100000},
        }}},
    }  # fmt: skip
    ledger = tmp_path / "ledger.sqlite"
    connection = dpsql.connect(cluster.url, policy=policy, ledger=ledger)
    record, stop = Record(), threading.Event()
    with BackgroundServer(build(connection, trust=True, workers=4)) as served:
        clients = [
            threading.Thread(target=_restart_client, args=(served.port, w, record, stop))
            for w in range(1, 5)
        ]
        for client in clients:
            client.start()
        try:
            deadline = time.monotonic() + 60
            while len(record.answered) < 40 and time.monotonic() < deadline:
                time.sleep(0.05)
            cluster.pg_ctl("restart", "-m", "fast")  # clients keep sending meanwhile
            restarted = time.monotonic()
            while sum(t > restarted for t in record.answered) < 40 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            for client in clients:
                client.join(timeout=60)
    answered, failed = len(record.answered), len(record.failed)
    assert sum(t > restarted for t in record.answered) >= 40, "no reconnect after the restart"
    for error in record.failed:  # clean: what happened and what to do, nothing else
        assert isinstance(error, psycopg.OperationalError) and error.sqlstate == "58000", error
        assert "connection to PostgreSQL" in str(error) and "retry" in str(error), error
    # one charge per query that reached the database, answered or not: a failed
    # query's charge is budget lost (the safe direction), never charged twice
    assert assert_log_consistent(str(ledger)) == answered + failed
    with Ledger(ledger) as book:
        assert book.spent("default").epsilon == answered + failed
