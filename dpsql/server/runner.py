"""Starting and stopping a wire server: in the foreground (`dpsql serve`) or on a thread.

`build()` makes the server from a Session (or a DB-API connection over one): one
database connection, policy and ledger for all clients, each client's Session
opened beside it; `serve_forever` binds it and serves until SIGINT or
SIGTERM; `bind` and `serve_handed` split that for `dpsql serve --processes`,
whose parent binds the sockets and accepts, and whose every server process
serves the connections it is handed;
`BackgroundServer` runs one on its own event loop in a daemon thread, for
tests, benchmarks and notebooks.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from dpsql.errors import InterfaceError
from dpsql.server.auth import Authenticator, is_loopback
from dpsql.server.cancels import ProcessRoutes
from dpsql.server.dispatch import Inbox
from dpsql.server.limits import AnalystConnections, Backoff, Limits
from dpsql.server.protocol import WireServer
from dpsql.server.statements import Backend


def build(
    connection: Any,
    *,
    host: str = "127.0.0.1",
    users: Mapping[str, str] | None = None,
    trust: bool = False,
    tls: ssl.SSLContext | None = None,
    workers: int = 8,
    limits: Limits | None = None,
    connections: AnalystConnections | None = None,
    backoff: Backoff | None = None,
) -> WireServer:
    """A wire server over `connection`'s database, policy and ledger (not yet listening).

    `connection` is a Session (`dpsql serve` opens one with `open_session`) or a DB-API
    connection (`dpsql.connect`); the server closes it when it stops.

    `users` (analyst -> SCRAM verifier) adds to and overrides the policy's
    `password` entries; `trust` lets analysts in without a password and is
    refused unless `host` is a loopback address; `limits` defaults to `Limits()`;
    `connections` counts analysts' connections and `backoff` failed logins (shared by
    `--processes`; default: this server's own, from `limits`).
    """
    limits = limits or Limits()
    if limits.require_tls and tls is None:
        raise InterfaceError("--require-tls needs a certificate: give --tls-cert and --tls-key")
    if trust and not is_loopback(host):
        raise InterfaceError(
            f"--trust lets anyone connect without a password, so it is refused on {host!r}; "
            "bind to 127.0.0.1 (or ::1), or give analysts passwords with 'dpsql passwd'"
        )
    backend = Backend(connection, workers, limits.query_timeout, limits.max_groups)
    policy = backend.policy
    verifiers = {**policy.credentials, **(users or {})}
    authenticator = Authenticator(policy.analysts, verifiers, trust)
    return WireServer(backend, authenticator, tls, limits, connections, backoff)


async def listen(server: WireServer, host: str, port: int) -> int:
    """Start listening; return the port (useful with port 0)."""
    listening = await server.start_server(host, port, reuse_address=True)
    return listening.sockets[0].getsockname()[1]


async def shutdown(server: WireServer) -> None:
    """Stop listening and end every connection's task (each closes its Session)."""
    tasks = list(server._tasks)  # pg-mimic keeps one task per connection
    server.close()
    if tasks:
        await asyncio.wait(tasks, timeout=5)


def serve_forever(
    server: WireServer, host: str, port: int, ready: Callable[[str], object] = print
) -> None:
    """Listen until interrupted (Ctrl-C or SIGTERM), then close connections and the backend."""

    async def start() -> None:
        bound = await listen(server, host, port)
        ready(f"dpsql serve: listening on {host}:{bound}")

    _serve_until_stopped(server, start)


def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on `host`:`port`, made as asyncio's `start_server` makes them (one
    per address the name has, SO_REUSEADDR, IPv6 sockets IPv6-only); with port 0 every
    socket takes the port the first was given. For `dpsql serve --processes`, whose
    parent accepts on them."""
    infos = socket.getaddrinfo(
        host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, protocol, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, protocol)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(100)  # asyncio's default backlog
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def serve_handed(
    server: WireServer, inbox: Inbox, routes: ProcessRoutes, ready: Callable[[], object]
) -> None:
    """Serve the connections the parent process hands over until SIGINT or SIGTERM, as
    serve_forever does; `ready()` once taking them."""

    async def start() -> None:
        server.serve_handed(inbox, routes)
        ready()

    _serve_until_stopped(server, start)


def _serve_until_stopped(server: WireServer, start: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        # before start(): a SIGTERM right after the server says it is ready shuts it down
        # cleanly rather than killing it
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        # What the process holds once started (the modules, the policy, the Session)
        # lives as long as it does: out of the collector's reach, a full collection
        # walks only what queries made (docs/server.md, "Speed", measures the tail)
        gc.freeze()
        await start()
        await stop.wait()
        await shutdown(server)

    try:
        asyncio.run(main())
    finally:
        server.backend.close()


class BackgroundServer:
    """A wire server on its own event loop in a daemon thread; use as a context manager."""

    def __init__(self, server: WireServer, host: str = "127.0.0.1", port: int = 0):
        self.server = server
        self.host = host
        self.loop = asyncio.new_event_loop()
        self.port = port
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            listen(self.server, self.host, self.port), self.loop
        )
        self.port = future.result(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(shutdown(self.server), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.server.backend.close()
