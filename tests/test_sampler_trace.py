"""A single noisy value costs the same Python-level work whatever the noise turns out to be.

A wall-clock test of the timing channel would be flaky; this checks its causes
deterministically. A draw's random words, and the noise made of them, must stay
in numpy arrays handled by a fixed sequence of numpy operations: the bytecodes
run, the C functions called and every scalar a frame holds (Python and numpy
scalars by value, arrays by shape) must be the same for a draw of small noise
(|noise| <= t/2) and one of large noise (|noise| >= 3t), t the expected |noise|.
A branch or loop on the value fails this, and so does Python integer arithmetic
on the words (whose time depends on the numbers: small ones are cached, large
ones take more digits), because the frames then hold the words. What it cannot
see is the time of one numpy operation on different data (table lookups at
different addresses): benchmarks/bench_samplers.py measures that (table 4).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

import numpy as np
import pytest

from dpsql.mechanisms import gaussian
from dpsql.mechanisms.gaussian import DiscreteGaussian, GridGaussian
from dpsql.mechanisms.grid import GridMechanism
from dpsql.mechanisms.laplace import DiscreteLaplace, GridLaplace
from dpsql.mechanisms.samplers import secure_generator
from dpsql.mechanisms.staircase import GridStaircase, Staircase

DRAWS = 3  # of each size of noise


def _scalar(value: object) -> object:
    """What a frame's local may reveal: scalars by value, arrays by dtype and shape."""
    if isinstance(value, int | float | np.generic):
        return value
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape)
    return None


def _work(call: Callable[[], np.ndarray]) -> tuple[float, list[tuple]]:
    """call()'s value and the work it ran: each bytecode (with the locals at each line) and
    each C function called, in order."""
    events: list[tuple] = []

    def local(frame, event: str, _arg: object):
        where = (frame.f_code.co_filename, frame.f_code.co_name, frame.f_lasti)
        if event == "line":
            state = sorted(
                (name, type(v).__name__, _scalar(v)) for name, v in frame.f_locals.items()
            )
            events.append((*where, tuple(state)))
        elif event == "opcode":
            events.append(where)
        return local

    def enter(frame, _event: str, _arg: object):
        frame.f_trace_opcodes = True
        return local

    def c_calls(_frame, event: str, arg: object) -> None:
        if event == "c_call":
            events.append(("C", getattr(arg, "__qualname__", repr(arg))))

    gc.collect()  # no collection (and no weakref callback) in the middle of a trace
    gc.disable()
    sys.setprofile(c_calls)
    sys.settrace(enter)
    try:
        value = call()
    finally:
        sys.settrace(None)
        sys.setprofile(None)
        gc.enable()
    return float(value[0]), events


def _generator(seed: int, pooled: bool) -> np.random.Generator:
    """A generator whose first request the pool fills (pooled) or the sampler draws alone.
    Every later fill draws as many values as the first (pool.FILL), so the first stands for
    every refill too."""
    return secure_generator(seed) if pooled else np.random.Generator(np.random.PCG64(seed))


def _draw(mechanism, values: np.ndarray, rng: np.random.Generator, monkeypatch) -> tuple:
    """|noise| of one draw, and how many passes of candidates it took (1 but for the Gaussian,
    whose rejection sampler needs another pass when too few candidates were accepted: more
    work, but how many passes is independent of the values accepted)."""
    inner = mechanism.steps if isinstance(mechanism, GridGaussian) else mechanism
    if not isinstance(inner, DiscreteGaussian):
        return abs(float(mechanism.sample(values, rng)[0])), 1
    plan, passes = gaussian._plan(inner.sigma2), []
    accept = plan._accept
    with monkeypatch.context() as patch:
        patch.setattr(plan, "_accept", lambda *args: passes.append(1) or accept(*args))
        noise = abs(float(mechanism.sample(values, rng)[0]))
    return noise, len(passes)


MECHANISMS = [
    DiscreteLaplace(1, 1.0),  # one word, from a tail table
    DiscreteLaplace(30, 1.0),
    DiscreteLaplace(10**6, 1.0),  # two words: a digit and the tail
    DiscreteLaplace(10**9, 1.0),  # three words
    GridLaplace(1000.0, 1.0),
    Staircase(100, 1.0),  # one table of offsets, block from a geometric table
    Staircase(5000, 2.0),  # step and offset from two words
    Staircase(100, 0.005),  # the block from a folded discrete Laplace
    GridStaircase(1000.0, 1.0),  # ~2^20 grid steps a block: step and offset words
    DiscreteGaussian(1, 0.5),
    DiscreteGaussian(100, 0.5),
    DiscreteGaussian(1000, 0.5),  # candidates of two words
    GridGaussian(1000.0, 0.5),
]


@pytest.mark.parametrize("pooled", [False, True], ids=["unpooled", "first-pooled"])
@pytest.mark.parametrize(
    "mechanism", MECHANISMS, ids=lambda m: f"{type(m).__name__}-{m.expected_abs_error():.3g}"
)
def test_small_and_large_noise_run_the_same_work(mechanism, pooled: bool, monkeypatch) -> None:
    t = mechanism.expected_abs_error()
    values = np.zeros(1) if isinstance(mechanism, GridMechanism) else np.zeros(1, dtype=np.int64)
    mechanism.sample(values, _generator(0, pooled))  # tables built outside the traces
    seeds: dict[str, list[int]] = {"small": [], "large": []}
    seed = 0
    while min(len(found) for found in seeds.values()) < DRAWS:
        seed += 1
        noise, passes = _draw(mechanism, values, _generator(seed, pooled), monkeypatch)
        size = "small" if noise <= t / 2 else "large" if noise >= 3 * t else None
        if size and passes == 1 and len(seeds[size]) < DRAWS:
            seeds[size].append(seed)
    works = {}
    for size, found in seeds.items():
        for seed in found:
            rng = _generator(seed, pooled)
            noise, work = _work(lambda rng=rng: mechanism.sample(values, rng))
            assert (abs(noise) <= t / 2) == (size == "small")  # the seed's draw again
            works[size, seed] = work
    reference = works["small", seeds["small"][0]]
    assert len(reference) > 100  # the trace saw the sampler's work
    for (size, seed), work in works.items():
        assert work == reference, f"the {size} noise of seed {seed} ran different work"
