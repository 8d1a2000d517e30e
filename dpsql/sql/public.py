"""Queries over public tables alone: answered exactly, and free.

A table the policy marks `public: true` holds no person's data (nations,
products, calendars), so any SELECT that reads public tables only is run as
written and its rows released as they are, charged nothing. What keeps this
safe is what it may reach: every table it names must be a public table of the
policy (never a private one, a catalog or a file), every column a declared
(or, for a public table that lists none, an existing) column of one, and every
function one of the deterministic functions and aggregates below, none of
which reads outside its arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from sqlglot import exp

from dpsql.accounting import Cost
from dpsql.errors import QueryRefused
from dpsql.policy import Table
from dpsql.results import Release
from dpsql.sql.check import SCALAR_FUNCTIONS, STRUCTURE
from dpsql.sql.qualify import qualified
from dpsql.sql.rewrite import in_dialect

# What a query over public data may use besides the private gate's structure and
# scalar functions: joins, subqueries, CTEs, DISTINCT, windows, grouping sets and the
# common aggregates. Each is deterministic and reads nothing but its arguments.
_PUBLIC_ONLY: tuple[type[exp.Expression], ...] = (
    exp.Join, exp.Subquery, exp.With, exp.CTE, exp.Union, exp.Except, exp.Intersect,
    exp.Exists, exp.Window, exp.WindowSpec, exp.Filter, exp.WithinGroup, exp.RowNumber,
    exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max, exp.Median, exp.Stddev, exp.StddevPop,
    exp.StddevSamp, exp.Variance, exp.VariancePop, exp.PercentileCont, exp.PercentileDisc,
    exp.Quantile, exp.CountIf, exp.Qualify, exp.Star, exp.Distinct,
    exp.GroupingSets, exp.Rollup, exp.Cube, exp.Grouping,
)  # fmt: skip
_ALLOWED = STRUCTURE + SCALAR_FUNCTIONS + _PUBLIC_ONLY
_CLAUSES = {
    "expressions", "from_", "where", "group", "having", "order", "limit", "offset",
    "joins", "with_", "distinct", "qualify",
}  # fmt: skip


@dataclass
class PublicPlan:
    """A query over public tables: run as written (its columns checked), free."""

    sql: str
    tables: tuple[str, ...]
    cost: Cost = field(default_factory=Cost)

    def release(self, columns: list[str], rows: list[tuple], rng: np.random.Generator) -> Release:
        return Release(
            columns,
            rows,
            notes=[f"public tables only ({', '.join(self.tables)}): exact, and free"],
        )

    def explain(self) -> list[tuple[str, str]]:
        return [
            ("sql", self.sql),
            ("tables", f"public: {', '.join(self.tables)}"),
            ("cost", "none: public tables hold no person's data"),
        ]


def plan_public(select: exp.Select, tables: dict[str, Table], dialect: str) -> PublicPlan:
    """The plan of a query whose every table is public."""
    require_public_query(select)
    checked = qualified(select, tables, dialect)
    names = tuple(sorted(table.name for table in tables.values()))
    return PublicPlan(in_dialect(checked, dialect), names)


def require_public_query(select: exp.Expression) -> None:
    """Refuse, in a query over public tables, a clause or node outside the allow-list."""
    for select_node in select.find_all(exp.Select):
        for key, value in select_node.args.items():
            if value and key not in _CLAUSES:
                raise QueryRefused(
                    f"the clause {key.rstrip('_').upper()}",
                    "it is outside the SQL dpsql runs even on public tables",
                    "use SELECT, FROM, JOIN, WHERE, GROUP BY, HAVING, ORDER BY and LIMIT",
                )
    for node in select.walk():
        if not isinstance(node, _ALLOWED):
            raise _refused(node)


def _refused(node: exp.Expression) -> QueryRefused:
    if isinstance(node, exp.Func):
        name = str(node.this).upper() if isinstance(node, exp.Anonymous) else node.sql_name()
        return QueryRefused(
            f"the function {name}",
            "it is not on dpsql's list of deterministic functions, which alone may run "
            "even over public tables (others could read files, settings or other tables)",
            "use arithmetic, CASE, COALESCE, string and date functions, and COUNT, SUM, AVG, "
            "MIN, MAX",
        )
    return QueryRefused(
        f"the construct {type(node).__name__} ({node.sql()[:40]})",
        "it is outside the SQL dpsql runs over public tables",
        "use plain SELECT, joins, subqueries and CTEs",
    )
