"""DP time / raw query time, row-level, with the policy's bounds proven by the database
and without: the clamps a proof makes redundant are left out (sql/proofs.py).

Builds (once, cached in a temporary folder) a DuckDB file of N census rows whose income
is capped at the policy's upper bound, so that the file's column statistics prove every
bounded column within its bounds. dpsql opening the file read-only, under a policy that
trusts them (trust_statistics), uses them (proven); the same file handed to dpsql as a connection
the caller opened proves nothing, since the caller could write to it (unproven). The
query mix is bench_e2e's, with integer SUM/AVG beside its float ones: a proven integer
SUM is the raw SUM, while a float SUM keeps its cast onto the release grid (the "limit"
column says what remains per query). Beside each, the bounded SQL dpsql sends (from
EXPLAIN) run raw: what the engine pays for the clamps, without dpsql's own work; and
dpsql's own time per query with the bounds proven (planning and release: each run's
time less the time spent in DuckDB's calls), the part of DP/raw that is not the engine's.
Target: DP/raw <= 1.2x median, proven. Usage:
    python benchmarks/bench_clamps.py [--rows 10000000] [--repeat 5]
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
from bench_e2e import QUERIES, census, paired, policy
from bench_overhead import TimedAdapter
from machine import python_probe_us

from dpsql import demo
from dpsql.adapters.duckdb import LOCKED
from dpsql.ledger import Ledger
from dpsql.policy import load_policy
from dpsql.session import Session

MIX = [
    *QUERIES,
    "SELECT SUM(age) FROM census",
    "SELECT sex, COUNT(*), AVG(age) FROM census GROUP BY sex",
]
_UPPER = demo.DEMO_POLICY["tables"]["census"]["columns"]["income"]["upper"]


def build(rows: int) -> Path:
    """The census with income capped, written once as a new table: an UPDATE would leave
    the statistics' old maximum, which proves nothing."""
    path = Path(tempfile.gettempdir()) / f"dpsql-bench-clamps-{rows}.duckdb"
    if not path.exists():
        print(f"building {rows:,} rows in {path} ...", flush=True)
        with duckdb.connect(str(path)) as connection:
            demo.create_census(connection, rows, table="uncapped")
            connection.execute(
                f"CREATE TABLE census AS SELECT * REPLACE (LEAST(income, {_UPPER}) AS income) "
                "FROM uncapped"
            )
            connection.execute("DROP TABLE uncapped")
    return path


def limit(sql: str) -> str:
    """What the bounded SQL still does per row beyond the raw query's work."""
    left = []
    if " WHEN " in sql:
        left.append("clamp")
    if "SUM(CAST(" in sql:
        left.append("float grid cast")
    return ", ".join(left) or "none"


def main() -> None:
    args, path, raw = census(__doc__, build)
    trusting = policy(False)
    trusting["tables"]["census"]["trust_statistics"] = True
    adapters = {  # each adds up the time its calls spend in DuckDB
        "unproven": TimedAdapter(duckdb.connect(str(path), read_only=True, config=LOCKED)),
        "proven": TimedAdapter(str(path)),
    }
    with tempfile.TemporaryDirectory() as folder:
        sessions = {
            name: Session(adapter, load_policy(trusting), Ledger(Path(folder) / name))
            for name, adapter in adapters.items()
        }
        proofs = sessions["proven"].proven.get("census", ())
        print(f"\nrow-level, {args.rows:,} rows; proven: "
              + ", ".join(f"{p.column} in [{p.lower:g}, {p.upper:g}]" for p in proofs))  # fmt: skip
        assert not sessions["unproven"].proven, "the handed connection must prove nothing"
        print(f"{'query':<50} {'raw s':>6} {'unproven':>8} {'proven':>6}"
              f" {'SQL/raw unproven':>16} {'proven':>6} {'own ms':>6}"
              "  limit when proven")  # fmt: skip
        ratios: dict[str, list[float]] = {name: [] for name in [*sessions, "SQL proven"]}
        owns: list[float] = []  # each query's median own time, proven (seconds)
        runs = iter(range(10**9))
        for sql in MIX:
            own: list[float] = []

            def private(session: Session, sql: str = sql, own: list[float] = own) -> None:
                # a new alias each run: a fresh, charged release, never the cache's
                adapter = session.adapter
                adapter.database_seconds = 0.0
                start = time.perf_counter()
                session.execute(sql.replace(" FROM census", f" FROM census AS r{next(runs)}"))
                if adapter is adapters["proven"]:
                    own.append(time.perf_counter() - start - adapter.database_seconds)

            bounded = {
                name: dict(session.execute(f"EXPLAIN {sql}").rows)["sql"]
                for name, session in sessions.items()
            }
            timings = paired(
                [
                    lambda sql=sql: raw.execute(sql).fetchall(),
                    *[lambda s=session: private(s) for session in sessions.values()],
                    *[lambda b=b: raw.execute(b).fetchall() for b in bounded.values()],
                ],
                args.repeat,
            )
            walls = [wall / timings[0][0] for wall, _ in timings[1:]]
            for name, ratio in zip(ratios, [*walls[:2], walls[3]], strict=True):
                ratios[name].append(ratio)
            owns.append(statistics.median(own[1:] or own))  # paired's first run warms up
            print(f"{sql[:48]:<50} {timings[0][0]:>6.3f} {walls[0]:>7.2f}x {walls[1]:>5.2f}x"
                  f" {walls[2]:>15.2f}x {walls[3]:>5.2f}x {owns[-1] * 1e3:>6.2f}"
                  f"  {limit(bounded['proven'])}")  # fmt: skip
        print(
            f"median DP/raw: unproven {statistics.median(ratios['unproven']):.2f}x, proven "
            f"{statistics.median(ratios['proven']):.2f}x (target <= 1.2x proven); SQL/raw proven "
            f"{statistics.median(ratios['SQL proven']):.2f}x; dpsql's own time, proven: median "
            f"{statistics.median(owns) * 1e3:.2f} ms (load average {os.getloadavg()[0]:.2f}; "
            f"Python probe {python_probe_us():.0f} us)"
        )


if __name__ == "__main__":
    main()
