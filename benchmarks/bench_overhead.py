"""Proxy overhead per query: parse, check, rewrite, charge, release (database time excluded).

Runs ten PUMS-style queries through a Session on the demo census table and
prints, per query, the median time dpsql adds around the database call.
Target: median <= 1 ms. Usage: python benchmarks/bench_overhead.py [--repeat 50]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from dpsql import demo
from dpsql.adapters.duckdb import DuckDBAdapter
from dpsql.ledger import Ledger
from dpsql.policy import load_policy
from dpsql.session import Session

QUERIES = [
    "SELECT COUNT(*) FROM census",
    "SELECT COUNT(*) FROM census WHERE age > 30 AND sex = 1",
    "SELECT SUM(income) FROM census",
    "SELECT AVG(income) FROM census WHERE income < 100000",
    "SELECT sex, COUNT(*) FROM census GROUP BY sex",
    "SELECT educ, AVG(income) FROM census GROUP BY educ",
    "SELECT race, married, COUNT(*) FROM census GROUP BY race, married",
    "SELECT state, COUNT(*) FROM census GROUP BY state",
    "SELECT sex, COUNT(*) AS n FROM census GROUP BY sex ORDER BY n DESC LIMIT 1",
    "SELECT COUNT(DISTINCT pid), SUM(income / 1000) FROM census WHERE age BETWEEN 20 AND 60",
]


class TimedAdapter(DuckDBAdapter):
    """The DuckDB adapter, adding up the time spent inside the database."""

    database_seconds = 0.0

    def execute(self, sql: str) -> tuple[list[str], list[tuple]]:
        start = time.perf_counter()
        try:
            return super().execute(sql)
        finally:
            self.database_seconds += time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    policy = load_policy(
        demo.DEMO_POLICY | {"analysts": {"default": {"epsilon": 1e6, "delta": 0.5}}}
    )
    adapter = TimedAdapter(demo.demo_connection())
    with tempfile.TemporaryDirectory() as folder:
        ledger = Ledger(Path(folder) / "ledger.sqlite")
        session = Session(adapter, policy, ledger)
        medians = []
        print(f"{'query':<90} {'overhead ms':>12} {'database ms':>12}")
        for sql in QUERIES:
            overheads, database = [], []
            for _ in range(args.repeat + 1):
                # a fresh release each time: charged, not served from the cache
                ledger.clear_cache()
                adapter.database_seconds = 0.0
                start = time.perf_counter()
                session.execute(sql)
                total = time.perf_counter() - start
                overheads.append(total - adapter.database_seconds)
                database.append(adapter.database_seconds)
            del overheads[0], database[0]  # the first run builds the sampler's tables
            medians.append(statistics.median(overheads) * 1e3)
            print(f"{sql[:88]:<90} {medians[-1]:>12.3f} {statistics.median(database) * 1e3:>12.3f}")
        print(
            f"\nmedian proxy overhead over {len(QUERIES)} queries: "
            f"{statistics.median(medians):.3f} ms "
            "(target <= 1 ms; SmartNoise SQL 1.0.10 adds 23-95 ms)"
        )


if __name__ == "__main__":
    main()
