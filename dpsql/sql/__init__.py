"""SQL front half of the pipeline: parse, check, analyze, rewrite into a plan."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from sqlglot import exp

from dpsql.accounting import Cost, split_epsilon
from dpsql.policy import Policy, Proven, Table
from dpsql.sql.analyze import analyze
from dpsql.sql.check import AGGREGATES, ORDER_STATISTICS, check_query
from dpsql.sql.grouping_sets import GroupingSetsPlan, has_grouping_sets, plan_grouping_sets
from dpsql.sql.local import plan_local
from dpsql.sql.normalize import normalize
from dpsql.sql.parse import nested_too_deeply
from dpsql.sql.plan import ConstantPlan, DirectPlan, DomainPlan, Options, Plan
from dpsql.sql.public import plan_public
from dpsql.sql.qualify import by_policy_names, tables_read
from dpsql.sql.quantiles import plan_quantiles
from dpsql.sql.relations import reads_relation, relation
from dpsql.sql.running import plan_running
from dpsql.sql.scalars import StagedPlan, plan_staged, value_subqueries
from dpsql.sql.synopsis import plan_synopsis


class StoredState(Protocol):
    """Read access to what earlier releases stored (the analyst's part of the ledger), and
    one write: a record a plan must keep although it releases nothing (a stream that ends)."""

    def get(self, key: str) -> str | None: ...

    def find(self, prefix: str, after: str = "") -> dict[str, str]:
        """Entries whose key starts with `prefix` and sorts after `after`."""
        ...

    def keep(self, key: str, payload: str) -> str:
        """Store `payload` under `key` unless one is stored; return the stored one."""
        ...

    @property
    def owner(self) -> tuple[str, str]:
        """Whose state this is: (ledger location, analyst)."""
        ...


class _NothingStored:
    owner = ("", "")

    def get(self, key: str) -> str | None:
        return None

    def find(self, prefix: str, after: str = "") -> dict[str, str]:
        return {}

    def keep(self, key: str, payload: str) -> str:
        return payload


@dataclass(frozen=True)
class PlanContext:
    """Everything a planner may use besides the query: policy, options, backend, secrets."""

    policy: Policy
    options: Options
    dialect: str
    seed: int  # secret per plan: keys the contribution-bounding hash
    unique_units: frozenset[str] = frozenset()
    stored: StoredState = field(default_factory=_NothingStored)
    budget: Cost | None = None  # the analyst's whole budget, when a planner needs to know it
    database: str = ""  # the adapter's identity: streams and synopses are kept per database
    # referenced columns ("table.column") the database keeps unique (sql/relations.py)
    unique_references: frozenset[str] = frozenset()
    # runs a query over public tables alone: key domains of their columns (join_domains.py)
    read_public: Callable[[str], list[tuple]] | None = None
    # per table (policy key): the value ranges the database proves (sql/proofs.py)
    proven: Mapping[str, tuple[Proven, ...]] = field(default_factory=dict)


def plan_domain(select: exp.Select, table: Table, context: PlanContext) -> Plan | None:
    """The plan of a GROUP BY without any aggregate (the keys of public domains); None for
    any other query."""
    if select.args.get("group") is None or select.find(*AGGREGATES) is not None:
        return None
    return DomainPlan(analyze(select, bounded_table(table, context)))


# Planners for checked queries whose shape has a plan of its own (tables of
# local reports, the keys of public domains alone, range synopses), given the
# query and its table. Each returns None when the query is not its shape; the
# first plan returned answers the query, else the direct plan does. Running
# totals are planned before the check, which refuses their window function.
SPECIAL_PLANNERS: tuple[Callable[[exp.Select, Table, PlanContext], Plan | None], ...] = (
    plan_local,
    plan_quantiles,
    plan_domain,
    plan_synopsis,  # last: on a table with synopses it returns the direct plan for any other query
)


def plan_query(select: exp.Select, context: PlanContext) -> Plan:
    """The plan answering a parsed SELECT; raises QueryRefused when it cannot be protected.

    `context.unique_units` names the tables (policy keys) whose privacy unit the
    database keeps unique: there each unit has one row, so the bounds are 1 and
    the rewrite needs no per-unit window.
    """
    try:
        return _planned(select, context)
    except RecursionError:  # the passes walk the tree recursively, as sqlglot does
        raise nested_too_deeply() from None


def _planned(select: exp.Select, context: PlanContext) -> Plan:
    select = normalize(select)
    # GROUPING SETS, ROLLUP, CUBE: one query per set (over public tables alone, run as written)
    if has_grouping_sets(select) and _reads_private(select, context.policy):
        return plan_grouping_sets(select, context.policy, _share_planner(context))
    plan = plan_running(select, context)  # a stream keeps the policy's bounds throughout
    if plan is not None:
        return plan
    options = context.options
    context = replace(
        context,
        policy=context.policy.with_contribution_bounds(
            options.max_rows_per_unit, options.max_groups_per_unit
        ),
    )
    staged = _staged(select, context)
    if staged is not None:
        return staged
    if reads_relation(select) or _reads_relation_table(select, context.policy):
        return _relational(select, context)
    table = check_query(select, context.policy)  # once, for every planner below
    if table is None:
        return ConstantPlan(select.sql(dialect=context.dialect))
    for planner in SPECIAL_PLANNERS:
        plan = planner(select, table, context)
        if plan is not None:
            return plan
    # With the value ranges the database proves, whose clamps the rewrite leaves out and
    # DirectPlan.explain names (the other planners keep every clamp).
    proven = replace(table, proven=context.proven.get(table.name.lower(), ()))
    return DirectPlan(
        analyze(select, bounded_table(proven, context)),
        context.options,
        context.dialect,
        context.seed,
    )


def _staged(select: exp.Select, context: PlanContext) -> StagedPlan | None:
    """The plan of a query with scalar subqueries that reads private tables
    (sql/scalars.py); None for any other."""
    if not value_subqueries(select) or not _reads_private(select, context.policy):
        return None  # over public tables alone, it is run as written
    return plan_staged(
        select,
        context.policy,
        _share_planner(context),
        lambda query: _reads_private(query, context.policy),
    )


def _share_planner(context: PlanContext) -> Callable[[exp.Select, int, int], Plan]:
    """Plans part `index` of a query released in parts (scalar subqueries, grouping sets)
    with one of `shares` equal shares of its epsilon and delta, and a secret of its own."""

    def planned_part(query: exp.Select, index: int, shares: int) -> Plan:
        options = context.options
        share = replace(
            options,
            epsilon=split_epsilon(options.epsilon, shares, binary_too=True),
            delta=split_epsilon(options.delta, shares, binary_too=True),
        )
        # a secret of its own per part, drawn from the plan's
        seed = (context.seed * 1_000_003 + index + 1) % 2**62
        return _planned(query, replace(context, options=share, seed=seed))

    return planned_part


def _reads_private(select: exp.Select, policy: Policy) -> bool:
    tables = tables_read(by_policy_names(select, policy), policy)
    return not all(table.public for table in tables.values())


def _reads_relation_table(select: exp.Select, policy: Policy) -> bool:
    """Whether the one table the query reads is public, or has its unit through a
    reference (it is then read joined to the table it references)."""
    source = select.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table):
        return False
    table = policy.table(".".join(part.name for part in source.this.parts))
    return table is not None and (table.public or table.via is not None)


def _relational(select: exp.Select, context: PlanContext) -> Plan:
    """A query over several tables, a subquery or a CTE, or over public tables: answered
    exactly when every table is public, else over one unit-carrying relation."""
    select = by_policy_names(select, context.policy)
    tables = tables_read(select, context.policy)
    if all(table.public for table in tables.values()):
        return plan_public(select, tables, context.dialect)
    related = relation(
        select,
        context.policy,
        context.dialect,
        context.unique_references,
        context.seed,
        context.read_public,
    )
    check_query(related.select, _Only(related.table))
    if related.select.find(*ORDER_STATISTICS) is not None:  # the quantiles' own planner
        plan = plan_quantiles(related.select, related.table, context)
    else:
        plan = DirectPlan(
            analyze(related.select, related.table), context.options, context.dialect, context.seed
        )
    plan.notes.append(f"the relation: {related.description}")
    return plan


@dataclass(frozen=True)
class _Only:
    """The policy as check_query sees a relation's outer query: its one virtual table."""

    only: Table

    def table(self, name: str) -> Table | None:
        return self.only if name == self.only.name else None


def bounded_table(table: Table, context: PlanContext) -> Table:
    """`table` with bounds of 1 when the database keeps its privacy unit unique."""
    if table.privacy_unit and table.name.lower() in context.unique_units:
        return replace(table, max_groups_per_unit=1, max_rows_per_unit=1, unique_unit=True)
    return table


__all__ = [
    "GroupingSetsPlan",
    "Options",
    "Plan",
    "PlanContext",
    "StagedPlan",
    "StoredState",
    "bounded_table",
    "plan_query",
]
