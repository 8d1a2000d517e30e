"""Auditing whole queries end to end: one Session plan released on neighbouring databases.

The neighbouring databases are two in-memory DuckDB databases that differ by
all rows of one privacy unit in both private tables (pid 0: five people rows at
the income bound, in a big group and alone in a group of its own, and six
orders at the amount bound; the join query repeats them 30 times). The query
is planned once through a Session; its bounded SQL runs once on each database,
since it is deterministic given the plan's secret (the key of the contribution
bounding); and the plan's own `release` turns the exact rows into noisy answers many
times with fresh randomness, since all the randomness of an answer is there.
So the audit covers the real release path without paying a query per sample.

By default one `release` call serves all runs: the exact rows are repeated
once per run, each group key replaced by a tag that says (run, group), and
the tags are read back from the released rows. DirectPlan draws noise and
selects keys group by group, so the copies are independent runs of the
query. `per_release=True` calls `release` once per run instead: slower, and
the path to use for a plan that treats its groups jointly; a plan without
`release_batches` (a quantile's: it releases the policy's keys only, so tagged
copies would not come back) is always released once per run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import numpy as np

import dpsql
from dpsql.audit.events import Finding, audit_outputs, with_low_bits
from dpsql.mechanisms.samplers import secure_generator
from dpsql.sql import StagedPlan
from dpsql.sql.analysis import KEY_PREFIX
from dpsql.sql.parse import parse_statement

TABLE = "audit_people"
ORDERS = "audit_orders"  # a second private table of the same unit, for the join
QUERIES = {
    "count": f"SELECT COUNT(*) AS n FROM {TABLE}",
    "sum": f"SELECT SUM(income) AS total FROM {TABLE}",
    "avg": f"SELECT AVG(income) AS mean FROM {TABLE}",
    "stddev": f"SELECT STDDEV(income) AS sd FROM {TABLE}",  # three measurements
    "group_by": f"SELECT grp, COUNT(*) AS n FROM {TABLE} GROUP BY grp",
    # a join on the unit repeats each person's rows: bounding on the joined relation
    "join": f"SELECT COUNT(*) AS n, SUM(o.amount) AS total FROM {ORDERS} o "
    f"JOIN {TABLE} p ON o.pid = p.pid WHERE p.grp <> 'z'",
    # the exponential mechanism over a bounded histogram, one release per run: slow at
    # large epsilons (about 4096 buckets per unit of epsilon)
    "median": f"SELECT MEDIAN(income) AS m FROM {TABLE}",
}
UPPER = 100.0
POLICY = {
    "version": 1,
    "defaults": {"epsilon_per_query": 1.0, "delta": 1e-6},
    "analysts": {"default": {"epsilon": 1e9, "delta": 0.5}},
    "tables": {
        TABLE: {
            "privacy_unit": "pid",
            "max_groups_per_unit": 2,
            "max_rows_per_unit": 2,
            "columns": {
                "pid": {"type": "int", "private": True},
                "grp": {"type": "string"},
                "income": {"type": "float", "lower": 0.0, "upper": UPPER},
            },
        },
        ORDERS: {
            "privacy_unit": "pid",
            "max_groups_per_unit": 2,
            "max_rows_per_unit": 2,
            "columns": {
                "pid": {"type": "int", "private": True},
                "amount": {"type": "float", "lower": 0.0, "upper": UPPER},
            },
        },
    },
}


def table_rows(with_unit: bool) -> list[tuple[int, str, float]]:
    """300 background units of 1-3 rows in groups a and b; unit 0 is the one that differs.

    Unit 0 has more rows than the bounds keep, all at the income bound, and is
    alone in group s: its removal moves COUNT and SUM by their full
    sensitivity and takes group s out of the data.
    """
    rows = [
        (pid, "a" if pid % 2 else "b", (pid * 37 + r * 11) % 100 + 0.25)
        for pid in range(1, 301)
        for r in range(pid % 3 + 1)
    ]
    if with_unit:
        rows += [(0, "a", UPPER)] * 3 + [(0, "s", UPPER)] * 2
    return rows


def order_rows(with_unit: bool) -> list[tuple[int, float]]:
    """0-3 orders of each background unit; unit 0 has six, all at the amount bound."""
    rows = [(pid, (pid * 13 + k * 7) % 50 + 0.5) for pid in range(1, 301) for k in range(pid % 4)]
    return rows + ([(0, UPPER)] * 6 if with_unit else [])


def _database(with_unit: bool) -> duckdb.DuckDBPyConnection:
    connection = duckdb.connect()
    connection.execute(f"CREATE TABLE {TABLE} (pid INTEGER, grp VARCHAR, income DOUBLE)")
    connection.executemany(f"INSERT INTO {TABLE} VALUES (?, ?, ?)", table_rows(with_unit))
    connection.execute(f"CREATE TABLE {ORDERS} (pid INTEGER, amount DOUBLE)")
    connection.executemany(f"INSERT INTO {ORDERS} VALUES (?, ?)", order_rows(with_unit))
    return connection


def audit_query(
    sql: str,
    runs: int,
    *,
    epsilon: float = 1.0,
    confidence: float = 0.999,
    seed: int | None = None,
    per_release: bool = False,
) -> tuple[float, float, Finding]:
    """(claimed epsilon, claimed delta, finding) for `sql` on the neighbouring audit tables.

    `seed` fixes the plan's secret and the noise (tests); None draws both from the OS.
    """
    first = dpsql.connect(_database(True), policy=POLICY, epsilon=epsilon, seed=seed)
    second = dpsql.connect(_database(False), policy=POLICY, epsilon=epsilon)
    try:
        session = first.session
        plan = session.plan(parse_statement(sql, session.adapter.dialect).tree)
        per_release = per_release or not hasattr(plan, "release_batches")
        rng = secure_generator(None if seed is None else seed + 1)
        outputs = []
        for connection in (first, second):
            adapter = connection.session.adapter
            if isinstance(plan, StagedPlan):  # each stage's SQL follows the stage before
                ran: dict[str, Any] = {}
                releases = (_staged(plan, adapter, rng, ran) for _ in range(runs))
                outputs.append(_collect(_per_run(releases, len(plan.analysis.keys)), runs))
                continue
            columns, rows = adapter.execute(plan.sql)
            outputs.append(_features(plan, columns, rows, runs, rng, per_release))
        names = set(outputs[0]) | set(outputs[1])
        missing = np.full(runs, -np.inf)  # a key that one database never releases
        features = [with_low_bits({n: out.get(n, missing) for n in names}) for out in outputs]
        delta = float(plan.cost.delta)
        finding = audit_outputs(features[0], features[1], delta, confidence)
        return float(plan.cost.epsilon), delta, finding
    finally:
        first.close()
        second.close()


def _features(
    plan: Any, columns: list[str], rows: list[tuple], runs: int, rng: np.random.Generator,
    per_release: bool,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Each released value per run: "column [key]" -> array over runs, -inf where not released."""
    width = sum(1 for name in columns if name.startswith(KEY_PREFIX))
    if width > 1:
        raise ValueError("the auditor follows queries that group by one column")
    return _collect(_released(plan, columns, rows, runs, rng, width, per_release), runs)


def _collect(
    released: Iterator[tuple[int, Any, list[str], tuple]], runs: int
) -> dict[str, np.ndarray]:
    """The released values by label, over runs (see _features)."""
    seen: dict[str, tuple[list[int], list[Any]]] = {}
    for run, key, names, values in released:
        for name, value in zip(names, values, strict=True):
            label = name if key is None else f"{name} [{key}]"
            found = seen.get(label)
            if found is None:
                found = seen[label] = ([], [])
            found[0].append(run)
            found[1].append(value)
    features = {}
    for label, (released_runs, values) in seen.items():
        features[label] = np.full(runs, -np.inf)
        features[label][released_runs] = values
    return features


def _released(
    plan: Any, columns: list[str], rows: list[tuple], runs: int, rng: np.random.Generator,
    width: int, per_release: bool,
) -> Iterator[tuple[int, Any, list[str], tuple]]:  # fmt: skip
    """(run, group key or None, value column names, values) for each released row."""
    if per_release:
        yield from _per_run((plan.release(columns, rows, rng) for _ in range(runs)), width)
        return
    groups = len(rows)
    copies = [
        ((run * groups + g,) if width else ()) + row[width:]
        for run in range(runs)
        for g, row in enumerate(rows)
    ]
    release = plan.release(columns, copies, rng)
    names = release.columns[width:]
    if not width and len(release.rows) != runs:
        raise RuntimeError("the plan did not release one row per run; use per_release=True")
    for index, row in enumerate(release.rows):
        if width:
            run, g = divmod(row[0], groups)
            yield run, rows[g][0], names, row[1:]
        else:
            yield index, None, names, row


def _per_run(releases: Iterator[Any], width: int) -> Iterator[tuple[int, Any, list[str], tuple]]:
    """(run, group key or None, value column names, values) of one release per run."""
    for run, release in enumerate(releases):
        names = release.columns[width:]
        for row in release.rows:
            yield run, (row[0] if width else None), names, row[width:]


def _staged(plan: Any, adapter: Any, rng: np.random.Generator, ran: dict[str, Any]) -> Any:
    """One release of a plan as the Session makes it (a staged plan: each stage, then
    the next planned over it), each distinct SQL run once on `adapter` (`ran`)."""
    if isinstance(plan, StagedPlan):
        # the audit's tables do not change: its stages share one snapshot
        return plan.release_with(lambda stage: _staged(stage, adapter, rng, ran), shared=True)
    if plan.sql not in ran:
        ran[plan.sql] = adapter.execute(plan.sql)
    columns, rows = ran[plan.sql]
    return plan.release(columns, rows, rng)
