"""Attacks on `dpsql serve` beyond malformed bytes: password guessing, login stalls,
TLS downgrade, trust off loopback, and resource exhaustion (connections, statement
size, parameters, query time). Each is refused with a clear error, and the server
keeps serving everyone else.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import dpsql
from dpsql.errors import InterfaceError
from dpsql.server import BackgroundServer, build
from dpsql.server.auth import Authenticator
from dpsql.server.limits import Backoff, Limits, SharedBackoff
from dpsql.server.protocol import WireServer, tls_context
from dpsql.server.statements import Backend

from .conftest import PASSWORDS, _policy, self_signed


def _connection(pums_db: Path, folder: Path) -> dpsql.Connection:
    return dpsql.connect(
        str(pums_db), policy=_policy(), analyst="alice", ledger=str(folder / "ledger.sqlite")
    )


def _server(pums_db: Path, folder: Path, limits: Limits, **options) -> BackgroundServer:
    return BackgroundServer(
        build(_connection(pums_db, folder), workers=2, limits=limits, **options)
    )


@pytest.fixture(scope="module")
def limited(pums_db, tmp_path_factory) -> Iterator[BackgroundServer]:
    limits = Limits(
        auth_timeout=2.0,
        query_timeout=1.0,
        connections_per_analyst=2,
        backoff_base=0.2,
        backoff_max=0.6,
    )
    with _server(pums_db, tmp_path_factory.mktemp("limited"), limits) as server:
        yield server


def _dsn(server: BackgroundServer, user: str = "alice", password: str | None = None) -> str:
    password = PASSWORDS.get(user, "x") if password is None else password
    return f"host=127.0.0.1 port={server.port} user={user} password='{password}'"


def _login_seconds(dsn: str) -> tuple[float, str]:
    """How long a failing login takes, and its message."""
    start = time.perf_counter()
    with pytest.raises(psycopg.OperationalError) as failed:
        psycopg.connect(dsn)
    return time.perf_counter() - start, str(failed.value)


# -- password guessing --------------------------------------------------------


@pytest.mark.parametrize("kind", [Backoff, SharedBackoff])
def test_backoff_doubles_per_failure_and_queues_concurrent_attempts(kind) -> None:
    backoff = kind(0.05, 0.2)
    assert backoff.delay("a") == 0
    for expected in (0.05, 0.1, 0.2, 0.2):  # doubling, then capped
        backoff.record("a", succeeded=False)
        assert backoff.delay("a") == expected
    assert backoff.delay("b") == 0  # per address

    async def three_at_once() -> list[float]:
        start = time.monotonic()

        async def attempt() -> float:
            await backoff.wait("a")
            return time.monotonic() - start

        return await asyncio.gather(attempt(), attempt(), attempt())

    waited = sorted(asyncio.run(three_at_once()))
    # concurrent attempts take successive slots: opening many connections does not help
    for slot, seconds in enumerate(waited, 1):
        assert 0.2 * slot - 0.01 <= seconds < 0.2 * slot + 1.0
    backoff.record("a", succeeded=True)  # 4 failures halved, not forgotten
    assert backoff.delay("a") == 0.1
    backoff.record("b", succeeded=True)  # an address without failures leaves "a" alone
    assert backoff.delay("a") == 0.1 and backoff.delay("b") == 0


def test_a_shared_backoff_entry_is_taken_over_only_by_a_failing_address() -> None:
    """SharedBackoff keeps an address in the entry its keyed hash picks; with one entry,
    every address shares it."""
    one = SharedBackoff(1.0, 1.0, remember=1)
    one.record("a", succeeded=False)
    one.record("b", succeeded=True)  # no failures of its own: "a" stays
    assert one.delay("a") == 1.0 and one.delay("b") == 0
    one.record("b", succeeded=False)  # a failing address takes the entry over
    assert one.delay("b") == 1.0 and one.delay("a") == 0


def test_backoff_remembers_a_bounded_number_of_addresses() -> None:
    small = Backoff(1.0, 1.0, remember=3)
    for address in "abcd":
        small.record(address, succeeded=False)
    assert small.delay("a") == 0 and small.delay("d") == 1.0  # bounded memory


def test_repeated_wrong_passwords_are_slowed_per_address(limited) -> None:
    times = [_login_seconds(_dsn(limited, "alice", "guess"))[0] for _ in range(3)]
    # no delay before the first guess, then 0.2 s and 0.4 s: each at least that
    assert times[1] >= 0.2 and times[2] >= 0.4 and times[2] > times[0] + 0.2
    start = time.perf_counter()
    with psycopg.connect(_dsn(limited), autocommit=True) as conn:  # the right password still works
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert time.perf_counter() - start >= 0.6  # after waiting its turn (capped)
    limited.server.backoff.record("127.0.0.1", succeeded=True)  # leave it clean
    assert limited.server.backoff.delay("127.0.0.1") == 0


def test_unknown_users_and_wrong_passwords_are_indistinguishable(pums_db, tmp_path) -> None:
    # without the back-off, which delays both alike, so the exchange itself is compared
    with _server(pums_db, tmp_path, Limits(backoff_base=0)) as server:
        known, unknown = [], []
        for _ in range(15):  # interleaved, so load on the machine hits both alike
            seconds, known_message = _login_seconds(_dsn(server, "alice", "wrong"))
            known.append(seconds)
            seconds, unknown_message = _login_seconds(_dsn(server, "mallory", "wrong"))
            unknown.append(seconds)
    assert known_message.replace("alice", "U") == unknown_message.replace("mallory", "U")
    # An unknown user refused at once would skip the SCRAM round trip and the
    # client's key derivation, a several-fold difference; the medians agree.
    fast, slow = sorted([statistics.median(known), statistics.median(unknown)])
    assert slow - fast < 0.35 * slow + 0.002, (known, unknown)


# -- login stalls, TLS, trust ---------------------------------------------------


def test_a_client_that_stalls_during_login_is_dropped(limited) -> None:
    with socket.create_connection(("127.0.0.1", limited.port), timeout=10) as sock:
        start = time.perf_counter()
        sock.sendall(struct.pack("!i", 100))  # a startup packet that never completes
        assert sock.recv(100) == b""  # closed by the server
        assert 1.9 <= time.perf_counter() - start < 6
    with psycopg.connect(_dsn(limited), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_tls_is_enforced_when_required(pums_db, tmp_path) -> None:
    with pytest.raises(InterfaceError, match="--require-tls needs a certificate"):
        build(_connection(pums_db, tmp_path), limits=Limits(require_tls=True))
    tls = tls_context(*self_signed(tmp_path))
    with _server(pums_db, tmp_path, Limits(require_tls=True), tls=tls) as server:
        with pytest.raises(psycopg.OperationalError, match="accepts only TLS"):
            psycopg.connect(_dsn(server) + " sslmode=disable")
        with psycopg.connect(_dsn(server) + " sslmode=require", autocommit=True) as conn:
            assert conn.info.pgconn.ssl_in_use
            assert conn.execute("SELECT 1").fetchone() == (1,)


def _outside_address() -> str:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 9))  # no packet is sent: this only picks a route
        address = probe.getsockname()[0]
    except OSError:
        address = ""
    finally:
        probe.close()
    if not address or address.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    return address


def test_trust_is_refused_to_clients_off_loopback(pums_db, tmp_path) -> None:
    address = _outside_address()
    backend = Backend(_connection(pums_db, tmp_path), 2)
    # what build() refuses to make: a trusting server reachable from outside
    server = WireServer(backend, Authenticator(backend.policy.analysts, {}, trust=True))
    with BackgroundServer(server, host=address) as running:
        dsn = f"host={address} port={running.port} user=alice"
        with pytest.raises(psycopg.OperationalError, match="trusts loopback clients only"):
            psycopg.connect(dsn)


# -- resource limits --------------------------------------------------------------


def test_connections_per_analyst_are_limited(limited) -> None:
    first = psycopg.connect(_dsn(limited), autocommit=True)
    second = psycopg.connect(_dsn(limited), autocommit=True)
    try:
        with pytest.raises(psycopg.OperationalError, match="too many connections for analyst"):
            psycopg.connect(_dsn(limited))
        with psycopg.connect(_dsn(limited, "bob"), autocommit=True) as other:  # per analyst
            assert other.execute("SELECT 1").fetchone() == (1,)
        second.close()
        with psycopg.connect(_dsn(limited), autocommit=True) as again:  # a slot came free
            assert again.execute("SELECT 1").fetchone() == (1,)
    finally:
        first.close()
        second.close()


def test_statement_size_and_parameter_count_are_limited(limited) -> None:
    with psycopg.connect(_dsn(limited), autocommit=True) as conn:
        with pytest.raises(psycopg.Error, match="over the limit of 1,000,000"):
            conn.execute("SELECT 1 /* " + "x" * 1_100_000 + " */")
        sql = "SELECT COUNT(*) FROM pums WHERE age IN (" + ", ".join(["%s"] * 10_001) + ")"
        with pytest.raises(psycopg.errors.TooManyArguments, match="limit of 10,000"):
            conn.execute(sql, list(range(10_001)))
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_query_over_the_timeout_is_canceled(limited) -> None:
    backend = limited.server.backend
    release = threading.Event()
    with psycopg.connect(_dsn(limited), autocommit=True) as conn:
        blockers = [backend.pool.submit(release.wait) for _ in range(2)]  # occupy both workers
        try:
            start = time.perf_counter()
            with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
                conn.execute("SELECT COUNT(*) FROM pums WHERE age > 71")
            assert 0.9 <= time.perf_counter() - start < 10
        finally:
            release.set()
            for blocker in blockers:
                blocker.result(timeout=10)
        assert conn.execute("SELECT 1").fetchone() == (1,)
