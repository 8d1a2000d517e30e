"""Wire throughput: private COUNTs over `dpsql serve` against the same queries in-process.

The server runs as its own process (`dpsql serve --trust` on loopback), as in
production: clients in the same process would share its interpreter lock and
be counted as wire cost. 1, 4 and 16 concurrent psycopg clients (over
bench_load's 8 analysts) run a trivial private COUNT over the demo census
table. Three kinds of query are timed separately:

- repeats: one query again and again, answered from the release cache (free;
  the server answers it from its memory of the cache, without a worker);
- first-seen: repeats the server has not answered since it started (released
  beforehand in this process, on the server's ledger), so its Session reads
  each from the release cache in a worker thread, as after a restart; one
  client only, and in process the same queries a second time;
- charged: a different constant in WHERE each time, so each is planned,
  charged (one fsync'ed ledger write), run and noised, in a worker thread.

The same queries through the DB-API in this process give the baseline. The
wire layer's cost per query is printed two ways, from the 1-client run:
wall time per query over the wire minus in-process wall time per query (it
includes the client's and the loopback's share), and the server process's
CPU time per query minus in-process CPU time per query (the server's own
share, which a loaded machine disturbs less). For repeats it can be negative:
the DB-API parses each one and reads the ledger, the server answers from
memory; first-seen shows what the server adds to a statement it hands to a
worker (the protocol, the trip to the thread), and charged the same around
a statement that does real work.

In process, queries run back to back on a processor whose caches stay warm;
over the wire each server thread idles between its queries (the client's
round trip, the other thread's turn), and on this virtual machine work that
follows an idle pause runs slower. So first-seen and charged queries are also
timed in process with PAUSE (0.2 ms) idle before each one, not counted:
"paced". The wire's cost beyond paced is the server's own: the protocol, the
hand-off, and a worker whose processor's caches do not hold the Session's
code and data (the first parse on a thread that has just woken costs about
twice a parse right after it). The server's CPU is split into its event loop
(the main thread) and its other threads (workers, and DuckDB's own).

In-process and wire runs alternate round by round and the fastest round of
each is shown. CPU times come from /proc in clock ticks (10 ms): keep
--queries in the hundreds. Prints ratios; not a timed test.

    python benchmarks/bench_wire.py [--queries 300] [--rounds 3]
        [--kinds repeats first-seen charged] [--baseline FOLDER] [--processes 1]

`--processes N` serves with `dpsql serve --processes N`: the server's CPU is
then summed over its processes, and its event loop's over theirs.

`--baseline` runs a second server from another version's dpsql package in the
same rounds, so a change is measured against what it replaces under one load.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from bench_load import ANALYSTS, _policy, _serve, server_processes  # the sibling's server
from machine import describe

import dpsql

CLIENTS = (1, 4, 16)
KINDS = ("repeats", "first-seen", "charged")
PAUSE = 0.0002  # seconds idle after each paced in-process query
HEADINGS = {
    "repeats": "repeats (answered from the server's memory)",
    "first-seen": "first-seen (in the release cache, new to the server: a worker reads it)",
    "charged": "charged (a new constant each time: planned, charged, run in a worker)",
}


def _queries(kind: str, client: int, count: int) -> list[str]:
    if kind == "repeats":
        return ["SELECT COUNT(*) FROM census WHERE age > 30"] * count
    # distinct per client and per run: each one is charged (first-seen: beforehand); the
    # two kinds compare differently, so they never share a release
    compare = ">=" if kind == "first-seen" else ">"
    return [
        f"SELECT COUNT(*) FROM census WHERE income {compare} {client * 1_000_000 + i}"
        for i in range(count)
    ]


def _cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User plus system CPU time of a process (all its threads) or of one of its threads."""
    stat = Path(f"/proc/{pid}/task/{thread}/stat" if thread else f"/proc/{pid}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of the server, and of its event loops (each server process's main
    thread); with --processes, the parent's own (accepting connections and handing them
    over) counts in the first."""
    served = server_processes(pid)
    total = sum(_cpu_seconds(p) for p in served) + (_cpu_seconds(pid) if served != [pid] else 0)
    return total, sum(_cpu_seconds(p, p) for p in served)


def _in_process(
    connection: dpsql.Connection, queries: list[str], pause: float = 0.0
) -> tuple[float, float]:
    """Wall and CPU seconds (this process, with the database's threads) for `queries`,
    back to back or each after `pause` seconds idle (not counted)."""
    cursor = connection.cursor()
    wall = cpu = 0.0
    for sql in queries:
        if pause:
            time.sleep(pause)
        start, used = time.perf_counter(), time.process_time()
        cursor.execute(sql)
        cursor.fetchall()
        wall += time.perf_counter() - start
        cpu += time.process_time() - used
    return wall, cpu


def _wire(port: int, server: int, clients: int, kind: str, n: int, offset: int) -> tuple:
    """Wall seconds and server CPU seconds (all, event loop) for `clients` clients sending
    `n` queries each."""
    connections = [
        psycopg.connect(
            f"host=127.0.0.1 port={port} user={ANALYSTS[i % len(ANALYSTS)]}", autocommit=True
        )
        for i in range(clients)
    ]
    for connection in connections:
        connection.execute(_queries(kind, offset + 99, 1)[0]).fetchall()  # warm each session
    barrier = threading.Barrier(clients + 1)

    def run(index: int) -> None:
        queries = _queries(kind, offset + index, n)
        barrier.wait()
        for sql in queries:
            connections[index].execute(sql).fetchall()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start, (cpu, loop) = time.perf_counter(), _server_cpu(server)
    for thread in threads:
        thread.join()
    elapsed, (cpu_end, loop_end) = time.perf_counter() - start, _server_cpu(server)
    for connection in connections:
        connection.close()
    return elapsed, cpu_end - cpu, loop_end - loop


def _measure(
    local: dpsql.Connection, servers: dict[str, tuple], kind: str, n: int, rounds: int
) -> None:
    """Print one kind's figures: in-process and wire runs (of each server) interleaved
    round by round, so a change in the machine's load hits all alike; the fastest round
    of each is shown."""
    _in_process(local, _queries(kind, 50, 5))  # warm up caches and the ledger
    counts = (1,) if kind == "first-seen" else CLIENTS
    paced = kind != "repeats"
    local_runs, paced_runs = [], []
    wire_runs = {(name, clients): [] for name in servers for clients in counts}
    for r in range(rounds):
        for runs, client, pause in ((local_runs, 99 - r, 0.0), (paced_runs, 79 - r, PAUSE)):
            if pause and not paced:
                continue
            queries = _queries(kind, client, n)
            if kind == "first-seen":
                _in_process(local, queries)  # released now, timed below from the cache
            runs.append([t / n for t in _in_process(local, queries, pause)])
        for s, (name, (server, port, released)) in enumerate(servers.items()):
            for clients in counts:
                # each server and round its own queries: a charged one is charged afresh
                offset = (clients + 10 * r + 100 * s) * 100
                if kind == "first-seen":
                    _in_process(released, _queries(kind, offset, n))
                run = _wire(port, server.pid, clients, kind, n, offset)
                wire_runs[name, clients].append([t / (clients * n) for t in run])
    wall, cpu = min(local_runs)
    print(f"\n{HEADINGS[kind]}\n  in-process DB-API {wall * 1e3:.3f} ms/query "
          f"({1 / wall:,.0f} queries/s), CPU {cpu * 1e3:.3f} ms/query")  # fmt: skip
    if paced:
        paced_wall, paced_cpu = min(paced_runs)
        print(f"  in process, paced ({PAUSE * 1e3:g} ms idle before each): "
              f"{paced_wall * 1e3:.3f} ms/query, CPU {paced_cpu * 1e3:.3f}")  # fmt: skip
    for (name, clients), runs in wire_runs.items():
        elapsed, used, loop = min(runs)
        label = f"{name}, " if len(servers) > 1 else ""
        print(f"  wire, {label}{clients:2d} clients: {1 / elapsed:8,.0f} queries/s, server CPU "
              f"{used * 1e3:.3f} ms/query (event loop {loop * 1e3:.3f}, "
              f"other threads {(used - loop) * 1e3:.3f})")  # fmt: skip
        if clients == 1:
            print(f"    the wire layer adds {(elapsed - wall) * 1e3:+.3f} ms/query wall, "
                  f"{(used - cpu) * 1e3:+.3f} ms/query CPU")  # fmt: skip
            if paced:
                print(f"      against paced: {(elapsed - paced_wall) * 1e3:+.3f} ms/query wall, "
                      f"{(used - paced_cpu) * 1e3:+.3f} ms/query CPU")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=300, help="queries per client")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the fastest is shown")
    parser.add_argument(
        "--kinds",
        nargs="+",
        default=list(KINDS),
        choices=KINDS,
        help="which queries to time",
    )
    parser.add_argument("--baseline", type=Path, metavar="FOLDER",
                        help="also time a server of another version: FOLDER holds its dpsql "
                        "package (e.g. git archive HEAD~1 dpsql | tar -x -C FOLDER)")  # fmt: skip
    parser.add_argument("--processes", type=int, default=1,
                        help="server processes (dpsql serve --processes; default: 1)")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dpsql-bench-wire-") as name:
        folder = Path(name)
        database, policy = _policy(folder)
        sources = {"this tree": None, "baseline": args.baseline} if args.baseline else {"": None}
        servers = {}
        for i, (label, source) in enumerate(sources.items()):
            ledger = folder / f"served{i}.sqlite"
            server = _serve(str(database), policy, ledger, max(CLIENTS), source, args.processes)
            # releases first-seen queries on the server's ledger, as its first client
            released = dpsql.connect(
                str(database), policy=str(policy), analyst=ANALYSTS[0], ledger=str(ledger)
            )
            servers[label] = *server, released
        ledger = folder / "local.sqlite"
        local = dpsql.connect(
            str(database), policy=str(policy), analyst=ANALYSTS[0], ledger=str(ledger)
        )
        print(f"{args.queries} queries per client, fastest of {args.rounds} rounds; demo census "
              f"(50,000 rows); {args.processes} server process(es)\n{describe()}")  # fmt: skip
        try:
            for kind in args.kinds:
                _measure(local, servers, kind, args.queries, args.rounds)
        finally:
            local.close()
            for server, _, released in servers.values():
                released.close()
                server.terminate()
                server.wait(timeout=60)
        print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
