"""End-to-end DP time / raw query time on a large synthetic census table in DuckDB.

Builds (once, cached in a temporary folder) a DuckDB file with N rows of the
demo generator, then times each query run raw on DuckDB and through dpsql,
with row-level privacy and with user-level bounding (privacy unit pid). Every
dpsql run is a fresh, charged release: its text differs from every earlier one
(a new table alias), so neither the release cache nor a cleared cache's disk
write is in the timing.
Each query's bounded SQL (what dpsql sends, read from EXPLAIN) is also run raw,
which splits the ratio into the engine's share and dpsql's own.
Targets: <= 1.2x row-level, <= 2x user-level. Usage:
    python benchmarks/bench_e2e.py [--rows 10000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
from machine import describe

from dpsql import demo
from dpsql.adapters.duckdb import LOCKED, DuckDBAdapter
from dpsql.ledger import Ledger
from dpsql.policy import load_policy
from dpsql.session import Session

QUERIES = [
    "SELECT COUNT(*) FROM census WHERE age > 30",
    "SELECT SUM(income) FROM census",
    "SELECT sex, COUNT(*), AVG(income) FROM census GROUP BY sex",
    "SELECT educ, SUM(income) FROM census WHERE income < 200000 GROUP BY educ",
    "SELECT state, COUNT(*) FROM census GROUP BY state",
]


def build(rows: int) -> Path:
    path = Path(tempfile.gettempdir()) / f"dpsql-bench-census-{rows}.duckdb"
    if not path.exists():
        print(f"building {rows:,} rows in {path} ...", flush=True)
        with duckdb.connect(str(path)) as connection:
            demo.create_census(connection, rows)
    return path


def policy(user_level: bool) -> dict:
    document = copy.deepcopy(demo.DEMO_POLICY)
    document["analysts"] = {"default": {"epsilon": 1e9, "delta": 0.5}}
    if not user_level:
        table = document["tables"]["census"]
        del table["privacy_unit"], table["max_groups_per_unit"], table["max_rows_per_unit"]
    return document


def paired(runs: list, repeat: int) -> list[tuple[float, float]]:
    """Median wall and process-CPU seconds of each of `runs`, taken in turns so that a
    change in the machine's load falls on all alike."""
    for run in runs:
        run()  # warm the database's caches
    samples: list[tuple[list[float], list[float]]] = [([], []) for _ in runs]
    for _ in range(repeat):
        for run, (walls, cpus) in zip(runs, samples, strict=True):
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    return [(statistics.median(walls), statistics.median(cpus)) for walls, cpus in samples]


def census(
    doc: str, built: Callable[[int], Path] = build
) -> tuple[argparse.Namespace, Path, duckdb.DuckDBPyConnection]:
    """The command line (--rows, --repeat) of a benchmark described by `doc`, after printing
    the machine; the census table's file (`built` for the rows), and a raw read-only
    connection to it."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(describe())
    path = built(args.rows)
    return args, path, duckdb.connect(str(path), read_only=True, config=LOCKED)


def main() -> None:
    args, path, raw = census(__doc__)
    compare(lambda sql: raw.execute(sql).fetchall(), DuckDBAdapter(str(path)), args, cpu=True)


def compare(run_raw, adapter, args: argparse.Namespace, *, cpu: bool = False) -> None:
    """Print raw and dpsql times of QUERIES on `adapter`, row-level then user-level.

    Beside them, the time of the bounded SQL that dpsql sends (from EXPLAIN), run
    raw: its ratio to the raw query is what the engine pays for the clamps and the
    bounding, and dpsql's time minus it is what dpsql adds around the database
    (parsing, planning, the charge, the noise, the release). With `cpu` (the
    database runs in this process) also the ratio of process CPU time, which the
    load of other work on a shared machine disturbs far less.
    """
    with tempfile.TemporaryDirectory() as folder:
        for user_level in (False, True):
            ledger = Ledger(Path(folder) / f"ledger{user_level}.sqlite")
            session = Session(adapter, load_policy(policy(user_level)), ledger)
            label = "user-level (pid, 1 row, 1 group)" if user_level else "row-level"
            print(f"\n{label}, {args.rows:,} rows, {adapter.dialect}")
            print(f"{'query':<62} {'raw s':>7} {'dpsql s':>7} {'ratio':>6}"
                  + (f" {'cpu ratio':>9}" if cpu else "")
                  + f" {'SQL/raw':>7} {'added ms':>8}")  # fmt: skip
            ratios, cpu_ratios, sql_ratios, runs = [], [], [], itertools.count()
            for sql in QUERIES:

                def private(sql: str = sql, session=session, runs=runs) -> None:
                    session.execute(sql.replace(" FROM census", f" FROM census AS r{next(runs)}"))

                bounded = dict(session.execute(f"EXPLAIN {sql}").rows)["sql"]
                (raw_time, raw_cpu), (dp_time, dp_cpu), (sql_time, _) = paired(
                    [
                        lambda sql=sql: run_raw(sql),
                        private,
                        lambda bounded=bounded: run_raw(bounded),
                    ],
                    args.repeat,
                )
                ratios.append(dp_time / raw_time)
                cpu_ratios.append(dp_cpu / raw_cpu)
                sql_ratios.append(sql_time / raw_time)
                print(f"{sql[:60]:<62} {raw_time:>7.3f} {dp_time:>7.3f} {ratios[-1]:>6.2f}"
                      + (f" {cpu_ratios[-1]:>9.2f}" if cpu else "")
                      + f" {sql_ratios[-1]:>7.2f} {(dp_time - sql_time) * 1e3:>8.2f}")  # fmt: skip
            target = 2.0 if user_level else 1.2
            print(
                f"median ratio {statistics.median(ratios):.2f}"
                + (f", CPU time {statistics.median(cpu_ratios):.2f}" if cpu else "")
                + f", the bounded SQL alone {statistics.median(sql_ratios):.2f}"
                + f" (target <= {target}; load average {os.getloadavg()[0]:.2f})"
            )


if __name__ == "__main__":
    main()
