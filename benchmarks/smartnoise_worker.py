"""SmartNoise SQL's side of bench_smartnoise.py, run by the interpreter that has snsql.

SmartNoise SQL pins its own pandas and opendp, so it usually lives in a virtual
environment of its own; bench_smartnoise.py starts this script with that
environment's Python (`--smartnoise-python`) and reads one JSON document from
its standard output: per query, SmartNoise's total privacy cost and the rows of
each of `trials` releases.

Usage (by bench_smartnoise.py): python smartnoise_worker.py REQUEST.json
"""

from __future__ import annotations

import json
import sys

import pandas as pd
import snsql


def main() -> None:
    with open(sys.argv[1]) as source:
        request = json.load(source)
    data = pd.read_csv(request["csv"])
    privacy = snsql.Privacy(epsilon=request["epsilon"], delta=request["delta"])
    reader = snsql.from_df(data, privacy=privacy, metadata=request["metadata"])
    answers = []
    for query in request["queries"]:
        epsilon, delta = reader.get_privacy_cost(query)
        releases = [reader.execute(query)[1:] for _ in range(request["trials"])]
        answers.append({"epsilon": float(epsilon), "delta": float(delta), "releases": releases})
    json.dump(answers, sys.stdout, default=float)


if __name__ == "__main__":
    main()
