"""Tumult Analytics' side of bench_quantiles.py and bench_spark.py, run by the interpreter
that has tmlt.analytics.

Tumult Analytics pins its own PySpark (3.5), pandas and numpy, so it lives in a virtual
environment of its own; the benchmarks start this script with that environment's Python
(`--tumult-python`) and read one JSON document from its standard output. The request's
`task` says which:

* `quantiles` (bench_quantiles.py): per requested quantile, the values of `trials`
  releases, each at `epsilon` (pure DP) for one added or removed row (`AddOneRow`), and
  the seconds the releases took;
* `mix` (bench_spark.py): per query of its mix (COUNT, SUM, AVG, GROUP BY a public key
  set), the releases and the seconds of each, user-level: `AddRowsWithID` on the unit
  column with `MaxRowsPerID(max_rows)` enforced, pure DP at `epsilon`, after one
  unrecorded warm-up release.

Spark runs locally with the request's master and shuffle partitions; its warehouse
(Tumult Core keeps intermediate tables in a database of its own) and any metastore go
to a temporary folder, so a run leaves nothing in the working directory.

Usage (by the benchmarks): python tumult_worker.py REQUEST.json
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession
from tmlt.analytics import (
    AddOneRow,
    AddRowsWithID,
    KeySet,
    MaxRowsPerID,
    PureDPBudget,
    QueryBuilder,
    Session,
)


def spark_session(request: dict, folder: str) -> SparkSession:
    """A local Spark whose warehouse and metastore live in `folder`."""
    # Tumult runs Python functions in Spark's workers: this interpreter, which has it
    os.environ["PYSPARK_PYTHON"] = sys.executable
    return (
        SparkSession.builder.master(request.get("master", "local[*]"))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")  # a local run: Spark's 200 only add tasks
        .config("spark.driver.memory", request.get("memory", "1g"))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(Path(folder) / "spark-warehouse"))
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={folder}")
        .getOrCreate()
    )


def quantiles(spark: SparkSession, request: dict) -> list[dict]:
    """Per quantile, `trials` releases at `epsilon` each and the seconds they took."""
    data = spark.read.parquet(request["parquet"])
    epsilon, trials = request["epsilon"], request["trials"]
    answers = []
    for q in request["quantiles"]:
        # one session per quantile, its budget the trials' sum: each release spends epsilon
        session = Session.from_dataframe(
            privacy_budget=PureDPBudget(epsilon * trials),
            source_id="t",
            dataframe=data,
            protected_change=AddOneRow(),
        )
        query = QueryBuilder("t").quantile(
            request["column"], q, low=request["lower"], high=request["upper"], name="q"
        )
        start = time.perf_counter()
        releases = [
            float(session.evaluate(query, PureDPBudget(epsilon)).collect()[0]["q"])
            for _ in range(trials)
        ]
        answers.append({"releases": releases, "seconds": time.perf_counter() - start})
    return answers


def _mix_queries(request: dict) -> dict:
    """bench_spark.py's mix in Tumult's query language, by the names bench_spark.py uses:
    each a query and a function from its collected rows to [(key, value), ...]."""
    low, high = request["lower"], request["upper"]

    def bounded() -> QueryBuilder:
        return QueryBuilder("census").enforce(MaxRowsPerID(request["max_rows"]))

    def scalar(rows: list) -> list:
        return [[None, float(rows[0]["v"])]]

    keys = KeySet.from_dict({"educ": list(range(request["educ_low"], request["educ_high"] + 1))})
    return {
        "COUNT": (bounded().filter("age > 30").count(name="v"), scalar),
        "SUM": (bounded().sum("income", low, high, name="v"), scalar),
        "AVG": (bounded().average("income", low, high, name="v"), scalar),
        "GROUP BY educ": (
            bounded().groupby(keys).count(name="v"),
            lambda rows: sorted([int(row["educ"]), float(row["v"])] for row in rows),
        ),
    }


def mix(spark: SparkSession, request: dict) -> dict:
    """Per query of the mix, its releases (lists of [key, value]) and each one's seconds."""
    data = spark.read.parquet(request["parquet"])
    epsilon, trials = request["epsilon"], request["trials"]
    answers = {}
    for name, (query, values) in _mix_queries(request).items():
        # one session per query, budgeted for the warm-up and the trials at epsilon each
        session = Session.from_dataframe(
            privacy_budget=PureDPBudget(epsilon * (trials + 1)),
            source_id="census",
            dataframe=data,
            protected_change=AddRowsWithID(request["unit"]),
        )
        session.evaluate(query, PureDPBudget(epsilon)).collect()  # warm-up
        releases, seconds = [], []
        for _ in range(trials):
            start = time.perf_counter()
            rows = session.evaluate(query, PureDPBudget(epsilon)).collect()
            seconds.append(time.perf_counter() - start)
            releases.append(values(rows))
        answers[name] = {"releases": releases, "seconds": seconds}
    return answers


TASKS = {"quantiles": quantiles, "mix": mix}


def main() -> None:
    with open(sys.argv[1]) as source:
        request = json.load(source)
    with tempfile.TemporaryDirectory() as folder:
        spark = spark_session(request, folder)
        spark.sparkContext.setLogLevel("ERROR")
        answers = TASKS[request.get("task", "quantiles")](spark, request)
        spark.stop()
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main()
