"""A child process for tests/test_ledger.py: races on, or is killed while using, one ledger.

Run as ``python tests/ledger_worker.py '<json job>'``. It prints ``ready`` once
imported, and (for racing jobs) waits for a line on stdin, so that the parent
can start every worker at the same moment.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from fractions import Fraction

from dpsql.accounting import Cost
from dpsql.errors import BudgetExhausted
from dpsql.ledger import Ledger


def _cost(spec: list[str]) -> Cost:
    return Cost(Fraction(spec[0]), Fraction(spec[1]))


def race_charges(job: dict) -> dict:
    cost, budget = _cost(job["cost"]), _cost(job["budget"])
    ok = refused = 0
    # A short seeded pause between charges lets the other workers take the
    # write lock in between, so the charges really interleave.
    rng = random.Random(job["name"])
    # Open after the start signal, so workers also race to create the file.
    with Ledger(job["path"]) as ledger:
        for i in range(job["n"]):
            try:
                ledger.charge("alice", cost, budget, f"{job['name']}-{i}")
                ok += 1
            except BudgetExhausted:
                refused += 1
            time.sleep(rng.uniform(0, job.get("pause", 0.0)))
    return {"ok": ok, "refused": refused}


def race_release(job: dict) -> dict:
    with Ledger(job["path"]) as ledger:
        return {"stored": ledger.store_release("alice", "q", job["payload"])}


def charge_forever(job: dict) -> None:
    # Every line "ok <n>" is printed only after charge() returned, so the
    # parent knows at least n charges were committed before the kill.
    cost, budget = _cost(job["cost"]), _cost(job["budget"])
    with Ledger(job["path"]) as ledger:
        i = 0
        while True:
            ledger.charge("alice", cost, budget, f"{job['name']}-{i}")
            i += 1
            print(f"ok {i}", flush=True)
            ledger.store_release("alice", f"{job['name']}-{i}", json.dumps({"n": i}))


def fork_and_charge(job: dict) -> dict:
    # In a process of its own: fork() with the test suite's threads around
    # could deadlock or crash the child for reasons unrelated to the ledger.
    cost, budget = _cost(job["cost"]), _cost(job["budget"])
    with Ledger(job["path"]) as ledger:
        ledger.charge("alice", cost, budget, "parent")
        pid = os.fork()
        if pid == 0:  # the child must not reuse the parent's connection
            code = 1
            try:
                ledger.charge("alice", cost, budget, "child")
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        ledger.charge("alice", cost, budget, "parent again")
        return {"child": os.waitstatus_to_exitcode(status)}


def main() -> None:
    job = json.loads(sys.argv[1])
    print("ready", flush=True)
    if job["mode"] == "forever":
        charge_forever(job)
        return
    if job["mode"] == "fork":
        print(json.dumps(fork_and_charge(job)), flush=True)
        return
    sys.stdin.readline()
    result = race_charges(job) if job["mode"] == "charges" else race_release(job)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
