"""Differencing and tracker attacks: queries that try to isolate one person.

Each attack is either refused before anything runs, or answered with noise
calibrated to the worst case: its bounded SQL is run on PUMS and on PUMS
without the targeted person (tests/test_sensitivity.py's neighbouring
databases), and no measurement may move by more than the sensitivity its
noise is calibrated to. The targets are the people the attacks are written
for: the highest incomes and people alone in their (age, educ, race, sex) cell.
"""

from __future__ import annotations

import math

import pytest
from conftest import on_every_backend, pums_policy
from test_sensitivity import _assert_sensitivities, _plans, database  # noqa: F401

from dpsql.errors import QueryRefused
from dpsql.policy import load_policy
from dpsql.sql import Options, PlanContext, plan_query
from dpsql.sql.parse import parse_statement

# {t} is the table; {age}, {educ}, {race}, {sex}, {income} are the target's values.
NARROW = "age = {age} AND educ = {educ} AND race = {race} AND sex = {sex}"
ANSWERED = [
    f"SELECT COUNT(*) FROM {{t}} WHERE {NARROW}",  # first: the tight one (moves by max_rows)
    f"SELECT SUM(income) FROM {{t}} WHERE {NARROW}",
    f"SELECT COUNT(*) FROM {{t}} WHERE NOT ({NARROW})",  # the complement
    f"SELECT SUM(income) FROM {{t}} WHERE NOT ({NARROW})",
    "SELECT SUM(income) FROM {t} WHERE income >= {income}",
    "SELECT COUNT(*), SUM(income) FROM {t} WHERE income BETWEEN {income} AND {income}",
    "SELECT SUM(CASE WHEN income = {income} THEN 1000000 ELSE 0 END) FROM {t}",
    "SELECT SUM(CASE WHEN age = {age} AND educ = {educ} THEN income * 1000 ELSE 0 END) FROM {t}",
    "SELECT income, COUNT(*) FROM {t} GROUP BY income",  # near-unique keys
    "SELECT age, educ, race, sex, COUNT(*), SUM(income) FROM {t} GROUP BY 1, 2, 3, 4",
    "SELECT income, COUNT(*) AS n FROM {t} GROUP BY income ORDER BY income DESC LIMIT 1",
    "SELECT COUNT(*) FROM {t} WHERE income > {income} - 1 ORDER BY 1 LIMIT 1 OFFSET 0",
    "SELECT SUM(income * 1e9) FROM {t}",  # magnitude blown up: the noise grows with it
    "SELECT SUM(income / (age + 1)) FROM {t}",
    "SELECT SUM(income) / COUNT(*) FROM {t} WHERE income >= {income}",  # division by a noisy count
    "SELECT AVG(income) FROM {t} WHERE income >= {income}",
    "SELECT COUNT(DISTINCT income) FROM {t}",  # the target's income may be the only one
    f"SELECT STDDEV(income), VAR_POP(age) FROM {{t}} WHERE {NARROW}",
    "SELECT VAR_SAMP(income) FROM {t} WHERE income >= {income}",
    "SELECT SUM(COALESCE(income, 1e15)) FROM {t}",  # NULL replaced by a huge value
    "SELECT SUM(income) FROM {t} WHERE income = CAST('NaN' AS DOUBLE)",
    "SELECT COUNT(*) FROM {t} WHERE income > 1e300 OR age = 99999999999999999999",
    "SELECT SUM(age) FROM {t} WHERE age > 1e308",
    "SELECT SUM(age) FROM {t} WHERE age < -1e308 OR income < 1e-320",
    "SELECT FLOOR(income / 100000) AS band, SUM(income) FROM {t} GROUP BY band",
]

REFUSED = [
    # raw values and the person's identity
    "SELECT income FROM {t} WHERE " + NARROW,
    "SELECT income, COUNT(*) FROM {t} WHERE " + NARROW,
    "SELECT COUNT(*) FROM pums_pid WHERE pid = 17",
    "SELECT MAX(pid) FROM pums_pid",
    "SELECT SUM(DISTINCT income) FROM {t}",
    # sensitivity that cannot be bounded, or would not fit in a row's arithmetic
    "SELECT SUM(1 / (age - 40)) FROM {t}",
    "SELECT SUM(income / (age - {age})) FROM {t}",
    "SELECT SUM(age * 9223372036854775807) FROM {t}",
    "SELECT SUM(age * 1e300 * 1e300) FROM {t}",
    "SELECT SUM(income + 1e308 + 1e308) FROM {t}",
    "SELECT SUM(EXP(income)) FROM {t}",
    "SELECT SUM(POWER(income, 40)) FROM {t}",
    "SELECT SUM(CAST('NaN' AS DOUBLE) * income) FROM {t}",
    "SELECT SUM(CAST('Infinity' AS DOUBLE)) FROM {t}",
    "SELECT COUNT(*) FROM {t} WHERE income > 1e400",  # PostgreSQL fails on the literal
    # DuckDB converts a quoted constant to the column's type once a row reaches it
    "SELECT SUM(income) FROM {t} WHERE income = 'NaN'",
    "SELECT COUNT(*) FROM {t} WHERE age > 95 AND age = 'x'",
    "SELECT COUNT(*) FROM {t} WHERE COALESCE(income, 'x') = 1",
    # ... and so values of another type, or constants that fail to compute
    "SELECT COUNT(*) FROM {t} WHERE " + NARROW + " AND income = DATE '2020-01-01'",
    "SELECT COUNT(*) FROM {t} WHERE " + NARROW + " AND age = INTERVAL '1' DAY",
    "SELECT COUNT(*) FROM {t} WHERE " + NARROW + " AND age = CAST('x' AS INT)",
    "SELECT COUNT(*) FROM {t} WHERE " + NARROW + " AND income = CAST('1e999' AS DOUBLE)",
    "SELECT COUNT(*) FROM {t} WHERE " + NARROW + " AND income = LN(-1)",
    # a database error for one row would answer without noise (the error channel)
    "SELECT COUNT(*) FROM {t} WHERE " + NARROW + " AND 1 / (income - {income}) > 0",
    "SELECT COUNT(*) FROM {t} WHERE " + NARROW + " AND LN(income - {income}) > 0",
    "SELECT COUNT(*) FROM {t} WHERE " + NARROW + " AND SQRT(income - {income}) > 0",
    "SELECT COUNT(*) FROM {t} WHERE CAST(income AS TINYINT) = 0",
    "SELECT COUNT(*) FROM {t} WHERE CAST(income AS DECIMAL(3, 0)) > 0",
    "SELECT COUNT(*) FROM {t} WHERE CAST(CAST(income AS TEXT) AS INTEGER) > 0",
    "SELECT COUNT(*) FROM {t} WHERE age * 92233720368547758 > 0",
    "SELECT COUNT(*) FROM {t} WHERE income % (age - {age}) = 0",
    "SELECT COUNT(*) FROM {t} WHERE EXP(income / 100) > 1",
    "SELECT COUNT(*) FROM {t} GROUP BY FLOOR(LN(income))",
    # tracker shapes outside the subset
    # a scalar subquery is its own release (tests/test_relations.py); correlated, refused
    "SELECT COUNT(*) FROM {t} a WHERE income = (SELECT MAX(b.income) FROM {t} b "
    "WHERE b.age = a.age)",
    "SELECT COUNT(*) FROM {t} a JOIN {t} b ON a.income = b.income",
    "SELECT SUM(income) OVER (ORDER BY income) FROM {t}",
    "SELECT COUNT(*) FROM {t} UNION SELECT COUNT(*) FROM {t} WHERE " + NARROW,
]

TARGETS_SQL = [
    # (age, educ, race, sex, income, unit) of people with at least `rows` rows (so that the
    # narrow COUNT moves by its full sensitivity): alone in their cell, then top incomes
    "SELECT MIN(age), MIN(educ), MIN(race), MIN(sex), MIN(income), MIN({unit}) FROM {source} "
    "GROUP BY age, educ, race, sex HAVING COUNT(DISTINCT {unit}) = 1 AND COUNT(*) >= {rows} "
    "ORDER BY MIN({unit}) LIMIT 2",
    "SELECT DISTINCT age, educ, race, sex, income, {unit} FROM {source} WHERE {unit} IN "
    "(SELECT {unit} FROM {source} GROUP BY {unit} HAVING COUNT(*) >= {rows}) "
    "AND income IS NOT NULL ORDER BY income DESC, {unit} LIMIT 2",
]


def _targets(raw, source: str, unit: str, rows: int) -> list[dict]:
    found = []
    for query in TARGETS_SQL:
        found += raw.rows(query.format(source=source, unit=unit, rows=rows))
    keys = ("age", "educ", "race", "sex", "income", "unit")
    return [dict(zip(keys, row, strict=True)) for row in found]


def _format(shape: str, table: str, target: dict) -> str:
    values = {k: (repr(float(v)) if k == "income" else int(v)) for k, v in target.items()}
    return shape.format(t=table, **values)


@pytest.mark.parametrize("shape", REFUSED)
def test_isolating_queries_are_refused_before_anything_runs(shape):
    target = {"age": 40, "educ": 9, "race": 1, "sex": 1, "income": 123456.0, "unit": 1}
    policy = load_policy(pums_policy())
    for table in ("pums", "pums_pid"):
        sql = _format(shape, table, target)
        context = PlanContext(policy, Options(epsilon=1.0, delta=1e-6), "duckdb", seed=5)
        with pytest.raises(QueryRefused) as refused:
            plan_query(parse_statement(sql, "duckdb").tree, context)
        assert refused.value.hint and refused.value.reason, sql


@on_every_backend
@pytest.mark.parametrize(
    ("table", "source", "unit", "bounds"),
    [
        ("pums_pid", "base_pid", "pid", (1, 1)),
        ("pums_dup", "base_dup", "pid", (2, 2)),
        ("pums", "base_rows", "row_id", (1, 1)),
    ],
)
def test_isolating_queries_are_calibrated_to_the_worst_case(database, table, source, unit, bounds):  # noqa: F811
    max_groups, max_rows = bounds
    policy_dict = pums_policy()
    if table != "pums":
        spec = policy_dict["tables"][table]
        spec["max_groups_per_unit"], spec["max_rows_per_unit"] = max_groups, max_rows
    policy = load_policy(policy_dict)
    for target in _targets(database, source, unit, max_rows):
        shapes = [_format(shape, table, target) for shape in ANSWERED]
        plans = _plans(shapes, table, policy, database.dialect)
        _assert_worst_case(plans, table, max_groups if table != "pums" else 1, max_rows)
        # removing the target (all its rows) moves no measurement beyond its sensitivity
        _assert_sensitivities(
            database, plans, table, source, unit, [target["unit"]], max_groups=max_groups
        )


def _assert_worst_case(plans, table: str, groups: int, rows: int) -> None:
    """Each SUM's sensitivity covers the largest value its clamp lets through, times the
    rows and groups one person may add: the noise is sized for the worst person."""
    for plan in plans:
        per_unit = groups if plan.analysis.keys and table != "pums" else 1
        for measurement, measure in zip(plan.analysis.measurements, plan.measures, strict=True):
            stated = measure.noise.sensitivity * measure.step
            if measurement.kind == "sum":
                worst = measurement.bounds.magnitude * rows * per_unit
            else:
                worst = (1 if measurement.kind == "count_units" else rows) * per_unit
            assert stated >= worst * (1 - 1e-12), (measurement.key, stated, worst)
            assert math.isfinite(stated)
