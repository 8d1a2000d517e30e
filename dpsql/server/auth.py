"""Who may connect to `dpsql serve`: SCRAM-SHA-256 against stored verifiers, or trust on loopback.

Verifiers use PostgreSQL's own format (`SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`),
so the server never holds a password. They come from the policy
(`analysts.<name>.password`) or from a users file of `analyst:verifier` lines,
which `dpsql passwd` writes. The exchange itself is scramp's server, the same
library pg-mimic and pg8000 use; pg-mimic's own SCRAM plugin derives keys
from a plaintext password and lets unknown users try an empty one, so it is
replaced here.

An unknown user gets a decoy verifier: a salt that is stable per name for the
life of the server and a random key no password matches. The exchange runs
to the end and fails with the same message as a wrong password, so a client
cannot tell which names exist.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import logging
import os
import secrets
import struct
from collections.abc import Mapping
from pathlib import Path

from pg_mimic import AuthPlugin, messages
from pg_mimic.auth import _set_client_first  # tolerates libpq's empty SCRAM username
from pg_mimic.errors import INVALID_PASSWORD, PgError
from pg_mimic.stream import PgStream
from scramp import ScramException, ScramMechanism

from dpsql.errors import InterfaceError
from dpsql.policy import analyst_name_problem

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096  # PostgreSQL's default for password_encryption = scram-sha-256
_SCRAM = ScramMechanism(MECHANISM)
_logger = logging.getLogger(__name__)


def make_verifier(password: str, iterations: int = ITERATIONS) -> str:
    """A PostgreSQL-format SCRAM-SHA-256 verifier for `password`."""
    if not password:
        raise InterfaceError("the password is empty; choose a non-empty password")
    salt, stored_key, server_key, count = _SCRAM.make_auth_info(password, iterations)
    b64 = base64.b64encode
    return (
        f"{MECHANISM}${count}:{b64(salt).decode()}$"
        f"{b64(stored_key).decode()}:{b64(server_key).decode()}"
    )


def parse_verifier(verifier: str) -> tuple[bytes, bytes, bytes, int]:
    """(salt, stored key, server key, iterations) of a verifier, as scramp's auth_fn returns."""
    try:
        mechanism, count_salt, keys = verifier.split("$")
        count, salt = count_salt.split(":")
        stored_key, server_key = keys.split(":")
        if mechanism != MECHANISM:
            raise ValueError(mechanism)
        decode = base64.b64decode
        return decode(salt), decode(stored_key), decode(server_key), int(count)
    except ValueError:
        raise InterfaceError(
            f"not a SCRAM-SHA-256 verifier: {verifier[:20]!r}...; create one with "
            "'dpsql passwd <analyst>'"
        ) from None


def read_users(path: str | os.PathLike) -> dict[str, str]:
    """The `analyst:verifier` lines of a users file (blank lines and # comments skipped)."""
    users = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, separator, verifier = line.partition(":")
        if not separator:
            raise InterfaceError(f"{path}, line {number}: expected 'analyst:SCRAM-SHA-256$...'")
        parse_verifier(verifier)
        users[name] = verifier
    return users


def write_user(path: str | os.PathLike, analyst: str, verifier: str) -> None:
    """Add or replace `analyst` in a users file, readable by its owner only."""
    problem = analyst_name_problem(analyst)  # a newline split the file into two entries
    if problem:
        raise InterfaceError(problem)
    path = Path(path)
    users = read_users(path) if path.exists() else {}
    users[analyst] = verifier
    text = "".join(f"{name}:{entry}\n" for name, entry in users.items())
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text)


def is_loopback(host: str) -> bool:
    """True when `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Authenticator:
    """Picks the auth plugin for each startup `user`; only analysts with a budget get in."""

    def __init__(self, analysts: Mapping[str, object], verifiers: Mapping[str, str], trust: bool):
        self.analysts = frozenset(analysts)
        self.verifiers = {name: parse_verifier(v) for name, v in verifiers.items()}
        self.trust = trust
        self._decoy_key = secrets.token_bytes(32)

    def __call__(self, username: str) -> AuthPlugin:
        if self.trust:
            return _Trust(username in self.analysts)
        known = username in self.analysts and username in self.verifiers
        return _Scram(self.verifiers[username] if known else self._decoy(username))

    def _decoy(self, username: str) -> tuple[bytes, bytes, bytes, int]:
        salt = hmac.digest(self._decoy_key, username.encode("utf-8", "replace"), "sha256")[:16]
        return salt, secrets.token_bytes(32), secrets.token_bytes(32), ITERATIONS


class _Trust(AuthPlugin):
    """No password (--trust, loopback only); still only analysts the policy knows."""

    def __init__(self, known: bool):
        self.known = known

    async def authenticate(self, stream: PgStream, username: str, identity_provider) -> bool:
        return self.known


class _Scram(AuthPlugin):
    """The SCRAM-SHA-256 exchange against one stored verifier."""

    def __init__(self, auth_info: tuple[bytes, bytes, bytes, int]):
        self.auth_info = auth_info

    async def authenticate(self, stream: PgStream, username: str, identity_provider) -> bool:
        server = _SCRAM.make_server(lambda _user: self.auth_info)
        stream.write(messages.make_authentication_sasl([MECHANISM]))
        await stream.drain()
        try:
            client_first = await _password_message(stream, initial=True)
            _set_client_first(server, client_first)
            stream.write(
                messages.make_authentication_sasl_continue(server.get_server_first().encode())
            )
            await stream.drain()
            server.set_client_final(await _password_message(stream, initial=False))
            final = server.get_server_final()
        except (ScramException, UnicodeDecodeError, ValueError, struct.error) as exc:
            _logger.info("SCRAM authentication failed for user %r: %s", username, exc)
            return False
        stream.write(messages.make_authentication_sasl_final(final.encode()))
        await stream.drain()
        return True


async def _password_message(stream: PgStream, *, initial: bool) -> str:
    tag, payload = await stream.read_message()
    if tag != messages.PASSWORD:
        raise PgError(INVALID_PASSWORD, "expected a SASL response during authentication")
    if initial:
        mechanism, data = messages.parse_sasl_initial_response(payload)
        if mechanism != MECHANISM:
            raise ValueError(f"unsupported SASL mechanism {mechanism!r}")
        return data.decode("utf-8")
    return payload.decode("utf-8")


__all__ = [
    "Authenticator",
    "is_loopback",
    "make_verifier",
    "parse_verifier",
    "read_users",
    "write_user",
]
