"""Continual counting benchmark: accuracy ratio of the two counters, and the cost of a tick.

1. Factorization / binary-tree maximum per-step error at T = 2^16 under the
   same zCDP budget (2 rho = 1, Gaussian tree): the theory says about 0.28
   (sqrt(21.13 / 272)); we print the closed-form ratio and the measured one
   (float Gaussian noise: only the variance matters here).
2. A tick over 1 million new rows: the time of the stream's tick (its bounded
   step query and the release) against the raw incremental GROUP BY over the
   same new rows, on DuckDB, for a row-level table.
3. The factorization counter's cost per step at T = 2^20: the FFT
   precomputation once, amortised over the horizon, plus an O(1) step.

    python benchmarks/bench_continual.py [--reps 2000] [--rows 1000000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

import dpsql
from dpsql.mechanisms.continual import BinaryTree, ContinualStream, Factorization
from dpsql.sql import running


def _normal(size, sigma, rng):
    return rng.normal(0, sigma, size)


def accuracy_ratio(reps: int) -> None:
    horizon = 1 << 16
    tree = BinaryTree(horizon, 17.0, lambda n, rng: rng.normal(0, np.sqrt(17.0), n), honaker=False)
    fact = Factorization(horizon, 0.5, 1.0, _normal)
    closed = np.sqrt(fact.variance().max() / tree.variance().max())
    rng = np.random.default_rng(1)
    measured = []
    for counter in (fact, tree):
        total = np.zeros(horizon)
        for _ in range(reps):
            total += counter.noise(rng) ** 2
        measured.append(np.sqrt(total.max() / reps))
    print(f"max error ratio factorization / binary tree at T = 2^16: closed form {closed:.4f}, "
          f"measured {measured[0] / measured[1]:.4f} ({reps} runs)")  # fmt: skip


def tick_cost(rows: int) -> None:
    db = duckdb.connect()
    db.execute("CREATE TABLE bench_events (day DATE, v INT)")
    db.execute(f"INSERT INTO bench_events SELECT DATE '2024-01-01' + (i % 30)::INT, 1 "
               f"FROM range({rows}) t(i)")  # fmt: skip
    policy = {"version": 1, "defaults": {"epsilon_per_query": 1.0, "delta": 1e-6},
              "analysts": {"default": {"epsilon": 10.0, "delta": 1e-5}},
              "tables": {"bench_events": {"columns": {
                  "day": {"type": "date", "lower": "2024-01-01", "upper": "2024-12-31",
                          "continual": {"step": "1 day", "epsilon": 1.0}},
                  "v": {"type": "int", "lower": 0, "upper": 1}}}}}  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        con = dpsql.connect(db, policy=policy, ledger=Path(folder) / "ledger.sqlite")
        query = ("SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) AS n FROM bench_events "
                 "GROUP BY day")  # fmt: skip
        clock = [dt.datetime(2024, 1, 31, tzinfo=dt.UTC)]
        running.clock = lambda: clock[0]
        con.execute(query).fetchall()  # charge the stream and release January
        db.execute(f"INSERT INTO bench_events SELECT DATE '2024-01-31' + (i % 30)::INT, 1 "
                   f"FROM range({rows}) t(i)")  # fmt: skip
        clock[0] = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
        began = time.perf_counter()
        con.execute(query).fetchall()
        tick = time.perf_counter() - began
        began = time.perf_counter()
        db.execute("SELECT day, COUNT(*) FROM bench_events WHERE day >= DATE '2024-01-31' "
                   "AND day < DATE '2024-03-01' GROUP BY day").fetchall()  # fmt: skip
        raw = time.perf_counter() - began
        running.clock = running._utc_now
    print(f"tick over {rows:,} new rows: {tick * 1e3:.1f} ms vs raw incremental GROUP BY "
          f"{raw * 1e3:.1f} ms: ratio {tick / raw:.2f}")  # fmt: skip


def step_cost() -> None:
    horizon = 1 << 20
    counter = Factorization(horizon, 0.5, 1.0, _normal)
    began = time.perf_counter()
    stream = ContinualStream(counter, 7)
    opened = time.perf_counter() - began
    began = time.perf_counter()
    for _ in range(10_000):
        stream.step(1.0)
    per_step = (time.perf_counter() - began) / 10_000
    print(f"factorization at T = 2^20: {opened:.2f} s to precompute the noise "
          f"({opened / horizon * 1e6:.2f} us per step amortised), then {per_step * 1e6:.2f} us "
          f"per step: {(opened / horizon + per_step) * 1e3:.4f} ms per step in all")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description="continual counting benchmark")
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    accuracy_ratio(args.reps)
    tick_cost(args.rows)
    step_cost()


if __name__ == "__main__":
    main()
