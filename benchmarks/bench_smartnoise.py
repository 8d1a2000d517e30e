"""Accuracy at equal total cost: dpsql beside SmartNoise SQL on four PUMS queries.

Each query is released `--trials` times by each system on the same 1,000-person
PUMS table (the real sample at ../shared/data/pums/PUMS.csv when present, else
the generated stand-in of tests/pums_sample.py), row-level, with the bounds
SmartNoise's own PUMS metadata uses (age 0-100, income 0-500,000). SmartNoise
spends its epsilon once per measurement, so a query's total cost is read from
SmartNoise (`get_privacy_cost`) and dpsql is given exactly that total epsilon
and delta for the query. Both know the columns hold no NULLs (SmartNoise's
`nullable: False`, dpsql's `nullable: false`); `sex` and `married` are public
domains to dpsql ([0, 1]), `educ`'s keys come from the data in both.

Printed per query: the root mean squared error of the released values against
the exact answer over all released cells, each system's share of true groups
it left out (partition selection), and dpsql's RMSE over SmartNoise's. Target
(issue 30): dpsql's error lower on every query at equal total cost.

dpsql's releases here are fresh draws of one plan over one read of the data
(`plan.release` with seeds 0, 1, ...), which is what a charged release draws;
SmartNoise's are `reader.execute` calls. SmartNoise SQL pins its own pandas
and opendp: install it in a virtual environment of its own and name its
Python, e.g.
    python -m venv /tmp/snsql && /tmp/snsql/bin/pip install smartnoise-sql
    python benchmarks/bench_smartnoise.py --smartnoise-python /tmp/snsql/bin/python
Usage: python benchmarks/bench_smartnoise.py [--trials 300] [--smartnoise-python PY]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import sqlglot

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from pums_sample import write_sample

import dpsql

REAL_SAMPLE = Path(__file__).parent.parent.parent / "shared" / "data" / "pums" / "PUMS.csv"
DELTA = 1e-5
QUERIES = [
    "SELECT COUNT(*) AS n FROM PUMS.PUMS",
    "SELECT sex, AVG(age) AS age FROM PUMS.PUMS GROUP BY sex",
    "SELECT married, SUM(income) AS total FROM PUMS.PUMS GROUP BY married",
    "SELECT educ, AVG(income) AS income FROM PUMS.PUMS GROUP BY educ",
]
BOUNDS = {"age": (0, 100), "income": (0, 500_000)}


def smartnoise_metadata() -> dict:
    columns = {
        name: {"type": "int", "lower": low, "upper": high, "nullable": False}
        for name, (low, high) in BOUNDS.items()
    }
    keys = {
        name: {"type": "string", "nullable": False} for name in ("sex", "educ", "race", "married")
    }
    return {"Database": {"PUMS": {"PUMS": {"rows": 1000, "row_privacy": True} | columns | keys}}}


def dpsql_policy(epsilon: float, types: dict[str, str]) -> dict:
    """Row-level; each bounded column declared as DuckDB stores it (PUMS.csv's incomes
    are written as floats)."""
    columns = {
        name: {"type": types[name], "lower": low, "upper": high, "nullable": False}
        for name, (low, high) in BOUNDS.items()
    }
    columns |= {name: {"type": "int", "values": [0, 1]} for name in ("sex", "married")}
    columns |= {name: {"type": "int"} for name in ("educ", "race")}
    return {
        "version": 1,
        "defaults": {"epsilon_per_query": epsilon, "delta": DELTA},
        "analysts": {"default": {"epsilon": 1e6, "delta": 0.5}},
        "tables": {"pums": {"columns": columns}},
    }


def smartnoise_releases(python: str, csv: Path, trials: int) -> list[dict]:
    """SmartNoise's cost and releases per query, from smartnoise_worker.py under `python`."""
    request = {
        "csv": str(csv),
        "epsilon": 1.0,
        "delta": DELTA,
        "metadata": smartnoise_metadata(),
        "queries": QUERIES,
        "trials": trials,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as out:
        json.dump(request, out)
    worker = Path(__file__).parent / "smartnoise_worker.py"
    done = subprocess.run(
        [python, str(worker), out.name], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def dpsql_releases(csv: Path, query: str, epsilon: float, delta: float, trials: int) -> list:
    """`trials` fresh releases of `query` by dpsql at total (epsilon, delta)."""
    connection = duckdb.connect()
    connection.execute(f"CREATE TABLE pums AS SELECT * FROM read_csv_auto('{csv}')")
    stored = dict(
        connection.execute("SELECT column_name, data_type FROM duckdb_columns()").fetchall()
    )
    policy = dpsql_policy(
        epsilon, {k: "float" if v == "DOUBLE" else "int" for k, v in stored.items()}
    )
    policy["defaults"]["delta"] = delta
    with (
        tempfile.TemporaryDirectory() as folder,
        dpsql.connect(connection, policy=policy, ledger=Path(folder) / "l.sqlite") as con,
    ):
        session = con.session
        plan = session.plan(sqlglot.parse_one(query.replace("PUMS.PUMS", "pums")))
        columns, rows = session.adapter.execute(plan.sql)
        return [plan.release(columns, rows, np.random.default_rng(i)).rows for i in range(trials)]


def truth(csv: Path, query: str) -> dict[str, float]:
    rows = duckdb.sql(
        query.replace("PUMS.PUMS", f"read_csv_auto('{csv}')")
    ).fetchall()  # the exact answer, keyed as the releases are
    return {_key(row): float(row[-1]) for row in rows}


def _key(row) -> str:
    return str(row[0]) if len(row) > 1 else ""


def score(releases: list, exact: dict[str, float]) -> tuple[float, float]:
    """(RMSE over released true groups, share of true groups left out)."""
    squares, dropped, cells = [], 0, 0
    for rows in releases:
        released = {_key(row): float(row[-1]) for row in rows}
        for key, value in exact.items():
            cells += 1
            if key in released:
                squares.append((released[key] - value) ** 2)
            else:
                dropped += 1
    return math.sqrt(float(np.mean(squares))) if squares else math.nan, dropped / cells


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--smartnoise-python", default=sys.executable)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        csv = REAL_SAMPLE if REAL_SAMPLE.exists() else write_sample(Path(folder)) / "PUMS.csv"
        print(f"data: {'the real PUMS sample' if csv == REAL_SAMPLE else 'the generated stand-in'}")
        peer = smartnoise_releases(args.smartnoise_python, csv, args.trials)
        print(f"{'query':<66} {'eps':>4} {'dpsql RMSE':>11} {'SN RMSE':>11} {'ratio':>6} "
              f"{'dropped dpsql/SN':>17}")  # fmt: skip
        ratios = []
        for query, theirs in zip(QUERIES, peer, strict=True):
            exact = truth(csv, query)
            ours = dpsql_releases(csv, query, theirs["epsilon"], theirs["delta"], args.trials)
            (our_error, our_drop), (their_error, their_drop) = (
                score(ours, exact),
                score(theirs["releases"], exact),
            )
            ratios.append(our_error / their_error)
            print(f"{query:<66} {theirs['epsilon']:>4g} {our_error:>11.4g} {their_error:>11.4g} "
                  f"{ratios[-1]:>6.2f} {our_drop:>8.1%}/{their_drop:.1%}")  # fmt: skip
        worst = max(ratios)
        verdict = "met" if worst < 1 else "missed"
        print(
            f"worst dpsql/SmartNoise error ratio {worst:.2f} (target < 1 on every query: {verdict})"
        )


if __name__ == "__main__":
    main()
