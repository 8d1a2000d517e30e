"""A least-recently-used cache bounded by the total weight of its values: this module's job.

Used for what a process keeps between queries: streams planned before and
their noise (sql/running.py), and the wire server's answers and statement
shapes (server/). Hand-written on an OrderedDict: functools.lru_cache wraps a
function and bounds the number of entries, not their size, and a noise vector
of a long stream weighs millions of values.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any


class WeightedLru:
    """Values by key; the least recently used are dropped once the weights add up past
    `limit` (the newest always stays). A value weighing more than `largest` (default:
    `limit`) is not kept: it would push out many others. Safe to share between threads."""

    def __init__(self, limit: int, *, largest: int | None = None):
        self.limit = limit
        self.largest = limit if largest is None else largest
        self.total = 0
        self._entries: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        """The value kept under `key` (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: Any, value: Any, weight: int = 1) -> None:
        """Keep `value` under `key`, replacing what was there, unless it weighs too much."""
        if weight > self.largest:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.total -= old[1]
            self._entries[key] = value, weight
            self.total += weight
            while self.total > self.limit and len(self._entries) > 1:
                self.total -= self._entries.popitem(last=False)[1][1]
