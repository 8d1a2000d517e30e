"""SQL front half of the pipeline: parse, check, analyze, rewrite into a plan."""

from __future__ import annotations

from sqlglot import exp

from dpsql.policy import Policy
from dpsql.sql.analyze import analyze
from dpsql.sql.check import check_query
from dpsql.sql.plan import ConstantPlan, DirectPlan, Options, Plan


def plan_query(select: exp.Select, policy: Policy, options: Options, dialect: str, seed: int) -> Plan:
    """The plan answering a parsed SELECT; raises QueryRefused when it cannot be protected."""
    table = check_query(select, policy)
    if table is None:
        return ConstantPlan(select.sql(dialect=dialect))
    return DirectPlan(analyze(select, table), options, dialect, seed)


__all__ = ["Options", "Plan", "plan_query"]
