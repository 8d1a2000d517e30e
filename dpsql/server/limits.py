"""The wire server's resource limits and its per-address back-off on failed logins.

`Limits` is what one `dpsql serve` allows a client: time to log in, statements
and parameters per connection, connections per analyst, time per query,
groups per released result, and whether TLS is required. `AnalystConnections`
counts each analyst's connections against their limit, in one process or, made
before the fork, across the processes of `--processes N`. `Backoff` slows
password guessing: each failed login from an address makes the next login
from it wait longer, whichever user name it tries, so unknown users and wrong
passwords still look alike.
"""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import os
import time
from collections import OrderedDict
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from dpsql.results import MAX_GROUPS


@dataclass(frozen=True)
class Limits:
    """What one client may use; the defaults suit an interactive, shared proxy."""

    #: Seconds from accepting a connection to a completed login (PostgreSQL's
    #: authentication_timeout): a client that stalls during startup is dropped.
    auth_timeout: float = 60.0
    #: Seconds a statement may run before the client gets 57014 and the statement
    #: is interrupted in the database (0: no limit).
    query_timeout: float = 300.0
    #: Groups one query may release; more is refused after the charge (54000).
    #: Only released groups are held, so this bounds a query's memory.
    max_groups: int = MAX_GROUPS
    #: Authenticated connections one analyst may hold at once.
    connections_per_analyst: int = 32
    #: Prepared statements and named portals one connection may keep.
    statements_per_connection: int = 1000
    #: Parameters one statement may take (PostgreSQL's own limit is 65535).
    parameters_per_statement: int = 10_000
    #: Refuse clients that did not ask for TLS (needs a certificate).
    require_tls: bool = False
    #: The delay after the first failed login from an address; it doubles per failure.
    backoff_base: float = 0.25
    #: The longest delay before a login from an address with failures.
    backoff_max: float = 10.0


class AnalystConnections:
    """The connections each analyst holds now, in this server process."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def admit(self, analyst: str, most: int) -> bool:
        """Count one more connection of `analyst`, unless they hold `most` already."""
        count = self._counts.get(analyst, 0)
        if count >= most:
            return False
        self._counts[analyst] = count + 1
        return True

    def leave(self, analyst: str) -> None:
        """Count one connection of `analyst` fewer."""
        count = self._counts.pop(analyst) - 1
        if count:
            self._counts[analyst] = count


class SharedAnalystConnections(AnalystConnections):
    """The connections each analyst of the policy holds now, in every process forked after
    this was made: one counter per analyst in shared memory, under one lock.

    A process that dies leaves its connections counted, but then the parent stops
    every process (dpsql/server/processes.py). An analyst outside the list (none
    logs in: the policy names every analyst) is counted in this process only.
    """

    def __init__(self, analysts: Iterable[str]):
        super().__init__()
        self._index = {analyst: i for i, analyst in enumerate(sorted(set(analysts)))}
        # fork: the children inherit the shared memory and its lock (a semaphore)
        self._shared = multiprocessing.get_context("fork").Array("q", max(len(self._index), 1))

    def admit(self, analyst: str, most: int) -> bool:
        index = self._index.get(analyst)
        if index is None:
            return super().admit(analyst, most)
        with self._shared.get_lock():
            if self._shared[index] >= most:
                return False
            self._shared[index] += 1
            return True

    def leave(self, analyst: str) -> None:
        index = self._index.get(analyst)
        if index is None:
            super().leave(analyst)
            return
        with self._shared.get_lock():
            self._shared[index] -= 1


class Backoff:
    """Per-address delays before login attempts, doubling with each failure.

    Concurrent attempts from one address queue behind each other (each takes
    the next slot), so opening many connections at once does not speed up
    guessing. A successful login halves the address's count. At most `remember`
    addresses are kept, the least recently failing forgotten first, so a
    spray of addresses cannot grow memory without bound.
    """

    def __init__(self, base: float, most: float, remember: int = 10_000):
        self.base = base
        self.most = most
        self.remember = remember
        self._failures: OrderedDict[str, int] = OrderedDict()
        self._next_slot: dict[str, float] = {}

    def delay(self, address: str) -> float:
        """How long an attempt from `address` starting now would wait."""
        with self._locked():
            return self._step(self._entry(address)[0])

    def _step(self, failures: int) -> float:
        if not failures or not self.base:
            return 0.0
        return min(self.most, self.base * 2 ** min(failures - 1, 64))

    async def wait(self, address: str) -> None:
        """Wait for this address's next login slot (none for an address without failures)."""
        now = time.monotonic()
        with self._locked():
            failures, next_slot = self._entry(address)
            step = self._step(failures)
            if not step:
                return
            start = max(now, next_slot)
            self._store(address, failures, start + step, touched=False)
        await asyncio.sleep(start + step - now)

    def record(self, address: str, succeeded: bool) -> None:
        # A success halves the count rather than clearing it: someone with an
        # account of their own could otherwise reset the delay between guesses.
        with self._locked():
            failures, next_slot = self._entry(address)
            failures = failures // 2 if succeeded else failures + 1
            self._store(address, failures, next_slot, touched=True)

    # -- where the counts are kept: this process's memory ------------------------------

    def _locked(self) -> AbstractContextManager[object]:
        return nullcontext()  # one event loop: nothing runs in between

    def _entry(self, address: str) -> tuple[int, float]:
        """The address's failures and the time its next attempt may start."""
        return self._failures.get(address, 0), self._next_slot.get(address, 0.0)

    def _store(self, address: str, failures: int, next_slot: float, *, touched: bool) -> None:
        """Keep the address's counts (`touched`: a login ended, which makes it the most
        recent address, remembered longest; else only its next slot moved)."""
        if not failures:
            self._failures.pop(address, None)
            self._next_slot.pop(address, None)
            return
        if touched:
            self._failures.pop(address, None)
        self._failures[address] = failures
        self._next_slot[address] = next_slot
        while len(self._failures) > self.remember:
            forgotten, _ = self._failures.popitem(last=False)
            self._next_slot.pop(forgotten, None)


class SharedBackoff(Backoff):
    """The back-off of every process forked after this was made: a guesser whose
    connections the parent spreads over N processes waited 1/N of the delay.

    The counts live in shared memory (every process reads the same monotonic
    clock): a table of `remember` entries under one lock, an address in the
    entry its keyed hash picks (the key is secret, so no one picks addresses
    that share an entry). A failing address takes over an entry another one
    held, forgetting it, as the local back-off forgets the least recent address.
    """

    def __init__(self, base: float, most: float, remember: int = 16_384):
        super().__init__(base, most, remember)
        context = multiprocessing.get_context("fork")
        self._tags = context.RawArray("q", remember)  # the address's hash; 0: empty
        self._counts = context.RawArray("q", remember)
        self._slots = context.RawArray("d", remember)
        self._lock = context.Lock()
        self._key = os.urandom(16)

    def _locked(self) -> AbstractContextManager[object]:
        return self._lock

    def _place(self, address: str) -> tuple[int, int]:
        digest = hashlib.blake2b(address.encode(), digest_size=8, key=self._key).digest()
        tag = int.from_bytes(digest, "big", signed=True) or 1
        return tag % self.remember, tag

    def _entry(self, address: str) -> tuple[int, float]:
        index, tag = self._place(address)
        if self._tags[index] != tag:
            return 0, 0.0
        return self._counts[index], self._slots[index]

    def _store(self, address: str, failures: int, next_slot: float, *, touched: bool) -> None:
        index, tag = self._place(address)
        if self._tags[index] != tag and not (touched and failures):
            return  # another address's entry, and nothing of this one's to remember
        self._tags[index] = tag if failures else 0
        self._counts[index] = failures
        self._slots[index] = next_slot


__all__ = ["AnalystConnections", "Backoff", "Limits", "SharedAnalystConnections", "SharedBackoff"]
