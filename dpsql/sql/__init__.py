"""SQL front half of the pipeline: parse, check, analyze, rewrite into a plan."""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from dpsql.policy import Policy
from dpsql.sql.analyze import analyze
from dpsql.sql.check import check_query
from dpsql.sql.plan import ConstantPlan, DirectPlan, Options, Plan


def plan_query(
    select: exp.Select,
    policy: Policy,
    options: Options,
    dialect: str,
    seed: int,
    unique_units: frozenset[str] = frozenset(),
) -> Plan:
    """The plan answering a parsed SELECT; raises QueryRefused when it cannot be protected.

    `unique_units` names the tables (policy keys) whose privacy unit the database
    keeps unique: there each unit has one row, so the bounds are 1 and the
    rewrite needs no per-unit window.
    """
    table = check_query(select, policy)
    if table is None:
        return ConstantPlan(select.sql(dialect=dialect))
    if table.privacy_unit and table.name.lower() in unique_units:
        table = replace(table, max_groups_per_unit=1, max_rows_per_unit=1, unique_unit=True)
    return DirectPlan(analyze(select, table), options, dialect, seed)


__all__ = ["Options", "Plan", "plan_query"]
