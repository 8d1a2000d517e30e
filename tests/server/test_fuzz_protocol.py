"""Protocol fuzzing of `dpsql serve` over raw sockets (Hypothesis).

Random and mutated frontend traffic: startup packets of every kind (wrong
lengths and versions, SSLRequest and GSSENCRequest repeated or late, cancel
requests, huge parameter lists) and, after a valid login, sequences of
messages with wrong lengths, unknown types, truncated bodies and Parse, Bind,
Describe, Execute and Close in any order. The property: the server answers
with well-formed messages (every error with a SQLSTATE) and ends or keeps only
that connection; a connection opened before the fuzzing keeps working
throughout, and afterwards no connection, task or per-analyst count is left
behind (memory stays bounded).

Examples per test: 40 in CI; set DPSQL_FUZZ_EXAMPLES for a longer run.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpsql
from dpsql.server import BackgroundServer, build
from dpsql.server.limits import Limits

from .conftest import _policy

EXAMPLES = int(os.environ.get("DPSQL_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize="DPSQL_FUZZ_EXAMPLES" not in os.environ,  # CI: the same examples every run
)
SSL, GSSENC, CANCEL, V3 = 80877103, 80877104, 80877102, 3 << 16
# Every message type a backend may send (protocol 3.0).
BACKEND_TAGS = set(b"RKS12C3DIEnNtsZTvc") | set(b"AGHWd")


@pytest.fixture(scope="module")
def fuzzed(pums_db, tmp_path_factory) -> Iterator[BackgroundServer]:
    """A trust server on loopback with a short login deadline, so stalled startups end."""
    connection = dpsql.connect(
        str(pums_db),
        policy=_policy(),
        analyst="alice",
        ledger=str(tmp_path_factory.mktemp("fuzz") / "ledger.sqlite"),
    )
    limits = Limits(auth_timeout=2.0, statements_per_connection=50)
    with BackgroundServer(build(connection, trust=True, workers=2, limits=limits)) as server:
        yield server


@pytest.fixture(scope="module")
def bystander(fuzzed) -> Iterator[psycopg.Connection]:
    """A client connected before the fuzzing that must keep working throughout."""
    dsn = f"host=127.0.0.1 port={fuzzed.port} user=carol"
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


def _message(tag: bytes, body: bytes, length_error: int = 0) -> bytes:
    return tag + struct.pack("!i", len(body) + 4 + length_error) + body


def _packet(code: int, body: bytes, length_error: int = 0) -> bytes:
    return struct.pack("!ii", len(body) + 8 + length_error, code) + body


def _cstr(text: str) -> bytes:
    return text.encode() + b"\x00"


def _startup_body(parameters: list[tuple[str, str]]) -> bytes:
    return b"".join(_cstr(k) + _cstr(v) for k, v in parameters) + b"\x00"


LOGIN = _packet(V3, _startup_body([("user", "alice"), ("database", "pums")]))

names = st.sampled_from(["", "s1", "s2", "p"])
sql_texts = st.sampled_from(
    [
        "SELECT 1",
        "SELECT COUNT(*) FROM pums",
        "SELECT COUNT(*) FROM pums WHERE age > $1",
        "SELECT age FROM pums",
        "BEGIN",
        "ROLLBACK",
        "SELECT $1, $2",
        "",
        "SELEC",
        "SET dpsql.epsilon = 0.5",
    ]
)
small_ints = st.integers(min_value=-3, max_value=70_000)


@st.composite
def parse_messages(draw) -> bytes:
    oids = draw(st.lists(st.sampled_from([0, 23, 25, 20, 701, 999_999]), max_size=4))
    count = draw(st.one_of(st.just(len(oids)), small_ints))
    body = _cstr(draw(names)) + _cstr(draw(sql_texts)) + struct.pack("!h", count & 0x7FFF)
    return b"P", body + b"".join(struct.pack("!i", oid) for oid in oids)


@st.composite
def bind_messages(draw) -> bytes:
    values = draw(st.lists(st.one_of(st.none(), st.binary(max_size=12)), max_size=4))
    formats = draw(st.lists(st.integers(0, 3), max_size=3))
    count = draw(st.one_of(st.just(len(values)), small_ints)) & 0x7FFF
    body = _cstr(draw(names)) + _cstr(draw(names))
    body += struct.pack("!h", len(formats)) + b"".join(struct.pack("!h", f) for f in formats)
    body += struct.pack("!h", count)
    for value in values:
        body += struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value
    results = draw(st.lists(st.integers(0, 2), max_size=2))
    body += struct.pack("!h", len(results)) + b"".join(struct.pack("!h", r) for r in results)
    return b"B", body


structured = st.one_of(
    parse_messages(),
    bind_messages(),
    st.tuples(st.just(b"Q"), sql_texts.map(_cstr)),
    st.tuples(st.just(b"D"), st.tuples(st.sampled_from(b"SPX"), names).map(
        lambda t: bytes([t[0]]) + _cstr(t[1]))),
    st.tuples(st.just(b"C"), st.tuples(st.sampled_from(b"SPX"), names).map(
        lambda t: bytes([t[0]]) + _cstr(t[1]))),
    st.tuples(st.just(b"E"), st.tuples(names, small_ints).map(
        lambda t: _cstr(t[0]) + struct.pack("!i", t[1] & 0x7FFFFFFF))),
    st.tuples(st.sampled_from([b"S", b"H"]), st.just(b"")),
)  # fmt: skip
random_message = st.tuples(
    st.binary(min_size=1, max_size=1).filter(lambda tag: tag != b"X"), st.binary(max_size=40)
)
message = st.tuples(
    st.one_of(structured, structured, random_message),
    st.sampled_from([0, 0, 0, 0, -1, 1, -5, 1 << 20]),  # a wrong length now and then
)


@st.composite
def startup_traffic(draw) -> bytes:
    """What a client may send before logging in: requests, packets, garbage."""
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["ssl", "gss", "cancel", "v3", "version", "huge", "raw"]))
        if kind == "ssl":
            parts.append(_packet(SSL, b""))
        elif kind == "gss":
            parts.append(_packet(GSSENC, b""))
        elif kind == "cancel":
            parts.append(_packet(CANCEL, draw(st.binary(max_size=12))))
        elif kind == "huge":  # a startup packet with thousands of parameters
            count = draw(st.integers(100, 5000))
            parts.append(_packet(V3, _startup_body([(f"k{i}", "v") for i in range(count)])))
        elif kind == "raw":
            parts.append(draw(st.binary(max_size=30)))
        else:
            code = V3 if kind == "v3" else draw(st.integers(0, 2**31 - 1))
            params = draw(st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8)), max_size=4))
            body = b"".join(
                k.encode("utf-8", "replace") + b"\x00" + v.encode("utf-8", "replace") + b"\x00"
                for k, v in params
            )
            parts.append(_packet(code, body + draw(st.sampled_from([b"\x00", b""]))))
    traffic = b"".join(parts)
    cut = draw(st.integers(0, len(traffic)))
    return traffic[: cut if draw(st.booleans()) else len(traffic)]


def _exchange(port: int, traffic: bytes) -> bytes:
    """Send `traffic`, close our side, and read everything until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        try:
            sock.sendall(traffic)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server closed first: what it sent is still readable
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    return received


def _assert_well_formed(received: bytes) -> None:
    """Backend messages only, whole, and every ErrorResponse with a SQLSTATE."""
    position = 0
    while position < len(received):
        tag = received[position]
        assert tag in BACKEND_TAGS, f"unknown backend message {bytes([tag])!r}"
        (length,) = struct.unpack("!i", received[position + 1 : position + 5])
        body = received[position + 5 : position + 1 + length]
        assert len(body) == length - 4, "a truncated backend message"
        if tag == ord("E"):
            assert b"C" in {field[:1] for field in body.split(b"\x00")}
        position += 1 + length


def _assert_others_unaffected(bystander: psycopg.Connection) -> None:
    assert bystander.execute("SELECT 1").fetchone() == (1,)


@FUZZ
@given(traffic=startup_traffic())
def test_fuzzed_startups_end_cleanly(fuzzed, bystander, traffic: bytes) -> None:
    received = _exchange(fuzzed.port, traffic)
    # one byte 'N' answers each encryption request (at most two); no notice comes
    # before a login, so a leading 'N' followed by a message tag or the end is one
    for _ in range(2):
        if received[:1] == b"N" and received[1:2] in (b"", b"N", b"E", b"R"):
            received = received[1:]
    _assert_well_formed(received)
    _assert_others_unaffected(bystander)


@FUZZ
@given(messages=st.lists(message, min_size=1, max_size=12), cut=st.integers(0, 64))
def test_fuzzed_message_sequences_get_errors_not_crashes(
    fuzzed, bystander, messages: list, cut: int
) -> None:
    traffic = b"".join(_message(tag, body, error) for (tag, body), error in messages)
    traffic = LOGIN + traffic[: len(traffic) - cut] + _message(b"S", b"")
    received = _exchange(fuzzed.port, traffic)
    assert received.startswith(b"R"), "the login went through"
    _assert_well_formed(received)
    _assert_others_unaffected(bystander)


def test_nothing_is_left_behind(fuzzed, bystander) -> None:
    """After the fuzzing (this runs last in the module): only the bystander remains."""
    for _ in range(20):
        _exchange(fuzzed.port, LOGIN + _message(b"Q", _cstr("SELECT 1")))
    server = fuzzed.server
    # a closed socket ends its task on the server's loop: wait briefly for the last ones
    for _ in range(100):
        if len(server._connections) == 1:
            break
        time.sleep(0.05)
    assert len(server._connections) == 1 and len(server._tasks) == 1
    assert server._analysts._counts == {"carol": 1}
    assert len(server.backoff._failures) <= 1  # startups without a user are not logins


def test_too_many_prepared_statements_is_an_error_not_memory(fuzzed, bystander) -> None:
    parses = b"".join(
        _message(b"P", _cstr(f"s{i}") + _cstr("SELECT 1") + struct.pack("!h", 0)) for i in range(51)
    )
    received = _exchange(fuzzed.port, LOGIN + parses + _message(b"S", b""))
    assert received.count(b"1\x00\x00\x00\x04") == 50  # ParseComplete, 50 times
    assert b"C54000" in received and b"keeps 50 prepared statements" in received
    _assert_others_unaffected(bystander)
