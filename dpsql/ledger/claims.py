"""Claims on a ledger: one answer at a time per statement, across every thread, process
and proxy that shares the ledger.

A Session looks up its release cache and then charges. Two identical statements
racing through that gap would both be charged, and a client that retries after
a dropped connection does exactly that, often through another server process
(`dpsql serve --processes`) or another proxy. A claim on the statement's key
makes the second wait for the first, and then find its release in the cache.

A key maps to one of `SLOTS` slots; two keys sharing a slot only wait for each
other. Each claim first takes an in-process lock (one of `STRIPES`, picked by
the slot, so threads of one process never both hold a slot), then the slot
across processes:

* an SQLite file ledger: a one-byte lock at offset `slot` of `<ledger>-claims`,
  an open file description (OFD) lock on Linux, so it belongs to this file
  descriptor rather than to the process: two ledger objects of one process
  exclude each other too, and closing one does not drop the other's locks (a
  POSIX `lockf` lock would do both). Elsewhere, `lockf`. The kernel releases
  it when the process dies, however it dies.
* a PostgreSQL ledger: a session advisory lock on a connection of its own
  (`pg_try_advisory_lock`, polled, since a blocking wait would hold the
  connection every thread of the process shares). PostgreSQL releases it when
  the session ends, so a proxy that dies leaves no claim behind
  (`dpsql.ledger.postgres.PostgresClaims`, beside the psycopg it needs).
* a ledger in memory: the in-process lock alone (no other process can share it).

Hand-written: the standard library's `fcntl` gives the locks but not the slot
mapping, and no lock library covers both a file and PostgreSQL.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import struct
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from dpsql.errors import OperationalError

STRIPES = 256  # in-process locks
SLOTS = 1 << 16  # a multiple of STRIPES: keys sharing a slot share a stripe

# struct flock of Linux on 64-bit machines: type, whence, start, length, pid.
_FLOCK = "hhqqi4x"
_OFD = hasattr(fcntl, "F_OFD_SETLKW") and struct.calcsize(_FLOCK) == 32


def slot_of(key: str) -> int:
    """The slot a key claims: the same in every process (Python's hash() is not)."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % SLOTS


class Claims:
    """Claims among the threads of one process (a ledger in memory)."""

    def __init__(self) -> None:
        self._stripes = [threading.Lock() for _ in range(STRIPES)]

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Hold `key` until the block ends, waiting for whoever holds it (or its slot)."""
        slot = slot_of(key)
        with self._stripes[slot % STRIPES], self._across_processes(slot):
            yield

    def _across_processes(self, slot: int) -> AbstractContextManager[None]:
        return nullcontext()

    def close(self) -> None:
        """Give back what the claims hold open (a file, a connection)."""


class OwnHandleClaims(Claims):
    """Claims across processes through a handle (a file, a connection) each process opens
    for itself, on first use and again after a fork: a child must not share its
    parent's (an OFD lock belongs to the open file description a fork shares; a
    PostgreSQL session would carry two conversations)."""

    def __init__(self) -> None:
        super().__init__()
        self._handle: Any = None
        self._pid = os.getpid()
        self._opening = threading.Lock()  # also orders a release after close()

    def _open(self) -> Any:
        raise NotImplementedError

    def _usable(self, handle: Any) -> bool:
        return True

    def _inherited(self, handle: Any) -> None:
        """What to do with the parent's handle in a forked child (left open by default)."""

    def _close(self, handle: Any) -> None:
        raise NotImplementedError

    def _own(self) -> Any:
        with self._opening:
            mine = self._pid == os.getpid()
            if self._handle is not None and not mine:
                self._inherited(self._handle)
            if self._handle is None or not mine or not self._usable(self._handle):
                self._handle, self._pid = self._open(), os.getpid()
            return self._handle

    def close(self) -> None:
        with self._opening:
            if self._handle is not None and self._pid == os.getpid():
                self._close(self._handle)
            self._handle = None


class FileClaims(OwnHandleClaims):
    """Claims on byte locks of a file beside an SQLite ledger."""

    def __init__(self, path: str, mode: int = 0o600) -> None:
        super().__init__()
        self.path = path
        self._mode = mode  # the file's permissions (the ledger's)

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, self._mode)
            if os.fstat(fd).st_uid == os.getuid():  # as SQLite does, past the umask
                os.fchmod(fd, self._mode)
        except OSError as exc:
            raise OperationalError(
                f"cannot open {self.path}, the file that keeps identical statements "
                f"from being charged twice at once: {exc}; dpsql needs to write "
                "beside the ledger: give it write access to that folder (nothing was "
                "charged)"
            ) from exc
        return fd

    def _close(self, handle: int) -> None:
        os.close(handle)

    @contextmanager
    def _across_processes(self, slot: int) -> Iterator[None]:
        fd = self._own()
        _lock_byte(fd, slot, fcntl.F_WRLCK)
        try:
            yield
        finally:
            with self._opening:
                # closed meanwhile (the ledger was): the lock went with the descriptor,
                # whose number may now be another file's
                if self._handle == fd:
                    _lock_byte(fd, slot, fcntl.F_UNLCK)


def _lock_byte(fd: int, offset: int, kind: int) -> None:
    """Take (waiting) or give back a write lock on one byte of `fd`."""
    if _OFD:
        command = fcntl.F_OFD_SETLKW if kind != fcntl.F_UNLCK else fcntl.F_OFD_SETLK
        fcntl.fcntl(fd, command, struct.pack(_FLOCK, kind, os.SEEK_SET, offset, 1, 0))
    else:
        fcntl.lockf(fd, fcntl.LOCK_EX if kind != fcntl.F_UNLCK else fcntl.LOCK_UN, 1, offset)
