"""`dpsql serve --processes 2`: real server processes, real clients, no mocks.

* psycopg and `psql -c` are answered; a process's backend pids carry its index.
* Two analysts charging distinct queries from many connections spread over both
  processes spend exactly their budget and are refused exactly the rest: the
  budget is one, in the ledger file, whichever process charges.
* An identical statement sent through another process while the first runs
  waits for it instead of being charged again; stopped while it waits, it is
  never charged.
* Connections are balanced: 4 opened one after another land 2 and 2, every
  time; a new connection goes to the process holding the fewest, so after
  closes it goes where they were; a client that disconnects before its
  startup message, and a cancel request, are uncounted once they end.
* A cancel request reaches its statement whichever process it is handed to: a
  single cancel per statement, sent once the statement is running (the server's
  CPU says so), over eight statements; a cancel lost by a process that does not
  own the statement would leave it running until the query timeout.
* A connection the parent accepted is upgraded to TLS by its server process.
* A ledger in memory and a spark:// database are refused with what to write.
* SIGTERM to the parent ends every server process; a server process killed
  with SIGKILL makes the parent stop the other one and exit non-zero; a server
  that cannot start says why once, and the parent exits with its code.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import duckdb
import psycopg
import pytest
import yaml
from test_faults import start_serve

from dpsql import demo
from dpsql.ledger import Ledger
from dpsql.server.cancels import PID_BITS

from .conftest import self_signed

ANALYSTS = ("ann", "ben")
BUDGET = 10  # queries' worth each (1.0 epsilon a query)
SLOW = "SELECT COUNT(*) FROM slow WHERE v > 3"  # minutes, unless cancelled


def _serve(*options: str) -> tuple[subprocess.Popen, int]:
    """`dpsql serve --trust --processes 2` on a free port, and that port."""
    return start_serve("--processes", "2", *options)


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _cpu(pids: list[int]) -> float:
    """CPU seconds the processes have used (all their threads)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _gone(pids: list[int], timeout: float = 30.0) -> bool:
    """Whether every process has ended (and was reaped) within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return True
        time.sleep(0.05)
    return False


def _policy() -> dict:
    policy = dict(demo.DEMO_POLICY)
    policy["analysts"] = {
        "default": {"epsilon": 1e6, "delta": 1e-3},
        **{name: {"epsilon": float(BUDGET), "delta": 1e-3} for name in ANALYSTS},
    }
    columns = {"id": {"type": "int"}, "v": {"type": "int", "lower": 0, "upper": 100}}
    policy["tables"] = {**policy["tables"], "slow": {"columns": columns}}
    return policy


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The demo census in a DuckDB file, with a view `slow` that takes minutes to scan; the
    policy; where the ledger goes."""
    folder = tmp_path_factory.mktemp("processes")
    database, _ = demo.write_demo(folder)
    with duckdb.connect(str(database)) as connection:
        connection.execute(
            "CREATE VIEW slow AS SELECT range AS id, range % 101 AS v FROM range(1000000000000)"
        )
    policy = folder / "policy.yaml"
    policy.write_text(yaml.safe_dump(_policy()))
    return database, policy, folder / "ledger.sqlite"


@pytest.fixture(scope="module")
def served(files: tuple[Path, Path, Path]) -> Iterator[tuple[subprocess.Popen, int, Path]]:
    database, policy, ledger = files
    server, port = _serve(
        "--database", str(database), "--policy", str(policy), "--ledger", str(ledger),
        "--query-timeout", "60", "--max-connections-per-analyst", "64",
    )  # fmt: skip
    try:
        yield server, port, ledger
    finally:
        _stop(server)


def _connect(port: int, analyst: str = "default") -> psycopg.Connection:
    return psycopg.connect(f"host=127.0.0.1 port={port} user={analyst}", autocommit=True)


def test_psycopg_and_psql_are_answered(served) -> None:
    _, port, _ = served
    with _connect(port) as conn:
        assert conn.execute("SELECT COUNT(*) FROM census").fetchone()[0] > 40_000
        assert conn.info.backend_pid >> PID_BITS in (0, 1)
    result = subprocess.run(
        ["psql", "-X", "-h", "127.0.0.1", "-p", str(port), "-U", "default", "census",
         "-c", "SELECT sex, COUNT(*) FROM census GROUP BY sex ORDER BY sex"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PGCONNECT_TIMEOUT": "10"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "(2 rows)" in result.stdout and "NOTICE:  dpsql accuracy" in result.stderr


def _spread_connections(port: int, analyst: str, least: int) -> list[psycopg.Connection]:
    """At least `least` connections of `analyst`, more until both processes hold some (the
    parent hands each to the process holding fewer)."""
    connections: list[psycopg.Connection] = []
    while (
        len(connections) < least or len({c.info.backend_pid >> PID_BITS for c in connections}) < 2
    ):
        assert len(connections) < 100, "every connection went to one server process"
        connections.append(_connect(port, analyst))
    return connections


def _process(conn: psycopg.Connection) -> int:
    """The index of the server process serving `conn`."""
    return conn.info.backend_pid >> PID_BITS


def _held(port: int) -> int:
    """Connections the server has not closed on `port`: its ends, with `port` as their local
    port, in /proc/net/tcp that are connecting (SYN_RECV), established or closed by the
    client only (CLOSE_WAIT). A server process reports a connection ended to the parent
    before it closes it."""
    held = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            _, local, _, state = line.split()[:4]
            held += int(local.rsplit(":", 1)[1], 16) == port and state in ("01", "03", "08")
    return held


def _settle(port: int, held: int) -> None:
    """Wait until the server holds exactly `held` connections on `port`."""
    deadline = time.monotonic() + 30
    while _held(port) != held:
        assert time.monotonic() < deadline, f"the server holds {_held(port)}, not {held}"
        time.sleep(0.01)


def _assert_balanced(port: int) -> None:
    """With no connection open, 4 opened one after another land 2 and 2."""
    _settle(port, 0)
    connections = [_connect(port) for _ in range(4)]
    try:
        assert sorted(_process(c) for c in connections) == [0, 0, 1, 1]
    finally:
        for conn in connections:
            conn.close()


def test_connections_one_after_another_land_two_and_two(served) -> None:
    _, port, _ = served
    for _ in range(5):
        _assert_balanced(port)


def test_a_new_connection_goes_where_connections_closed(served) -> None:
    """Of 4 connections (2 and 2), both of one process's are closed: the next 2 go there."""
    _, port, _ = served
    for process in (0, 1, 0, 1):
        _settle(port, 0)
        connections = [_connect(port) for _ in range(4)]
        try:
            closing = [c for c in connections if _process(c) == process]
            assert len(closing) == 2
            for conn in closing:
                conn.close()
            _settle(port, 2)
            connections += [_connect(port) for _ in range(2)]
            assert [_process(c) for c in connections[4:]] == [process, process]
        finally:
            for conn in connections:
                conn.close()


def test_vanished_clients_and_cancel_requests_are_uncounted(served) -> None:
    """While one connection is open in process 0, every short connection goes to process 1:
    three that close before their startup message and two cancel requests. Were any
    left counted, 4 new connections would not land 2 and 2."""
    _, port, _ = served
    _settle(port, 0)
    with _connect(port) as kept:
        assert _process(kept) == 0
        for _ in range(3):
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
            _settle(port, 1)
        for _ in range(2):
            kept.cancel()  # nothing runs: the request is applied to nothing
            _settle(port, 1)
        assert kept.execute("SELECT 1").fetchone() == (1,)
    _assert_balanced(port)


def test_a_handed_over_connection_is_upgraded_to_tls(tmp_path: Path) -> None:
    """The server processes take the server's side of a TLS handshake on connections the
    parent accepted."""
    cert, key = self_signed(tmp_path)
    server, port = _serve(
        "--demo", "--ledger", str(tmp_path / "ledger.sqlite"),
        "--tls-cert", cert, "--tls-key", key, "--require-tls",
    )  # fmt: skip
    dsn = f"host=127.0.0.1 port={port} user=default sslmode=require"
    try:
        with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
            assert {_process(first), _process(second)} == {0, 1}
            for conn in (first, second):
                assert conn.info.pgconn.ssl_in_use
                assert conn.execute("SELECT COUNT(*) FROM census").fetchone()[0] > 40_000
    finally:
        _stop(server)


def test_an_analyst_s_connection_limit_holds_across_processes(tmp_path: Path) -> None:
    """--max-connections-per-analyst is the server's limit, not each process's: with a limit
    of 2, two connections on two processes leave no room for a third on either (each
    process counted its own, so an analyst could hold N times the limit)."""
    server, port = _serve(
        "--demo", "--ledger", str(tmp_path / "ledger.sqlite"),
        "--max-connections-per-analyst", "2",
    )  # fmt: skip
    try:
        with _connect(port) as first, _connect(port) as second:
            assert {_process(first), _process(second)} == {0, 1}
            with pytest.raises(psycopg.OperationalError, match="too many connections"):
                _connect(port).close()
        _settle(port, 0)  # each process counts a connection out before it closes it
        with _connect(port) as again, _connect(port) as more:  # both were counted out
            assert again.execute("SELECT 1").fetchone() == more.execute("SELECT 1").fetchone()
    finally:
        _stop(server)


def test_failed_logins_slow_an_address_in_every_process(tmp_path: Path) -> None:
    """The back-off after failed passwords is the server's: failures seen by one process
    delay the address's next attempt in the other (each kept its own, so a guesser
    spread over N processes got N tries per delay)."""
    users = tmp_path / "users.txt"
    subprocess.run(
        [sys.executable, "-m", "dpsql.cli", "passwd", "default", "--users", str(users),
         "--password-stdin"], input="right\n", text=True, check=True, timeout=60,
    )  # fmt: skip
    server = subprocess.Popen(
        [sys.executable, "-m", "dpsql.cli", "serve", "--demo", "--processes", "2", "--port", "0",
         "--users", str(users), "--ledger", str(tmp_path / "ledger.sqlite")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = server.stdout.readline()
        assert "listening on" in line, line + server.stderr.read()
        port = int(line.rsplit(":", 1)[1])
        dsn = f"host=127.0.0.1 port={port} user=default password="

        def guess(held: int) -> float:
            """A wrong password's seconds, once the server is back to `held` connections
            (so the parent has counted the failed one's end before the next comes)."""
            start = time.monotonic()
            with pytest.raises(psycopg.OperationalError, match="password authentication"):
                psycopg.connect(dsn + "wrong")
            took = time.monotonic() - start
            _settle(port, held)
            return took

        with psycopg.connect(dsn + "right") as first:  # process 0: the next go to 1
            assert _process(first) == 0
            guess(1), guess(1)  # both on process 1: the address has 2 failures
            with psycopg.connect(dsn + "right") as second:  # waits its turn; 2 -> 1 failure
                assert _process(second) == 1
                # a tie: process 0, which has seen no failure of this address itself
                assert guess(2) >= 0.25  # the 0.25 s a first failure costs (0.0 before)
    finally:
        _stop(server)


def _charges(ledger: Path, analyst: str = "default") -> int:
    with Ledger(ledger) as book:
        return len(book.charges(analyst))


def _running(children: list[int], before: float) -> None:
    """Wait until the server processes have used half a second of CPU since `before`: a
    slow statement is running, not on its way."""
    deadline = time.monotonic() + 60
    while _cpu(children) - before < 0.5 and time.monotonic() < deadline:
        time.sleep(0.02)


def _in_thread(conn: psycopg.Connection, sql: str) -> tuple[threading.Thread, list]:
    """Send `sql` on `conn` from a thread: the thread, and a list that gets its error."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            conn.execute(sql)
        except psycopg.Error as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_one_budget_across_processes(served) -> None:
    """24 distinct charged queries per analyst at once against a budget of 10: exactly 10
    answered and 14 refused (53000), and the ledger holds exactly 10 charges."""
    _, port, ledger = served
    outcomes: dict[str, list[str]] = {name: [] for name in ANALYSTS}
    lock = threading.Lock()

    def client(analyst: str, conn: psycopg.Connection, number: int) -> None:
        for q in range(3):
            sql = f"SELECT COUNT(*) FROM census WHERE income > {number * 10 + q}"
            try:
                conn.execute(sql).fetchall()
                outcome = "answered"
            except psycopg.errors.InsufficientResources:
                outcome = "refused"
            with lock:
                outcomes[analyst].append(outcome)

    connections = {name: _spread_connections(port, name, 8) for name in ANALYSTS}
    threads = [
        threading.Thread(target=client, args=(name, conn, number))
        for name, conns in connections.items()
        for number, conn in enumerate(conns)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        for conns in connections.values():
            for conn in conns:
                conn.close()
    with Ledger(ledger) as book:
        for name in ANALYSTS:
            sent = 3 * len(connections[name])
            assert outcomes[name].count("answered") == BUDGET, outcomes[name]
            assert outcomes[name].count("refused") == sent - BUDGET
            assert book.spent(name).epsilon == Fraction(BUDGET)


def test_a_cancel_reaches_its_statement_in_any_process(served) -> None:
    """Each statement gets one cancel request, sent once it runs; eight statements on new
    connections, each cancel on a connection of its own, which the parent hands to the
    process holding fewer: not the statement's, so broken routing would leave it running."""
    server, port, _ = served
    children = _children(server.pid)
    for _ in range(8):
        with _connect(port) as conn:
            before = _cpu(children)
            runner, outcome = _in_thread(conn, SLOW)
            # a cancel between statements is ignored, as in PostgreSQL
            _running(children, before)
            conn.cancel()
            runner.join(timeout=90)
            assert not runner.is_alive()
            assert isinstance(outcome[0], psycopg.errors.QueryCanceled)
            assert "due to user request" in str(outcome[0])  # not the query timeout
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_an_identical_statement_in_another_process_waits_uncharged(served) -> None:
    """A client retrying a statement through another process while the first still runs
    (a dropped connection, say) is not charged a second time: it waits for the first.
    Stopped while it waits, it never runs and is never charged."""
    server, port, ledger = served
    children = _children(server.pid)
    sql = "SELECT COUNT(*) FROM slow WHERE v > 7"  # minutes, unless cancelled
    connections = _spread_connections(port, "default", 2)
    try:
        first = connections[0]
        second = next(
            c
            for c in connections
            if c.info.backend_pid >> PID_BITS != first.info.backend_pid >> PID_BITS
        )
        charged = _charges(ledger)
        before = _cpu(children)
        first_thread, first_outcome = _in_thread(first, sql)
        _running(children, before)
        assert _charges(ledger) == charged + 1
        second_thread, second_outcome = _in_thread(second, sql)
        time.sleep(1.0)  # far longer than a charge takes
        assert _charges(ledger) == charged + 1, "charged again while the first one ran"
        second.cancel()
        second_thread.join(timeout=60)
        assert isinstance(second_outcome[0], psycopg.errors.QueryCanceled)
        first.cancel()
        first_thread.join(timeout=60)
        assert isinstance(first_outcome[0], psycopg.errors.QueryCanceled)
        # the second's worker now gets the claim, and must give up without a charge
        time.sleep(1.0)
        assert _charges(ledger) == charged + 1, "a statement stopped while it waited was charged"
        for conn in (first, second):
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        for conn in connections:
            conn.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--demo", "--ledger", ":memory:"], "':memory:' is in memory"),
        (["--demo", "--ledger", "file:budget?mode=memory"], "is in memory"),
        (["--demo", "--ledger", "sqlite:///:memory:"], "is in memory"),
        (["--database", ":memory:", "--policy", "POLICY"], "':memory:' is in memory"),
        (["--database", "spark://local[2]", "--policy", "POLICY", "--ledger", "l.sqlite"],
         "Spark Connect (--database sc://"),
    ],
)  # fmt: skip
def test_unshareable_setups_are_refused(options, message, files, capsys) -> None:
    from dpsql.cli import main

    options = [str(files[1]) if option == "POLICY" else option for option in options]
    with pytest.raises(SystemExit, match=r"--processes 2 .*; .*--processes 1") as refused:
        main(["serve", "--processes", "2", *options])
    assert message in str(refused.value.code)


@pytest.mark.parametrize("count", ["0", "65", "two"])
def test_processes_is_checked_like_the_other_options(count, capsys) -> None:
    from dpsql.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", "--demo", "--processes", count])
    assert exited.value.code == 2
    assert "argument --processes:" in capsys.readouterr().err


def test_sigterm_to_the_parent_ends_every_process(tmp_path: Path) -> None:
    server, port = _serve("--demo", "--ledger", str(tmp_path / "ledger.sqlite"))
    try:
        children = _children(server.pid)
        assert len(children) == 2
        with _connect(port) as conn:  # each process built the demo table itself
            assert conn.execute("SELECT COUNT(*) FROM census").fetchone()[0] > 40_000
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
        assert _gone(children)
        out, err = server.communicate(timeout=10)
        assert "listening on" not in out  # said once, before: the first line
        assert err == ""
    finally:
        _stop(server)


def test_a_killed_process_stops_the_server(tmp_path: Path) -> None:
    server, _ = _serve("--demo", "--ledger", str(tmp_path / "ledger.sqlite"))
    try:
        children = _children(server.pid)
        os.kill(children[0], signal.SIGKILL)
        assert server.wait(timeout=60) != 0
        assert _gone(children)
        err = server.stderr.read()
        assert re.search(rf"server process [01] \(pid {children[0]}\) was killed by signal 9", err)
    finally:
        _stop(server)


def test_a_server_that_cannot_start_says_why_once(files, tmp_path: Path) -> None:
    _, policy, _ = files
    result = subprocess.run(
        [sys.executable, "-m", "dpsql.cli", "serve", "--trust", "--port", "0",
         "--processes", "2", "--database", str(tmp_path / "absent.duckdb"), "--policy",
         str(policy), "--ledger", str(tmp_path / "ledger.sqlite")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.count("cannot open DuckDB database") == 1, result.stderr
