"""The supervisor of `dpsql serve --processes N`: fork N server processes, wait for them
to be ready, hand them the connections, forward signals to them, and stop them
all if one of them dies.

One server process is bound by Python's interpreter lock to about one core; N
processes use N. Every child builds its own DB-API connection, Backend and
WireServer after the fork: DuckDB, connection pools, the ledger's SQLite
connection and threads must never cross fork(). The parent loads the policy,
binds the port and forks; it opens no database and starts no thread.

Connections: the parent accepts every one and hands it to the process with
the fewest open connections (`dpsql.server.dispatch`); the processes do not
accept themselves. The parent starts accepting once every process is ready,
and stops (closing the listening sockets, so new clients are refused) as soon
as it is told to stop or a process dies.

Startup: child 0 is forked first, and the parent waits until it is ready (a
byte on a pipe) or dead. A bad policy, a missing database or an unreachable
server thus fails in one process, which prints its own error once, and the
parent exits with its code without forking the others. Then the others are
forked and awaited, and `announce()` (the "listening on" line) runs once.

Signals: SIGINT and SIGTERM to the parent are forwarded (as SIGTERM) to
every child, which shuts down as a single `dpsql serve` does, and the parent
exits once all have. A child that exits on its own is a failure: the parent
says so, stops the others and exits non-zero, for a service manager
(systemd's Restart=on-failure) to start the whole server again. A child that
ignores SIGTERM for `STOP_GRACE` seconds is killed (the ledger survives a
SIGKILL at any point). Children ask the kernel for a SIGTERM should the
parent die first, so none is left holding the port.

Once every process is ready, the parent's loop selects on the listening
sockets and the processes' channels for up to `_POLL` seconds, then takes
the signals that came (sigtimedwait, not waiting): a blocked signal cannot
wake select, and unblocking them for a handler is what the mask avoids.
Python has no pselect or signalfd, which would wait for both at once.

Why hand-written: multiprocessing's Pool or Process gives no hand-over of
accepted connections, no readiness handshake and no signal forwarding, and
its fork start method leaves the same fork-safety work to do; gunicorn
supervises WSGI and ASGI HTTP workers, not a PostgreSQL protocol server, and
its workers accept for themselves (the uneven spread this avoids); it would
be a dependency for about 350 lines (this module and dispatch.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Iterable

from dpsql.server.dispatch import Dispatcher, Inbox

# The parent blocks these and takes them with sigtimedwait, so no handler of the
# parent's ever runs in a child between fork() and the child's own handlers.
_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD}
STOP_GRACE = 30.0  # seconds a child may take to shut down before it is killed
_POLL = 0.05  # seconds between looks for signals while waiting on pipes and sockets
_PR_SET_PDEATHSIG = 1

# serve(index, inbox, ready) runs server process `index`, serving the connections
# `inbox` is handed, until it is told to stop; it calls ready() once it takes
# connections, and returns its exit code.
Serve = Callable[[int, Inbox, Callable[[], None]], int]


def supervise(
    count: int,
    serve: Serve,
    *,
    listening: list[socket.socket],
    shared: Iterable[socket.socket] = (),
    announce: Callable[[], object] = lambda: None,
) -> int:
    """Run `serve` in `count` forked processes until they are stopped; the exit code.

    The parent accepts on `listening` (closed in the children) and hands the
    connections over; `shared` are the sockets the children inherit (the
    cancel routes): the parent closes its copies once every child is forked.
    """
    if threading.active_count() > 1:
        raise RuntimeError("dpsql serve --processes must fork before any thread starts")
    dispatcher = Dispatcher(listening)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        return _Supervisor(serve, mask, dispatcher).run(count, list(shared), announce)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        dispatcher.close()


class _Supervisor:
    def __init__(self, serve: Serve, mask: set[signal.Signals], dispatcher: Dispatcher):
        self.serve = serve
        self.mask = mask  # the signal mask before supervise(): the children's
        self.dispatcher = dispatcher
        self.children: dict[int, int] = {}  # pid -> index, while not reaped
        self.starting: dict[int, int] = {}  # readiness pipe's read end -> pid
        self.ready: set[int] = set()  # pids that said they take connections
        self.stopping = False
        self.failed: int | None = None  # the exit code, once a child failed
        self.codes: list[int] = []

    def run(self, count: int, shared: list[socket.socket], announce: Callable[[], object]) -> int:
        self._fork(0)
        self._wait_until_started()
        if self.failed is None and not self.stopping:
            for index in range(1, count):
                self._fork(index)
            self._wait_until_started()
        for sock in shared:
            sock.close()
        if self.failed is None and not self.stopping:
            announce()
        while self.children:
            if self.stopping or self.failed is not None:  # the rest were told to stop
                self.dispatcher.close()
                self._handle(self._next_signal(STOP_GRACE))
            else:
                self._dispatch()
        if self.failed is not None:
            return self.failed
        return next((code for code in self.codes if code), 0)

    def _fork(self, index: int) -> None:
        read, write = os.pipe()
        channel = self.dispatcher.add()
        sys.stdout.flush()  # else the child's copy of buffered output is written twice
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            self._child(index, write, parent, channel)  # never returns
        os.close(write)
        channel.close()
        self.children[pid] = index
        self.starting[read] = pid

    def _child(self, index: int, ready_pipe: int, parent: int, channel: socket.socket) -> None:
        code = 1
        try:
            _stop_with_parent(parent)
            for pipe in self.starting:  # the parent's ends of earlier children's pipes
                os.close(pipe)
            inbox = self.dispatcher.inbox(channel)
            signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)

            def ready() -> None:
                os.write(ready_pipe, b"R")
                os.close(ready_pipe)

            code = self.serve(index, inbox, ready)
        except SystemExit as exc:  # as the interpreter reports it
            if isinstance(exc.code, int) or exc.code is None:
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except KeyboardInterrupt:
            code = 128 + signal.SIGINT
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            # never back into the parent's stack (the command line, a test runner)
            os._exit(code)

    def _wait_until_started(self) -> None:
        """Until every forked child is ready, or has died, or the parent is told to stop."""
        while self.starting and self.failed is None and not self.stopping:
            readable, _, _ = select.select(list(self.starting), [], [], _POLL)
            for pipe in readable:
                pid = self.starting.pop(pipe)
                if os.read(pipe, 1):
                    self.ready.add(pid)
                elif pid in self.children:  # it exited before it was ready: learn how now,
                    self._reaped(pid, os.waitpid(pid, 0)[1])  # not at its SIGCHLD, later
                os.close(pipe)
            while (signum := self._next_signal(0)) is not None:
                self._handle(signum)
        for pipe in self.starting:
            os.close(pipe)
        self.starting.clear()

    def _dispatch(self) -> None:
        """Hand over the connections that came within `_POLL` seconds, then take the
        signals that came."""
        reading, writing = self.dispatcher.waiting()
        readable, writable, _ = select.select(reading, writing, [], _POLL)
        self.dispatcher.ready(readable, writable)
        while (signum := self._next_signal(0)) is not None:
            self._handle(signum)

    def _next_signal(self, timeout: float) -> int | None:
        """The next pending signal of ours, waiting up to `timeout` seconds."""
        info = signal.sigtimedwait(_SIGNALS, timeout)
        if info is None and timeout:  # the stop grace is over
            self._signal_all(signal.SIGKILL)
        return info.si_signo if info is not None else None

    def _handle(self, signum: int | None) -> None:
        if signum in (signal.SIGINT, signal.SIGTERM):
            self.stopping = True
            self._signal_all(signal.SIGTERM)
        elif signum == signal.SIGCHLD:
            self._reap()

    def _reap(self) -> None:
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            self._reaped(pid, status)

    def _reaped(self, pid: int, status: int) -> None:
        index = self.children.pop(pid, None)
        if index is None:
            return
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code  # killed by a signal: as a shell says
        self.codes.append(code)
        if self.stopping or self.failed is not None:
            return
        if pid not in self.ready:  # it failed to start, and has said why itself
            self.failed = code or 1
        else:
            how = f"was killed by signal {code - 128}" if code > 128 else f"exited ({code})"
            print(f"dpsql serve: server process {index} (pid {pid}) {how}; stopping the "
                  "others: restart dpsql serve (a service manager does it on failure)",
                  file=sys.stderr, flush=True)  # fmt: skip
            self.failed = 1
        self._signal_all(signal.SIGTERM)

    def _signal_all(self, signum: int) -> None:
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


def _stop_with_parent(parent: int) -> None:
    """Have the kernel send this child SIGTERM when the parent dies (Linux), so a parent
    killed outright leaves no server process behind holding the port."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the request was made
        os.kill(os.getpid(), signal.SIGTERM)


__all__ = ["STOP_GRACE", "supervise"]
