"""Sensitivity on neighbouring databases.

For every accepted query shape, the rewritten (bounded, exact) SQL is run on
PUMS_dup and on PUMS_dup without one person (all rows of one pid). The L1
change of each measurement across groups must not exceed the sensitivity the
plan calibrates its noise to; the change of the distinct-unit counts used for
key selection must not exceed max_groups_per_unit.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import on_every_backend, pums_policy

from dpsql.policy import load_policy
from dpsql.sql import Options, PlanContext, plan_query
from dpsql.sql.parse import parse_statement

SHAPES = [
    "SELECT COUNT(*) FROM {t}",
    "SELECT COUNT(income) FROM {t}",
    "SELECT COUNT(DISTINCT pid) FROM {t}",
    "SELECT SUM(income) FROM {t}",
    "SELECT AVG(age) FROM {t}",
    "SELECT SUM(income) FROM {t} WHERE income < 100000",
    "SELECT SUM(income) FROM {t} WHERE income BETWEEN 20000 AND 30000",
    "SELECT SUM(income / 1000) FROM {t}",
    "SELECT SUM(100 - age) FROM {t}",
    "SELECT SUM(CASE WHEN sex = 1 THEN income ELSE 0 END) FROM {t}",
    "SELECT COUNT(*) FROM {t} WHERE age BETWEEN 20 AND 40 AND sex IN (0, 1)",
    "SELECT sex, COUNT(*), SUM(income) FROM {t} GROUP BY sex",
    "SELECT educ, AVG(income) FROM {t} GROUP BY educ",
    "SELECT race, married, COUNT(*), SUM(age) FROM {t} GROUP BY race, married",
    "SELECT FLOOR(age / 10) AS decade, COUNT(*) FROM {t} GROUP BY 1",
    "SELECT CASE WHEN age < 30 THEN 'young' ELSE 'old' END AS band, SUM(income) "
    "FROM {t} GROUP BY band",
    "SELECT age, COUNT(DISTINCT pid) FROM {t} GROUP BY age",
    "SELECT COUNT(*) FILTER (WHERE age > 30), SUM(income) FILTER (WHERE sex = 1) FROM {t}",
    "SELECT sex, married, AVG(income) FILTER (WHERE educ > 12) FROM {t} GROUP BY ALL",
    # sums of squares centred on the bounds' midpoint, and bounded distinct counts
    "SELECT STDDEV(income), VAR_POP(age) FROM {t}",
    "SELECT sex, VAR_SAMP(income) FROM {t} WHERE income < 50000 GROUP BY sex",
    "SELECT COUNT(DISTINCT income), COUNT(DISTINCT age) FROM {t}",
    "SELECT educ, COUNT(DISTINCT age) FROM {t} GROUP BY educ",
]


@pytest.fixture(scope="module")
def database(backend):
    """A writable copy of the PUMS tables on the backend, named base_*."""
    scratch = backend.scratch(
        {"base_dup": "pums_dup", "base_null": "pums_null", "base_pid": "pums_pid",
         "base_numbered": "pums"}
    )  # fmt: skip
    scratch.replace_table(
        "base_rows", "SELECT *, row_number() OVER () AS row_id FROM base_numbered"
    )
    scratch.dialect = backend.dialect
    yield scratch
    scratch.close()


def _by_key(rows, keys):
    return {tuple(row[:keys]): np.array([int(v or 0) for v in row[keys:]]) for row in rows}


def _l1_change(before, after, keys, columns):
    first, second = _by_key(before, keys), _by_key(after, keys)
    # the measurements' columns only: the bounding note's are checked as totals
    first = {k: v[:columns] for k, v in first.items()}
    second = {k: v[:columns] for k, v in second.items()}
    zero = np.zeros(columns, dtype=np.int64)
    return sum(
        np.abs(first.get(k, zero) - second.get(k, zero)) for k in first.keys() | second.keys()
    )


def _assert_sensitivities(database, plans, table, source, column, removed, max_groups):
    """Remove each of `removed` (values of `column`) from `source` in turn and check every plan."""
    database.replace_table(table, f"SELECT * FROM {source}")
    full = [database.rows(plan.sql) for plan in plans]
    reached = np.zeros(len(plans), dtype=bool)
    for value in removed:
        database.replace_table(table, f"SELECT * FROM {source} WHERE {column} <> {int(value)}")
        for index, plan in enumerate(plans):
            keys = len(plan.analysis.keys)
            width = keys + len(plan.measures) + (plan.selection is not None)
            after = database.rows(plan.sql)
            change = _l1_change(full[index], after, keys, width - keys)
            limits = [m.noise.sensitivity for m in plan.measures]
            if plan.selection is not None:  # distinct units per group, for key selection
                limits.append(max_groups)
            assert np.all(change <= np.array(limits)), (plan.sql, value, change, limits)
            reached[index] |= bool(change[0] == limits[0])
            if plan.bounding is not None:
                moved = note_change(full[index], after)
                assert moved <= plan.bounding.noise.sensitivity, (plan.sql, value, moved)
    # the bounds are tight for the counts: some removal moves a COUNT(*) by its sensitivity
    assert reached[0]


def note_change(before, after) -> int:
    """The L1 change of the bounding note's exact totals (rows cut, rows kept): the last
    two columns (capped rows before the bounding, rows kept) summed over the groups."""

    def totals(rows):
        capped, kept = (sum(int(row[i] or 0) for row in rows) for i in (-2, -1))
        return np.array([capped - kept, kept])

    return int(np.abs(totals(before) - totals(after)).sum())


def _plans(shapes, table, policy, dialect, unique_units=frozenset()):
    options = Options(epsilon=1.0, delta=1e-6)
    return [
        plan_query(
            parse_statement(shape.format(t=table), dialect).tree,
            PlanContext(policy, options, dialect, seed=11, unique_units=unique_units),
        )
        for shape in shapes
    ]


@on_every_backend
@pytest.mark.parametrize("base", ["dup", "null"])
@pytest.mark.parametrize("bounds", [(1, 1), (2, 2), (3, 1)])
def test_measurements_change_at_most_by_their_sensitivity(database, base, bounds):
    max_groups, max_rows = bounds
    policy_dict = pums_policy()
    table = policy_dict["tables"]["pums_dup"]
    table["max_groups_per_unit"], table["max_rows_per_unit"] = max_groups, max_rows
    plans = _plans(SHAPES, "pums_dup", load_policy(policy_dict), database.dialect)
    source = f"base_{base}"
    heaviest = (
        f"SELECT pid FROM {source} WHERE pid IS NOT NULL GROUP BY pid "
        "ORDER BY COUNT(*) DESC, pid LIMIT 25"
    )
    pids = [row[0] for row in database.rows(heaviest)]
    _assert_sensitivities(database, plans, "pums_dup", source, "pid", pids, max_groups)


@on_every_backend
def test_row_level_measurements_change_at_most_by_their_sensitivity(database):
    shapes = [s for s in SHAPES if "pid" not in s]
    plans = _plans(shapes, "pums", load_policy(pums_policy()), database.dialect)
    rows = [row[0] for row in database.rows(
        "SELECT row_id FROM base_rows ORDER BY income DESC, row_id LIMIT 25"
    )]  # fmt: skip
    _assert_sensitivities(database, plans, "pums", "base_rows", "row_id", rows, 1)


@on_every_backend
def test_unique_units_need_no_bounding_to_keep_their_sensitivity(database):
    # PUMS_pid has one row per pid: with the unit declared unique, bounds are 1 and no window
    policy_dict = pums_policy()
    policy_dict["tables"]["pums_pid"]["max_rows_per_unit"] = 3
    plans = _plans(
        SHAPES, "pums_pid", load_policy(policy_dict), database.dialect, frozenset({"pums_pid"})
    )
    assert all("ROW_NUMBER" not in plan.sql for plan in plans)
    pids = [row[0] for row in database.rows(
        "SELECT pid FROM base_pid ORDER BY income DESC, pid LIMIT 25"
    )]  # fmt: skip
    _assert_sensitivities(database, plans, "pums_pid", "base_pid", "pid", pids, 1)


@on_every_backend
def test_ranges_from_long_literals_keep_the_rows_the_database_keeps(database):
    """Every backend compares `age < 19.000000000000000001` exactly, so age 19 passes;
    read as the float 19.0, the range left 19 out, the rewrite dropped the clamp's upper
    side, and removing one person moved the SUM by 38 against a stated 36 (found by an
    audit)."""
    shapes = ["SELECT SUM(age) FROM {t} WHERE age >= 18 AND age < 19.000000000000000001"]
    plans = _plans(shapes, "pums_dup", load_policy(pums_policy()), database.dialect)
    assert plans[0].measures[0].noise.sensitivity == 38  # 2 rows of 19
    database.replace_table("pums_dup", "SELECT * FROM base_dup")
    full = [database.rows(plan.sql)[0][0] for plan in plans]
    # the persons with the most rows at the edges (18 or 19): each moves the sums most
    heaviest = database.rows(
        "SELECT pid FROM base_dup WHERE age IN (18, 19) GROUP BY pid "
        "ORDER BY COUNT(*) DESC, pid LIMIT 6"
    )
    for (pid,) in heaviest:
        database.replace_table("pums_dup", f"SELECT * FROM base_dup WHERE pid <> {pid}")
        for plan, before in zip(plans, full, strict=True):
            change = abs(before - database.rows(plan.sql)[0][0])
            assert change <= plan.measures[0].noise.sensitivity, (plan.sql, pid, change)


# Exact number types for income on each backend: read as DOUBLE (DuckDB's), compared as
# stored (PostgreSQL's numeric(15, 2)), or read through the guard (an unconstrained numeric).
_EXACT_INCOME = {"duckdb": ["DECIMAL(15, 2)", "DECIMAL(38, 2)"],
                 "postgres": ["NUMERIC(15, 2)", "NUMERIC"]}  # fmt: skip


@on_every_backend
def test_exact_number_columns_keep_their_sensitivity(database):
    """Income stored as DECIMAL/NUMERIC, each shape planned as connect plans it (the
    policy marked by the stored types, Policy.as_stored): removing one person moves
    every measurement by at most its sensitivity."""
    policy_dict = pums_policy()
    table = policy_dict["tables"]["pums_dup"]
    table["max_groups_per_unit"], table["max_rows_per_unit"] = 2, 2
    pids = [row[0] for row in database.rows(
        "SELECT pid FROM base_dup WHERE pid IS NOT NULL GROUP BY pid "
        "ORDER BY COUNT(*) DESC, pid LIMIT 15"
    )]  # fmt: skip
    for exact in _EXACT_INCOME[database.dialect]:
        database.replace_table(
            "base_exact",
            f"SELECT pid, age, sex, educ, race, CAST(income AS {exact}) AS income, married "
            "FROM base_dup",
        )
        policy = load_policy(policy_dict).as_stored(
            {"pums_dup": {"income": exact.lower()}}, database.dialect
        )
        read_as_double = policy.tables["pums_dup"].column("income").read_as_double
        assert read_as_double == (exact != "NUMERIC(15, 2)")
        plans = _plans(SHAPES, "pums_dup", policy, database.dialect)
        _assert_sensitivities(database, plans, "pums_dup", "base_exact", "pid", pids, 2)
