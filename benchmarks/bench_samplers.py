"""Speed and timing-channel check of the exact samplers and mechanisms, measured in one run.

Prints four tables:
1. each mechanism (secure discrete Laplace, staircase at epsilon 0.1..10, discrete
   Gaussian at sigma 1..1e4, and the grid versions of the three for real values)
   against numpy's naive float Laplace and Gaussian and,
   when it is installed, OpenDP: samples/s for batches of a million, and single
   calls: the median (served from the generator's noise pool, pool.py), the mean
   over all calls (refills included), the first and second calls on a new
   generator (the first fills its pool, the second is served from it) with the
   99th percentile of first calls (the worst single calls, OS noise included) and
   the median first call after other work has evicted the caches (as between two
   queries of a server: the realistic worst case, not part of the verdict), a
   refill (an unpooled draw of the pool's FILL values, what the call that
   refills pays) and a call on an unpooled generator, with the targets (>= 30 M/s
   Laplace and staircase, >= 15 M/s Gaussian, every single call < 40 us);
2. throughput of the discrete Laplace sampler and grid Laplace across scales;
3. single-call latency across scales, pooled and unpooled;
4. the timing channel: median single-call time conditioned on the size of the
   noise drawn (|noise| <= t/2 versus |noise| >= 3t, t the noise's E|X| or scale),
   for pooled calls and for the unpooled samplers that fill the pools.
   A sampler whose time does not depend on the value shows the same median in
   both buckets; as a positive control, a textbook sampler that loops once per
   unit of noise shows the leak.

Run: python benchmarks/bench_samplers.py [--quick]   (about a minute on 2 cores)
"""

from __future__ import annotations

import gc
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from fractions import Fraction

import numpy as np
from machine import describe

from dpsql.mechanisms.gaussian import DiscreteGaussian, GridGaussian
from dpsql.mechanisms.laplace import DiscreteLaplace, GridLaplace
from dpsql.mechanisms.pool import FILL
from dpsql.mechanisms.samplers import discrete_laplace, laplace_sampler, secure_generator
from dpsql.mechanisms.staircase import GridStaircase, Staircase

QUICK = "--quick" in sys.argv  # small sizes, for development and the smoke test
SIZE = 200_000 if QUICK else 2_000_000
BATCH = 100_000 if QUICK else 1_000_000
REPEATS = 2 if QUICK else 7  # best of several: the machine may be shared
SCALES = [1, 10, 1000, 10**6]
CALLS = 2_000 if QUICK else 40_000
LATENCY_CALLS = 200 if QUICK else 2000
FIRST_CALLS = 50 if QUICK else 300  # new generators, one first call each
COLD_CALLS = 10 if QUICK else 60  # first calls after evicting the caches (3 ms each)
ROUNDS = 2 if QUICK else 10  # table 1's single calls: rounds over all mechanisms
OPENDP_BATCH = 2_000 if QUICK else 20_000  # OpenDP draws ~0.1 M/s: a million would take minutes
STAIRCASE_EPSILONS = [0.1, 0.5, 1.0, 2.0, 5.0, 10.0]
STAIRCASE_SENSITIVITY = 100
GAUSSIAN_SIGMAS = [1, 10, 100, 1000, 10**4]
TARGETS = {"laplace": (30e6, 40.0), "staircase": (30e6, 40.0), "gaussian": (15e6, 40.0)}


# Rates and latencies count this process's CPU time, not wall time: on a machine shared
# with other work, wall time mostly measures the others (the timing-channel table, which
# compares two buckets of the same calls, keeps wall time: that is what an observer sees).


def best_rate(draw, size: int = SIZE) -> float:
    draw()  # build and cache tables outside the timing
    best = math.inf
    for _ in range(REPEATS):
        start = time.process_time()
        draw()
        best = min(best, time.process_time() - start)
    return size / best


def latencies_us(call) -> tuple[float, float]:
    """Median and mean CPU time of LATENCY_CALLS calls in a row (the mean counts refills)."""
    call()
    times = []
    for _ in range(LATENCY_CALLS):
        start = time.process_time_ns()
        call()
        times.append(time.process_time_ns() - start)
    return statistics.median(times) / 1000, statistics.mean(times) / 1000


def median_latency_us(call) -> float:
    return latencies_us(call)[0]


def evict_caches() -> None:
    """Other work between two draws, as a query's parsing, planning and database reads would
    do: 16 MB written (more than this machine's caches) and some unrelated Python run."""
    _SCRATCH.fill(1)
    json.loads(json.dumps({str(i): list(range(i % 20)) for i in range(2000)}))


_SCRATCH = np.empty(16 << 20, dtype=np.uint8)


def single_calls_ns(mechanisms: list[object]) -> list[dict[str, list[int]]]:
    """CPU times of each kind of single call of each mechanism: pooled calls in a row on one
    generator ("pooled", refills included), the first and second calls on a new generator, a
    first call after other work has evicted the caches ("cold"), an unpooled draw of FILL
    values ("refill", what the call that refills pays) and of one value.

    Measured in ROUNDS rounds that each visit every mechanism, so that a burst of other work on
    the shared machine lands on every row a little instead of on one row entirely; garbage
    collection is off, or a collection would be timed with the call that triggered it.
    """
    one, fill = np.zeros(1, dtype=np.int64), np.zeros(FILL, dtype=np.int64)
    rng, plain = secure_generator(), unpooled_generator()
    in_a_row = {
        "pooled": lambda m: m.sample(one, rng),
        "refill": lambda m: m.sample(fill, plain),
        "unpooled": lambda m: m.sample(one, plain),
    }
    times = [{kind: [] for kind in (*in_a_row, "first", "second", "cold")} for _ in mechanisms]
    gc.collect()
    gc.disable()
    try:
        for _ in range(ROUNDS):
            for mechanism, out in zip(mechanisms, times, strict=True):
                for kind, call in in_a_row.items():
                    call(mechanism)  # its code and tables back in cache, as in a run of calls
                    for _ in range(LATENCY_CALLS // ROUNDS):
                        start = time.process_time_ns()
                        call(mechanism)
                        out[kind].append(time.process_time_ns() - start)
                for _ in range(FIRST_CALLS // ROUNDS):
                    fresh = secure_generator()
                    for kind in ("first", "second"):
                        start = time.process_time_ns()
                        mechanism.sample(one, fresh)
                        out[kind].append(time.process_time_ns() - start)
                for _ in range(COLD_CALLS // ROUNDS):
                    fresh = secure_generator()
                    evict_caches()
                    start = time.process_time_ns()
                    mechanism.sample(one, fresh)
                    out["cold"].append(time.process_time_ns() - start)
    finally:
        gc.enable()
    return times


def unpooled_generator() -> np.random.Generator:
    """The secure AES stream in numpy's plain Generator, which the noise pools pass through."""
    return np.random.Generator(secure_generator().bit_generator)


def mechanisms() -> list[tuple[str, str, object]]:
    """(label, family, mechanism) for the secure mechanisms compared in table 1."""
    rows = [("discrete Laplace, Delta=1, eps=1", "laplace", DiscreteLaplace(1, 1.0))]
    for epsilon in STAIRCASE_EPSILONS:
        label = f"staircase, Delta={STAIRCASE_SENSITIVITY}, eps={epsilon:g}"
        rows.append((label, "staircase", Staircase(STAIRCASE_SENSITIVITY, epsilon)))
    for sigma in GAUSSIAN_SIGMAS:  # rho = 1/2: sigma = Delta
        rows.append(
            (f"discrete Gaussian, sigma={sigma:g}", "gaussian", DiscreteGaussian(sigma, 0.5))
        )
    # the grid versions for real-valued queries: the integer samplers at ~2^19-2^20 grid steps
    rows += [
        ("grid Laplace, Delta=1000, eps=1", "laplace", GridLaplace(1000.0, 1.0)),
        ("grid staircase, Delta=1000, eps=1", "staircase", GridStaircase(1000.0, 1.0)),
        ("grid Gaussian, Delta=1000, rho=0.5", "gaussian", GridGaussian(1000.0, 0.5)),
    ]
    return rows


def opendp_rows() -> list[tuple[str, Callable[[], object], Callable[[], object]]]:
    """OpenDP's exact samplers (a vector of OPENDP_BATCH, one value), when it is installed."""
    try:
        import opendp.prelude as dp
    except ImportError:
        return []
    dp.enable_features("contrib")
    one = dp.atom_domain(T=int)
    many = dp.vector_domain(one)
    zeros = [0] * OPENDP_BATCH
    laplace = dp.m.make_laplace(one, dp.absolute_distance(T=int), scale=1.0)
    laplaces = dp.m.make_laplace(many, dp.l1_distance(T=int), scale=1.0)
    gaussian = dp.m.make_gaussian(one, dp.absolute_distance(T=int), scale=1.0)
    gaussians = dp.m.make_gaussian(many, dp.l2_distance(T=int), scale=1.0)
    return [
        ("OpenDP discrete Laplace, scale 1", lambda: laplaces(zeros), lambda: laplace(0)),
        ("OpenDP discrete Gaussian, sigma 1", lambda: gaussians(zeros), lambda: gaussian(0)),
    ]


def mechanism_table() -> None:
    rng = secure_generator()
    naive = np.random.default_rng()
    zeros = np.zeros(BATCH, dtype=np.int64)
    print(
        f"{'sampler':<36} | {'batch of ' + format(BATCH, ','):>16} | {'single call':>11} | "
        f"{'mean call':>9} | {'1st call':>8} | {'1st p99':>8} | {'1st cold':>8} | "
        f"{'2nd call':>8} | {'refill':>8} | {'unpooled':>8} | target"
    )
    print("-" * 178)
    baselines = [
        (
            "numpy laplace (float, insecure)",
            lambda: naive.laplace(0.0, 1.0, BATCH),
            lambda: naive.laplace(0.0, 1.0, 1),
        ),
        (
            "numpy normal (float, insecure)",
            lambda: naive.normal(0.0, 1.0, BATCH),
            lambda: naive.normal(0.0, 1.0, 1),
        ),
    ]
    for label, batch, single in baselines:
        rate, (latency, mean) = best_rate(batch, BATCH), latencies_us(single)
        print(
            f"{label:<36} | {rate / 1e6:>12.1f} M/s | {latency:>8.1f} us | {mean:>6.1f} us | "
            f"{'':>8} | {'':>8} | {'':>8} | {'':>8} | {'':>8} | {'':>8} |"
        )
    rows = mechanisms()
    rates = [best_rate(lambda m=m: m.sample(zeros, rng), BATCH) for _, _, m in rows]
    for (label, family, _), rate, times in zip(
        rows, rates, single_calls_ns([mechanism for _, _, mechanism in rows]), strict=True
    ):
        us = {kind: statistics.median(values) / 1000 for kind, values in times.items()}
        mean = statistics.mean(times["pooled"]) / 1000
        worst = statistics.quantiles(times["first"], n=100)[-1] / 1000
        floor, ceiling = TARGETS[family]
        slowest = max(mean, *(value for kind, value in us.items() if kind != "cold"))
        verdict = "met" if rate >= floor and slowest < ceiling else "MISSED"
        print(
            f"{label:<36} | {rate / 1e6:>12.1f} M/s | {us['pooled']:>8.1f} us | {mean:>6.1f} us | "
            f"{us['first']:>5.1f} us | {worst:>5.1f} us | {us['cold']:>5.1f} us | "
            f"{us['second']:>5.1f} us | "
            f"{us['refill']:>5.1f} us | {us['unpooled']:>5.1f} us | "
            f">= {floor / 1e6:g} M/s, < {ceiling:g} us: {verdict}"
        )
    others = opendp_rows()
    if not others:
        print("OpenDP: not installed, so not compared (pip install opendp to include it)")
    for label, batch, single in others:
        rate, (latency, mean) = best_rate(batch, OPENDP_BATCH), latencies_us(single)
        print(
            f"{label:<36} | {rate / 1e6:>12.3f} M/s | {latency:>8.1f} us | {mean:>6.1f} us | "
            f"{'':>10} | (batch of {OPENDP_BATCH:,})"
        )
    print(
        "single call: median; mean call: all calls, pool refills included; 1st and 2nd call: "
        "medians on a new generator (the 1st fills its pool), and the 99th percentile of 1st "
        "calls; 1st cold: median 1st call after other work has evicted the caches, as between "
        f"two queries; refill: an unpooled draw of the pool's FILL ({FILL}) values, what a "
        "refilling call pays; unpooled: one value on a generator with no pool; the verdict "
        "reads the batch rate and every median single-call figure of warm calls"
    )


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
    rng, plain = secure_generator(), unpooled_generator()
    naive = np.random.default_rng()
    one = np.zeros(1)
    print(
        f"{'scale':>9} | {'discrete Laplace':>17} | {'unpooled':>9} | {'grid Laplace':>13} | "
        f"{'unpooled':>9} | {'numpy laplace':>13}"
    )
    print("-" * 86)
    for scale in SCALES:
        grid = GridLaplace(float(scale), 1.0)
        draw = laplace_sampler(Fraction(scale))
        exact = median_latency_us(lambda d=draw: d(1, rng))
        bare = median_latency_us(lambda d=draw: d(1, plain))
        gridded = median_latency_us(lambda g=grid: g.sample(one, rng))
        bare_grid = median_latency_us(lambda g=grid: g.sample(one, plain))
        baseline = median_latency_us(lambda s=float(scale): naive.laplace(0.0, s, 1))
        print(
            f"{scale:>9g} | {exact:>14.1f} us | {bare:>6.1f} us | {gridded:>10.1f} us | "
            f"{bare_grid:>6.1f} us | {baseline:>10.1f} us"
        )


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
    rng, plain = secure_generator(), unpooled_generator()
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
    whole = np.zeros(1, dtype=np.int64)
    for label, mechanism, generator in (
        ("staircase Delta=100 eps=0.1", Staircase(100, 0.1), rng),
        ("staircase Delta=100 eps=1", Staircase(100, 1.0), rng),
        ("staircase Delta=100 eps=5", Staircase(100, 5.0), rng),
        ("discrete Gaussian sigma=1", DiscreteGaussian(1, 0.5), rng),
        ("discrete Gaussian sigma=100", DiscreteGaussian(100, 0.5), rng),
        ("discrete Gaussian sigma=1e4", DiscreteGaussian(10**4, 0.5), rng),
        ("discrete Laplace t=1 unpooled", DiscreteLaplace(1, 1.0), plain),
        ("discrete Laplace t=30 unpooled", DiscreteLaplace(30, 1.0), plain),
        ("discrete Laplace t=100 unpooled", DiscreteLaplace(100, 1.0), plain),
        ("discrete Laplace t=1e6 unpooled", DiscreteLaplace(10**6, 1.0), plain),
        ("staircase eps=1 unpooled", Staircase(100, 1.0), plain),
        ("staircase D=5000 eps=2 unpooled", Staircase(5000, 2.0), plain),
        ("discrete Gaussian s=1 unpooled", DiscreteGaussian(1, 0.5), plain),
        ("discrete Gaussian s=100 unpooled", DiscreteGaussian(100, 0.5), plain),
    ):
        typical = mechanism.expected_abs_error()
        rows.append((label, typical, lambda m=mechanism, g=generator: int(m.sample(whole, g)[0])))
    rows.append(("textbook loop t=100 (control)", 100, lambda: textbook_loop(100)))
    print(
        f"{'sampler':<32} | {'|noise| <= t/2':>14} | {'|noise| >= 3t':>13} | "
        f"{'large/small':>11} | {'n small':>7} | {'n large':>7}"
    )
    print("-" * 99)
    for label, scale, call in rows:
        call()
        small, large, n_small, n_large = conditioned_medians(call, scale)
        print(
            f"{label:<32} | {small:>11.2f} us | {large:>10.2f} us | {large / small:>11.3f} | "
            f"{n_small:>7} | {n_large:>7}"
        )


def main() -> None:
    start = time.perf_counter()
    print(describe() + "\n")
    print(
        "Mechanisms: samples per CPU second (best of", REPEATS, "runs), median single-call CPU time"
    )
    mechanism_table()
    print("\nThroughput, best of", REPEATS, "runs of", SIZE, "samples (secure = AES-CTR generator)")
    throughput_table()
    print(f"\nSingle-call latency, median of {LATENCY_CALLS} calls of one value")
    latency_table()
    print(f"\nTiming channel, {CALLS} single calls each: median time by noise magnitude")
    timing_table()
    print(f"\n(total {time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
