"""A dpsql wire server started in-process on a free port, over the PUMS tables.

Analysts: alice (large budget), bob (3 queries' worth), carol (for the
concurrency test); all log in with SCRAM passwords, stored as verifiers in
the policy (alice, bob) or in a users file (carol). `trusted` is a second
server with --trust on loopback, for raw-socket tests.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import pums_policy

import dpsql
from dpsql.server import BackgroundServer, build
from dpsql.server.auth import make_verifier

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret"}


@dataclass
class Served:
    server: BackgroundServer
    connection: dpsql.Connection

    @property
    def port(self) -> int:
        return self.server.port

    def url(self, analyst: str = "alice", scheme: str = "postgresql") -> str:
        return f"{scheme}://{analyst}:{PASSWORDS[analyst]}@127.0.0.1:{self.port}/pums"

    def dsn(self, analyst: str = "alice") -> str:
        return f"host=127.0.0.1 port={self.port} user={analyst} password={PASSWORDS[analyst]}"

    def spent(self, analyst: str) -> float:
        return float(self.connection.session.ledger.spent(analyst).epsilon)


def _policy() -> dict:
    return pums_policy(
        analysts={
            "default": {"epsilon": 10.0, "delta": 1e-5},
            "alice": {"epsilon": 1000.0, "delta": 1e-3, "password": make_verifier("alice-secret")},
            "bob": {"epsilon": 3.0, "delta": 1e-6, "password": make_verifier("bob-secret")},
            "carol": {"epsilon": 1000.0, "delta": 1e-3},
        }
    )


def _database(request: pytest.FixtureRequest) -> str:
    if request.param == "duckdb":
        return str(request.getfixturevalue("pums_db"))
    try:
        return request.getfixturevalue("postgres_backend").database
    except pytest.FixtureLookupError:
        pytest.skip("the PostgreSQL test backend (tests/conftest.py postgres_backend) is absent")


@pytest.fixture(scope="module", params=["duckdb", "postgres"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A SCRAM server; parametrised over DuckDB and PostgreSQL for the client suite."""
    yield from _serve(_database(request), tmp_path_factory.mktemp("wire"))


@pytest.fixture(scope="module")
def duck(pums_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A SCRAM server over DuckDB, for the tests that need not run on every backend."""
    yield from _serve(str(pums_db), tmp_path_factory.mktemp("wire-duck"))


def _serve(database: str, folder: Path) -> Iterator[Served]:
    connection = dpsql.connect(
        database, policy=_policy(), analyst="alice", ledger=str(folder / "ledger.sqlite")
    )
    users = {"carol": make_verifier(PASSWORDS["carol"])}
    with BackgroundServer(build(connection, users=users, workers=2)) as server:
        yield Served(server, connection)


@pytest.fixture(scope="module")
def trusted(pums_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("wire-trust")
    connection = dpsql.connect(
        str(pums_db), policy=_policy(), analyst="alice", ledger=str(folder / "ledger.sqlite")
    )
    with BackgroundServer(build(connection, trust=True, workers=2)) as server:
        yield Served(server, connection)


def self_signed(folder: Path) -> tuple[str, str]:
    """A throwaway certificate and key for 127.0.0.1, as PEM file paths."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(cert), str(key)
