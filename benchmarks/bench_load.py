"""Load: 32 concurrent wire clients against `dpsql serve` for a bounded time.

The server runs as its own process (`dpsql serve --trust` on loopback) over the
demo census table, in DuckDB and in PostgreSQL. Each client (8 analysts, 4
connections each) runs distinct private COUNTs and SUMs back to back, so every
query is planned, charged (an fsync'ed ledger write), run and noised. Reported
per backend: throughput, p50/p99/p99.9 latency and the slowest query, the
server's resident memory over time (a leak shows as growth after warm-up),
errors, and the ledger check: the ledger's total must equal the sum of the
answered queries' costs exactly. With `--clients 1` nothing queues, and p99.9
and the slowest query show the server's full garbage collections.
The same figures per tenth of the run show whether anything drifts, and
`--plot` draws throughput, latency and memory over time into a PNG.

    python benchmarks/bench_load.py [--seconds 600] [--clients 32] [--backend duckdb]
        [--plot docs/img/load-{backend}.png] [--processes 1]

`--processes N` runs `dpsql serve --processes N`; memory is then the sum over
its server processes.

PostgreSQL uses DPSQL_TEST_POSTGRES_URL (a scratch schema, dropped afterwards).
Not a timed test: it prints figures, and exits non-zero only if a check fails.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path
from urllib.parse import quote

import psycopg
import yaml
from bench_postgres import load as load_postgres  # the sibling benchmark, shared

from dpsql import demo
from dpsql.ledger import Ledger

ANALYSTS = [f"load{i}" for i in range(8)]


def _policy(folder: Path) -> tuple[Path, Path]:
    database, _ = demo.write_demo(folder)
    policy = dict(demo.DEMO_POLICY)
    policy["analysts"] = {name: {"epsilon": 1e9, "delta": 1e-3} for name in ANALYSTS}
    path = folder / "load-policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return database, path


def _serve(
    database: str,
    policy: Path,
    ledger: Path,
    clients: int,
    source: Path | None = None,
    processes: int = 1,
) -> tuple[subprocess.Popen, int]:
    """`dpsql serve` in a process of its own (with `processes` > 1, a parent and that many
    server processes), and its port; `source` is a folder holding another version's dpsql
    package to serve with instead of this one."""
    # run from `source` too: `python -m` puts the working directory first on the path
    env = dict(os.environ, PYTHONPATH=str(source)) if source else None
    # the option only when asked for: a baseline from before it existed still starts
    several = ["--processes", str(processes)] if processes > 1 else []
    server = subprocess.Popen(
        [sys.executable, "-m", "dpsql.cli", "serve", "--database", database, "--policy",
         str(policy), "--ledger", str(ledger), "--trust", "--port", "0",
         "--max-connections-per-analyst", str(clients), *several],
        stdout=subprocess.PIPE, text=True, env=env, cwd=source,
    )  # fmt: skip
    line = server.stdout.readline()
    if "listening on" not in line:
        server.kill()
        raise SystemExit(f"dpsql serve did not start: {line}")
    return server, int(line.rsplit(":", 1)[1])


def server_processes(pid: int) -> list[int]:
    """The processes that serve: `pid` itself, or its children under --processes."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in children] or [pid]


def _rss_mb(pid: int) -> float:
    """Resident memory of the server, summed over its server processes."""
    total = 0.0
    for served in server_processes(pid):
        for line in Path(f"/proc/{served}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024
    return total


class Load:
    """The clients' shared record: (end time, latency) of answered queries, and errors."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answers: list[tuple[float, float]] = []
        self.errors: list[str] = []


def _client(port: int, number: int, until: float, load: Load) -> None:
    analyst = ANALYSTS[number % len(ANALYSTS)]
    latencies = []
    try:
        with psycopg.connect(f"host=127.0.0.1 port={port} user={analyst}", autocommit=True) as conn:
            i = 0
            while time.monotonic() < until:
                aggregate = "COUNT(*)" if i % 2 else "SUM(age)"
                sql = f"SELECT {aggregate} FROM census WHERE income > {number * 10**7 + i}"
                start = time.monotonic()
                conn.execute(sql).fetchall()
                end = time.monotonic()
                latencies.append((end, end - start))
                i += 1
    except psycopg.Error as error:
        with load.lock:
            load.errors.append(str(error))
    with load.lock:
        load.answers.extend(latencies)


def _percentiles(latencies: list[float], *tails: float) -> tuple[float, ...]:
    """p50 and p99 in ms, then each of `tails` (0.999: p99.9) and the slowest."""
    ms = sorted(1000 * t for t in latencies)
    quantiles = [ms[min(len(ms) - 1, int(q * len(ms)))] for q in (0.99, *tails)]
    return (statistics.median(ms), *quantiles, *([ms[-1]] if tails else []))


def _over_time(answers: list[tuple[float, float]], start: float, seconds: float, parts: int):
    """(start s, queries/s, p50 ms, p99 ms) of each of `parts` equal slices of the run."""
    width = seconds / parts
    slices: list[list[float]] = [[] for _ in range(parts)]
    for end, latency in answers:
        slices[min(parts - 1, int((end - start) / width))].append(latency)
    return [
        (i * width, len(part) / width, *(_percentiles(part) if part else (0.0, 0.0)))
        for i, part in enumerate(slices)
    ]


def _plot(path: str, name: str, clients: int, rows: list[tuple], memory: list[tuple]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (top, middle, bottom) = pyplot.subplots(3, 1, figsize=(8, 8), sharex=True)
    times = [row[0] for row in rows]
    top.plot(times, [row[1] for row in rows], marker="o")
    top.set_ylabel("queries/s")
    middle.plot(times, [row[2] for row in rows], marker="o", label="p50")
    middle.plot(times, [row[3] for row in rows], marker="o", label="p99")
    middle.set_ylabel("latency (ms)")
    middle.legend()
    bottom.plot([t for t, _ in memory], [m for _, m in memory])
    bottom.set_ylabel("server RSS (MB)")
    bottom.set_xlabel("seconds into the run")
    top.set_title(f"dpsql serve under {clients} wire clients: {name}")
    for axes in (top, middle, bottom):
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    print(f"  plot: {path}")


def run(
    name: str,
    database: str,
    policy: Path,
    folder: Path,
    seconds: float,
    clients: int,
    plot: str | None = None,
    processes: int = 1,
) -> bool:
    ledger = folder / f"{name}-ledger.sqlite"
    server, port = _serve(database, policy, ledger, clients, processes=processes)
    load, memory = Load(), []
    start = time.monotonic()
    until = start + seconds
    threads = [
        threading.Thread(target=_client, args=(port, n, until, load)) for n in range(clients)
    ]
    try:
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            memory.append((time.monotonic() - start, _rss_mb(server.pid)))
            time.sleep(min(1.0, seconds / 20))
        for thread in threads:
            thread.join()
    finally:
        server.terminate()
        server.wait(timeout=60)
    elapsed = time.monotonic() - start
    answered = len(load.answers)
    cost = Fraction(str(demo.DEMO_POLICY["defaults"]["epsilon_per_query"]))
    with Ledger(ledger) as book:
        total = sum((book.spent(a).epsilon for a in ANALYSTS), Fraction(0))
    exact = total == cost * answered
    several = f", {processes} server processes" if processes > 1 else ""
    print(f"\n{name}: {clients} clients for {elapsed:.0f} s{several}")
    print(f"  answered {answered} queries: {answered / elapsed:.1f} queries/s")
    if answered:
        # p99.9 and the slowest show the server's full garbage collections
        p50, p99, tail, slowest = _percentiles([t for _, t in load.answers], 0.999)
        print(f"  latency p50 {p50:.1f} ms, p99 {p99:.1f} ms, p99.9 {tail:.1f}, max {slowest:.1f}")
        rows = _over_time(load.answers, start, seconds, 10)
        print("  per tenth of the run (start s: queries/s, p50 ms, p99 ms):")
        for at, rate, p50, p99 in rows:
            print(f"    {at:5.0f}: {rate:7.1f} q/s, p50 {p50:6.1f}, p99 {p99:7.1f}")
        if plot:
            _plot(plot.format(backend=name), name, clients, rows, memory)
    print(f"  errors: {len(load.errors)}" + (f" (first: {load.errors[0]})" if load.errors else ""))
    print(f"  ledger total epsilon {float(total):g} = answered x {float(cost):g}: {exact}")
    step = max(1, len(memory) // 10)
    print("  server memory (s: MB): " + ", ".join(f"{t:.0f}: {m:.0f}" for t, m in memory[::step]))
    if memory:
        warm = memory[len(memory) // 5][1]
        print(f"  after warm-up {warm:.0f} MB, at the end {memory[-1][1]:.0f} MB")
    return exact and not load.errors


def _postgres_database(folder: Path, census: Path) -> tuple[str, str] | None:
    url = os.environ.get("DPSQL_TEST_POSTGRES_URL")
    if not url:
        print("\npostgres: skipped (set DPSQL_TEST_POSTGRES_URL)")
        return None
    schema = f"h11_load_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        load_postgres(admin, schema, census, keyed=True)
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options={quote(f'-c search_path={schema}')}", schema


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--backend", choices=["duckdb", "postgres", "both"], default="both")
    parser.add_argument("--plot", help="PNG path; {backend} is replaced, e.g. load-{backend}.png")
    parser.add_argument("--processes", type=int, default=1, help="dpsql serve --processes")
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        census, policy = _policy(folder)
        if args.backend in ("duckdb", "both"):
            ok &= run(
                "duckdb",
                str(census),
                policy,
                folder,
                args.seconds,
                args.clients,
                args.plot,
                args.processes,
            )
        if args.backend in ("postgres", "both") and (pg := _postgres_database(folder, census)):
            url, schema = pg
            try:
                ok &= run(
                    "postgres",
                    url,
                    policy,
                    folder,
                    args.seconds,
                    args.clients,
                    args.plot,
                    args.processes,
                )
            finally:
                admin_url = os.environ["DPSQL_TEST_POSTGRES_URL"]
                with psycopg.connect(admin_url, autocommit=True) as admin:
                    admin.execute(f"DROP SCHEMA {schema} CASCADE")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
