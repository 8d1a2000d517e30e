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
  (`dpsql._ledger_postgres.PostgresClaims`, beside the psycopg it needs).
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


class FileClaims(Claims):
    """Claims on byte locks of a file beside an SQLite ledger."""

    def __init__(self, path: str, mode: int = 0o600) -> None:
        super().__init__()
        self.path = path
        self._mode = mode  # the file's permissions (the ledger's)
        self._fd: int | None = None
        self._pid = os.getpid()
        self._opening = threading.Lock()

    def _descriptor(self) -> int:
        with self._opening:
            # A forked child shares its parent's open file description, and with it
            # the parent's OFD locks: it opens its own.
            if self._fd is None or self._pid != os.getpid():
                try:
                    self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, self._mode)
                    if os.fstat(self._fd).st_uid == os.getuid():  # as SQLite does, past the umask
                        os.fchmod(self._fd, self._mode)
                except OSError as exc:
                    raise OperationalError(
                        f"cannot open {self.path}, the file that keeps identical statements "
                        f"from being charged twice at once: {exc}; dpsql needs to write "
                        "beside the ledger"
                    ) from exc
                self._pid = os.getpid()
            return self._fd

    @contextmanager
    def _across_processes(self, slot: int) -> Iterator[None]:
        fd = self._descriptor()
        _lock_byte(fd, slot, fcntl.F_WRLCK)
        try:
            yield
        finally:
            with self._opening:
                # closed meanwhile (the ledger was): the lock went with the descriptor,
                # whose number may now be another file's
                if self._fd == fd:
                    _lock_byte(fd, slot, fcntl.F_UNLCK)

    def close(self) -> None:
        with self._opening:
            if self._fd is not None and self._pid == os.getpid():
                os.close(self._fd)
            self._fd = None


def _lock_byte(fd: int, offset: int, kind: int) -> None:
    """Take (waiting) or give back a write lock on one byte of `fd`."""
    if _OFD:
        command = fcntl.F_OFD_SETLKW if kind != fcntl.F_UNLCK else fcntl.F_OFD_SETLK
        fcntl.fcntl(fd, command, struct.pack(_FLOCK, kind, os.SEEK_SET, offset, 1, 0))
    else:
        fcntl.lockf(fd, fcntl.LOCK_EX if kind != fcntl.F_UNLCK else fcntl.LOCK_UN, 1, offset)
