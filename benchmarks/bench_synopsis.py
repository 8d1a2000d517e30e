"""Synopsis benchmark: accuracy against flat, build time against the raw GROUP BY, answer time.

    python benchmarks/bench_synopsis.py            # full size: 65,536 bins, 10M rows
    python benchmarks/bench_synopsis.py --small    # a quick run

Targets (issue 5): at 65,536 bins and epsilon 1 the consistent tree (b = 16)
has >= 8x lower RMSE than flat over 10,000 random ranges; building over 10M
rows costs <= 2x the raw GROUP BY bin; a range answer takes < 1 ms.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

import dpsql
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.mechanisms.tree import HierarchicalHistogram, TreeShape, range_weights


def accuracy(bins: int, epsilon: float, branching: int, queries: int, draws: int = 20) -> None:
    rng = np.random.default_rng(1)
    counts = rng.poisson(50, bins)
    starts = rng.integers(0, bins, queries)
    stops = rng.integers(0, bins, queries)
    starts, stops = np.minimum(starts, stops), np.maximum(starts, stops) + 1
    truth = np.concatenate([[0], np.cumsum(counts)])
    truth = truth[stops] - truth[starts]
    flat_noise = DiscreteLaplace(1, epsilon)
    tree_errors, flat_errors = [], []
    for _ in range(draws):  # one draw's errors are correlated across ranges: average draws
        tree = HierarchicalHistogram.build(counts, branching, epsilon, rng)
        flat = np.concatenate([[0], np.cumsum(flat_noise.sample(counts, rng))])
        tree_errors.append(tree.prefix[stops] - tree.prefix[starts] - truth)
        flat_errors.append(flat[stops] - flat[starts] - truth)
    empirical_tree = np.sqrt(np.mean(np.square(tree_errors)))
    empirical_flat = np.sqrt(np.mean(np.square(flat_errors)))
    squares, _ = range_weights(tree.shape, starts, stops)
    closed_tree = np.sqrt(np.mean(squares) * tree.node_variance)
    closed_flat = np.sqrt(np.mean(stops - starts) * flat_noise.variance())
    levels = TreeShape(bins, branching).levels
    print(f"accuracy: {bins:,} bins, epsilon {epsilon}, b={branching} ({levels} levels), "
          f"{queries:,} random ranges, {draws} draws")  # fmt: skip
    print("| estimator | RMSE empirical | RMSE closed form |\n|---|---|---|")
    print(f"| flat (Laplace 1/eps per bin) | {empirical_flat:,.1f} | {closed_flat:,.1f} |")
    print(f"| consistent tree | {empirical_tree:,.1f} | {closed_tree:,.1f} |")
    print(f"ratio flat/tree: {empirical_flat / empirical_tree:.2f} empirical, "
          f"{closed_flat / closed_tree:.2f} closed form (target >= 8)\n")  # fmt: skip


def build_time(rows: int, bins: int) -> None:
    folder = Path(tempfile.mkdtemp())
    database = folder / "bench.duckdb"
    with duckdb.connect(str(database)) as con:
        con.execute(
            f"CREATE TABLE events AS SELECT i AS visitor, (hash(i) % {bins})::INT AS x "
            f"FROM range({rows}) t(i)"
        )
    raw_sql = "SELECT FLOOR(x / 1) AS b, COUNT(*) FROM events GROUP BY 1"
    with duckdb.connect(str(database), read_only=True) as con:
        raw = _best(lambda: con.execute(raw_sql).fetchall())
    print(f"build over {rows:,} rows into {bins:,} bins (best of 3)")
    print("| privacy | raw GROUP BY bin | synopsis build | ratio |\n|---|---|---|---|")
    for label, unit in (("row-level", False), ("user-level (bounded)", True)):
        table = {"columns": {"x": {"type": "int", "lower": 0, "upper": bins - 1,
                                   "synopsis": {"bin": 1, "epsilon": 1.0}}}}  # fmt: skip
        if unit:
            table["privacy_unit"] = "visitor"
            table["columns"]["visitor"] = {"type": "int", "private": True}
        policy = {"version": 1, "analysts": {"default": {"epsilon": 1e6}},
                  "tables": {"events": table}}  # fmt: skip

        def build(policy: dict = policy) -> None:
            with dpsql.connect(str(database), policy=policy, ledger=folder / "l.sqlite") as c:
                c.session.drop_synopsis("events", "x")
                c.session.build_synopsis("events", "x")

        took = _best(build)
        print(f"| {label} | {raw:.3f} s | {took:.3f} s | {took / raw:.2f}x |")
    with dpsql.connect(str(database), policy=policy, ledger=folder / "l.sqlite") as c:
        queries = [f"SELECT COUNT(*) FROM events WHERE x BETWEEN {a} AND {a + 999}"
                   for a in range(0, 200)]  # fmt: skip
        start = time.perf_counter()
        for sql in queries:
            c.execute(sql)
        per_sql = (time.perf_counter() - start) / len(queries)
    print(f"\nSQL range query answered from the stored synopsis, end to end: "
          f"{per_sql * 1e3:.2f} ms\n")  # fmt: skip


def answer_time(bins: int) -> None:
    rng = np.random.default_rng(2)
    tree = HierarchicalHistogram.build(rng.poisson(5, bins), 16, 1.0, rng)
    tree.answer(0, 1)  # consistency is computed once, on first use
    pairs = np.sort(rng.integers(0, bins + 1, (2000, 2)), axis=1)
    start = time.perf_counter()
    for a, b in pairs:
        tree.answer(int(a), int(b))
    each = (time.perf_counter() - start) / len(pairs)
    print(f"range answer from a built synopsis ({bins:,} bins), with variance and 95% interval: "
          f"{each * 1e6:.0f} us (target < 1 ms)")  # fmt: skip


def _best(action, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run at small sizes")
    args = parser.parse_args()
    bins, rows = (4096, 200_000) if args.small else (65_536, 10_000_000)
    accuracy(bins, 1.0, 16, 10_000)
    answer_time(bins)
    build_time(rows, bins)


if __name__ == "__main__":
    main()
