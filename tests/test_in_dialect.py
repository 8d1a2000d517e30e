"""in_dialect writes what sqlglot writes: each name folded as the backend folds it unquoted
(from a cache, where the dialect folds by the name alone), then quoted (sql/rewrite.py)."""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

from dpsql.sql.rewrite import in_dialect

DIALECTS = ["duckdb", "postgres", "spark", "snowflake", "bigquery", "tsql"]

# Names of every case, quoted or not, keywords among them; no constant with a decimal
# point, no minus and no IS, which in_dialect also respells (tests elsewhere).
QUERIES = [
    'SELECT "Income" AS "K0", COUNT(*) AS n FROM "Census" WHERE "Age" > 3 GROUP BY "Income"',
    "SELECT educ, SUM(income) AS total FROM census AS c WHERE c.sex = 1 GROUP BY educ",
    'SELECT "select", "Order" FROM (SELECT "From" AS "select", x AS "Order" FROM t) AS "Sub"',
    "SELECT MAX(CASE WHEN Married = 1 THEN Age ELSE 0 END) FROM Survey.People",
]


def reference(query: exp.Expression, dialect: str) -> str:
    """The text of sqlglot's own passes: names unquoted, normalised, printed quoted."""
    unquoted = query.copy()
    for identifier in unquoted.find_all(exp.Identifier):
        identifier.set("quoted", False)
    return normalize_identifiers(unquoted, dialect=dialect).sql(dialect=dialect, identify=True)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_in_dialect_writes_what_sqlglot_writes_with_names_folded(dialect: str) -> None:
    for sql in QUERIES:
        query = sqlglot.parse_one(sql, read="duckdb")
        assert in_dialect(query.copy(), dialect) == reference(query, dialect), sql
