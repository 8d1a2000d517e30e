"""Wire throughput: private COUNTs over `dpsql serve` against the same queries in-process.

1, 4 and 16 concurrent psycopg clients (one analyst each, so the ledger is
shared) run a trivial private COUNT over the demo census table. Two kinds of
query are timed separately:

- distinct: a different constant in WHERE each time, so each is planned,
  charged (one fsync'ed ledger write), run and noised;
- repeats: one query again and again, answered from the release cache (free).

The same queries through the DB-API in one thread give the baseline; "added"
is the wire layer's cost per query (wire time per query from one client minus
in-process time per query). Prints ratios; not a timed test.

    python benchmarks/bench_wire.py [--queries 400]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import psycopg

import dpsql
from dpsql import demo
from dpsql.server import BackgroundServer, build

ANALYSTS = [f"a{i}" for i in range(16)]


def _policy() -> dict:
    policy = dict(demo.DEMO_POLICY)
    policy["analysts"] = {name: {"epsilon": 1e9, "delta": 1e-3} for name in ANALYSTS}
    return policy


def _queries(kind: str, client: int, count: int) -> list[str]:
    if kind == "repeats":
        return ["SELECT COUNT(*) FROM census WHERE age > 30"] * count
    # distinct per client and per run: each one is charged
    return [
        f"SELECT COUNT(*) FROM census WHERE income > {client * 1_000_000 + i}" for i in range(count)
    ]


def _in_process(connection: dpsql.Connection, queries: list[str]) -> float:
    cursor = connection.cursor()
    start = time.perf_counter()
    for sql in queries:
        cursor.execute(sql)
        cursor.fetchall()
    return time.perf_counter() - start


def _wire(port: int, clients: int, kind: str, per_client: int, offset: int) -> float:
    connections = [
        psycopg.connect(f"host=127.0.0.1 port={port} user={ANALYSTS[i]}", autocommit=True)
        for i in range(clients)
    ]
    barrier = threading.Barrier(clients + 1)

    def run(index: int) -> None:
        queries = _queries(kind, offset + index, per_client)
        barrier.wait()
        for sql in queries:
            connections[index].execute(sql).fetchall()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    for connection in connections:
        connection.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=400, help="queries per client")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="dpsql-bench-wire-"))
    database, _ = demo.write_demo(folder)
    policy, ledger = _policy(), str(folder / "ledger.sqlite")
    local = dpsql.connect(str(database), policy=policy, analyst="a0", ledger=ledger)
    served = dpsql.connect(str(database), policy=policy, analyst="a0", ledger=ledger)
    n = args.queries
    print(f"{n} queries per client; demo census (50,000 rows); ms per query and queries/s")
    with BackgroundServer(build(served, trust=True, workers=4)) as server:
        for kind in ("repeats", "distinct"):
            _in_process(local, _queries(kind, 90, 5))  # warm up caches and the ledger
            baseline = _in_process(local, _queries(kind, 99, n)) / n
            print(f"\n{kind}: in-process DB-API {baseline * 1e3:.3f} ms/query "
                  f"({1 / baseline:,.0f} queries/s)")  # fmt: skip
            for clients in (1, 4, 16):
                elapsed = _wire(server.port, clients, kind, n, offset=clients * 100)
                rate = clients * n / elapsed
                line = f"  wire, {clients:2d} clients: {rate:8,.0f} queries/s"
                if clients == 1:
                    added = elapsed / n - baseline
                    line += f", {added * 1e3:+.3f} ms/query added by the wire layer"
                print(line)
    local.close()


if __name__ == "__main__":
    main()
