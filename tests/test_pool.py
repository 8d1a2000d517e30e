"""The noise pool: pooled values are the sampler's own draws in order, each served once.

A counting stand-in sampler (every value it ever returns is distinct) shows
which values a pool serves, drops and never repeats, including under threads;
the real mechanisms show that single pooled calls return exactly what one
vectorised draw from the same seed returns, so pooling cannot change the law.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from dpsql.mechanisms import samplers
from dpsql.mechanisms.gaussian import DiscreteGaussian, GridGaussian
from dpsql.mechanisms.laplace import DiscreteLaplace, GridLaplace
from dpsql.mechanisms.pool import FILL, POOL_REQUEST, NoisePool, PoolableGenerator
from dpsql.mechanisms.samplers import secure_generator
from dpsql.mechanisms.staircase import Staircase


class Counter:
    """A stand-in sampler returning 0, 1, 2, ... across calls, and recording each call's size."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self._next = itertools.count()
        self._lock = threading.Lock()

    def __call__(self, size: int, rng: np.random.Generator) -> np.ndarray:
        with self._lock:
            self.sizes.append(size)
            return np.array([next(self._next) for _ in range(size)], dtype=np.int64)


def test_every_fill_draws_the_same_number_of_values() -> None:
    counter = Counter()
    pool, rng = NoisePool(counter), secure_generator(1)
    served = [int(pool(1, rng)[0]) for _ in range(10_000)]
    assert served == list(range(10_000))  # one at a time, in order, none skipped or repeated
    # the first fill and every refill: the slowest single call is one draw of FILL values
    assert counter.sizes == [FILL] * -(-10_000 // FILL)


def test_a_request_that_does_not_fit_drops_the_rest_and_never_serves_it() -> None:
    counter = Counter()
    pool, rng = NoisePool(counter), secure_generator(1)
    half = (FILL - 4) // 2
    assert pool(half, rng).tolist() + pool(half, rng).tolist() == list(range(2 * half))
    again = pool(POOL_REQUEST, rng)  # 4 values left: not enough
    assert again.tolist() == list(range(FILL, FILL + POOL_REQUEST))
    assert counter.sizes == [FILL, FILL]


def test_large_requests_and_plain_generators_go_straight_to_the_sampler() -> None:
    counter = Counter()
    pool = NoisePool(counter)
    assert pool(POOL_REQUEST + 1, secure_generator(1)).size == POOL_REQUEST + 1
    assert pool(1, np.random.default_rng(1)).size == 1
    assert counter.sizes == [POOL_REQUEST + 1, 1]
    with pytest.raises(ValueError):
        samplers.laplace_sampler(1)(-1, secure_generator(1))  # not an empty slice of the pool


def test_threads_sharing_a_generator_never_get_the_same_value() -> None:
    counter = Counter()
    pool, rng = NoisePool(counter), secure_generator(2)
    results: list[list[int]] = [[] for _ in range(8)]

    def work(out: list[int], seed: int) -> None:
        sizes = np.random.default_rng(seed).integers(1, POOL_REQUEST + 1, 400)
        for size in sizes:
            out.extend(pool(int(size), rng).tolist())

    threads = [threading.Thread(target=work, args=(out, i)) for i, out in enumerate(results)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    served = [value for out in results for value in out]
    assert len(served) == len(set(served))
    assert max(served) < sum(counter.sizes)  # only values the sampler drew


def test_reserves_are_per_generator_and_go_with_it() -> None:
    counter = Counter()
    pool = NoisePool(counter)
    first, second = secure_generator(3), secure_generator(3)
    assert pool(1, first)[0] == 0 and pool(1, second)[0] == FILL  # not first's reserve
    assert pool(1, first)[0] == 1
    del first, second
    gc.collect()
    assert len(pool._reserves) == 0


def test_secure_generators_are_poolable() -> None:
    assert isinstance(secure_generator(), PoolableGenerator)
    assert isinstance(secure_generator(5), PoolableGenerator)


@pytest.mark.parametrize(
    "mechanism",
    [
        DiscreteLaplace(1, 1.0),
        DiscreteLaplace(3, 0.01),
        Staircase(100, 0.5),
        Staircase(10_000, 5.0),
        DiscreteGaussian(1, 0.5),
        DiscreteGaussian(10_000, 0.5),
        GridLaplace(1000.0, 1.0),
        GridGaussian(2.5, 0.1),
    ],
    ids=lambda mechanism: f"{type(mechanism).__name__}-{mechanism.scale:g}",
)
def test_single_calls_are_the_draws_of_the_same_seed(mechanism) -> None:
    fills = [FILL, FILL]  # the first fill and the next
    pooled = secure_generator(7)
    singles = [mechanism.sample(np.zeros(1, dtype=np.int64), pooled)[0] for _ in range(sum(fills))]
    # the same stream, read by draws of the same sizes on an unpooled generator
    plain = np.random.Generator(np.random.PCG64(7))
    draws = [mechanism.sample(np.zeros(size, dtype=np.int64), plain) for size in fills]
    assert np.array_equal(np.array(singles), np.concatenate(draws))


_FORK_SCRIPT = """
import json, os
import numpy as np
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.mechanisms import samplers
from dpsql.mechanisms.samplers import secure_generator

rng, mechanism, one = secure_generator(), DiscreteLaplace(1, 0.01), np.zeros(1, dtype=np.int64)
mechanism.sample(one, rng)  # the reserve now holds values the parent will serve
read, write = os.pipe()
pid = os.fork()
draws = {"words": rng.bit_generator.random_raw(4).tolist()}  # the stream right after the fork
draws["noise"] = [int(mechanism.sample(one, rng)[0]) for _ in range(40)]  # the parent's reserve
if pid == 0:
    os.write(write, json.dumps(draws).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps([draws, json.loads(os.read(read, 1 << 16))]))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_neither_serves_the_parents_reserve_nor_repeats_its_stream() -> None:
    # in a process of its own: fork() with the test suite's threads around is unsafe
    done = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    parent, child = json.loads(done.stdout)
    assert not set(parent["words"]) & set(child["words"])
    # scale 100: two independent values agree with probability < 0.003 (copies would agree in
    # all 40 places); 10 agreements would have probability below 1e-15
    assert sum(a == b for a, b in zip(parent["noise"], child["noise"], strict=True)) < 10
