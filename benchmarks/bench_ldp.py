"""Local-DP benchmark: client throughput and end-to-end server time, beside seed 001's figures.

Run: python benchmarks/bench_ldp.py [--epsilon 2] [--quick]

Data: dpsql.ldp.synthetic (2.75 million people; 1,085 county cells; 9.8
million sparse cells). "End to end" is perturbing every person's value on
the client side (one process, standing in for 2.75 million phones), then
counting and de-biasing on the server. Randomness is the OS-keyed AES-CTR
generator used in production, not a fast test generator. Times are CPU
seconds of this process (the shared machine's load swamps wall time).

Histogram encoding (she, the) draws n * d = 3e9 exact discrete Laplace
variates at county level, which one process cannot do in 10 s; its table
rows give the client and server parts separately (timed on 20,000 people and
scaled), and the end-to-end experiment draws the per-cell counts from their
exact distribution (`simulate_counts`, equal in distribution to perturbing
every person and counting).

Seed 001 (Python 3.9, i5-8259U, one process) reported: county RR 9 s,
UE 274 s, OLH 2,296 s, HM 20 s; sparse RR 7 s, UE 154,272 s (one run), HM 32 s,
OLH not run.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

from dpsql import ldp
from dpsql.ldp.synthetic import county_counts, people_from_counts, sparse_counts

SEED_COUNTY = {"grr": 9, "oue": 274, "olh": 2296, "hr": 20}
SEED_SPARSE = {"grr": 7, "oue": 154272, "hr": 32}
HISTOGRAM = ("she", "the")
HISTOGRAM_SAMPLE = 20_000


def timed(fn):
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def client_throughput(rng) -> None:
    print("\n## Client perturbation, d = 1,085 (target >= 1,000,000 reports/s)\n")
    print("| mechanism | reports/s (CPU time) |")
    print("|---|---:|")
    values = np.random.default_rng(1).integers(0, 1085, 1_000_000)
    for name in ("grr", "oue", "sue", "rappor", "olh", "hr", "hm", *HISTOGRAM):
        m = ldp.mechanism(name, 2.0, range(1085))
        some = values[:HISTOGRAM_SAMPLE] if name in HISTOGRAM else values
        m.perturb_indices(values[:1_000], rng)  # warm-up
        seconds, _ = timed(lambda m=m, some=some: m.perturb_indices(some, rng))
        print(f"| {name} | {some.size / seconds:,.0f} |")


def end_to_end(m, people, rng, sample: int | None = None):
    """(seconds, estimate, scaled) for perturb + aggregate + estimate over `people`."""
    if sample is None or sample >= people.size:
        t, est = timed(lambda: m.estimate(m.perturb_indices(people, rng)))
        return t, est, False
    chosen = np.random.default_rng(2).choice(people, sample, replace=False)
    t, _ = timed(lambda: m.estimate(m.perturb_indices(chosen, rng)))
    return t * people.size / sample, None, True


def simulated(m, truth, rng):
    """(seconds, estimate) with the per-cell counts drawn from their exact distribution."""
    return timed(lambda: m.estimate_from_counts(m.simulate_counts(truth, rng), int(truth.sum())))


def histogram_parts(m, people, rng) -> tuple[float, float]:
    """CPU seconds for all clients' perturbation and for the server's counting, scaled
    from HISTOGRAM_SAMPLE people."""
    chosen = np.random.default_rng(2).choice(people, HISTOGRAM_SAMPLE, replace=False)
    client, reports = timed(lambda: m.perturb_indices(chosen, rng))
    server, _ = timed(lambda: m.estimate(reports))
    scale = people.size / HISTOGRAM_SAMPLE
    return client * scale, server * scale


def expected_rmse(m, truth) -> float:
    n = int(truth.sum())
    if isinstance(m, ldp.HadamardResponse):  # its variance depends on the block's mass
        block = np.arange(truth.size) // (m.block_size - 1)
        mass = np.bincount(block, weights=truth)[block]
        return math.sqrt(np.mean([m.variance(n, c, b) for c, b in zip(truth, mass, strict=True)]))
    return math.sqrt(np.mean([m.variance(n, c) for c in truth]))


def rmse(est, truth) -> float:
    return float(np.sqrt(np.mean((est - truth) ** 2)))


def county(epsilon: float, rng, quick: bool) -> None:
    truth = county_counts()
    people = people_from_counts(truth)
    print(
        f"\n## County level: d = 1,085, n = {people.size:,}, epsilon = {epsilon:g} "
        "(target < 10 s end to end)\n"
    )
    print("| mechanism | end to end (CPU s) | RMSE | expected RMSE | seed 001 (s) |")
    print("|---|---:|---:|---:|---:|")
    for name in ("grr", "sue", "oue", "rappor", "olh", "hr", "hm", *HISTOGRAM):
        m = ldp.mechanism(name, epsilon, range(truth.size))
        if name in HISTOGRAM:
            seconds, est = simulated(m, truth, rng)
            client, server = histogram_parts(m, people, rng)
            note = (
                f" (counts drawn exactly; real reports: clients {client:,.0f} s in one "
                f"process, {1e6 * client / people.size:.0f} us each, server {server:,.1f} s)"
            )
        else:
            seconds, est, scaled = end_to_end(m, people, rng, 200_000 if quick else None)
            note = " (scaled from 200k people)" if scaled else ""
        expected = expected_rmse(m, truth)
        err = f"{rmse(est, truth):,.0f}" if est is not None else "-"
        seed = SEED_COUNTY.get(name, "-")
        print(f"| {name} | {seconds:,.2f}{note} | {err} | {expected:,.0f} | {seed} |")
    olh = ldp.mechanism("olh", 0.5, range(truth.size))
    seconds, est, scaled = end_to_end(olh, people, rng, 200_000 if quick else None)
    print(
        f"| olh at epsilon 0.5 (g = {olh.g}) | {seconds:,.2f} "
        f"| {rmse(est, truth) if est is not None else float('nan'):,.0f} | - | 2296 |"
    )


def sparse(epsilon: float, rng, quick: bool) -> None:
    truth = sparse_counts()
    people = people_from_counts(truth)
    d = truth.size
    print(
        f"\n## Sparse level: d = {d:,}, n = {people.size:,}, epsilon = {epsilon:g} "
        "(target: Hadamard < 60 s)\n"
    )
    print("| mechanism | time (s) | RMSE | how | seed 001 (s) |")
    print("|---|---:|---:|---|---:|")
    for name in ("grr", "hr", "hm"):
        m = ldp.mechanism(name, epsilon, range(d))
        seconds, est, _ = end_to_end(m, people, rng, 200_000 if quick else None)
        err = f"{rmse(est, truth):,.0f}" if est is not None else "-"
        print(f"| {name} | {seconds:,.2f} | {err} | end to end | {SEED_SPARSE.get(name, '-')} |")
    for name in ("oue", "the", "she"):
        m = ldp.mechanism(name, epsilon, range(d))
        seconds, est = simulated(m, truth, rng)
        print(
            f"| {name} | {seconds:,.1f} | {rmse(est, truth):,.0f} | sparse-aware counting "
            f"(per-cell counts drawn exactly; reports would be {m.message_bits:,} bits each) "
            f"| {SEED_SPARSE.get(name, '-')} |"
        )
    olh = ldp.mechanism("olh", epsilon, range(d))
    print(
        f"| olh | not run | - | decoding needs {olh.server_cost(people.size):.2g} operations "
        "| not run |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="sample 200k people everywhere")
    args = parser.parse_args()
    rng = ldp.secure_generator()
    print(f"# dpsql local-DP benchmark ({os.cpu_count()} cores visible; numpy runs on one)")
    client_throughput(rng)
    county(args.epsilon, rng, args.quick)
    sparse(args.epsilon, rng, args.quick)


if __name__ == "__main__":
    main()
