"""Post-processing: ORDER BY, LIMIT and OFFSET sorted in Python agree with DuckDB's evaluation.

Bare outputs ordered by released columns skip the private DuckDB (one
statement there costs more than the rest of a release); these tests hold the
Python sort to DuckDB's answer on the same released arrays, with NULL keys and
both dialects' NULL orderings.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql import demo
from dpsql.policy import load_policy
from dpsql.sql.analysis import KEY_PREFIX, VALUE_PREFIX
from dpsql.sql.analyze import analyze
from dpsql.sql.check import check_query
from dpsql.sql.parse import parse_statement
from dpsql.sql.postprocess import _evaluate, _sorted_in_python, project

POLICY = load_policy(demo.DEMO_POLICY)

SORTED = [
    "SELECT sex, COUNT(*) AS n FROM census GROUP BY sex ORDER BY n DESC LIMIT 1",
    "SELECT educ, COUNT(*) AS n, SUM(income) AS s FROM census GROUP BY educ "
    "ORDER BY s, educ DESC OFFSET 2",
    "SELECT educ, COUNT(*) FROM census GROUP BY educ ORDER BY 2 DESC NULLS FIRST, 1 LIMIT 3",
    "SELECT educ FROM census GROUP BY educ ORDER BY COUNT(*) DESC",
    "SELECT educ, COUNT(*) FROM census GROUP BY educ ORDER BY educ DESC",
    "SELECT educ, COUNT(*) FROM census GROUP BY educ LIMIT 2 OFFSET 1",
]
EVALUATED = [  # expressions or HAVING: left to DuckDB
    "SELECT educ, COUNT(*) * 2 AS n FROM census GROUP BY educ ORDER BY n",
    "SELECT educ, COUNT(*) AS n FROM census GROUP BY educ HAVING COUNT(*) > 3 ORDER BY n",
    "SELECT educ, COUNT(*) AS n FROM census GROUP BY educ ORDER BY COUNT(*) + 1",
]


def _analysis(sql: str, dialect: str):
    select = parse_statement(sql, dialect).tree
    return analyze(select, check_query(select, POLICY))


def _columns(analysis, keys: list, values: list[list[float]]) -> dict:
    columns = {f"{KEY_PREFIX}0": keys}
    for j in range(len(analysis.aggregates)):
        columns[f"{VALUE_PREFIX}{j}"] = np.array(values[j][: len(keys)], dtype=float)
    return columns


@settings(max_examples=60, deadline=None)
@given(
    sql=st.sampled_from(SORTED),
    dialect=st.sampled_from(["duckdb", "postgres"]),
    keys=st.lists(st.one_of(st.none(), st.integers(0, 50)), min_size=1, max_size=8, unique=True),
    values=st.lists(
        st.lists(st.floats(-1e6, 1e6), min_size=8, max_size=8, unique=True), min_size=2, max_size=2
    ),
)
def test_python_order_matches_duckdb(sql, dialect, keys, values) -> None:
    analysis = _analysis(sql, dialect)
    columns = _columns(analysis, keys, values)
    in_python = _sorted_in_python(analysis, columns)
    assert in_python is not None, "this query's order should be sorted in Python"
    rows, groups = in_python
    evaluated = _evaluate(analysis, columns)  # each row ends with its group's position
    assert rows == [row[:-1] for row in evaluated]
    assert groups == [row[-1] for row in evaluated]  # per-group accuracy follows its row


@pytest.mark.parametrize("sql", EVALUATED)
def test_expressions_and_having_are_left_to_duckdb(sql) -> None:
    analysis = _analysis(sql, "duckdb")
    columns = _columns(analysis, [1, 2, None], [[5.0, 1.0, 3.0], [2.0, 4.0, 6.0]])
    assert _sorted_in_python(analysis, columns) is None
    assert len(_evaluate(analysis, columns)) <= 3  # DuckDB evaluates it


def test_project_returns_the_sorted_rows() -> None:
    analysis = _analysis(SORTED[0], "duckdb")
    names, rows = project(analysis, [(1,), (2,)], [np.array([3.0, 7.0])])
    assert names == ["sex", "n"] and rows == [(2, 7.0)]


def test_values_that_do_not_compare_fall_back_to_duckdb() -> None:
    analysis = _analysis(SORTED[4], "duckdb")
    columns = _columns(analysis, [1, "a"], [[1.0, 2.0], [3.0, 4.0]])
    assert _sorted_in_python(analysis, columns) is None
