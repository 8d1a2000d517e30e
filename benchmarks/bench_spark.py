"""DP time / raw time on Spark local and on DuckDB, over one Parquet file per size.

For each size (default 10^5, 10^6, 10^7 rows) the census table of bench_e2e is
written to Parquet once (cached in a temporary folder); Spark (local[2], one
session for the run) and DuckDB (in memory) read that same file. Each engine
runs bench_e2e's queries raw and through dpsql with user-level bounding
(privacy unit pid: the ROW_NUMBER/DENSE_RANK windows run in the engine); every
dpsql run is a fresh, charged release. Printed per size and engine: the summed
median times over the queries, DP/raw (target <= 1.3x on Spark), and Spark's
raw time over DuckDB's, which tells where Spark's fixed cost per query
dominates. Usage:
    python benchmarks/bench_spark.py [--sizes 100000 1000000 10000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
from bench_e2e import QUERIES, build, policy, timed  # the sibling benchmark, shared

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


def spark_session():
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2]").appName("dpsql-bench")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g").config("spark.log.level", "ERROR")
        .getOrCreate()
    )  # fmt: skip


def measure(run_raw, adapter, repeat: int, folder: str) -> tuple[float, float]:
    """Summed median seconds over QUERIES: raw, and through dpsql with user-level bounding."""
    ledger = Ledger(Path(folder) / f"ledger-{adapter.dialect}.sqlite")
    session = Session(adapter, load_policy(policy(user_level=True)), ledger)
    raw = private = 0.0
    for sql in QUERIES:
        raw += timed(lambda sql=sql: run_raw(sql), repeat)

        def release(sql: str = sql) -> None:
            ledger.clear_cache()
            session.execute(sql)

        private += timed(release, repeat)
    return raw, private


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**5, 10**6, 10**7])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    spark = spark_session()
    print(f"{len(QUERIES)} queries, median of {args.repeat}, load {os.getloadavg()[0]:.1f}")
    print(f"{'rows':>11} {'engine':<7} {'raw s':>8} {'dpsql s':>8} {'DP/raw':>7} "
          f"{'Spark/DuckDB raw':>17}")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        for rows in args.sizes:
            path = parquet(rows)
            spark.read.parquet(str(path)).createOrReplaceTempView("census")
            spark_times = measure(
                lambda sql: spark.sql(sql).collect(), SparkAdapter(spark), args.repeat, folder
            )
            with duckdb.connect() as local:
                local.execute(f"CREATE VIEW census AS SELECT * FROM read_parquet('{path}')")
                duck_times = measure(
                    lambda sql, db=local: db.execute(sql).fetchall(),
                    DuckDBAdapter(local),
                    args.repeat,
                    folder,
                )
            for engine, (raw, private) in (("spark", spark_times), ("duckdb", duck_times)):
                relative = f"{spark_times[0] / duck_times[0]:>17.1f}" if engine == "spark" else ""
                print(f"{rows:>11,} {engine:<7} {raw:>8.2f} {private:>8.2f} "
                      f"{private / raw:>7.2f} {relative}")  # fmt: skip
    spark.stop()


if __name__ == "__main__":
    main()
