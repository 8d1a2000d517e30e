"""Cancel requests across `dpsql serve --processes` server processes.

A client cancels a statement by opening a NEW connection and sending a
CancelRequest with the backend pid and secret that BackendKeyData gave it;
the parent hands that connection to the server process holding the fewest
(`dpsql.server.dispatch`), often not the one running the statement. So pids
say where they belong: process i hands out pids with i in the bits above
`PID_BITS` (process 0's are pg-mimic's own 10000, 10001, ...), and a process
that receives a cancel for another's pid forwards its 8 bytes over that
process's Unix datagram socket. The owner applies it exactly as a cancel that
reached it directly, secret check included; nothing is trusted because it
was forwarded.

The parent makes one datagram socketpair per process before forking: a
datagram is one whole request (no framing, no partial reads), and a send
never blocks the event loop (a full inbox drops the cancel, which a client
may send again, as it may when one arrives between statements).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable, Container

PID_BITS = 24  # 16.7 M pids per process before they wrap; 64 processes stay below 2^30
MAX_PROCESSES = 64  # pids stay positive int32s, as BackendKeyData carries them
FIRST_PID = 10_000  # where pg-mimic starts: process 0 hands out the pids it always did
_SPAN = 1 << PID_BITS
_REQUEST = struct.Struct("!ii")  # pid, secret: the CancelRequest's body
_logger = logging.getLogger(__name__)


class CancelRoutes:
    """Made by the parent before forking: one inbox per server process, shared by all."""

    def __init__(self, count: int):
        if not 1 <= count <= MAX_PROCESSES:
            raise ValueError(f"between 1 and {MAX_PROCESSES} server processes, got {count}")
        # pairs[i][0]: where any process sends to process i; pairs[i][1]: what i reads
        self._pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(count)]

    @property
    def sockets(self) -> list[socket.socket]:
        """Every end, for the parent to close once every process is forked."""
        return [end for pair in self._pairs for end in pair]

    def take(self, index: int) -> ProcessRoutes:
        """Process `index`'s share, in that process after the fork: its own inbox and a
        way to every other one; the other processes' inboxes are closed here."""
        for i, (_, inbox) in enumerate(self._pairs):
            if i != index:
                inbox.close()
        outboxes = [send for send, _ in self._pairs]
        return ProcessRoutes(index, self._pairs[index][1], outboxes)


class ProcessRoutes:
    """One server process's pids, and the way to the process owning any other pid."""

    def __init__(self, index: int, inbox: socket.socket, outboxes: list[socket.socket]):
        self.index = index
        self._inbox = inbox
        self._outboxes = outboxes
        self._next = FIRST_PID
        self._loop: asyncio.AbstractEventLoop | None = None

    def allocate(self, used: Container[int]) -> int:
        """A pid of this process that no live connection holds."""
        for _ in range(_SPAN):
            low = self._next
            self._next = low + 1 if low + 1 < _SPAN else 1  # 0 would be pid 0 in process 0
            pid = self.index << PID_BITS | low
            if pid not in used:
                return pid
        raise RuntimeError("every backend pid of this server process is in use")

    def owns(self, pid: int) -> bool:
        return pid >= 0 and pid >> PID_BITS == self.index

    def forward(self, pid: int, secret: int) -> None:
        """Send a cancel to the process owning `pid`; a pid no process owns is ignored,
        as pg-mimic ignores an unknown one."""
        owner = pid >> PID_BITS if pid >= 0 else -1
        if not 0 <= owner < len(self._outboxes) or owner == self.index:
            return
        try:
            self._outboxes[owner].send(_REQUEST.pack(pid, secret), socket.MSG_DONTWAIT)
        except OSError as exc:  # its inbox is full, or the process is gone
            _logger.info("cancel request for pid %d not forwarded: %s", pid, exc)

    def receive(self, apply: Callable[[int, int], None]) -> None:
        """Apply every cancel forwarded to this process, on the running event loop."""
        self._inbox.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._inbox.fileno(), self._read, apply)

    def _read(self, apply: Callable[[int, int], None]) -> None:
        while True:
            try:
                datagram = self._inbox.recv(64)
            except (BlockingIOError, InterruptedError):
                return
            if len(datagram) == _REQUEST.size:
                apply(*_REQUEST.unpack(datagram))

    def close(self) -> None:
        """Stop receiving (the sockets go with the process)."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.remove_reader(self._inbox.fileno())
            self._loop = None


__all__ = ["MAX_PROCESSES", "PID_BITS", "CancelRoutes", "ProcessRoutes"]
