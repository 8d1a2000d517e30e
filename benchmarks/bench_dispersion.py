"""STDDEV and VAR of a 10-million-row column on DuckDB: DP time / raw time (target <= 1.5x).

dpsql releases a STDDEV from three measurements the database computes in one
scan: COUNT(x), SUM(x - m) and SUM((x - m)^2) of the clamped values, each summed
value rounded to its grid as an integer (sql/dispersion.py). Each query here is
timed raw on DuckDB (its own STDDEV_SAMP) and through dpsql, row-level, on the
census table bench_e2e.py builds; beside them, the bounded SQL dpsql sends run
raw (the engine's share of the ratio). Every dpsql run is a fresh, charged
release. Usage:
    python benchmarks/bench_dispersion.py [--rows 10000000] [--repeat 5]
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
from pathlib import Path

from bench_e2e import census, paired, policy

from dpsql.adapters.duckdb import DuckDBAdapter
from dpsql.ledger import Ledger
from dpsql.policy import load_policy
from dpsql.session import Session

TARGET = 1.5
QUERIES = [
    "SELECT STDDEV(income) FROM census",
    "SELECT STDDEV_POP(age) FROM census",
    "SELECT VAR_SAMP(income) FROM census WHERE income < 200000",
    "SELECT sex, STDDEV(income) FROM census GROUP BY sex",
]


def main() -> None:
    args, path, raw = census(__doc__)
    with tempfile.TemporaryDirectory() as folder:
        session = Session(
            DuckDBAdapter(str(path)),
            load_policy(policy(user_level=False)),
            Ledger(Path(folder) / "ledger.sqlite"),
        )
        runs = itertools.count()
        print(f"\nrow-level, {args.rows:,} rows, duckdb")
        print(f"{'query':<56} {'raw s':>7} {'dpsql s':>7} {'ratio':>6} {'SQL/raw':>7}")
        ratios = []
        for sql in QUERIES:

            def private(sql: str = sql) -> None:
                session.execute(sql.replace(" FROM census", f" FROM census AS r{next(runs)}"))

            bounded = dict(session.execute(f"EXPLAIN {sql}").rows)["sql"]
            (raw_time, _), (dp_time, _), (sql_time, _) = paired(
                [
                    lambda sql=sql: raw.execute(sql).fetchall(),
                    private,
                    lambda bounded=bounded: raw.execute(bounded).fetchall(),
                ],
                args.repeat,
            )
            ratios.append(dp_time / raw_time)
            print(f"{sql[:54]:<56} {raw_time:>7.3f} {dp_time:>7.3f} {ratios[-1]:>6.2f}"
                  f" {sql_time / raw_time:>7.2f}")  # fmt: skip
        print(f"median ratio {statistics.median(ratios):.2f} (target <= {TARGET})")


if __name__ == "__main__":
    main()
