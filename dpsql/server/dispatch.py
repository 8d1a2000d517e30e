"""Handing connections over between the processes of `dpsql serve --processes`.

The parent (`Dispatcher`) accepts every connection and passes its descriptor
(SCM_RIGHTS) to the server process that holds the fewest open connections; a
server process (`Inbox`) serves what it is handed and sends back one byte for
each of those connections that has ended, so the parent's counts stay right.
Left to the kernel, with every process accepting on the shared socket, 4
clients landed 2 and 2, 3 and 1, or 4 and 0.

Ties go to the lowest index: the spread is the same as with round-robin
whenever connections overlap, and clients that connect one at a time keep
reaching the same process, whose memory of answered repeats and login
back-off (both per process) then see all of them.

One SOCK_SEQPACKET socket pair per process carries both ways: a record is one
connection (a byte and its descriptor), with no framing to parse and never
two descriptors read as one. Sends never block: a process whose queue is full
(hundreds of connections it has not picked up) gets no more until it has room,
and while no process has any, connections wait in the kernel's backlog.

Why hand-written: no library passes accepted sockets between processes for
asyncio servers (multiprocessing.reduction sends descriptors, but blocking,
with no counting); it is socket.send_fds and recv_fds plus the counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable

_ENDED = b"\0"  # a server process's word that one connection it was handed has ended
_AT_MOST = 1 << 16  # bytes of such words in one record


class Dispatcher:
    """The parent's side: the listening sockets, and a channel and a count of open
    connections per server process."""

    def __init__(self, listening: list[socket.socket]):
        self._listening = listening
        self._channels: list[socket.socket | None] = []  # None: that process is gone
        self._counts: list[int] = []
        self._full: set[int] = set()  # processes whose queue of hand-overs is full
        self._record = bytearray(_AT_MOST)

    def add(self) -> socket.socket:
        """A channel to the next server process, before it is forked: its end, for the
        child to take with `inbox` and the parent to close."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.setblocking(False)
        self._channels.append(mine)
        self._counts.append(0)
        return theirs

    def inbox(self, theirs: socket.socket) -> Inbox:
        """In a child, just forked with `theirs` from `add`: the parent's sockets are closed
        (a child holding a listening socket or another's channel would keep it open)."""
        self.close()
        return Inbox(theirs)

    def waiting(self) -> tuple[list[socket.socket], list[socket.socket]]:
        """What to select on: (to read, to write)."""
        reading = [channel for channel in self._channels if channel is not None]
        if self._candidates():  # else connections wait in the backlog until one has room
            reading += self._listening
        return reading, [self._channels[index] for index in self._full]

    def ready(self, readable: list[socket.socket], writable: list[socket.socket]) -> None:
        """Act on what select found: word of ended connections first, then one new
        connection per listening socket. Before accepting, every channel is read, not
        only those select found readable: a connection that ended just before the new
        one came is then counted as ended."""
        accepting = [listener for listener in self._listening if listener in readable]
        for index, channel in enumerate(self._channels):
            if channel in writable:
                self._full.discard(index)
            if channel is not None and (accepting or channel in readable):
                self._read(index, channel)
        for listener in accepting:
            self._accept(listener)

    def close(self) -> None:
        """Stop accepting (new clients are refused) and close every channel."""
        for sock in self._listening:
            sock.close()
        self._listening = []
        for index in range(len(self._channels)):
            self._drop(index)

    def _candidates(self) -> list[int]:
        return [
            index
            for index, channel in enumerate(self._channels)
            if channel is not None and index not in self._full
        ]

    def _drop(self, index: int) -> None:
        channel = self._channels[index]
        if channel is not None:
            channel.close()
            self._channels[index] = None
        self._full.discard(index)

    def _read(self, index: int, channel: socket.socket) -> None:
        while True:
            try:
                ended = channel.recv_into(self._record)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                ended = 0
            if not ended:  # the process is gone or shutting down: hand it nothing more
                self._drop(index)
                return
            self._counts[index] -= ended

    def _accept(self, listener: socket.socket) -> None:
        try:
            connection, _ = listener.accept()
        except OSError:  # none after all, or the client already gave up
            return
        with connection:  # the parent's copy: closed whether handed over or not
            for index in sorted(self._candidates(), key=lambda i: (self._counts[i], i)):
                try:
                    socket.send_fds(self._channels[index], [b"C"], [connection.fileno()])
                except BlockingIOError:
                    self._full.add(index)
                except OSError:
                    self._drop(index)
                else:
                    self._counts[index] += 1
                    return


Handle = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Inbox:
    """A server process's side: serve each connection handed over, and say when it ends."""

    def __init__(self, channel: socket.socket):
        self._channel: socket.socket | None = channel
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: Handle | None = None
        self._starting: set[asyncio.Task] = set()  # the loop keeps only weak references
        self._unsent = 0  # ended connections not yet reported: the parent's queue was full

    def receive(self, handle: Handle) -> None:
        """Serve every connection handed over with `handle(reader, writer)`, as
        asyncio.start_server serves those it accepts, on the running event loop."""
        assert self._channel is not None
        self._channel.setblocking(False)
        self._handle = handle
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._channel.fileno(), self._read)

    def close(self) -> None:
        """Take no more connections: those handed over but not yet read are closed with
        the channel, and the parent, reading its end, hands this process nothing more."""
        if self._channel is None:
            return
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.remove_reader(self._channel.fileno())
        self._channel.close()
        self._channel = None

    def _read(self) -> None:
        while self._channel is not None:
            try:
                # non-inheritable, as accept() makes them (PEP 446)
                data, descriptors, _, _ = socket.recv_fds(
                    self._channel, 1, 1, socket.MSG_CMSG_CLOEXEC
                )
            except (BlockingIOError, InterruptedError):
                return
            if not data:  # the parent is gone (and this process is told to stop)
                self.close()
            elif not descriptors:  # out of descriptors: the kernel closed the connection
                self._report()
            else:
                connection = socket.socket(fileno=descriptors[0])
                task = self._loop.create_task(
                    self._loop.connect_accepted_socket(self._protocol, connection)
                )
                self._starting.add(task)
                task.add_done_callback(self._starting.discard)

    def _protocol(self) -> asyncio.StreamReaderProtocol:
        # as start_server makes them: with a callback, which also makes a TLS upgrade
        # server-side (open_connection's streams would upgrade as a client)
        return asyncio.StreamReaderProtocol(asyncio.StreamReader(), self._handled)

    async def _handled(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        finally:
            self._report()

    def _report(self) -> None:
        """Tell the parent one more connection has ended."""
        if self._channel is None:
            return
        self._unsent += 1
        words = min(self._unsent, _AT_MOST)
        try:
            self._channel.send(_ENDED * words)
        except OSError:  # the parent's queue is full (sent with the next), or it is gone
            return
        self._unsent -= words


__all__ = ["Dispatcher", "Inbox"]
