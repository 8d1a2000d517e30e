"""Synopsis benchmark: accuracy against flat, build time against the raw GROUP BY, answer time.

    python benchmarks/bench_synopsis.py            # full size: 65,536 bins, 10M rows
    python benchmarks/bench_synopsis.py --small    # a quick run

Targets (issue 5): at 65,536 bins and epsilon 1 the consistent tree (b = 16)
has >= 8x lower RMSE than flat over 10,000 random ranges; building over 10M
rows costs <= 2x the raw GROUP BY bin; a range answer takes < 1 ms, timed
both from a built tree and as a whole SQL query through dpsql.connect (with
its split into parsing and planning against the answer). The Gaussian
variant is measured beside the Laplace trees at equal (epsilon, delta).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
from machine import describe

import dpsql
from dpsql.accounting import zcdp_rho
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.mechanisms.tree import HierarchicalHistogram, range_weights
from dpsql.sql.parse import parse_statement


def accuracy(bins: int, epsilon: float, delta: float, queries: int, draws: int = 60) -> None:
    """RMSE over random ranges: flat against consistent trees, Laplace (pure epsilon) and
    Gaussian (rho-zCDP within the same (epsilon, delta)), b = 16 and b = 2."""
    rng = np.random.default_rng(1)
    counts = rng.poisson(50, bins)
    starts = rng.integers(0, bins, queries)
    stops = rng.integers(0, bins, queries)
    starts, stops = np.minimum(starts, stops), np.maximum(starts, stops) + 1
    truth = np.concatenate([[0], np.cumsum(counts)])
    truth = truth[stops] - truth[starts]
    rho = zcdp_rho(epsilon, delta)
    flat_noise = DiscreteLaplace(1, epsilon)
    trees = {
        f"b={b}, {name}": (lambda b=b, build=build: build(b))
        for b in (16, 2)
        for name, build in (
            ("Laplace", lambda b: HierarchicalHistogram.build(counts, b, epsilon, rng)),
            ("Gaussian", lambda b: HierarchicalHistogram.build_gaussian(counts, b, rho, rng)),
        )
    }
    print(f"accuracy: {bins:,} bins, epsilon {epsilon} (Gaussian: delta {delta:g}, "
          f"rho {rho:.4g}), {queries:,} random ranges, {draws} draws "
          f"({10 * draws} for flat)")  # fmt: skip
    print("| estimator | levels | RMSE empirical | RMSE closed form | flat / this (closed) |")
    print("|---|---|---|---|---|")
    closed_flat = np.sqrt(np.mean(stops - starts) * flat_noise.variance())
    # flat errors of overlapping ranges are strongly correlated: many cheap draws steady them
    flat = _rmse(
        lambda: np.cumsum(flat_noise.sample(counts, rng)), starts, stops, truth, 10 * draws
    )
    print(f"| flat (Laplace 1/eps per bin) | - | {flat:,.1f} | {closed_flat:,.1f} | 1 |")
    for name, build in trees.items():
        made = []

        def prefix(build=build, made=made) -> np.ndarray:
            made.append(build())
            return made[-1].prefix[1:]

        empirical = _rmse(prefix, starts, stops, truth, draws)
        tree = made[-1]
        squares, _ = range_weights(tree.shape, starts, stops)
        closed = np.sqrt(np.mean(squares) * tree.node_variance)
        print(f"| consistent tree {name} | {tree.shape.levels} | {empirical:,.1f} | "
              f"{closed:,.1f} | {flat / empirical:.2f} ({closed_flat / closed:.2f}) |")  # fmt: skip
    print("target: flat / consistent tree b=16, Laplace >= 8\n")


def _rmse(cumulative, starts, stops, truth, draws: int) -> float:
    """RMSE over `draws` independent releases: one draw's errors are correlated across ranges."""
    errors = []
    for _ in range(draws):
        prefix = np.concatenate([[0], cumulative()])
        errors.append(prefix[stops] - prefix[starts] - truth)
    return float(np.sqrt(np.mean(np.square(errors))))


def build_time(rows: int, bins: int, repeats: int) -> None:
    """Time of building a synopsis (connect, bounded GROUP BY, noise, store) beside the raw
    GROUP BY. Rounds interleave the variants so the shared machine's load hits all alike, and
    CPU time (all of the process's threads, DuckDB's included) is shown beside wall time: on
    a loaded machine it is the steadier of the two."""
    with tempfile.TemporaryDirectory() as folder:  # the 10M-row table is ~20 MB: not kept
        _build_time(Path(folder), rows, bins, repeats)


def _build_time(folder: Path, rows: int, bins: int, repeats: int) -> None:
    database = folder / "bench.duckdb"
    with duckdb.connect(str(database)) as con:
        con.execute(
            f"CREATE TABLE events AS SELECT i AS visitor, (hash(i) % {bins})::INT AS x "
            f"FROM range({rows}) t(i)"
        )
        # the same rows with the unit declared a key: dpsql reads it from the catalog and,
        # each unit having one row, bounds nothing (as row-level), at user-level privacy
        con.execute("CREATE TABLE events_keyed (visitor BIGINT PRIMARY KEY, x INT)")
        con.execute("INSERT INTO events_keyed SELECT * FROM events")
    policies, tables = {}, {}
    for label, unit in (
        ("row-level", False),
        ("user-level (bounded)", True),
        ("user-level (unit a declared key)", True),
    ):
        table = {"columns": {"x": {"type": "int", "lower": 0, "upper": bins - 1,
                                   "synopsis": {"bin": 1, "epsilon": 1.0}}}}  # fmt: skip
        if unit:
            table["privacy_unit"] = "visitor"
            table["columns"]["visitor"] = {"type": "int", "private": True}
        tables[label] = "events_keyed" if "key" in label else "events"
        policies[label] = {"version": 1, "analysts": {"default": {"epsilon": 1e6}},
                           "tables": {tables[label]: table}}  # fmt: skip
    raw_sql = "SELECT FLOOR(x / 1) AS b, COUNT(*) FROM events GROUP BY 1"
    actions = {"raw": lambda: _query(database, raw_sql)}
    for label, policy in policies.items():
        with dpsql.connect(str(database), policy=policy, ledger=folder / "l.sqlite") as c:
            plan = dict(c.execute(f"EXPLAIN SELECT COUNT(x) FROM {tables[label]}").fetchall())
        actions[f"{label} SQL"] = lambda sql=plan["sql"]: _query(database, sql)
        actions[label] = lambda policy=policy, table=tables[label]: _build(
            database, policy, folder / "l.sqlite", table
        )
    wall, cpu = dict.fromkeys(actions, float("inf")), dict.fromkeys(actions, float("inf"))
    for _ in range(repeats):
        for name, action in actions.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            action()
            wall[name] = min(wall[name], time.perf_counter() - start)
            cpu[name] = min(cpu[name], time.process_time() - start_cpu)
    print(f"build over {rows:,} rows into {bins:,} bins (best of {repeats}, interleaved); "
          "wall time, CPU time in brackets")  # fmt: skip
    print(f"raw GROUP BY bin: {wall['raw']:.3f} s ({cpu['raw']:.3f} s)")
    print("| privacy | build SQL alone | whole build | ratio to raw |\n|---|---|---|---|")
    for label in policies:
        sql = label + " SQL"
        print(f"| {label} | {wall[sql]:.3f} s ({cpu[sql]:.3f} s) | {wall[label]:.3f} s "
              f"({cpu[label]:.3f} s) | {wall[label] / wall['raw']:.2f}x "
              f"({cpu[label] / cpu['raw']:.2f}x) |")  # fmt: skip


def _query(database: Path, sql: str) -> None:
    with duckdb.connect(str(database), read_only=True) as con:
        con.execute(sql).fetchall()


def _build(database: Path, policy: dict, ledger: Path, table: str) -> None:
    with dpsql.connect(str(database), policy=policy, ledger=ledger) as c:
        c.session.drop_synopsis(table, "x")
        c.session.build_synopsis(table, "x")


def answer_time(bins: int) -> None:
    rng = np.random.default_rng(2)
    tree = HierarchicalHistogram.build(rng.poisson(5, bins), 16, 1.0, rng)
    tree.answer(0, 1)  # consistency is computed once, on first use
    pairs = np.sort(rng.integers(0, bins + 1, (2000, 2)), axis=1)
    start, start_cpu = time.perf_counter(), time.process_time()
    for a, b in pairs:
        tree.answer(int(a), int(b))
    each = (time.perf_counter() - start) / len(pairs)
    each_cpu = (time.process_time() - start_cpu) / len(pairs)
    print(f"range answer from a built synopsis ({bins:,} bins), with variance and 95% interval: "
          f"{each * 1e6:.0f} us wall, {each_cpu * 1e6:.0f} us CPU (target < 1 ms)")  # fmt: skip


def sql_answer_time(bins: int, queries: int = 500, rounds: int = 7) -> None:
    """A whole SQL range query answered from the stored synopsis through dpsql.connect, its
    text new each time (no release-cache hit), and its split: parsing and planning (check,
    analysis, the synopsis's match and the ledger read of its payload) against the answer
    from the decoded tree. CPU time of this thread (the work is all Python: no database
    runs), the median of `rounds` rounds of `queries` distinct queries each."""
    with tempfile.TemporaryDirectory() as folder:
        database, ledger = Path(folder) / "answer.duckdb", Path(folder) / "l.sqlite"
        with duckdb.connect(str(database)) as con:
            con.execute(f"CREATE TABLE events AS SELECT (hash(i) % {bins})::INT AS x "
                        "FROM range(100000) t(i)")  # fmt: skip
        policy = {"version": 1, "analysts": {"default": {"epsilon": 10.0}},
                  "tables": {"events": {"columns": {"x": {
                      "type": "int", "lower": 0, "upper": bins - 1,
                      "synopsis": {"bin": 1, "epsilon": 1.0, "branching": 16}}}}}}  # fmt: skip
        with dpsql.connect(str(database), policy=policy, ledger=ledger) as c:
            c.execute("SELECT COUNT(x) FROM events")  # builds the synopsis
            _sql_answer_time(c, bins, queries, rounds)


def _sql_answer_time(connection, bins: int, queries: int, rounds: int) -> None:
    session = connection.session
    rng, seen = np.random.default_rng(3), set()

    def fresh() -> list[str]:
        """`queries` random ranges, none asked before."""
        texts = []
        while len(texts) < queries:
            low, high = sorted(int(x) for x in rng.integers(0, bins, 2))
            if (low, high) not in seen:
                seen.add((low, high))
                texts.append(f"SELECT COUNT(*) FROM events WHERE x BETWEEN {low} AND {high}")
        return texts

    def whole(texts: list[str]) -> float:
        start = time.thread_time()
        for sql in texts:
            connection.execute(sql)
        return (time.thread_time() - start) / len(texts)

    def split(texts: list[str]) -> tuple[float, float]:
        """CPU per query of parsing and planning, and of answering: timed query by query,
        nothing kept between queries (kept trees and plans slow the collector down)."""
        front = back = 0.0
        for sql in texts:
            start = time.thread_time()
            plan = session.plan(parse_statement(sql, session.adapter.dialect).tree)
            middle = time.thread_time()
            plan.release([], [], session._rng)
            front, back = front + middle - start, back + time.thread_time() - middle
        return front / len(texts), back / len(texts)

    whole(fresh())  # warm: the stored tree is decoded by the first
    wholes, splits = zip(*[(whole(fresh()), split(fresh())) for _ in range(rounds)], strict=True)
    planning, answer = zip(*splits, strict=True)
    print(f"SQL range query answered from the stored synopsis ({bins:,} bins), dpsql.connect, "
          f"a new text each time: median CPU of {rounds} rounds of {queries} queries")  # fmt: skip
    for name, times in (
        ("whole query", wholes),
        ("its parsing and planning (check, analysis, synopsis match, ledger read)", planning),
        ("its answer from the decoded tree", answer),
    ):
        print(f"  {name}: {np.median(times) * 1e6:.0f} us")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run at small sizes")
    parser.add_argument("--repeats", type=int, default=3, help="build rounds (the best is kept)")
    args = parser.parse_args()
    bins, rows = (4096, 200_000) if args.small else (65_536, 10_000_000)
    print(describe() + "\n")
    accuracy(bins, 1.0, 1e-6, 10_000)
    answer_time(bins)
    sql_answer_time(bins)
    build_time(rows, bins, args.repeats)


if __name__ == "__main__":
    main()
