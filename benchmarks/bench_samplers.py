"""Speed and timing-channel check of the exact samplers, measured in one run.

Prints three tables:
1. throughput (samples/s) of the secure exact discrete Laplace and grid Laplace
   at several scales, against numpy's naive (and float-porous) Generator.laplace;
2. single-call latency (median microseconds for one value);
3. the timing channel: median single-call time conditioned on the size of the
   noise drawn (|noise| <= scale/2 versus |noise| >= 3*scale). A constant-work
   sampler shows the same median in both buckets; as a positive control, a
   textbook sampler that loops once per unit of noise shows the leak.

Run: python benchmarks/bench_samplers.py   (about 30 s on 2 cores)
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import time
from fractions import Fraction

import numpy as np

from dpsql.mechanisms.laplace import GridLaplace
from dpsql.mechanisms.samplers import discrete_laplace, secure_generator

SIZE = 2_000_000
REPEATS = 7  # best of several: the machine may be shared
SCALES = [1, 10, 1000, 10**6]
CALLS = 20_000


def best_rate(draw) -> float:
    draw()  # build and cache tables outside the timing
    best = math.inf
    for _ in range(REPEATS):
        start = time.perf_counter()
        draw()
        best = min(best, time.perf_counter() - start)
    return SIZE / best


def median_latency_us(call) -> float:
    call()
    times = []
    for _ in range(2000):
        start = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1000


def throughput_table() -> None:
    rng = secure_generator()
    naive = np.random.default_rng()
    zeros = np.zeros(SIZE)
    print(
        f"{'scale':>9} | {'discrete Laplace':>17} | {'grid Laplace':>13} | "
        f"{'numpy laplace':>13} | {'dlap/numpy':>10} | {'grid/numpy':>10}"
    )
    print("-" * 88)
    for scale in SCALES:
        grid = GridLaplace(float(scale), 1.0)
        exact = best_rate(lambda s=scale: discrete_laplace(Fraction(s), SIZE, rng))
        gridded = best_rate(lambda g=grid: g.sample(zeros, rng))
        baseline = best_rate(lambda s=scale: naive.laplace(0.0, float(s), SIZE))
        print(
            f"{scale:>9g} | {exact / 1e6:>13.1f} M/s | {gridded / 1e6:>9.1f} M/s | "
            f"{baseline / 1e6:>9.1f} M/s | {exact / baseline:>10.2f} | "
            f"{gridded / baseline:>10.2f}"
        )


def latency_table() -> None:
    rng = secure_generator()
    naive = np.random.default_rng()
    one = np.zeros(1)
    print(f"{'scale':>9} | {'discrete Laplace':>17} | {'grid Laplace':>13} | {'numpy laplace':>13}")
    print("-" * 62)
    for scale in SCALES:
        grid = GridLaplace(float(scale), 1.0)
        exact = median_latency_us(lambda s=Fraction(scale): discrete_laplace(s, 1, rng))
        gridded = median_latency_us(lambda g=grid: g.sample(one, rng))
        baseline = median_latency_us(lambda s=float(scale): naive.laplace(0.0, s, 1))
        print(f"{scale:>9g} | {exact:>14.1f} us | {gridded:>10.1f} us | {baseline:>10.1f} us")


def textbook_loop(scale: float) -> int:
    """Positive control: geometric by repeated coin flips, whose time grows with |noise|."""
    keep = math.exp(-1 / scale)
    while True:
        magnitude = 0
        while random.random() < keep:
            magnitude += 1
        sign = random.random() < 0.5
        if magnitude or not sign:  # reject -0 so that 0 is not counted twice
            return -magnitude if sign else magnitude


def conditioned_medians(call, scale: float) -> tuple[float, float, int, int]:
    """Median single-call time (us) for small and for large |noise|, and the bucket sizes."""
    small, large = [], []
    gc.disable()
    try:
        for _ in range(CALLS):
            start = time.perf_counter_ns()
            value = call()
            elapsed = time.perf_counter_ns() - start
            if abs(value) <= scale / 2:
                small.append(elapsed)
            elif abs(value) >= 3 * scale:
                large.append(elapsed)
    finally:
        gc.enable()
    return statistics.median(small) / 1000, statistics.median(large) / 1000, len(small), len(large)


def timing_table() -> None:
    rng = secure_generator()
    rows = []
    for scale in (1, 100, 10**6):
        exact = Fraction(scale)
        rows.append(
            (
                f"discrete Laplace t={scale:g}",
                scale,
                lambda e=exact: int(discrete_laplace(e, 1, rng)[0]),
            )
        )
    grid = GridLaplace(1000.0, 1.0)
    one = np.zeros(1)
    rows.append(("grid Laplace scale=1000", grid.scale, lambda: float(grid.sample(one, rng)[0])))
    rows.append(("textbook loop t=100 (control)", 100, lambda: textbook_loop(100)))
    print(
        f"{'sampler':<31} | {'|noise| <= t/2':>14} | {'|noise| >= 3t':>13} | "
        f"{'large/small':>11} | {'n small':>7} | {'n large':>7}"
    )
    print("-" * 98)
    for label, scale, call in rows:
        call()
        small, large, n_small, n_large = conditioned_medians(call, scale)
        print(
            f"{label:<31} | {small:>11.2f} us | {large:>10.2f} us | {large / small:>11.3f} | "
            f"{n_small:>7} | {n_large:>7}"
        )


def main() -> None:
    start = time.perf_counter()
    print("Throughput, best of", REPEATS, "runs of", SIZE, "samples (secure = AES-CTR generator)")
    throughput_table()
    print("\nSingle-call latency, median of 2000 calls of one value")
    latency_table()
    print(f"\nTiming channel, {CALLS} single calls each: median time by noise magnitude")
    timing_table()
    print(f"\n(total {time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
