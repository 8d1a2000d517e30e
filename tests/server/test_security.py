"""Authentication, budgets, cancel, concurrency and hostile input against the wire server."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading

import psycopg
import pytest

import dpsql
from dpsql.errors import InterfaceError
from dpsql.server import BackgroundServer, build
from dpsql.server.auth import read_users
from tests.conftest import cancelling

from .conftest import PASSWORDS, _policy, self_signed


def _count(served, analyst: str = "alice", sql: str = "SELECT COUNT(*) FROM pums") -> int:
    with psycopg.connect(served.dsn(analyst), autocommit=True) as conn:
        return conn.execute(sql).fetchone()[0]


def test_wrong_password_and_unknown_user_look_alike(duck) -> None:
    errors = []
    for user, password in (("alice", "wrong"), ("mallory", "wrong"), ("default", "wrong")):
        with pytest.raises(psycopg.OperationalError) as failed:
            psycopg.connect(f"host=127.0.0.1 port={duck.port} user={user} password='{password}'")
        errors.append(str(failed.value).replace(user, "USER"))
    assert "password authentication failed" in errors[0]
    assert errors[0] == errors[1] == errors[2]
    assert _count(duck) > 0  # the server is unaffected


def test_budget_exhaustion_is_sqlstate_53000(duck) -> None:
    with psycopg.connect(duck.dsn("bob"), autocommit=True) as conn:
        for age in (20, 30, 40):
            conn.execute(f"SELECT COUNT(*) FROM pums WHERE age > {age}")
        with pytest.raises(psycopg.errors.InsufficientResources, match="budget exhausted") as e:
            conn.execute("SELECT COUNT(*) FROM pums WHERE age > 50")
        assert e.value.sqlstate == "53000"
        assert conn.execute("SELECT COUNT(*) FROM pums WHERE age > 20").fetchone()  # cached: free
    assert duck.spent("bob") == pytest.approx(3.0)


def test_cancel_while_waiting_charges_nothing(duck) -> None:
    backend = duck.server.server.backend
    release = threading.Event()
    before = duck.spent("alice")
    with psycopg.connect(duck.dsn(), autocommit=True) as conn:
        # occupy both workers; bounded, so a missed cancel fails the test instead of hanging it
        blockers = [backend.pool.submit(release.wait, 60) for _ in range(2)]
        try:
            with cancelling(conn, 0.3), pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute("SELECT COUNT(*) FROM pums WHERE age > 61")
            release.set()
            assert conn.execute("SELECT 1").fetchone() == (1,)  # ReadyForQuery came back
        finally:
            release.set()
            for blocker in blockers:
                blocker.result(timeout=10)
    assert duck.spent("alice") == before


def test_concurrent_clients_are_charged_exactly(duck) -> None:
    answered, lock = [], threading.Lock()

    def client(worker: int) -> None:
        with psycopg.connect(duck.dsn("carol"), autocommit=True) as conn:
            for i in range(5):
                sql = f"SELECT COUNT(*) FROM pums WHERE age > {worker * 5 + i}"
                if worker % 3 == 0 and i == 2:
                    sql = "SELECT age FROM pums"  # refused: not charged
                try:
                    conn.execute(sql).fetchall()
                except psycopg.errors.InsufficientPrivilege:
                    continue
                with lock:
                    answered.append(sql)

    threads = [threading.Thread(target=client, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(answered) == 40 - 3
    assert duck.spent("carol") == pytest.approx(len(answered) * 1.0)


def _raw(served) -> socket.socket:
    return socket.create_connection(("127.0.0.1", served.port), timeout=10)


def _startup(version: int = 196608, user: str = "alice") -> bytes:
    body = (
        struct.pack("!i", version) + b"user\x00" + user.encode() + b"\x00database\x00pums\x00\x00"
    )
    return struct.pack("!i", len(body) + 4) + body


def _read_until(sock: socket.socket, tag: bytes) -> list[tuple[bytes, bytes]]:
    """Messages up to and including the first with `tag` (or until the server closes)."""
    messages, buffer = [], b""
    while True:
        while len(buffer) >= 5:
            length = struct.unpack("!i", buffer[1:5])[0]
            if len(buffer) < length + 1:
                break
            messages.append((buffer[:1], buffer[5 : length + 1]))
            buffer = buffer[length + 1 :]
            if messages[-1][0] == tag:
                return messages
        chunk = sock.recv(65536)
        if not chunk:
            return messages
        buffer += chunk


def _message(tag: bytes, body: bytes) -> bytes:
    return tag + struct.pack("!i", len(body) + 4) + body


def _sqlstate(body: bytes) -> str:
    fields = dict((f[:1], f[1:]) for f in body.split(b"\x00") if f)
    return fields[b"C"].decode()


def test_hostile_input(trusted) -> None:
    # truncated startup packet, then a client that just goes away
    with _raw(trusted) as sock:
        sock.sendall(b"\x00\x00")
    # unsupported protocol version 2.0
    with _raw(trusted) as sock:
        sock.sendall(_startup(version=2 << 16))
        (tag, body), *_ = _read_until(sock, b"E")
        assert tag == b"E" and _sqlstate(body) == "0A000"
    # an oversized startup packet
    with _raw(trusted) as sock:
        sock.sendall(struct.pack("!ii", 1 << 30, 196608))
        assert _sqlstate(_read_until(sock, b"E")[-1][1]) == "08P01"
    with _raw(trusted) as sock:
        sock.sendall(_startup())
        assert _read_until(sock, b"Z")[-1] == (b"Z", b"I")
        # a malformed Bind: an error, skip to Sync, and the connection lives on
        sock.sendall(_message(b"B", b"\x00\x00\xff") + _message(b"E", b"\x00\x00\x00\x00\x00"))
        sock.sendall(_message(b"S", b""))
        replies = _read_until(sock, b"Z")
        assert [t for t, _ in replies] == [b"E", b"Z"] and _sqlstate(replies[0][1]) == "08P01"
        # a $n beyond the parameter limit: refused at Parse, before a type is kept for
        # each number (a $20000000 held 150 MB and blocked every client for a second)
        sock.sendall(_message(b"P", b"\x00SELECT COUNT(*) FROM pums WHERE age > $20000000\x00"
                              b"\x00\x00") + _message(b"S", b""))  # fmt: skip
        replies = _read_until(sock, b"Z")
        assert [t for t, _ in replies] == [b"E", b"Z"] and _sqlstate(replies[0][1]) == "54023"
        # a text parameter that is not UTF-8, and a binary int8 of 3 bytes: errors, not a
        # dropped connection
        parse = b"s1\x00SELECT COUNT(*) FROM pums WHERE age > $1\x00\x00\x01\x00\x00\x00\x14"
        for formats, value, state in (
            (b"\x00\x00", b"\xff\xfe", "22021"),
            (b"\x00\x01\x00\x01", b"\x00\x00\x01", "22P03"),
        ):
            bind = b"\x00s1\x00" + formats + b"\x00\x01" + struct.pack("!i", len(value)) + value
            sock.sendall(_message(b"P", parse) + _message(b"B", bind + b"\x00\x00")
                         + _message(b"S", b""))  # fmt: skip
            replies = _read_until(sock, b"Z")
            assert _sqlstate(next(body for tag, body in replies if tag == b"E")) == state
        # an unknown message type
        sock.sendall(_message(b"!", b"") + _message(b"S", b""))
        assert _sqlstate(_read_until(sock, b"Z")[0][1]) == "0A000"
        # an oversized message ends only this connection
        sock.sendall(b"Q" + struct.pack("!i", 1 << 30))
        assert _sqlstate(_read_until(sock, b"E")[-1][1]) == "08P01"
    assert _count(trusted) > 0


def test_client_vanishing_mid_query_loses_only_its_answer(trusted) -> None:
    sql = "SELECT COUNT(*) FROM pums WHERE age > 33"
    before = trusted.spent("alice")
    with _raw(trusted) as sock:
        sock.sendall(_startup())
        _read_until(sock, b"Z")
        sock.sendall(_message(b"Q", sql.encode() + b"\x00"))
    # the charge happened once; the answer waits in the release cache, free
    _count(trusted, sql=sql)
    _count(trusted, sql=sql)
    assert trusted.spent("alice") == pytest.approx(before + 1.0)


def test_trust_needs_loopback_and_fixed_seeds_are_refused(pums_db, tmp_path) -> None:
    connection = dpsql.connect(str(pums_db), policy=_policy(), analyst="alice",
                               ledger=str(tmp_path / "l.sqlite"))  # fmt: skip
    with pytest.raises(InterfaceError, match="--trust"):
        build(connection, host="0.0.0.0", trust=True)
    seeded = dpsql.connect(str(pums_db), policy=_policy(), analyst="alice", seed=1,
                           ledger=str(tmp_path / "l.sqlite"))  # fmt: skip
    with pytest.raises(InterfaceError, match="fixed seed"):
        build(seeded)
    connection.close()
    seeded.close()


def test_passwd_users_file_and_tls(pums_db, tmp_path) -> None:
    users = tmp_path / "users.txt"
    subprocess.run(
        [sys.executable, "-m", "dpsql.cli", "passwd", "default", "--users", str(users),
         "--password-stdin"], input="s3cret pass\n", text=True, check=True, timeout=60,
    )  # fmt: skip
    assert list(read_users(users)) == ["default"] and "s3cret" not in users.read_text()
    assert users.stat().st_mode & 0o077 == 0
    # a newline in the name split the file into two entries, another analyst's among them
    refused = subprocess.run(
        [sys.executable, "-m", "dpsql.cli", "passwd", "a\nb", "--users", str(users),
         "--password-stdin"], input="pw\n", text=True, capture_output=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode != 0 and "control characters" in refused.stderr
    assert list(read_users(users)) == ["default"]
    cert, key = self_signed(tmp_path)
    from dpsql.server.protocol import tls_context

    connection = dpsql.connect(str(pums_db), policy=_policy(), analyst="alice",
                               ledger=str(tmp_path / "l.sqlite"))  # fmt: skip
    server = build(connection, users=read_users(users), tls=tls_context(cert, key))
    with BackgroundServer(server) as running:
        dsn = f"host=127.0.0.1 port={running.port} user=default password='s3cret pass'"
        with psycopg.connect(dsn + " sslmode=require", autocommit=True) as conn:
            assert conn.info.pgconn.ssl_in_use
            assert conn.execute("SELECT COUNT(*) FROM pums").fetchone()[0] > 0
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(dsn.replace("s3cret pass", PASSWORDS["alice"]))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--port", "99999"], "argument --port: must be at least 0 and at most 65535"),
        (["--port", "x"], "argument --port: expected a whole number, got 'x'"),
        (["--workers", "0"], "argument --workers: must be at least 1, got 0"),
        (["--query-timeout", "nan"], "argument --query-timeout: must be at least 0, got nan"),
        (["--auth-timeout", "inf"], "argument --auth-timeout: must be at least 0.001, got inf"),
        (["--max-connections-per-analyst", "-5"], "must be at least 1, got -5"),
    ],
)
def test_serve_refuses_bad_options_with_what_to_give(options, message, capsys) -> None:
    from dpsql.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", "--demo", *options])
    assert exited.value.code == 2  # argparse's usage error, before anything is opened
    assert message in capsys.readouterr().err


def test_serve_says_why_it_cannot_listen_or_load_its_certificate(tmp_path) -> None:
    from dpsql.cli import main

    ledger = ["--ledger", str(tmp_path / "l.sqlite")]
    with pytest.raises(SystemExit, match=r"cannot use --tls-cert .*No such file"):
        main(["serve", "--demo", *ledger, "--tls-cert", "/absent.pem", "--tls-key", "/absent.key"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        with pytest.raises(SystemExit, match=rf"cannot listen on 127\.0\.0\.1:{port}: .*--port"):
            main(["serve", "--demo", *ledger, "--port", port])
    with pytest.raises(SystemExit, match=r"cannot listen on no\.such\.host\.invalid"):
        main(["serve", "--demo", *ledger, "--host", "no.such.host.invalid"])
