"""Proxy overhead per query: parse, check, rewrite, charge, release (database time excluded).

Runs ten PUMS-style queries through a Session on the demo census table and
prints, per query, the median time dpsql adds around the database call:

* cold: each run is a text dpsql has never seen (the table alias differs), so
  it is parsed, planned, charged (one durable ledger commit) and released
  afresh; this is the figure the target (median <= 1 ms) is judged on;
* the cold run's ledger charge alone, which is bounded below by one fsync of
  the ledger file (also measured bare, as the disk's floor), and the cold
  overhead without it (the CPU part dpsql controls);
* cached: a repeat of a text already answered, served from the release cache;
* planned: the cold text again, by another analyst (a release of its own, charged),
  its plan from the plan cache (docs/plan-cache.md), found by the text's tokens
  without a parse: the figure for a statement already planned;
* new constants: the cold text with its first constant changed (`age > 31` after
  `age > 30`: a dashboard's next value), by the same analyst: a shape planned
  before, planned afresh (constants are in the plan cache's key); queries
  without a constant show "-";
* each of those beside its target in probe units: each query's figure over the
  machine's Python probe measured beside that query's runs (the probe drifts by
  2x within a run on a shared machine), so figures from different days compare:
  cold <= 10 probes, planned and new constants <= 2.5 probes;
* the cold overhead in CPU time of this thread (the proxy's own work, which
  neither the disk's wait nor other processes' load inflate much);
* parse and plan alone for new texts, back to back and with a trivial
  database call (`SELECT 1`) between them: the proxy's code runs slower on the
  CPU caches a database call (or any idle wait) leaves behind, which is part
  of every cold figure above;
* the floor of a charged release, its parts measured alone in probe units: the
  ledger's charge (one commit; its fsync, as in a release, runs while it goes on),
  one discrete Laplace draw from the secure sampler, and building the Release;
  and beside them a DuckDB `SELECT 1` round trip, what the database call alone
  costs (excluded from the figures above): printed beside the planned-before
  figure and its target, so the target reads against what no release avoids;
* the floor of a cold query: that floor plus what no plan of a new text avoids, each
  measured alone the same way: sqlglot's parse of the query, its generation of the
  bounded SQL the query is rewritten to (EXPLAIN's), and storing the release in the
  release cache: printed beside the cold figure and its target;
* the same floor's parts timed where they run, inside the cold queries (the charge,
  dpsql's parse of the statement, sqlglot's generation of its bounded SQL, storing the
  release): on the CPU caches a query leaves them, each costs several times what it
  does alone, and what the cold figure holds beyond them is dpsql's own planning.

Usage: python benchmarks/bench_overhead.py [--repeat 50]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import sqlglot
from machine import describe, python_probe_us

import dpsql.session as session_module
from dpsql import demo
from dpsql.accounting import Cost
from dpsql.adapters.duckdb import DuckDBAdapter
from dpsql.ledger import Ledger
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.mechanisms.samplers import secure_generator
from dpsql.policy import load_policy
from dpsql.results import Accuracy, Release
from dpsql.session import Session
from dpsql.session import _encode as session_encode
from dpsql.sql.parse import parse_statement, sqlglot_dialect

QUERIES = [
    "SELECT COUNT(*) FROM census",
    "SELECT COUNT(*) FROM census WHERE age > 30 AND sex = 1",
    "SELECT SUM(income) FROM census",
    "SELECT AVG(income) FROM census WHERE income < 100000",
    "SELECT sex, COUNT(*) FROM census GROUP BY sex",
    "SELECT educ, AVG(income) FROM census GROUP BY educ",
    "SELECT race, married, COUNT(*) FROM census GROUP BY race, married",
    "SELECT state, COUNT(*) FROM census GROUP BY state",
    "SELECT sex, COUNT(*) AS n FROM census GROUP BY sex ORDER BY n DESC LIMIT 1",
    "SELECT COUNT(DISTINCT pid), SUM(income / 1000) FROM census WHERE age BETWEEN 20 AND 60",
]


class _TimedCursor:
    """A DuckDB cursor that adds the time spent in its calls to a counter."""

    def __init__(self, cursor: Any, owner: TimedAdapter):
        self._cursor, self._owner = cursor, owner

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._cursor, name)
        if name not in ("execute", "fetchall", "fetchmany", "fetchone"):
            return attribute

        def timed(*args: Any, **kwargs: Any) -> Any:
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return attribute(*args, **kwargs)
            finally:
                self._owner.database_seconds += time.perf_counter() - start
                self._owner.database_cpu += time.thread_time() - cpu

        return timed


class TimedAdapter(DuckDBAdapter):
    """The DuckDB adapter, adding up the time spent inside the database (whether the
    session fetches the result at once or in batches)."""

    database_seconds = 0.0
    database_cpu = 0.0  # CPU time of the calling thread inside the database

    def _cursor(self) -> Any:
        return _TimedCursor(super()._cursor(), self)


class Stopwatch:
    """Seconds spent in each named part of a query, added up until `reset`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.seconds, 0.0)

    def timed(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """`function`, its time added to part `name`."""
        self.seconds.setdefault(name, 0.0)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start

        return timed


STOPWATCH = Stopwatch()


class TimedLedger(Ledger):
    """The SQLite ledger, timing its charges and its stores of releases (STOPWATCH)."""

    def charge(self, *args: Any, **kwargs: Any) -> Cost:
        return STOPWATCH.timed("charge", super().charge)(*args, **kwargs)

    def store_release(self, *args: Any, **kwargs: Any) -> str:
        return STOPWATCH.timed("store", super().store_release)(*args, **kwargs)


def time_parse_and_generation() -> None:
    """Time, within each query, the parse of its statement (dpsql's, around sqlglot's)
    and sqlglot's generation of its bounded SQL (STOPWATCH): the parts of a cold query no
    plan of a new text avoids, measured where they run rather than alone."""
    session_module.parse_statement = STOPWATCH.timed("parse", session_module.parse_statement)
    duckdb = sqlglot_dialect("duckdb")  # the one instance every generation of the session uses
    duckdb.generate = STOPWATCH.timed("generate", duckdb.generate)


def fresh_text(sql: str, run: int) -> str:
    """The same query under a table alias never used before: planned and charged afresh."""
    return sql.replace(" FROM census", f" FROM census AS run{run}", 1)


def fsync_floor(folder: str, repeat: int) -> float:
    """Median seconds of one fsync after a 4 KiB append, in the ledger's folder."""
    samples = []
    descriptor = os.open(Path(folder) / "fsync.probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for _ in range(repeat):
            os.write(descriptor, b"x" * 4096)
            start = time.perf_counter()
            os.fsync(descriptor)
            samples.append(time.perf_counter() - start)
    finally:
        os.close(descriptor)
    return statistics.median(samples)


def parse_and_plan(session: Session, repeat: int, between: Any) -> float:
    """Median seconds to parse and plan a new text of each query, calling `between()` after each."""
    samples = []
    for run in range(repeat):
        for sql in QUERIES:
            text = fresh_text(sql, run)
            start = time.perf_counter()
            session.plan(parse_statement(text, session.adapter.dialect).tree)
            samples.append(time.perf_counter() - start)
            between()
    return statistics.median(samples)


def floor_parts(folder: str, repeat: int, bounded: dict[str, str]) -> dict[str, float]:
    """Each part a charged release pays, measured alone: its median over `repeat` runs in
    probe units (a probe measured beside each part). `bounded` is each query's bounded SQL
    (EXPLAIN's): sqlglot's parse of the query and its generation of that SQL, the parts
    of a cold query that no plan of it avoids, are each the median over the queries."""
    ledger = Ledger(Path(folder) / "floor.sqlite")
    cost, budget = Cost.of(1.0), Cost.of(1e9, 0.5)
    charges, stores = iter(range(10**9)), iter(range(10**9))

    def charge() -> None:  # the commit a release waits for; its fsync overlaps the query
        ledger.charge("floor", cost, budget, f"floor-{next(charges)}", sync=False)

    noise, rng, zero = DiscreteLaplace(1, 1.0), secure_generator(), np.zeros(1, dtype=np.int64)
    noise.prepare()
    accuracy = {"n": Accuracy(noise.name, noise.scale, noise.interval95(), 1.0)}
    release = Release(["n"], [(1,)], dict(accuracy), [])
    database = demo.demo_connection()
    trees = [sqlglot.parse_one(sql, read="duckdb") for sql in bounded.values()]
    parts: dict[str, list[Any]] = {
        "charge": [charge],
        "Laplace draw": [lambda: noise.sample(zero, rng)],
        "Release": [lambda: Release(["n"], [(1,)], dict(accuracy), [])],
        "store": [  # the release cache's write of a one-value release, encoded
            lambda: ledger.store_release(
                "floor", f"release-{next(stores)}", session_encode(release), durable=False
            )
        ],
        "parse": [lambda q=q: sqlglot.parse_one(q, read="duckdb") for q in bounded],
        "generate": [lambda t=t: t.sql(dialect="duckdb") for t in trees],
        "SELECT 1": [lambda: database.execute("SELECT 1").fetchall()],
    }
    units = {}
    try:
        for name, runs in parts.items():
            per_run = []
            for run in runs:
                run()  # the first call builds what later ones reuse
                probe = python_probe_us() / 1e6
                samples = []
                for _ in range(repeat):
                    start = time.perf_counter()
                    run()
                    samples.append(time.perf_counter() - start)
                    ledger.durable()  # untimed: each charge starts with no fsync pending
                per_run.append(statistics.median(samples) / probe)
            units[name] = statistics.median(per_run)
    finally:
        ledger.close()
        database.close()
    return units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    budget = {"epsilon": 1e6, "delta": 0.5}
    policy = load_policy(demo.DEMO_POLICY | {"analysts": {"default": budget, "other": budget}})
    adapter = TimedAdapter(demo.demo_connection())
    time_parse_and_generation()
    print(describe())
    with tempfile.TemporaryDirectory() as folder:
        ledger = TimedLedger(Path(folder) / "ledger.sqlite")
        session = Session(adapter, policy, ledger)
        other = session.for_analyst("other")  # shares the session's plan cache
        rows, probes, run, in_query = [], [], 0, []
        print(f"{'query':<58} {'cold ms':>8} {'charge':>7} {'cold-charge':>11} {'cached':>7} "
              f"{'cold cpu':>8} {'planned':>8} {'pl. cpu':>8} {'new con.':>8}")  # fmt: skip
        for sql in QUERIES:
            samples: dict[str, list[float]] = {name: [] for name in COLUMNS}
            parts_of_cold: dict[str, list[float]] = {name: [] for name in IN_QUERY}
            session.execute(sql)  # the first run builds the sampler's tables
            probes.append(python_probe_us() / 1e3)  # ms, beside this query's runs
            for _ in range(args.repeat):
                run += 1
                text = fresh_text(sql, run)
                runs = [("cold", session, text), ("cached", session, sql), ("planned", other, text)]
                if new_constant(text, run) != text:  # the shape `text` planned just now
                    runs.append(("new constants", session, new_constant(text, run)))
                for name, who, query in runs:
                    adapter.database_seconds = adapter.database_cpu = 0.0
                    STOPWATCH.reset()
                    start, thread = time.perf_counter(), time.thread_time()
                    who.execute(query)
                    samples[name].append(time.perf_counter() - start - adapter.database_seconds)
                    used = time.thread_time() - thread - adapter.database_cpu
                    if name == "cold":
                        samples["charge"].append(STOPWATCH.seconds["charge"])
                        samples["cold cpu"].append(used)
                        for part, values in parts_of_cold.items():
                            values.append(STOPWATCH.seconds[part])
                    elif name == "planned":
                        samples["planned cpu"].append(used)
            pairs = zip(samples["cold"], samples["charge"], strict=True)
            samples["cold-charge"] = [c - g for c, g in pairs]
            row = [statistics.median(v) * 1e3 if v else math.nan for v in samples.values()]
            rows.append(row)
            # in probe units: seconds to ms, over this query's probe (ms)
            in_query.append(
                {k: statistics.median(v) * 1e3 / probes[-1] for k, v in parts_of_cold.items()}
            )
            cells = zip(row, WIDTHS, strict=True)
            text = " ".join("-".rjust(w) if math.isnan(v) else f"{v:>{w}.3f}" for v, w in cells)
            print(f"{sql[:56]:<58} {text}")
        floor = fsync_floor(folder, args.repeat) * 1e3
        warm = parse_and_plan(session, args.repeat, lambda: None) * 1e3
        database = demo.demo_connection()
        after_call = parse_and_plan(
            session, args.repeat, lambda: database.execute("SELECT 1").fetchall()
        )
        bounded = {sql: dict(session.execute(f"EXPLAIN {sql}").rows)["sql"] for sql in QUERIES}
        parts = floor_parts(folder, max(args.repeat, 200), bounded)
    figure = dict(
        zip(COLUMNS, (_median(column) for column in zip(*rows, strict=True)), strict=True)
    )
    # each query's figure over the probe measured beside it (the machine's speed drifts)
    units = {
        name: _median([row[i] / probe for row, probe in zip(rows, probes, strict=True)])
        for i, name in enumerate(COLUMNS)
    }
    print(
        f"\nmedian over {len(QUERIES)} queries (load average {os.getloadavg()[0]:.2f}):\n"
        f"  cold overhead     {figure['cold']:.3f} ms (target <= 1 ms; SmartNoise SQL 1.0.10 "
        "adds 23-95 ms)\n"
        f"  of which charge   {figure['charge']:.3f} ms (one durable commit; a bare fsync here: "
        f"{floor:.3f} ms)\n"
        f"  cold minus charge {figure['cold-charge']:.3f} ms\n"
        f"  cold, CPU time    {figure['cold cpu']:.3f} ms (this thread, outside the database)\n"
        f"  cached repeat     {figure['cached']:.3f} ms\n"
        f"  planned before    {figure['planned']:.3f} ms (another analyst, the plan from the plan "
        f"cache, no parse), CPU time {figure['planned cpu']:.3f} ms\n"
        f"  new constants     {figure['new constants']:.3f} ms (a shape planned before, a constant "
        "changed: planned afresh, constants are in the plan cache's key)\n"
        f"  parse and plan    {warm:.3f} ms back to back, {after_call * 1e3:.3f} ms after a "
        "database call (SELECT 1): the CPU caches it leaves cold\n"
        f"in probe units (each query's figure over the probe measured beside it; probes "
        f"{min(probes) * 1e3:.0f}-{max(probes) * 1e3:.0f} us):\n"
        f"  cold              {units['cold']:5.1f} probes (target <= 10), CPU time "
        f"{units['cold cpu']:.1f}\n"
        f"  planned before    {units['planned']:5.1f} probes (target <= 2.5), CPU time "
        f"{units['planned cpu']:.1f}\n"
        f"  new constants     {units['new constants']:5.1f} probes (target <= 2.5)"
    )
    least = parts["charge"] + parts["Laplace draw"] + parts["Release"]
    print(
        f"the floor of a charged release, each part alone (load average "
        f"{os.getloadavg()[0]:.2f}):\n"
        f"  charge {parts['charge']:.2f} + Laplace draw {parts['Laplace draw']:.2f} + Release "
        f"{parts['Release']:.2f} = {least:.2f} probes, without the database\n"
        f"  a DuckDB SELECT 1 round trip alone: {parts['SELECT 1']:.2f} probes (excluded from "
        "the figures above)\n"
        f"  planned before {units['planned']:.1f} probes = floor + "
        f"{units['planned'] - least:.1f}; target 2.5 = floor + {2.5 - least:.1f}"
    )
    cold = least + parts["parse"] + parts["generate"] + parts["store"]
    where_run = {name: _median([q[name] for q in in_query]) for name in IN_QUERY}
    floor_in_query = sum(where_run.values()) + parts["Laplace draw"] + parts["Release"]
    print(
        f"the floor of a cold query, each part alone (warm CPU caches; medians over the "
        f"queries):\n"
        f"  the floor above {least:.2f} + sqlglot's parse of the query {parts['parse']:.2f} + "
        f"its generation of the bounded SQL {parts['generate']:.2f} + storing the release "
        f"{parts['store']:.2f} = {cold:.2f} probes\n"
        f"  cold {units['cold']:.1f} probes = floor + {units['cold'] - cold:.1f} (the check, "
        f"the analysis, the rewrite's tree, the release's work, cold caches); target 10 = "
        f"floor + {10 - cold:.1f}\n"
        f"the same floor's parts where they run, inside the cold queries (medians):\n"
        f"  charge {where_run['charge']:.2f} + Laplace draw and Release (alone) "
        f"{parts['Laplace draw'] + parts['Release']:.2f} + parsing the statement "
        f"{where_run['parse']:.2f} + generating its bounded SQL {where_run['generate']:.2f} + "
        f"storing the release {where_run['store']:.2f} = {floor_in_query:.2f} probes\n"
        f"  cold {units['cold']:.1f} probes = that floor + {units['cold'] - floor_in_query:.1f} "
        f"(dpsql's check, analysis, rewrite and release); target 10 = that floor + "
        f"{10 - floor_in_query:.1f}"
    )


# The parts of a cold query timed where they run (STOPWATCH), beside the columns.
IN_QUERY = ("charge", "parse", "generate", "store")


# Each query's columns, in the order printed, and their widths.
COLUMNS = ("cold", "charge", "cold-charge", "cached", "cold cpu", "planned", "planned cpu",
           "new constants")  # fmt: skip
WIDTHS = (8, 7, 11, 7, 8, 8, 8, 8)
_NUMBER = re.compile(r"\b\d+\b")


def new_constant(text: str, run: int) -> str:
    """`text` with its first constant after FROM changed (a dashboard's next value); the
    text itself if it has none."""
    head, found, tail = text.partition(" FROM ")
    changed = _NUMBER.sub(lambda match: str(int(match.group()) + 1 + run % 5), tail, count=1)
    return head + found + changed


def _median(values: Any) -> float:
    """The median of the values that were measured (a query without constants has none)."""
    measured = [v for v in values if not math.isnan(v)]
    return statistics.median(measured) if measured else math.nan


if __name__ == "__main__":
    main()
