"""Tumult Analytics' side of bench_quantiles.py, run by the interpreter that has tmlt.analytics.

Tumult Analytics pins its own PySpark, pandas and numpy, so it lives in a virtual
environment of its own; bench_quantiles.py starts this script with that
environment's Python (`--tumult-python`) and reads one JSON document from its
standard output: per requested quantile, the values of `trials` releases, each
at `epsilon` (pure DP) for one added or removed row (`AddOneRow`), and the
seconds the releases took.

Usage (by bench_quantiles.py): python tumult_worker.py REQUEST.json
"""

from __future__ import annotations

import json
import sys
import time

from pyspark.sql import SparkSession
from tmlt.analytics import AddOneRow, PureDPBudget, QueryBuilder, Session


def main() -> None:
    with open(sys.argv[1]) as source:
        request = json.load(source)
    spark = (
        SparkSession.builder.master("local[*]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")  # a local run: Spark's 200 only add tasks
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
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
    spark.stop()
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main()
