"""DP time / raw time on Spark local and on DuckDB, over one Parquet file per size.

For each size (default 10^5, 10^6, 10^7 rows) the census table of bench_e2e is
written to Parquet once (cached in a temporary folder). Spark runs as dpsql
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
Usage:
    python benchmarks/bench_spark.py [--sizes 100000 1000000 10000000] [--repeat 3]
        [--partitions 200] [--memory 4g]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
from bench_e2e import QUERIES, build, policy  # the sibling benchmark, shared

from dpsql.adapters.duckdb import DuckDBAdapter
from dpsql.adapters.spark import SparkAdapter
from dpsql.ledger import Ledger
from dpsql.policy import load_policy
from dpsql.session import Session


def parquet(rows: int) -> Path:
    """The census table of `rows` rows as one Parquet file (built once, then cached)."""
    path = Path(tempfile.gettempdir()) / f"dpsql-bench-census-{rows}.parquet"
    if not path.exists():
        with duckdb.connect(str(build(rows)), read_only=True) as source:
            source.execute(f"COPY census TO '{path}' (FORMAT parquet)")
    return path


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


def timed(run: Callable[[], object], repeat: int, cpu: Callable[[], float]) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds of `repeat` runs, after a warm-up run."""
    run()
    walls, cpus = [], []
    for _ in range(repeat):
        wall, used = time.perf_counter(), cpu()
        run()
        walls.append(time.perf_counter() - wall)
        cpus.append(cpu() - used)
    return sorted(walls)[len(walls) // 2], sorted(cpus)[len(cpus) // 2]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**5, 10**6, 10**7])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--partitions", type=int, help="also run Spark with this many")
    parser.add_argument("--memory", default="4g", help="Spark driver memory (default: 4g)")
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
            on_spark.execute(
                f"CREATE OR REPLACE TEMP VIEW census AS SELECT * FROM parquet.`{path}`"
            )
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
    on_spark.close()


if __name__ == "__main__":
    main()
