"""A child process for the budget tests: runs distinct private queries through dpsql.connect."""

from __future__ import annotations

import json
import sys

import dpsql


def main() -> None:
    database, policy, ledger, worker, count = sys.argv[1:6]
    answered = refused = 0
    with dpsql.connect(database, policy=json.loads(policy), ledger=ledger) as connection:
        cursor = connection.cursor()
        print("ready", flush=True)
        for i in range(int(count)):
            # distinct queries, so none is answered from the release cache
            try:
                cursor.execute(f"SELECT COUNT(*) FROM pums WHERE age >= {i} AND educ <> {worker}")
                answered += 1
            except dpsql.BudgetExhausted:
                refused += 1
            print(f"done {i}", flush=True)
    print(json.dumps({"answered": answered, "refused": refused}), flush=True)


if __name__ == "__main__":
    main()
