"""The PostgreSQL protocol v3 front end of `dpsql serve`, on pg-mimic.

Why pg-mimic (0.1.3, pinned): evaluated on this machine with psql, psycopg 3,
asyncpg, SQLAlchemy and pandas, it was the one library that passed every
client check: the full extended protocol with typed parameters and portals,
cancel requests, SQLSTATE errors, and pg_catalog emulation good enough for
psql's `\\dt` and `\\d`. riffq has no wheel for this platform, buenavista sends
errors without SQLSTATE and mis-reads text parameters, and pygwire is only a
codec (a server on it is ~270 lines plus all the catalog work). What pg-mimic
lacks is added here, by subclassing rather than forking:

- the startup phase (`WireServer._handle_client`): TLS when a certificate is
  given (SSLRequest answered 'S', else 'N'), protocol versions other than 3.0
  refused or negotiated down, size limits on every message, and no password
  store that accepts unknown users (see `dpsql.server.auth`);
- the message loop (`WireConnection`): socket writes batched until Sync,
  Query or Flush (one write per message cost about 20% of throughput),
  messages cut from buffered reads rather than read one by one, messages
  handled in the connection's own task rather than one task each (a cancel
  still stops only the running statement), a single simple-query
  statement not re-parsed to be split, malformed messages answered with
  08P01 instead of crashing the handler, a statement run at Bind so its
  columns are known (see statements.py), a client vanishing mid-query closing
  only its own connection, and the analyst's Session opened before the client
  is told it may send queries (so its first query is read at once, and a
  cancel of it finds it running);
- several server processes (`dpsql serve --processes`): serving connections
  the parent accepted and handed over (`dpsql.server.dispatch`), and backend
  pids that name their process, so a cancel request reaching another process
  is forwarded to it (`dpsql.server.cancels`);
- catalog rows (`dpsql.server.catalog`) sent as PostgreSQL encoded them, in
  the formats the Bind asked for, rather than re-encoded by pg-mimic (which
  has no binary form of regclass, aclitem and the other catalog types);
- the limits of `dpsql.server.limits`: a deadline for the whole login, a
  per-address back-off before each login after failures, TLS required when
  configured, connections per analyst, and statements and parameters per
  connection, each refused with its SQLSTATE and what to do instead.

Both override pg-mimic internals, which is why the version is pinned and
tests/server/ exercises every client: an upgrade that changes them fails there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import struct

from pg_mimic import PgError, PgServer, messages
from pg_mimic.connection import Connection, PortalEntry, _field_specs
from pg_mimic.errors import IN_FAILED_SQL_TRANSACTION
from pg_mimic.middleware import is_transaction_end
from pg_mimic.results import encode_row, format_code_for
from pg_mimic.stream import ConnectionClosed, PgStream
from pg_mimic.types import pack_int32, unpack_int32

from dpsql.server import batches, copy
from dpsql.server.auth import Authenticator, is_loopback
from dpsql.server.cancels import ProcessRoutes
from dpsql.server.dispatch import Inbox
from dpsql.server.introspection import SERVER_VERSION, CatalogPortal
from dpsql.server.limits import AnalystConnections, Backoff, Limits
from dpsql.server.sqlstate import (
    FEATURE_NOT_SUPPORTED,
    INVALID_AUTHORIZATION,
    PROGRAM_LIMIT_EXCEEDED,
    PROTOCOL_VIOLATION,
    QUERY_CANCELED,
    TOO_MANY_ARGUMENTS,
    TOO_MANY_CONNECTIONS,
)
from dpsql.server.statements import Backend, PrivatePortal, PrivateStatement, WireSession
from dpsql.server.values import parameter_count

MAX_STARTUP_LENGTH = 10_000  # as PostgreSQL's MAX_STARTUP_PACKET_LENGTH
MAX_MESSAGE_LENGTH = 8 * 1024 * 1024  # far above the Session's 1,000,000-character SQL limit
PROTOCOL_3_0 = 3 << 16
_FLUSH_AT = 64 * 1024
_READ_AT_ONCE = 64 * 1024
_FLUSHING = {messages.SYNC, messages.QUERY, messages.FLUSH}
_PARSERS = {
    messages.QUERY: messages.parse_query,
    messages.PARSE: messages.parse_parse,
    messages.BIND: messages.parse_bind,
    messages.DESCRIBE: messages.parse_describe,
    messages.EXECUTE: messages.parse_execute,
    messages.CLOSE: messages.parse_close,
}
_logger = logging.getLogger(__name__)


class LimitedStream(PgStream):
    """PgStream with length checks, and reads and writes buffered."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        super().__init__(reader, writer)
        self.buffer: list[bytes] = []
        self.size = 0
        self._received = bytearray()  # read past the last message returned

    async def read_startup_packet(self) -> tuple[int, bytes]:
        length = unpack_int32(await self._read_exactly(4))
        if not 8 <= length <= MAX_STARTUP_LENGTH:
            await self.fatal(PROTOCOL_VIOLATION, f"invalid startup packet length {length}")
        code = unpack_int32(await self._read_exactly(4))
        return code, await self._read_exactly(length - 8)

    async def read_message(self) -> tuple[bytes, bytes]:
        """The next message, cut from what the socket has delivered: a client's Bind,
        Describe, Execute and Sync arrive together, and reading each header and body
        with readexactly cost two coroutines and buffer copies per message.

        Only after the startup phase: bytes read ahead of a TLS upgrade would be lost.
        """
        received = self._received
        while True:
            if len(received) >= 5:
                length = unpack_int32(received, 1)
                if not 4 <= length <= MAX_MESSAGE_LENGTH:
                    await self.fatal(
                        PROTOCOL_VIOLATION,
                        f"invalid message length {length} (at most {MAX_MESSAGE_LENGTH} "
                        "bytes); send shorter statements",
                    )
                if len(received) > length:
                    break
            chunk = await self.reader.read(_READ_AT_ONCE)
            if not chunk:
                raise ConnectionClosed("the client closed the connection")
            received += chunk
        message = bytes(received[:1]), bytes(received[5 : length + 1])
        del received[: length + 1]
        return message

    def next_message(self) -> tuple[bytes, bytes] | None:
        """The next message if the socket has delivered all of it already, left unread."""
        received = self._received
        if len(received) < 5 or len(received) <= unpack_int32(received, 1):
            return None
        return bytes(received[:1]), bytes(received[5 : unpack_int32(received, 1) + 1])

    def write(self, data: bytes) -> None:
        self.buffer.append(data)
        self.size += len(data)

    async def drain(self) -> None:
        if self.buffer:
            self.writer.write(b"".join(self.buffer))
            self.buffer.clear()
            self.size = 0
        await self.writer.drain()

    async def close(self) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            await self.drain()
        await super().close()

    async def fatal(self, code: str, message: str) -> None:
        """Send a FATAL ErrorResponse and end the connection."""
        self.write(
            messages.make_error_response({"S": "FATAL", "V": "FATAL", "C": code, "M": message})
        )
        await self.drain()
        raise ConnectionClosed(message)


class WireConnection(Connection):
    """pg-mimic's connection with batched writes, run-at-Bind portals, 08P01 for bad input,
    and the server's limits."""

    server: WireServer

    def __init__(self, *args: object, address: str, deadline: float):
        super().__init__(*args)
        self.address = address  # the client's IP address, for the login back-off
        self.deadline = deadline  # event-loop time by which the login must be complete
        self._admitted = False
        self._cancel_requested = False
        self._handlers = {
            messages.QUERY: self._handle_simple_query,
            messages.PARSE: self._handle_parse,
            messages.BIND: self._handle_bind,
            messages.DESCRIBE: self._handle_describe,
            messages.EXECUTE: self._handle_execute,
            messages.CLOSE: self._handle_close,
        }

    async def run(self) -> None:
        """pg-mimic's run, but the analyst's Session opens before BackendKeyData and
        ReadyForQuery: it waits for a worker, and a client told it was ready sent its
        query and could not cancel it until a worker was free (psql's Ctrl-C was lost)."""
        try:
            if not await self._authenticate():
                return
            self.session._connection = self
            await self.session.init(self)
            await self._send_startup_completion()
            await self._command_loop()
        except ConnectionClosed:
            pass
        finally:
            if self._admitted:
                self.server.leave(self.username)
            with contextlib.suppress(Exception):
                await self.session.close()
            await self.stream.close()

    async def _authenticate(self) -> bool:
        backoff = self.server.backoff
        if self.server.auth_plugin_factory.trust and not is_loopback(self.address):
            # build() refuses --trust off loopback; this holds whatever the bound address
            await self.stream.fatal(
                INVALID_AUTHORIZATION,
                "this server trusts loopback clients only; connect from this machine",
            )
        try:
            async with asyncio.timeout_at(self.deadline):
                await backoff.wait(self.address)
                ok = await super()._authenticate()
        except TimeoutError:
            raise ConnectionClosed(f"no login from {self.address} in time") from None
        backoff.record(self.address, ok)
        if ok:
            limit = self.server.limits.connections_per_analyst
            if not self.server.admit(self.username):
                await self.stream.fatal(
                    TOO_MANY_CONNECTIONS,
                    f'too many connections for analyst "{self.username}": at most {limit} '
                    "at once; close idle connections (or share one pool), or ask the operator "
                    "to raise dpsql serve --max-connections-per-analyst",
                )
            self._admitted = True
        return ok

    async def _command_loop(self) -> None:
        task = asyncio.current_task()
        while True:
            tag, payload = await self.stream.read_message()
            if tag == messages.TERMINATE:
                return
            await self._run(tag, payload, task)
            if tag in (messages.QUERY, messages.SYNC):
                self.stream.write(messages.make_ready_for_query(self.tx_status))
                self._ignore_until_sync = False
            if tag in _FLUSHING or self.stream.size > _FLUSH_AT:
                await self.stream.drain()

    async def _run(self, tag: bytes, payload: bytes, task: asyncio.Task) -> None:
        """Handle one message in this connection's own task, which a CancelRequest cancels.

        pg-mimic wraps each message in a Task of its own so that a cancel hits
        only the statement; that cost about 20 us per message, four or five
        messages per query. Here the cancel (`request_cancel`) hits the
        connection's task while it waits inside this method, and only then: the
        flag tells it apart from the server's shutdown, which must go through.
        """
        self._current_task = task
        try:
            await self._dispatch(tag, payload)
        except asyncio.CancelledError:
            if not self._cancel_requested or task.cancelling() > 1:
                raise  # the server is closing this connection
            self._error(QUERY_CANCELED, "canceling statement due to user request")
        finally:
            self._current_task = None
            if self._cancel_requested:
                # balance our cancel() even when the statement finished first and
                # swallowed it, so later timeouts in this task count correctly
                task.uncancel()
                self._cancel_requested = False

    def request_cancel(self) -> None:
        """Cancel the statement now running, if one is; a cancel between statements is
        ignored, as in PostgreSQL."""
        if self._current_task is not None and not self._cancel_requested:
            self._cancel_requested = True
            self._current_task.cancel()

    async def _dispatch(self, tag: bytes, payload: bytes) -> None:
        if self._ignore_until_sync and tag != messages.SYNC:
            return
        try:
            await self._handle(tag, payload)
        except PgError as exc:
            self._error(exc.sqlstate, exc.message, exc.fields)

    async def _handle(self, tag: bytes, payload: bytes) -> None:
        if tag in (messages.SYNC, messages.FLUSH):
            return
        parser = _PARSERS.get(tag)
        if parser is None:
            raise PgError(FEATURE_NOT_SUPPORTED, f"message type {tag!r} is not supported by dpsql")
        try:
            parsed = parser(payload)
        except (ValueError, IndexError, struct.error, UnicodeDecodeError):
            raise PgError(
                PROTOCOL_VIOLATION, f"malformed {tag.decode('latin-1')!r} message"
            ) from None
        if tag == messages.PARSE:
            self._check_room(self.statements, parsed.statement_name, "prepared statements")
            # the $n the text names too: typing them allocates one entry per number
            self._check_parameters(max(len(parsed.param_oids), parameter_count(parsed.sql)))
        elif tag == messages.BIND:
            self._check_room(self.portals, parsed.portal_name, "portals")
            self._check_parameters(len(parsed.params))
        await self._handlers[tag](parsed)

    async def _handle_simple_query(self, sql: str) -> None:
        """pg-mimic's, with statements split as written (batches.py), and a single one not
        split at all (the tokenizer costs ~0.1 ms)."""
        if not sql.strip():
            self.stream.write(messages.make_empty_query_response())
            return
        single = ";" not in sql.strip().rstrip(";")
        for statement in [sql] if single else batches.split(sql):
            await self._execute_one_simple_statement(statement)

    async def _execute_one_simple_statement(self, sql: str) -> None:
        """pg-mimic's, but a private statement runs before its columns are described (they
        are the release's), a COPY (query) TO STDOUT streams its release, and command tags
        are PostgreSQL's."""
        if self.tx_status == b"E" and not is_transaction_end(sql):
            raise PgError(IN_FAILED_SQL_TRANSACTION, "current transaction is aborted, commands "
                          "ignored until end of transaction block; send ROLLBACK")  # fmt: skip
        request = copy.parse(sql) if copy.is_copy(sql) else None
        statement = await self.session.prepare(request.query if request else sql, [])
        portal = statement.bind([])
        if isinstance(portal, PrivatePortal | CatalogPortal):
            columns = await portal.run()
        else:
            columns = await statement.describe()
        rows, _ = await portal.execute(0)
        encoded = isinstance(portal, CatalogPortal)  # PostgreSQL's own text of each value
        if request is not None:
            if encoded:
                rows = [tuple(v if v is None else v.decode() for v in row) for row in rows]
            self.stream.write(copy.copy_messages(request, columns or [], rows))
            self.stream.write(messages.make_command_complete(f"COPY {len(rows)}"))
            return
        if columns is not None:
            self.stream.write(messages.make_row_description(_field_specs(columns)))
            for row in rows:
                values = list(row) if encoded else encode_row(row, columns)
                self.stream.write(messages.make_data_row(values))
        self.stream.write(messages.make_command_complete(batches.command_tag(sql, len(rows))))

    def _check_room(self, kept: dict, name: str, what: str) -> None:
        """Refuse a new named statement or portal beyond the limit: each holds memory."""
        limit = self.server.limits.statements_per_connection
        if name not in kept and len(kept) >= limit:
            raise PgError(
                PROGRAM_LIMIT_EXCEEDED,
                f"this connection already keeps {limit} {what}, the most dpsql allows; "
                "close some (Close message or DEALLOCATE), reuse names, or reconnect",
            )

    def _check_parameters(self, count: int) -> None:
        limit = self.server.limits.parameters_per_statement
        if count > limit:
            raise PgError(
                TOO_MANY_ARGUMENTS,
                f"the statement has {count:,} parameters, over dpsql's limit of {limit:,}; "
                "pass fewer values (e.g. split a long IN list over several queries)",
            )

    def _error(self, code: str, message: str, fields: dict | None = None) -> None:
        response = {"S": "ERROR", "V": "ERROR", "C": code, "M": message, **(fields or {})}
        self.stream.write(messages.make_error_response(response))
        if self.tx_status != b"I":
            self.tx_status = b"E"  # the transaction is failed until ROLLBACK, as in PostgreSQL
        self._ignore_until_sync = True

    async def _handle_bind(self, parsed: messages.ParsedBind) -> None:
        statement = self._get_statement(parsed.statement_name)
        if self.tx_status == b"E" and not is_transaction_end(statement.sql):
            raise PgError(IN_FAILED_SQL_TRANSACTION, "current transaction is aborted, commands "
                          "ignored until end of transaction block; send ROLLBACK")  # fmt: skip
        param_oids = getattr(statement, "param_oids", [])
        if isinstance(statement, PrivateStatement) and len(parsed.params) != len(param_oids):
            raise PgError(
                PROTOCOL_VIOLATION,
                f"bind message supplies {len(parsed.params)} parameters, but the statement "
                f"requires {len(param_oids)}",
            )
        try:
            texts = [
                self._decode_param(
                    value, format_code_for(parsed.param_format_codes, i), param_oids, i
                )
                for i, value in enumerate(parsed.params)
            ]
        except (UnicodeDecodeError, struct.error) as exc:
            # pg-mimic's decoders raise these for text that is not UTF-8 and binary
            # values of the wrong length; as they were, they ended the connection
            raise PgError(
                "22021" if isinstance(exc, UnicodeDecodeError) else "22P03",
                "a parameter could not be read: send text parameters in UTF-8 and binary "
                "ones in PostgreSQL's binary format of their type",
            ) from None
        portal = statement.bind(texts)
        if isinstance(portal, CatalogPortal):
            portal.formats = parsed.result_format_codes
            columns = await portal.run()
        elif isinstance(portal, PrivatePortal):
            columns = portal.columns  # known if the statement was described; it runs at Execute
        else:
            columns = await statement.describe()
        self.portals[parsed.portal_name] = PortalEntry(
            portal, columns, statement.sql, parsed.result_format_codes
        )
        self.stream.write(messages.make_bind_complete())

    async def _handle_describe(self, parsed: messages.ParsedDescribeOrClose) -> None:
        """pg-mimic's; a private portal not described yet is described by planning."""
        if parsed.kind != messages.TARGET_STATEMENT:
            entry = self._get_portal(parsed.name)
            if entry.columns is None and isinstance(entry.portal, PrivatePortal):
                if self._executes_next(parsed.name):
                    # the client has already sent its Execute (psycopg sends Bind, Describe,
                    # Execute, Sync at once): run now, rather than plan once more first
                    entry.columns = await entry.portal.run()
                else:
                    entry.columns = await entry.portal.describe()
        await super()._handle_describe(parsed)

    def _executes_next(self, portal: str) -> bool:
        """Whether the next message, already received, is an Execute of `portal`."""
        following = self.stream.next_message()
        if following is None or following[0] != messages.EXECUTE:
            return False
        return following[1].split(b"\0", 1)[0] == portal.encode()

    async def _handle_execute(self, parsed: messages.ParsedExecute) -> None:
        """pg-mimic's, with PostgreSQL's command tags; a private portal that was never
        described sends its rows in the release's own types."""
        entry = self._get_portal(parsed.portal_name)
        if self.tx_status == b"E" and not is_transaction_end(entry.sql):
            raise PgError(IN_FAILED_SQL_TRANSACTION, "current transaction is aborted, commands "
                          "ignored until end of transaction block; send ROLLBACK")  # fmt: skip
        rows, suspended = await entry.portal.execute(parsed.max_rows)
        if entry.columns is None and isinstance(entry.portal, PrivatePortal):
            entry.columns = entry.portal.columns
        entry.rows_returned += len(rows)
        if entry.columns is not None:
            for row in rows:
                try:
                    values = (
                        list(row)  # encoded by PostgreSQL in the formats Bind asked for
                        if isinstance(entry.portal, CatalogPortal)
                        else encode_row(row, entry.columns, entry.result_format_codes)
                    )
                except ValueError as exc:
                    raise PgError(FEATURE_NOT_SUPPORTED, str(exc)) from None
                self.stream.write(messages.make_data_row(values))
        if suspended:
            self.stream.write(messages.make_portal_suspended())
        else:
            tag = batches.command_tag(entry.sql, entry.rows_returned)
            self.stream.write(messages.make_command_complete(tag))


class WireServer(PgServer):
    """pg-mimic's server with dpsql's startup phase, authentication and sessions."""

    def __init__(
        self,
        backend: Backend,
        authenticator: Authenticator,
        tls: ssl.SSLContext | None = None,
        limits: Limits | None = None,
        connections: AnalystConnections | None = None,
        backoff: Backoff | None = None,
    ):
        super().__init__(
            lambda: WireSession(backend),
            authenticator,
            server_version=SERVER_VERSION,
        )
        self.backend = backend
        self.tls = tls
        self.limits = limits = limits or Limits()
        self.backoff = backoff or Backoff(limits.backoff_base, limits.backoff_max)
        # each analyst's logged-in connections: in this process, or in all of them
        self._analysts = connections or AnalystConnections()
        self.routes: ProcessRoutes | None = None  # set when one of several processes
        self.inbox: Inbox | None = None  # set when one of several processes

    def serve_handed(self, inbox: Inbox, routes: ProcessRoutes) -> None:
        """Serve the connections the parent process accepts and hands over (`dpsql serve
        --processes`), from now on the running event loop; `routes` take this
        process's share of backend pids and its forwarded cancel requests."""
        self.inbox = inbox
        inbox.receive(self._client_connected_cb)
        self.routes = routes
        routes.receive(super().cancel)

    def close(self) -> None:
        super().close()
        if self.inbox is not None:
            self.inbox.close()
        if self.routes is not None:
            self.routes.close()

    def cancel(self, pid: int, secret: int) -> None:
        """Cancel the statement of connection `pid` if `secret` is its own; a pid of
        another server process goes to that process, which checks the secret."""
        if self.routes is None or self.routes.owns(pid):
            super().cancel(pid, secret)
        else:
            self.routes.forward(pid, secret)

    def _allocate_pid(self) -> int:
        if self.routes is None:
            return super()._allocate_pid()
        return self.routes.allocate(self._connections)

    def admit(self, analyst: str) -> bool:
        """Count a logged-in connection of `analyst`, unless they are at the limit."""
        return self._analysts.admit(analyst, self.limits.connections_per_analyst)

    def leave(self, analyst: str) -> None:
        self._analysts.leave(analyst)

    async def _handle_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        stream = LimitedStream(reader, writer)
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if peer else ""
        deadline = asyncio.get_running_loop().time() + self.limits.auth_timeout
        try:
            async with asyncio.timeout_at(deadline):
                startup = await self._startup(stream, writer)
            if startup is None:
                return
            pid = self._allocate_pid()
            secret = struct.unpack("!i", os.urandom(4))[0]
            connection = WireConnection(
                stream, self.session_factory(), self, pid, secret, startup,
                address=address, deadline=deadline,
            )  # fmt: skip
            self._connections[pid] = connection
            try:
                await connection.run()
            finally:
                self._connections.pop(pid, None)
        except (ConnectionClosed, ConnectionError, OSError, ssl.SSLError, PgError,
                TimeoutError) as exc:  # fmt: skip
            # a client that vanished or misbehaved: its connection ends, no one else's
            _logger.debug("connection ended: %s", exc)
        except Exception:
            _logger.exception("connection failed")

    async def _startup(self, stream: LimitedStream, writer: asyncio.StreamWriter) -> dict | None:
        code, payload = await stream.read_startup_packet()
        asked: set[int] = set()
        # libpq may ask for GSS encryption, then for TLS: each once, in either order
        while code in (messages.SSL_REQUEST_CODE, messages.GSSENC_REQUEST_CODE):
            if code in asked or writer.get_extra_info("ssl_object") is not None:
                await stream.fatal(PROTOCOL_VIOLATION, "encryption was already negotiated")
            asked.add(code)
            tls = self.tls if code == messages.SSL_REQUEST_CODE else None
            await _reply(stream, b"S" if tls else b"N")
            if tls:
                await writer.start_tls(tls)
            code, payload = await stream.read_startup_packet()
        if code == messages.CANCEL_REQUEST_CODE:
            if len(payload) == 8:
                self.cancel(*messages.parse_cancel_request(payload))
            return None
        if self.limits.require_tls and writer.get_extra_info("ssl_object") is None:
            await stream.fatal(
                INVALID_AUTHORIZATION,
                "this dpsql server accepts only TLS connections; connect with sslmode=require",
            )
        if code >> 16 != 3:
            await stream.fatal(
                FEATURE_NOT_SUPPORTED,
                f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: dpsql speaks 3.0",
            )
        try:
            parameters = messages.parse_startup_message(payload)
        except (ValueError, UnicodeDecodeError):
            await stream.fatal(PROTOCOL_VIOLATION, "malformed startup packet")
        options = sorted(name for name in parameters if name.startswith("_pq_."))
        if code != PROTOCOL_3_0 or options:
            stream.write(_negotiate_protocol_version(options))
        if "user" not in parameters:
            await stream.fatal("28000", "no user name in the startup packet; connect with -U")
        return parameters


async def _reply(stream: LimitedStream, byte: bytes) -> None:
    stream.write(byte)
    await stream.drain()


def _negotiate_protocol_version(options: list[str]) -> bytes:
    """NegotiateProtocolVersion: this server speaks 3.0 and none of the `_pq_` options."""
    body = pack_int32(0) + pack_int32(len(options))
    body += b"".join(name.encode() + b"\x00" for name in options)
    return b"v" + pack_int32(len(body) + 4) + body


def tls_context(certificate: str, key: str) -> ssl.SSLContext:
    """A server-side TLS context from a PEM certificate chain and key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificate, key)
    return context


__all__ = ["WireServer", "tls_context"]
