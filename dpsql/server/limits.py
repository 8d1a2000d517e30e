"""The wire server's resource limits and its per-address back-off on failed logins.

`Limits` is what one `dpsql serve` allows a client: time to log in, statements
and parameters per connection, connections per analyst, time per query,
groups per released result, and whether TLS is required. `Backoff` slows
password guessing: each failed login from an address makes the next login
from it wait longer, whichever user name it tries, so unknown users and wrong
passwords still look alike.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

from dpsql.sql.plan import MAX_GROUPS


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
        failures = self._failures.get(address, 0)
        if not failures or not self.base:
            return 0.0
        return min(self.most, self.base * 2 ** min(failures - 1, 64))

    async def wait(self, address: str) -> None:
        """Wait for this address's next login slot (none for an address without failures)."""
        step = self.delay(address)
        if not step:
            return
        now = time.monotonic()
        start = max(now, self._next_slot.get(address, now))
        self._next_slot[address] = start + step
        await asyncio.sleep(start + step - now)

    def record(self, address: str, succeeded: bool) -> None:
        # A success halves the count rather than clearing it: someone with an
        # account of their own could otherwise reset the delay between guesses.
        failures = self._failures.pop(address, 0)
        failures = failures // 2 if succeeded else failures + 1
        if not failures:
            self._next_slot.pop(address, None)
            return
        self._failures[address] = failures
        while len(self._failures) > self.remember:
            forgotten, _ = self._failures.popitem(last=False)
            self._next_slot.pop(forgotten, None)


__all__ = ["Backoff", "Limits"]
