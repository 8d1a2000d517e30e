"""DP time / raw time on Spark local and on DuckDB, over one Parquet file per size.

For each size (default 10^5 and 10^6 rows; 10^7 with --sizes) the census table of
bench_e2e is written to Parquet once (cached in a temporary folder). Spark runs as dpsql
opens it, `spark://local[2]` (UTC, 4 shuffle partitions), and DuckDB (in
memory) read that same file.
Each engine runs bench_e2e's queries raw (through the same adapter) and
through dpsql with user-level bounding (privacy unit pid: Parquet declares no
key, so the per-unit ROW_NUMBER window runs in the engine); every dpsql run is
a fresh, charged release.

Printed per size and engine: the summed median wall time over the queries and
the CPU time it took (Spark: its JVM's plus this process's; DuckDB: this
process's), DP/raw of each, SQL/raw (the bounded SQL dpsql sends, read from
EXPLAIN and run raw: the engine's own cost of the bounding, without dpsql
around it), and Spark's raw wall time over DuckDB's, which
tells where Spark's fixed cost per query dominates. On a shared machine wall
times swell with the load; CPU times much less. `--partitions 200` adds a run
of Spark with its default shuffle partitions, in the same JVM, for comparison.

Then, per query of MIX (COUNT with WHERE, SUM, AVG, GROUP BY a public domain) on
Spark: raw, the same per-unit bounding written by hand in Spark SQL (the floor:
ROW_NUMBER by unit over a keyed hash, clamp, aggregate), dpsql user-level (no declared
key) and row-level, taking turns; DP/hand beside its target (<= 1.2x) and row-level
DP/raw beside its target (<= 1.3x).

With `--tumult-python PY` (a Python with tmlt-analytics in its own virtual environment:
it pins PySpark 3.5, and dpsql needs Spark 4), benchmarks/tumult_worker.py runs Tumult
Analytics on the same Parquet in a Spark of its own set up alike (local[2], 4
partitions, the same driver memory): per query of MIX, user-level (AddRowsWithID(pid),
MaxRowsPerID(1), dpsql's max_rows_per_unit), PureDP at epsilon 1, as dpsql's releases.
Printed: each one's median seconds a release and RMSE against the exact answer over
`--trials` releases (against the exact answer of the hand-written bounding: the clamp's
bias, the same for both, left out), Tumult/dpsql time (target >= 5x) and RMSE.
Usage:
    python benchmarks/bench_spark.py [--sizes 100000 1000000] [--repeat 3]
        [--partitions 200] [--memory 4g] [--tumult-python PY] [--trials 5]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
from bench_e2e import QUERIES, build, policy  # the sibling benchmarks, shared
from bench_quantiles import run_tumult, tumult_version

from dpsql.adapters.duckdb import DuckDBAdapter
from dpsql.adapters.spark import SparkAdapter
from dpsql.ledger import Ledger
from dpsql.policy import load_policy
from dpsql.session import Session

# The per-query mix: its name, the analyst's query, and the floor: the same contribution
# bounding that dpsql does, written here by hand in Spark SQL (each unit's rows cut to
# max_rows_per_unit = 1 by a ROW_NUMBER() over the unit ordered by a keyed hash of the
# unit and the columns read, then the policy's clamp, then the aggregate).
_ONE_ROW = "ROW_NUMBER() OVER (PARTITION BY pid ORDER BY xxhash64(7, pid{by})) AS rn"
_INCOME = "LEAST(GREATEST(income, 0.0), 500000.0)"  # the policy's bounds
MIX = [
    (
        "COUNT",
        "SELECT COUNT(*) FROM census WHERE age > 30",
        f"SELECT COUNT(*) FROM (SELECT {_ONE_ROW.format(by='')} FROM census "
        "WHERE pid IS NOT NULL AND age > 30) WHERE rn <= 1",
    ),
    (
        "SUM",
        "SELECT SUM(income) FROM census",
        f"SELECT SUM({_INCOME}) FROM (SELECT income, {_ONE_ROW.format(by=', income')} "
        "FROM census WHERE pid IS NOT NULL) WHERE rn <= 1",
    ),
    (
        "AVG",
        "SELECT AVG(income) FROM census",
        f"SELECT AVG({_INCOME}) FROM (SELECT income, {_ONE_ROW.format(by=', income')} "
        "FROM census WHERE pid IS NOT NULL) WHERE rn <= 1",
    ),
    (
        "GROUP BY educ",  # public domain 1..16: no partition selection
        "SELECT educ, COUNT(*) FROM census GROUP BY educ",
        f"SELECT educ, COUNT(*) FROM (SELECT educ, {_ONE_ROW.format(by=', educ')} "
        "FROM census WHERE pid IS NOT NULL AND educ BETWEEN 1 AND 16) WHERE rn <= 1 "
        "GROUP BY educ",
    ),
]
USER_TARGET, ROW_TARGET = 1.2, 1.3  # DP / hand-written bounding, row-level DP / raw
TUMULT_TARGET = 5.0  # Tumult's seconds a release / dpsql's


def parquet(rows: int) -> Path:
    """The census table of `rows` rows as one Parquet file (built once, then cached)."""
    path = Path(tempfile.gettempdir()) / f"dpsql-bench-census-{rows}.parquet"
    if not path.exists():
        with duckdb.connect(str(build(rows)), read_only=True) as source:
            source.execute(f"COPY census TO '{path}' (FORMAT parquet)")
    return path


def census_view(adapter: SparkAdapter, path: Path) -> None:
    """Point the Spark session's view `census` at the Parquet file `path`."""
    adapter.execute(f"CREATE OR REPLACE TEMP VIEW census AS SELECT * FROM parquet.`{path}`")


def _java_children() -> list[int]:
    """Process ids of the JVMs this process started (Spark's driver), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            comm, _, rest = (entry / "stat").read_text().rpartition(")")
        except (OSError, ValueError):
            continue
        if comm.endswith("(java") and int(rest.split()[1]) == os.getpid():
            found.append(int(entry.name))
    return found


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of process `pid` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_clock(jvms: list[int]) -> Callable[[], float]:
    """CPU seconds used so far by this process and the given JVMs."""
    return lambda: time.process_time() + sum(_cpu_of(pid) for pid in jvms)


def turns(
    runs: list[Callable[[], object]], repeat: int, cpu: Callable[[], float]
) -> list[tuple[float, float]]:
    """Median wall and CPU seconds of each of `runs` over `repeat` rounds, after a warm-up
    of each; the runs take turns in every round, so a change in the machine's load falls on
    all of them alike."""
    for run in runs:
        run()
    samples: list[tuple[list[float], list[float]]] = [([], []) for _ in runs]
    for _ in range(repeat):
        for run, (walls, cpus) in zip(runs, samples, strict=True):
            wall, used = time.perf_counter(), cpu()
            run()
            walls.append(time.perf_counter() - wall)
            cpus.append(cpu() - used)
    return [(statistics.median(walls), statistics.median(cpus)) for walls, cpus in samples]


def timed(run: Callable[[], object], repeat: int, cpu: Callable[[], float]) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds of `repeat` runs, after a warm-up run."""
    return turns([run], repeat, cpu)[0]


def measure(adapter, repeat: int, folder: str, cpu: Callable[[], float]) -> list[float]:
    """[raw wall, raw CPU, dpsql wall, dpsql CPU, bounded SQL wall] summed over QUERIES,
    user-level bounding; the bounded SQL is what dpsql sends (from EXPLAIN), run raw."""
    ledger = Ledger(Path(folder) / f"ledger-{adapter.dialect}.sqlite")
    session = Session(adapter, load_policy(policy(user_level=True)), ledger)
    totals = [0.0] * 5
    for sql in QUERIES:

        def release(sql: str = sql) -> None:
            ledger.clear_cache()
            session.execute(sql)

        bounded = dict(session.execute(f"EXPLAIN {sql}").rows)["sql"]
        raw = timed(lambda sql=sql: adapter.execute(sql), repeat, cpu)
        private = timed(release, repeat, cpu)
        alone = timed(lambda bounded=bounded: adapter.execute(bounded), repeat, cpu)
        for index, seconds in enumerate((*raw, *private, alone[0])):
            totals[index] += seconds
    return totals


def releaser(adapter, user_level: bool, folder: str) -> Callable[[str], list[tuple]]:
    """A function that releases a query through dpsql anew on each call (a charged
    release, the cache cleared), user-level (pid, one row) or row-level."""
    ledger = Ledger(Path(folder) / f"ledger-mix-{user_level}.sqlite")
    session = Session(adapter, load_policy(policy(user_level=user_level)), ledger)

    def release(sql: str) -> list[tuple]:
        ledger.clear_cache()
        return session.execute(sql).rows

    return release


def per_query(adapter, rows: int, repeat: int, folder: str, cpu: Callable[[], float]) -> None:
    """Print, per query of MIX: raw, the hand-written bounding, dpsql user-level and
    row-level times, with DP/hand and DP/raw beside their targets."""
    user, row = releaser(adapter, True, folder), releaser(adapter, False, folder)
    for name, sql, hand in MIX:
        (raw, _), (floor, floor_cpu), (private, private_cpu), (rowlevel, _) = turns(
            [partial(adapter.execute, sql), partial(adapter.execute, hand),
             partial(user, sql), partial(row, sql)],
            repeat,
            cpu,
        )  # fmt: skip
        print(f"{rows:>11,} {name:<14} {raw:>7.2f} {floor:>7.2f} {private:>8.2f} "
              f"{private / floor:>7.2f} {private_cpu / floor_cpu:>11.2f} "
              f"{private / raw:>7.2f} {rowlevel:>9.2f} {rowlevel / raw:>11.2f} "
              f"{os.getloadavg()[0]:>5.1f}", flush=True)  # fmt: skip


def _values(rows: list[tuple]) -> dict:
    """A release or an answer as {group key (None without GROUP BY): value}."""
    return {row[0] if len(row) > 1 else None: float(row[-1]) for row in rows}


def rmse(exact: dict, releases: list[dict]) -> float:
    """Root mean squared error of `releases` against `exact`, over every group of each
    (a group missing from the exact answer counts 0)."""
    errors = [value - exact.get(key, 0.0) for release in releases for key, value in release.items()]
    return math.sqrt(statistics.fmean(error * error for error in errors))


def beside_tumult(adapter, rows: int, path: Path, args: argparse.Namespace, folder: str) -> None:
    """Print, per query of MIX, dpsql's and Tumult Analytics' seconds a release (median
    of `args.trials`, after a warm-up each) and RMSE against the exact bounded answer, at
    epsilon 1 (pure DP) and one row per unit, with Tumult / dpsql for both."""
    peer = run_tumult(
        args.tumult_python,
        {"task": "mix", "parquet": str(path), "epsilon": 1.0, "trials": args.trials,
         "unit": "pid", "max_rows": 1, "lower": 0.0, "upper": 500_000.0,
         "educ_low": 1, "educ_high": 16, "master": "local[2]", "memory": args.memory},
    )  # fmt: skip
    if isinstance(peer, str):
        print(f"{rows:>11,} Tumult Analytics {peer}")
        return
    release = releaser(adapter, True, folder)
    for name, sql, hand in MIX:
        # the exact bounded answer (every unit's row, clamped): the error is the noise's,
        # without the clamp's bias, which both share
        exact = _values(adapter.execute(hand)[1])
        release(sql)  # warm-up
        seconds, releases = [], []
        for _ in range(args.trials):
            start = time.perf_counter()
            releases.append(_values(release(sql)))
            seconds.append(time.perf_counter() - start)
        ours, theirs = statistics.median(seconds), statistics.median(peer[name]["seconds"])
        error = rmse(exact, releases)
        peer_error = rmse(exact, [{key: value for key, value in r} for r in peer[name]["releases"]])
        relative = f"{peer_error / error:.2f}" if error else "-"  # every release exact
        print(f"{rows:>11,} {name:<14} {ours:>8.2f} {theirs:>9.2f} {theirs / ours:>13.1f} "
              f"{error:>12.4g} {peer_error:>12.4g} {relative:>13} "
              f"{os.getloadavg()[0]:>5.1f}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**5, 10**6])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--partitions", type=int, help="also run Spark with this many")
    parser.add_argument("--memory", default="4g", help="Spark driver memory (default: 4g)")
    parser.add_argument("--tumult-python", help="a Python with tmlt-analytics (its own venv)")
    parser.add_argument("--trials", type=int, default=5, help="releases each beside Tumult")
    args = parser.parse_args()
    url = f"spark://local[2]?spark.driver.memory={args.memory}"
    on_spark = SparkAdapter(url)
    spark_cpu = cpu_clock(_java_children())
    print(f"{len(QUERIES)} queries, median of {args.repeat}, 2 local cores, driver {args.memory}")
    print(f"{'rows':>11} {'engine':<10} {'raw s':>7} {'dpsql s':>8} {'DP/raw':>7} "
          f"{'raw cpu':>8} {'dpsql cpu':>9} {'DP/raw cpu':>10} {'SQL/raw':>7} "
          f"{'Spark/DuckDB raw':>16} {'load':>5}")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        for rows in args.sizes:
            path = parquet(rows)
            census_view(on_spark, path)
            runs = {}
            for partitions in ("4", str(args.partitions) if args.partitions else None):
                if partitions:
                    on_spark.execute(f"SET spark.sql.shuffle.partitions={partitions}")
                    runs[f"spark/{partitions}"] = measure(on_spark, args.repeat, folder, spark_cpu)
            on_spark.execute("SET spark.sql.shuffle.partitions=4")
            with duckdb.connect() as local:
                local.execute(f"CREATE VIEW census AS SELECT * FROM read_parquet('{path}')")
                runs["duckdb"] = measure(
                    DuckDBAdapter(local), args.repeat, folder, time.process_time
                )
            for engine, (raw, raw_cpu, private, private_cpu, alone) in runs.items():
                relative = runs["spark/4"][0] / runs["duckdb"][0] if engine == "spark/4" else None
                print(f"{rows:>11,} {engine:<10} {raw:>7.2f} {private:>8.2f} {private / raw:>7.2f} "
                      f"{raw_cpu:>8.2f} {private_cpu:>9.2f} {private_cpu / raw_cpu:>10.2f} "
                      f"{alone / raw:>7.2f} {f'{relative:.1f}' if relative else '':>16} "
                      f"{os.getloadavg()[0]:>5.1f}", flush=True)  # fmt: skip
        print(
            f"\nper query on Spark (4 partitions), user-level unless marked; targets: "
            f"DP/hand <= {USER_TARGET}, row-level DP/raw <= {ROW_TARGET}"
        )
        print(f"{'rows':>11} {'query':<14} {'raw s':>7} {'hand s':>7} {'dpsql s':>8} "
              f"{'DP/hand':>7} {'DP/hand cpu':>11} {'DP/raw':>7} {'row DP s':>9} "
              f"{'row DP/raw':>11} {'load':>5}")  # fmt: skip
        for rows in args.sizes:
            census_view(on_spark, parquet(rows))
            per_query(on_spark, rows, args.repeat, folder, spark_cpu)
        if args.tumult_python:
            print(
                f"\nbeside Tumult Analytics {tumult_version(args.tumult_python)} (its own "
                f"Spark 3.5, local[2], 4 partitions, the same Parquet): user-level, "
                f"1 row per unit, PureDP epsilon 1, median of {args.trials} releases; "
                f"target Tumult/dpsql time >= {TUMULT_TARGET}, at equal or lower error"
            )
            print(f"{'rows':>11} {'query':<14} {'dpsql s':>8} {'Tumult s':>9} "
                  f"{'Tumult/dpsql':>13} {'dpsql RMSE':>12} {'Tumult RMSE':>12} "
                  f"{'RMSE T/dpsql':>13} {'load':>5}")  # fmt: skip
            for rows in args.sizes:
                path = parquet(rows)
                census_view(on_spark, path)
                beside_tumult(on_spark, rows, path, args, folder)
    on_spark.close()


if __name__ == "__main__":
    main()
