"""Noise drawn ahead in vectorised batches and handed out a few values at a time: this module's job.

A vectorised draw costs an exact sampler a fixed sequence of numpy operations
(8-20 us on 2 cores) whatever its size up to a few hundred values. A
NoisePool wraps one sampler (one mechanism at one parameter) and keeps for
each generator a reserve of values drawn ahead; a small request is a slice of
that reserve (under 4 us). Every fill, a generator's first request's and each
refill, draws FILL values: the request that pays for it is the slowest single
call, so its size is chosen for that call's time, not for the average (see FILL).
Filling reserves when a session opens would not spare its first calls: a
reserve belongs to one sampler, one mechanism at one parameter (sensitivity,
epsilon or rho), and which ones a session needs is known only when its queries
are planned.

Why this keeps the samplers' guarantees:
- every value is an exact sample the wrapped sampler drew from the requesting
  generator's own stream; reserves are never shared between generators, so a
  seeded generator stays reproducible and one session's noise never reaches
  another's;
- each value is handed out once: the read position only moves forward under a
  lock, so threads sharing a generator never get the same value; values left
  when a request does not fit are dropped, a choice made on counts alone;
- serving copies a slice, whose time depends on the request's size and never
  on the values; when a refill happens depends only on how many values were
  served, and a refill takes the wrapped sampler's time, itself independent of
  the values.
Values waiting in memory reveal no more than the generator does: whoever can
read this process's memory can read the AES key and compute its noise anyway.
A forked child drops every reserve it inherited (the parent still serves them),
and samplers.secure_generator re-keys the child's generators.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable

import numpy as np

POOL_REQUEST = 32  # larger requests share the sampler's fixed cost among their own values
# Values per fill. Measured (CPU time, 2 cores): a draw of 64 costs 0.5-2.5 us more than a draw
# of 1, one of 256 another 2-7 us (the Gaussian the most); refills of 256 made the slowest single
# calls 35-45 us, and saved under 0.3 us per call on average against fills of 64. 512 bytes
# per (sampler, generator).
FILL = 64

Draw = Callable[[int, np.random.Generator], np.ndarray]


class PoolableGenerator(np.random.Generator):
    """numpy's Generator, weakly referenceable so that a pool's reserves go when it does.

    numpy's own Generator cannot be weakly referenced; a pool keeping it alive
    would keep every session's generator and reserves for the life of the process.
    """


class _Reserve:
    """Values drawn ahead for one generator, and where the next unserved one is."""

    __slots__ = ("next", "values")

    def __init__(self) -> None:
        self.values = np.empty(0, dtype=np.int64)
        self.next = 0


class NoisePool:
    """draw(size, rng) of one sampler, serving small requests on a PoolableGenerator from a
    reserve refilled by one vectorised draw (other generators and large requests go through)."""

    def __init__(self, draw: Draw) -> None:
        self._draw = draw
        self._empty()
        _POOLS.add(self)

    def _empty(self) -> None:
        self._reserves: weakref.WeakKeyDictionary[PoolableGenerator, _Reserve] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def __call__(self, size: int, rng: np.random.Generator) -> np.ndarray:
        if not 0 <= size <= POOL_REQUEST or not isinstance(rng, PoolableGenerator):
            return self._draw(size, rng)  # the sampler refuses a negative size
        with self._lock:
            reserve = self._reserves.get(rng)
            if reserve is None:
                reserve = self._reserves[rng] = _Reserve()
            start, stop = reserve.next, reserve.next + size
            if stop > reserve.values.size:
                reserve.values = self._draw(FILL, rng)
                start, stop = 0, size
            reserve.next = stop
            return reserve.values[start:stop].copy()


_POOLS: weakref.WeakSet[NoisePool] = weakref.WeakSet()


def _forget_reserves() -> None:
    """In a forked child: serving the parent's reserves would repeat the parent's noise, and a
    lock held by another thread at the fork would never be released (that thread is gone)."""
    for pool in list(_POOLS):
        pool._empty()


os.register_at_fork(after_in_child=_forget_reserves)
