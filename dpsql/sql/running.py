"""Running totals in SQL, answered from a continual counter: the planner and its plan.

Recognised shapes (one running total per query, over a column whose policy
declares `continual: {step, epsilon[, delta, mechanism]}`):

    SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) AS so_far FROM events GROUP BY day
    SELECT day, COUNT(*) OVER (ORDER BY day ROWS UNBOUNDED PRECEDING) FROM events
    SELECT day, SUM(SUM(amount)) OVER (ORDER BY day) FROM events GROUP BY day
    SELECT day, shop, SUM(COUNT(*)) OVER (PARTITION BY shop ORDER BY day) ... GROUP BY day, shop

A stream's identity is the query without its watermark (`WHERE day < X`,
which only says up to where to release), with its mechanism and price (the
policy's choice, or SET dpsql.continual's: another mechanism is another
stream). Its first run charges the whole horizon once and stores a secret
noise key; every run releases the steps that are complete (before the
watermark and, for dates and timestamps, before the clock), re-releasing
stored past steps unchanged, for free. Each step's exact value is read once,
when it is first released, through one bounded GROUP BY built by
analyze/rewrite in which each unit keeps its earliest steps, so a unit adds at
most max_groups * max_rows rows to the whole stream.

That bound holds only while released steps keep their rows, so each tick checks
that every released step still has the exact bounded total it was measured with,
and (with a privacy unit) the digest of which unit adds what (both stored with
the tick, never released): a changed history ends the stream before anything
else is released. A column declared `history: mutable` instead keeps a
record, per stream, of the groups each unit has used (under an HMAC of the unit
with a secret of the stream), and each tick bounds a unit by what its record has
left; there rows arriving later for a released step are ignored. Releases never
change.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import math
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.accounting import Cost, zcdp_rho
from dpsql.errors import IntegrityError, QueryRefused
from dpsql.lru import WeightedLru
from dpsql.mechanisms.base import OutOfRange
from dpsql.mechanisms.continual import (
    EXACT_HORIZON,
    PRECISION_BITS,
    BinaryTree,
    ContinualStream,
    ExactFactorization,
    NoiseMismatch,
    column_norm_squared,
    keyed_generator,
    laplace_tree,
)
from dpsql.policy import Column, ContinualSpec, Table
from dpsql.results import Accuracy, Release
from dpsql.sql.analysis import Analysis
from dpsql.sql.analyze import analyze
from dpsql.sql.check import AGGREGATES, check_clauses, check_query, over_the_release
from dpsql.sql.intervals import Interval
from dpsql.sql.plan import beyond_the_sampler, exact_integers, sum_grid
from dpsql.sql.ranges import conjuncts
from dpsql.sql.rewrite import DIGEST_DIALECTS, SumGrid, rewrite
from dpsql.sql.temporal import holds_date

MAX_HORIZON = 1 << 22
STATE_PREFIX = "stream:"
_FROM = "from"  # a tick's stored values are named by the step they start from
# The record of a stream that ended on a changed history: it sorts after `meta`, so the
# ticks' reads (names after the last tick decoded) find it.
_ENDED = "meta:ended"
# A standing query is planned again at every tick, and checking and analysing it
# cost more than the database's own incremental GROUP BY: streams planned before
# are kept, by everything their plan depends on, and so are their noise vectors
# (data-independent, derived from the stream's key), up to these sizes. So are
# the values released so far, and a tick reads only the ticks stored since
# (reading and decoding them all took a tick of an hourly stream from 4.4 ms
# CPU at 10 ticks to 12.9 ms at 2,000; reading them all, 3.9 ms; now 2.0 ms).
_PLANNED_STREAMS = 64
_NOISE_VALUES = 1 << 23
_RELEASED_VALUES = 1 << 22
# Texts standing for the step query's bounds in its per-dialect text, and a second pair
# that checks the template. For a date or timestamp column they are dates, as the bounds
# are: the rewrite reads a column that WHERE holds between two such constants as stored
# (temporal.held_by), which keeps the database's aggregation on the stored column (a
# tick cost 1.7x the raw query otherwise).
_BOUND_MARKERS = (("__dpsql_first_step__", "__dpsql_end_step__"),
                  ("__dpsql_first_probe__", "__dpsql_end_probe__"))  # fmt: skip
_DATE_MARKERS = (("1111-11-11", "2222-12-22"), ("1212-12-12", "2121-12-21"))


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# The stream's clock: dates and timestamps are released once their step has
# ended. Any value is safe (it is public and independent of the data); tests
# set it to replay time.
clock: Callable[[], dt.datetime] = _utc_now


def _refuse(construct: str, reason: str, hint: str) -> QueryRefused:
    return QueryRefused(construct, reason, hint)


@dataclass(frozen=True)
class _Shape:
    """A running-total query taken apart."""

    window: exp.Window
    alias: str
    aggregate: exp.Expression  # COUNT(*), COUNT(col) or SUM(col)
    order: exp.Column
    partition: exp.Column | None
    outputs: list[tuple[str, str]]  # (output name, "order" | "partition" | "total")


def plan_running(select: exp.Select, context: Any) -> RunningPlan | None:
    """The plan for a running-total query, or None when `select` has no window function
    but windows over the whole release (post-processing, left to the direct plan)."""
    windows = [window for window in select.find_all(exp.Window) if not over_the_release(window)]
    if not windows:
        return None
    planned = (
        _tree_key(select),
        context.policy.digest,
        context.policy.data_version,
        context.database,
        context.options,
        context.dialect,
        context.unique_units,
        _budget_without_delta(context),  # not the budget: hashing its Fractions cost more
    )
    stream = _planned.get(planned)
    if stream is not None:  # the same query, checked and planned under the same everything
        return RunningPlan(stream, context)
    # the stream is built from the window's parts alone: a clause it would drop
    # (a join, a CTE, QUALIFY, ...) is refused rather than silently ignored
    check_clauses(select)
    shape = _shape(select, windows)
    where = select.args.get("where")
    plain = _plain_query(shape, select.args["from_"].copy(), where.this if where else None)
    table = check_query(plain, context.policy)
    column = table.column(shape.order.name) if table is not None else None
    if column is None or column.continual is None:
        name = shape.order.name
        raise _refuse(
            f"a running total ordered by {name}",
            f"the policy declares no continual stream on {name}",
            f"ask the data owner for 'continual: {{step: 1 day, epsilon: 1.0}}' on {name}",
        )
    from dpsql.sql import bounded_table  # the package imports this module

    stream = _Stream.of(select, shape, bounded_table(table, context), column, context)
    _planned.put(planned, stream)
    return RunningPlan(stream, context)


def _tree_key(node: Any) -> Any:
    """An exact, hashable image of a parsed tree: each node's class and arguments.

    Hand-written: sqlglot's exact forms are its SQL, which copies the whole tree
    before printing it (a quarter of a millisecond at each tick, 13x this walk),
    and its serialisation (unhashable dicts); its own equality compares hashes
    of names folded to lower case.
    """
    if isinstance(node, exp.Expression):
        return (type(node), *[(name, _tree_key(value)) for name, value in node.args.items()])
    if isinstance(node, list):
        return tuple([_tree_key(value) for value in node])
    return node  # a name, flag or enum: hashable (sqlglot hashes the arguments too)


# shared by the sessions of a process (the wire server runs them in threads)
_planned = WeightedLru(_PLANNED_STREAMS)
_noises = WeightedLru(_NOISE_VALUES)  # weighed in values
# (ledger location, analyst, prefix, noise key) -> (last tick's name, the values released)
_decoded = WeightedLru(_RELEASED_VALUES)


def _shape(select: exp.Select, windows: list[exp.Window]) -> _Shape:
    if len(windows) > 1:
        raise _refuse(
            "several window functions",
            "dpsql releases one running total per query",
            "run one query per running total",
        )
    window = windows[0]
    inner = window.this
    if isinstance(inner, exp.Sum) and isinstance(inner.this, AGGREGATES):
        aggregate = inner.this  # SUM(COUNT(*)) OVER (...) over a GROUP BY
    elif isinstance(inner, exp.Count | exp.Sum):
        aggregate = inner  # COUNT(*) OVER (...) straight over the rows
    else:
        raise _refuse(
            f"the window function {inner.sql()}",
            "only running COUNTs and SUMs are answered",
            "write SUM(COUNT(*)) OVER (ORDER BY day) with GROUP BY day",
        )
    if not isinstance(aggregate, exp.Count | exp.Sum) or aggregate.find(exp.Distinct):
        raise _refuse(
            f"a running {aggregate.sql()}",
            "only running COUNT(*), COUNT(col) and SUM(col) are answered",
            "keep a running SUM and a running COUNT",
        )
    _check_frame(window)
    order = window.args.get("order")
    keys = order.expressions if order is not None else []
    if not keys:  # COUNT(*) OVER () straight over the rows
        raise _refuse(
            "a window without ORDER BY over the rows",
            "dpsql answers a window as a running total, OVER (ORDER BY day), or over the "
            "released aggregates of a GROUP BY, as SUM(COUNT(*)) OVER ()",
            "write SUM(COUNT(*)) OVER () with a GROUP BY for a total of the released counts",
        )
    if len(keys) != 1 or not isinstance(keys[0].this, exp.Column) or keys[0].args.get("desc"):
        raise _refuse(
            "this window's ORDER BY",
            "a running total is ordered by one column, ascending",
            "write OVER (ORDER BY day)",
        )
    partitions = window.args.get("partition_by") or []
    if len(partitions) > 1 or any(not isinstance(p, exp.Column) for p in partitions):
        raise _refuse(
            "this window's PARTITION BY",
            "running totals are kept per value of one column",
            "write OVER (PARTITION BY shop ORDER BY day)",
        )
    order_col = keys[0].this
    partition = partitions[0] if partitions else None
    outputs = []
    alias = "running_total"
    for item in select.expressions:
        node = item.this if isinstance(item, exp.Alias) else item
        if node is window:
            alias = item.alias_or_name if isinstance(item, exp.Alias) else alias
            outputs.append((alias, "total"))
        elif isinstance(node, exp.Column) and node.name.lower() == order_col.name.lower():
            outputs.append((item.alias_or_name, "order"))
        elif (
            isinstance(node, exp.Column)
            and partition is not None
            and node.name.lower() == partition.name.lower()
        ):
            outputs.append((item.alias_or_name, "partition"))
        else:
            raise _refuse(
                f"the select item {item.sql()}",
                "a running-total query returns the "
                "ordered column, the partition column and the running total",
                "remove it, or run it as a separate GROUP BY query",
            )
    _check_order(select, order_col)
    for key in ("having", "limit", "offset", "distinct"):
        if select.args.get(key):
            raise _refuse(
                f"{key.upper()} in a running-total query",
                "the stream's steps are released whole",
                f"remove the {key.upper()}",
            )
    _check_group(select, order_col, partition, aggregate is not inner)
    return _Shape(window, alias, aggregate, order_col, partition, outputs)


def _check_order(select: exp.Select, order: exp.Column) -> None:
    """ORDER BY may only restate the stream's own order (steps are released in it)."""
    ordering = select.args.get("order")
    for item in ordering.expressions if ordering is not None else []:
        node = item.this
        if item.args.get("desc") or not (
            isinstance(node, exp.Column) and node.name.lower() == order.name.lower()
        ):
            raise _refuse(
                f"ORDER BY {item.sql()} in a running-total query",
                f"the steps are released in the order of {order.name}",
                f"remove the ORDER BY, or write ORDER BY {order.name}",
            )


def _check_frame(window: exp.Window) -> None:
    spec = window.args.get("spec")
    if spec is None:
        return
    start, end = spec.args.get("start"), spec.args.get("end")
    unbounded = (
        str(start).upper() == "UNBOUNDED"
        and str(spec.args.get("start_side")).upper() == "PRECEDING"
    )
    to_current = end is None or str(end).upper() == "CURRENT ROW"
    if not (unbounded and to_current):
        raise _refuse(
            f"the window frame {spec.sql()}",
            "only running totals from the start of the stream are answered",
            "write ROWS UNBOUNDED PRECEDING or no frame",
        )


def _check_group(
    select: exp.Select, order: exp.Column, partition: exp.Column | None, nested: bool
) -> None:
    group = select.args.get("group")
    names = (
        {e.name.lower() for e in group.expressions if isinstance(e, exp.Column)} if group else set()
    )
    wanted = {order.name.lower()} | ({partition.name.lower()} if partition is not None else set())
    if (nested and names != wanted) or (not nested and group is not None):
        raise _refuse(
            "this GROUP BY",
            "a running total groups by its ordered column and its partition column only",
            f"write GROUP BY {', '.join(sorted(wanted))}",
        )


def _plain_query(
    shape: _Shape, source: str | exp.Expression, condition: exp.Expression | None
) -> exp.Select:
    """The per-step GROUP BY the running total sums, over `source` where `condition`: what
    the gate checks (the query's own FROM and WHERE), and what a step query analyses (the
    policy's table, without the watermark)."""
    keys = [shape.order] + ([shape.partition] if shape.partition else [])
    # built from copies for this call only: the builders need not copy them again
    plain = exp.select(*[k.copy() for k in keys], shape.aggregate.copy()).from_(source, copy=False)
    if condition is not None:
        plain = plain.where(condition.copy(), copy=False)
    return plain.group_by(*[k.copy() for k in keys], copy=False)


# -- the stream: domain, watermark, identity ---------------------------------


@dataclass(frozen=True)
class _Domain:
    """The ordered column's steps: start, width and count (the horizon).

    What is derived from the declaration is computed once (cached_property): a
    stream's domain is kept with its plan, and each tick reads these per row.
    """

    column: Column
    spec: ContinualSpec

    @cached_property
    def start(self) -> Any:
        lower = self.column.lower
        if self.column.type == "timestamp" and not isinstance(lower, dt.datetime):
            return dt.datetime.combine(lower, dt.time())
        return lower

    def steps_before(self, bound: Any) -> int:
        """How many whole steps end at or before `bound`."""
        span = bound - self.start
        if isinstance(span, dt.timedelta):
            return span // self.spec.step
        return math.floor(span / self.spec.step)

    @cached_property
    def horizon(self) -> int:
        if self.column.type == "date":
            return self.steps_before(self.column.upper + dt.timedelta(days=1))
        if self.column.type == "int":
            return self.steps_before(self.column.upper + 1)
        return self.steps_before(self._upper) + 1

    @property
    def _upper(self) -> Any:
        upper = self.column.upper
        if self.column.type == "timestamp" and not isinstance(upper, dt.datetime):
            return dt.datetime.combine(upper, dt.time())
        return upper

    def label(self, index: int) -> Any:
        return self.start + index * self.spec.step

    @cached_property
    def native(self) -> bool:
        """Whether each value of the column is a step of its own (days by the day, ints by 1).

        The step query then groups by the column itself, which the database
        does as fast as the raw GROUP BY; a computed step per row (bucket)
        cost 3.5x the raw query on DuckDB.
        """
        kind, step = self.column.type, self.spec.step
        return (kind == "date" and step == dt.timedelta(days=1)) or (kind == "int" and step == 1)

    def index(self, value: Any) -> int:
        """The 0-based step of a value the step query grouped by (its bucket, or the value)."""
        if not self.native:
            return int(value)
        if self.column.type == "int":
            return int(value) - int(self.start)
        if isinstance(value, dt.datetime):  # a timestamp column the policy declares a date
            value = value.date()
        return (value - self.start).days

    def bucket(self, column: exp.Column) -> exp.Expression:
        """SQL for the 0-based step of a row."""
        if self.column.type == "date":
            # DATEDIFF, not date - date: that is an INTERVAL in Spark and elsewhere
            offset = exp.DateDiff(
                this=column.copy(),
                expression=exp.cast(exp.convert(str(self.start)), "DATE"),
                unit=exp.var("DAY"),
            )
            width = self.spec.step.days
        elif self.column.type == "timestamp":
            seconds = exp.TimeToUnix(this=column.copy())
            start = self.start.replace(tzinfo=dt.UTC).timestamp()
            offset = exp.Sub(this=seconds, expression=exp.convert(start))
            width = self.spec.step.total_seconds()
        else:
            offset = exp.Sub(this=column.copy(), expression=exp.convert(self.start))
            width = self.spec.step
        return exp.Floor(this=exp.Div(this=exp.paren(offset), expression=exp.convert(width)))

    def text(self, bound: Any) -> str:
        """A bound's text in its SQL literal: ISO dates and times, numbers as Python prints
        them (as sqlglot does)."""
        if isinstance(bound, dt.datetime):
            return bound.isoformat(sep=" ")
        return bound.isoformat() if isinstance(bound, dt.date) else str(bound)

    def literal(self, text: str) -> exp.Expression:
        """The SQL literal of a bound of the column's type, from its text (see `text`): a
        float's as a DOUBLE, so that a template's marker is cast as the bound it stands
        for (spellings: a constant with a decimal point is a DOUBLE)."""
        if self.column.type == "float":
            return exp.cast(exp.Literal.number(text), exp.DataType.Type.DOUBLE)
        if self.column.type == "int":
            return exp.Literal.number(text)
        kind = exp.DataType.Type.DATE if self.column.type == "date" else exp.DataType.Type.TIMESTAMP
        # exp.DataType(this=...) rather than a type name, which exp.cast would parse
        return exp.Cast(this=exp.Literal.string(text), to=exp.DataType(this=kind))


def _watermark(
    where: exp.Expression | None, order: str, domain: _Domain
) -> tuple[Any, exp.Expression | None]:
    """Split WHERE into the upper bound on the ordered column and the rest (the stream's filter)."""
    bound = None
    rest = []
    for condition in conjuncts(where):
        columns = {c.name.lower() for c in condition.find_all(exp.Column)}
        if order.lower() not in columns:
            rest.append(condition)
            continue
        value = _upper_bound(condition, order, domain)
        if value is None:
            raise _refuse(
                f"the condition {condition.sql()}",
                f"a running total covers the stream "
                f"from its start; {order} may only be bounded above (the watermark)",
                f"write {order} < X to release the steps before X",
            )
        bound = value if bound is None else min(bound, value)
    filters = exp.and_(*rest) if rest else None
    return bound, filters


def _upper_bound(condition: exp.Expression, order: str, domain: _Domain) -> Any:
    if not isinstance(condition, exp.LT | exp.LTE):
        return None
    left, right = condition.this, condition.expression
    if not (isinstance(left, exp.Column) and left.name.lower() == order.lower()):
        return None
    literal = right.this if isinstance(right, exp.Cast) else right
    if not isinstance(literal, exp.Literal):
        return None
    kind = domain.column.type
    try:
        if kind == "date":
            value: Any = dt.date.fromisoformat(literal.this)
        elif kind == "timestamp":
            value = dt.datetime.fromisoformat(literal.this)
        else:
            value = float(literal.this) if literal.is_number else None
    except ValueError:
        value = None
    if value is None:
        raise _refuse(
            f"the condition {condition.sql()}",
            f"the bound is not a {kind} literal",
            f"compare {order} with a {kind} literal",
        )
    if isinstance(condition, exp.LTE) and kind in ("int", "date"):
        value = value + (1 if kind == "int" else dt.timedelta(days=1))
    return value


def _budget_without_delta(context: Any) -> bool:
    """Whether the analyst's budget has no delta: all that a stream's plan reads of it."""
    return context.budget is not None and not context.budget.delta


@dataclass(frozen=True)
class _Choice:
    """A stream's mechanism, the delta its Gaussian noise is converted with, and why."""

    mechanism: str  # one of policy.CONTINUAL_MECHANISMS
    delta: float  # 0 for the binary tree (pure epsilon)
    reason: str


def _choose(spec: ContinualSpec, column: str, context: Any) -> _Choice:
    """SET dpsql.continual (or connect(continual=...)) if set, else the policy's choice.

    The stream costs the epsilon the policy declares either way. A factorization
    the policy declares is converted with the policy's delta; one the analyst
    picks, with the session's dpsql.delta, which must be positive, as must the
    delta of the analyst's budget.
    """
    asked = context.options.continual
    mechanism = spec.mechanism if asked == "policy" else asked
    if asked == "policy":
        reason = f"the policy's choice for {column}"
    elif asked == spec.mechanism:
        reason = f"SET dpsql.continual = '{asked}', the policy's choice for {column} too"
    else:
        reason = (
            f"SET dpsql.continual = '{asked}' "
            f"(the policy's choice for {column} is {spec.mechanism})"
        )
    if mechanism == "binary":
        return _Choice(mechanism, 0.0, f"{reason}: pure epsilon, Laplace noise")
    delta = spec.delta if spec.mechanism == "factorization" else context.options.delta
    no_budget = _budget_without_delta(context)
    if no_budget or not delta:
        who = "your budget has no delta" if no_budget else "this session's dpsql.delta is 0"
        raise _refuse(
            f"a factorization stream on {column}",
            f"its Gaussian noise is (epsilon, delta)-DP and needs a delta > 0, but {who}",
            "SET dpsql.continual = 'binary' (the binary tree: pure epsilon, no delta)"
            + (
                ", or ask the data owner for a delta"
                if no_budget
                else ", or SET dpsql.delta = 1e-9"
            ),
        )
    return _Choice(mechanism, delta, f"{reason}: Gaussian noise, (epsilon, delta) = "
                   f"({spec.epsilon:g}, {delta:g}) through zCDP")  # fmt: skip


@dataclass
class _Stream:
    """One stream: what is counted, over which steps, with which counter, and its identity."""

    table: Table
    domain: _Domain
    shape: _Shape
    filters: exp.Expression | None
    watermark: Any
    partition_values: tuple[Any, ...]
    identity: str
    counter: BinaryTree | ExactFactorization
    cost: Cost
    grid: SumGrid | None
    sensitivity: int
    choice: _Choice
    mutable: bool  # history: mutable (a record per unit) rather than checked
    # the step query without its bounds on the ordered column, analysed once
    base: Analysis
    # per dialect: the unranked step query's text cut where its bounds go (see step_sql)
    templates: dict[str, list[str] | None] = field(default_factory=dict)
    # the labels of the steps released so far (each release lists every step)
    known_labels: list[Any] = field(default_factory=list)

    @classmethod
    def of(
        cls, select: exp.Select, shape: _Shape, table: Table, column: Column, context: Any
    ) -> _Stream:
        spec = column.continual
        domain = _Domain(column, spec)
        horizon = domain.horizon
        if not 1 <= horizon <= MAX_HORIZON:
            raise _refuse(
                f"a stream of {horizon:,} steps",
                f"dpsql keeps streams of 1 to {MAX_HORIZON:,} steps",
                "ask for a coarser continual step",
            )
        where = select.args.get("where")
        watermark, filters = _watermark(
            where.this if where is not None else None, shape.order.name, domain
        )
        partition_values: tuple[Any, ...] = (None,)
        if shape.partition is not None:
            declared = table.column(shape.partition.name)
            domain_values = declared.public_domain if declared is not None else None
            if domain_values is None:
                raise _refuse(
                    f"PARTITION BY {shape.partition.name}",
                    "running totals per key need the keys' public domain",
                    f"declare values: [...] for {shape.partition.name} in the policy",
                )
            partition_values = tuple(domain_values)
        contributions = (
            table.max_groups_per_unit * table.max_rows_per_unit if table.privacy_unit else 1
        )
        mutable = spec.history == "mutable"
        if mutable and not table.privacy_unit:
            raise _refuse(
                f"a stream on {table.name}.{column.name} with history: mutable",
                "its record of what each unit used needs a privacy unit: without one a row "
                "has no identity that outlives an update or a deletion",
                f"ask the data owner to declare a privacy_unit for {table.name} (a row id, "
                "with max_groups_per_unit: 1 and max_rows_per_unit: 1, protects rows)",
            )
        base = analyze(_plain_query(shape, table.name, filters), table)
        choice = _choose(spec, column.name, context)
        if choice.mechanism == "factorization" and horizon > EXACT_HORIZON:
            raise _refuse(
                f"a factorization stream of {horizon:,} steps",
                f"dpsql computes the factorization exactly over at most {EXACT_HORIZON:,} steps",
                "SET dpsql.continual = 'binary' (the binary tree, any horizon up to "
                f"{MAX_HORIZON:,} steps), or ask the data owner for a coarser continual step",
            )
        grid, sensitivity = None, contributions
        try:
            rho = _rho(spec, choice)
            if isinstance(shape.aggregate, exp.Sum):
                # per unit, not per group: a unit's rows all fall on the one stream
                grid, sensitivity = _sum_grid(
                    base.measurements[0].bounds, contributions, spec.epsilon, rho, horizon
                )
            counter, cost = _counter(spec, choice, horizon, sensitivity, rho, len(partition_values))
            _check_finite(counter, grid)
        except OutOfRange as exc:
            larger = f"declare a larger continual epsilon for {table.name}.{column.name}"
            family = "laplace" if choice.mechanism == "binary" else "gaussian"
            raise beyond_the_sampler(family, spec.epsilon, exc, larger) from None
        # the mechanism and its price are part of the identity: switching mechanism
        # is another stream, with its own charge, noise key and released steps. So is a
        # SUM's grid step: its released totals are stored in whole steps, which under
        # another step (another dpsql's grid) would be misread and continued wrongly.
        # And so is the sensitivity (a unit the database came to keep unique moves the
        # stream less): one noise key drawn at two scales would not be the noise of either.
        grid_step = [grid.step] if grid is not None else []
        # The factorization's release changed (exact integers up to the noise, see
        # ExactFactorization): a stream stored by the earlier noise path is not continued
        # by this one, it starts afresh (and is charged once more). The tree's is unchanged.
        # Its noise's parameters are part of it too: z drawn again at another variance or
        # lattice would be other noise beside q's already released.
        version = (
            ["factorization: exact, lattice-rounded", str(counter.sigma2), counter.exponent,
             PRECISION_BITS]
            if isinstance(counter, ExactFactorization)
            else []
        )  # fmt: skip
        identity = hashlib.sha256(
            json.dumps(
                [
                    table.name,
                    shape.order.name.lower(),
                    shape.partition.name.lower() if shape.partition is not None else None,
                    shape.aggregate.sql(dialect="duckdb", normalize=True),
                    filters.sql(dialect="duckdb", normalize=True) if filters is not None else None,
                    context.policy.digest,
                    context.policy.data_version,
                    context.database,  # one stream per database, its rows its own
                    [choice.mechanism, spec.epsilon, choice.delta, sensitivity],
                    # what the stored ticks hold (the exact totals checked, or a record of
                    # units) and how a unit is bounded: streams stored before either was
                    # kept start again
                    ["history", spec.history],
                    *grid_step,
                    *version,
                ]
            ).encode()
        ).hexdigest()[:32]
        return cls(
            table,
            domain,
            shape,
            filters,
            watermark,
            partition_values,
            identity,
            counter,
            cost,
            grid,
            sensitivity,
            choice,
            mutable,
            base,
        )

    def complete_steps(self) -> int:
        """Steps released by now: those ended before the watermark and, for times, the clock."""
        bounds = [] if self.watermark is None else [self.watermark]
        now = clock().astimezone(dt.UTC).replace(tzinfo=None)
        if self.domain.column.type == "date":
            bounds.append(now.date())
        elif self.domain.column.type == "timestamp":
            bounds.append(now)
        done = min((self.domain.steps_before(b) for b in bounds), default=self.domain.horizon)
        return max(0, min(done, self.domain.horizon))

    def labels(self, count: int) -> list[Any]:
        """The labels of the first `count` steps (kept: every release lists every step)."""
        known = self.known_labels
        if len(known) < count:
            known = known + [self.domain.label(i) for i in range(len(known), count)]
            self.known_labels = known  # replaced whole, never extended in place: threads share it
        return known[:count]

    @property
    def unit(self) -> float:
        """A released total's unit: the SUM's grid step, or 1 for counts."""
        return self.grid.step if self.grid is not None else 1.0

    @cached_property
    def deviation(self) -> np.ndarray:
        """Each step's standard deviation in the counter's units (closed form)."""
        return np.sqrt(self.counter.variance())

    @cached_property
    def accuracy(self) -> Accuracy:
        """The running total's accuracy: a closed form, the same at every tick."""
        largest = float(self.deviation.max() * self.unit)
        note = (
            f"per-step standard deviation from {self.deviation[0] * self.unit:.4g} to "
            f"{largest:.4g} (closed form); it varies with the step"
        )
        return Accuracy(self.counter.name, largest, None, float(self.sensitivity * self.unit), note)

    def step_sql(self, done: int, steps: int, context: Any, seed: int) -> str:
        """One bounded GROUP BY of the per-step values of the first `steps` steps, its
        rows chosen within a step by the keyed hash of `seed`.

        By default every step from the start is read: the released ones, to check that
        they still have the totals released, and with a privacy unit every step is
        ranked, so that each unit keeps its earliest steps. With `history: mutable`
        only the steps after the `done` ones already released are read, one row per
        unit and group (the record bounds each unit further).
        """
        ranked = self.table.privacy_unit is not None and not self.table.unique_unit
        bounds = (self.domain.label(done if self.mutable else 0), self.domain.label(steps))
        # Ranking (and the digest) keys its hash with the stream's secret, which a
        # template shared by the streams of several analysts cannot hold: that query is
        # built anew. Otherwise only the bounds change from tick to tick, and building
        # the query (analysis, rewrite, SQL generation) cost more than a tenth of
        # the database's own GROUP BY over a million rows: it is built once per
        # dialect with marker bounds, and each tick writes its bounds into it.
        texts = [self.domain.text(bound) for bound in bounds]
        # the template was built with bounds the rewrite takes as held (_DATE_MARKERS):
        # only bounds it takes as held too may be written into it
        usable = (
            not ranked
            and not self.digested(context.dialect)  # its hash is keyed by the stream's secret
            and (not self._temporal or all(holds_date(t) for t in texts))
        )
        pieces = self._template(context.dialect) if usable else None
        if pieces is None:
            literals = [self.domain.literal(text) for text in texts]
            return self._step_query(*literals, context.dialect, seed)
        return _filled(pieces, texts)

    def digested(self, dialect: str) -> bool:
        """Whether the step query gives each step a digest of which unit adds what (see
        rewrite's digest_seed), besides its total: by default, for a table with a unit."""
        return (
            not self.mutable
            and self.table.privacy_unit is not None
            and (dialect in DIGEST_DIALECTS)
        )

    @property
    def _temporal(self) -> bool:
        return self.domain.column.type in ("date", "timestamp")

    def _template(self, dialect: str) -> list[str] | None:
        """The unranked step query's text cut where its bounds' texts go (each may appear
        more than once: a guarded date is also compared inside the source), built on
        first use; None when the analyst wrote a marker too, which the check finds:
        the template filled with the second pair of markers must be the query built
        with them."""
        if dialect not in self.templates:
            markers, probes = _DATE_MARKERS if self._temporal else _BOUND_MARKERS
            # nothing is ranked, so the rewrite reads no secret: 0 stands for it
            built = [
                self._step_query(*[self.domain.literal(t) for t in pair], dialect, 0)
                for pair in (markers, probes)
            ]
            pieces = re.split(f"({re.escape(markers[0])}|{re.escape(markers[1])})", built[0])
            # the markers at odd places, as 0 and 1: which bound goes there
            pieces[1::2] = [str(markers.index(marker)) for marker in pieces[1::2]]
            # one assignment, so sessions in other threads see no half-built entry
            self.templates[dialect] = pieces if _filled(pieces, probes) == built[1] else None
        return self.templates[dialect]

    def _step_query(
        self, first: exp.Expression, end: exp.Expression, dialect: str, seed: int
    ) -> str:
        """The step query over the rows with `first` <= order < `end` (two SQL literals)."""
        order = exp.column(self.base.keys[0].expression.name, quoted=True)
        # The analyst's parts went through analyze (self.base); the bounds on
        # the ordered column and the step of a row are ours (literals of its
        # declared type; a date difference or a number over a positive
        # constant, never an error), so they are added to the analysis: the
        # step replaces the ordered column as the first group key, unless every
        # value is its own step. The rewrite copies what it embeds.
        inside = exp.and_(
            exp.GTE(this=order.copy(), expression=first),
            exp.LT(this=order.copy(), expression=end),
        )
        base = self.base
        where = inside if base.where is None else exp.and_(exp.paren(base.where.copy()), inside)
        bucket = order.copy() if self.domain.native else self.domain.bucket(order)
        keys = [replace(base.keys[0], expression=bucket, domain=None), *base.keys[1:]]
        analysis = replace(base, where=where, keys=keys)
        grids = {0: self.grid} if self.grid is not None else {}
        return rewrite(
            analysis,
            grids,
            dialect,
            seed,
            False,
            earliest_groups=True,
            per_unit=self.mutable,
            # its own secret beside the rows' (seed) and the groups' (seed + 1)
            digest_seed=seed + 2 if self.digested(dialect) else None,
        )


def _filled(pieces: list[str], bounds: list[str] | tuple[str, str]) -> str:
    """A step query's template with its bounds' texts written in."""
    return "".join(bounds[int(p)] if i % 2 else p for i, p in enumerate(pieces))


def _rho(spec: ContinualSpec, choice: _Choice) -> float | None:
    """The factorization's zCDP rho, the largest within (epsilon, delta); None for the tree.
    OutOfRange when none converts to within them (a tiny epsilon and a tiny delta)."""
    if choice.mechanism == "binary":
        return None
    rho = zcdp_rho(spec.epsilon, choice.delta)
    if not rho:
        raise OutOfRange(f"no zCDP rho converts to within delta {choice.delta:g}")
    return rho


def _sum_grid(
    bounds: Interval, contributions: int, epsilon: float, rho: float | None, horizon: int
) -> tuple[SumGrid, int]:
    """A running SUM's grid step, and how far one unit moves the stream, in grid steps.

    sum_grid makes the step about the noise scale / 2^20, reading the scale as
    magnitude / epsilon: Laplace's, the tree's. The factorization's scale is its sigma,
    magnitude * ||R|| / sqrt(2 rho), which stops growing as epsilon shrinks once the
    conversion to (epsilon, delta) is limited by delta (epsilon about delta or below).
    There epsilon's step outgrew sigma's without bound: beyond any row, so each row
    was 0 or 1 step, and the noise, the same number of steps whatever epsilon, was
    multiplied by a step of 2^986 at epsilon 1e-300 (magnitude 1200): releases of
    1e308 or inf. So where epsilon's step is coarser than both a row's bound and
    sigma / 2^20, the step is about sigma / 2^20. (A step beyond a row's bound still
    inflates the noise by step / bound, as sum_grid does for Laplace at tiny
    epsilons: no more than at the epsilon where the two steps meet.) Everywhere else
    it is epsilon's, as it always was, and so are the releases, bit for bit.
    """
    grid, steps = _grid(bounds, contributions, epsilon)
    # ||R|| >= 1: at epsilon >= sqrt(2 rho), epsilon's step is the finer
    if rho is not None and grid.step > bounds.magnitude and epsilon < math.sqrt(2 * rho):
        sigma_epsilon = math.sqrt(2 * rho / column_norm_squared(horizon))
        if epsilon < sigma_epsilon:
            grid, steps = _grid(bounds, contributions, sigma_epsilon)
    return grid, steps


def _grid(bounds: Interval, contributions: int, epsilon: float) -> tuple[SumGrid, int]:
    """sum_grid for one stream, with a step of inf where it would overflow a float (bounds
    near float's range over a tiny epsilon): `_check_finite` refuses it."""
    try:
        return sum_grid(bounds, contributions, 1, epsilon)
    except OverflowError:
        return SumGrid(math.inf, bounds), 1


def _check_finite(counter: BinaryTree | ExactFactorization, grid: SumGrid | None) -> None:
    """OutOfRange when the noise, in the column's units, could overflow a float: a running
    SUM of values near float's range at a small epsilon (it released inf)."""
    if isinstance(counter, ExactFactorization):
        deviation = counter.sigma * counter.norm  # r_T's, the largest
    else:  # each eta_t sums at most one estimate per level, none noisier than a node
        deviation = math.sqrt(counter.levels * counter.node_variance)
    deviation *= grid.step if grid is not None else 1.0
    # a release beyond 2^10 standard deviations has a probability below e^-700
    if not deviation * 2.0**10 < math.inf:  # inf or NaN (0 noise on an infinite step)
        raise OutOfRange(
            f"noise of standard deviation {deviation:.4g} cannot be drawn exactly "
            "(releases would be beyond float range)"
        )


def _counter(
    spec: ContinualSpec,
    choice: _Choice,
    horizon: int,
    sensitivity: int,
    rho: float | None,
    partitions: int,
) -> tuple[BinaryTree | ExactFactorization, Cost]:
    """The stream's counter, its noise prepared (OutOfRange now, before the charge)."""
    if rho is None:
        return laplace_tree(horizon, spec.epsilon, sensitivity), Cost.of(spec.epsilon)
    counter = ExactFactorization(horizon, rho, sensitivity, partitions)
    counter.prepare()
    return counter, Cost.of(spec.epsilon, choice.delta)


# -- the plan -----------------------------------------------------------------


class RunningPlan:
    """Running totals from a continual counter: charged once per stream, then free."""

    # Each run releases the steps completed since: never answer it from the release cache.
    cacheable = False

    def __init__(self, stream: _Stream, context: Any):
        self.stream = stream
        self.prefix = f"{STATE_PREFIX}{stream.identity}:"
        meta = context.stored.get(f"{self.prefix}meta")
        self.meta: dict[str, Any] | None = json.loads(meta) if meta is not None else None
        self.key = self.meta["key"] if self.meta is not None else None
        self.past = _released(context.stored, self.prefix, self.key, len(stream.partition_values))
        if self.past.ended:
            raise _ended(stream)
        self.released = self.past.values
        self.steps = stream.complete_steps()
        self.cost = stream.cost if self.key is None else Cost()
        # Which of a unit's rows a step keeps is chosen by a keyed hash: one secret for
        # the whole stream, so that a released step measured again gives its total again
        # unless its rows changed (a fresh secret per tick would choose other rows).
        self.seed = self.meta.get("rows", 0) if self.meta is not None else context.seed
        self._stored = context.stored
        self._context = context
        # the step query's row: the step, the partition, the unit (mutable), the
        # step's value, its digest (digested)
        self._value = 1 + (stream.shape.partition is not None) + stream.mutable
        self.digested = stream.digested(context.dialect)
        self.sql = (
            stream.step_sql(self.done, self.steps, context, self.seed)
            if self.steps > self.done
            else None
        )

    @property
    def done(self) -> int:
        return self.released.shape[1]

    def release(self, columns: list[str], rows: list[tuple], rng: np.random.Generator) -> Release:
        state = {}
        if self.key is None:
            self.key = int(rng.integers(0, 1 << 63)) << 63 | int(rng.integers(0, 1 << 63))
            self.meta = {"key": self.key, "rows": self.seed}
            if self.stream.mutable:  # from the OS: no test seed makes units' keys guessable
                self.meta["units"] = secrets.token_hex(32)
            state[f"{self.prefix}meta"] = json.dumps(self.meta)
        values = self.released
        notes = [
            f"running totals over {self.stream.domain.horizon} steps from a "
            f"{self.stream.counter.name}; "
            + (
                "rows arriving later for a released step are ignored and each unit is "
                "bounded by a record of what it used, so releases never change"
                if self.stream.mutable
                else "a released step whose rows change ends the stream, so releases never change"
            )
        ]
        if self.steps > self.done:
            fresh, kept = self._extend(rows)
            # named by the step it starts from: of two releases built on the same released
            # steps (concurrent sessions), the ledger keeps the first and withholds the other
            state[f"{self.prefix}{_FROM}{self.done:08d}"] = json.dumps(
                {"released": fresh.tolist(), **kept}
            )
            values = np.concatenate([values, fresh], axis=1)
        values = values[:, : self.steps]  # a lower watermark shows fewer of the released steps
        return Release(self._columns(), self._rows(values), self._accuracy(), notes, state=state)

    def _extend(self, rows: list[tuple]) -> tuple[np.ndarray, dict[str, Any]]:
        """Noisy running totals for steps done+1..steps, per partition, and what is stored
        with them: the new steps' exact values (the check of later ticks; a factorization
        computes its later steps from them, and from their q, stored too), and under
        `history: mutable` the groups each unit used."""
        width, new = len(self.stream.partition_values), self.steps - self.done
        kept: dict[str, Any] = {}
        if self.stream.mutable:
            exact, kept["used"] = self._bounded_by_record(rows)
        else:
            measured, digests = self._totals(rows, self.steps)
            self._check_history(measured[:, : self.done], digests[:, : self.done])
            exact = measured[:, self.done :]
            if self.digested:
                kept["digest"] = digests[:, self.done :].tolist()
        kept["exact"] = exact.tolist()
        fresh = np.zeros((width, new))
        counter = self.stream.counter
        if isinstance(counter, ExactFactorization):
            kept["quantized"] = []
            past = self.past
            for part in range(width):
                exact_past = past.exact[part] if past.exact is not None else []
                quantized_past = past.quantized[part] if past.quantized is not None else []
                last = float(self.released[part, -1]) if self.done else None
                if len(exact_past) != self.done:  # ticks of another format before
                    raise _not_continued(self.stream, "its stored steps do not match")
                try:
                    quantized, fresh[part] = counter.extend(
                        exact_past, quantized_past, self._noise(part), kept["exact"][part], last
                    )
                except NoiseMismatch as exc:
                    raise _not_continued(self.stream, str(exc)) from None
                kept["quantized"].append(quantized)
            return fresh, kept
        for part in range(width):
            stream = ContinualStream(counter, self.key, part, noise=self._noise(part))
            if self.done:
                last = self.released[part, -1]
                stream.resume(self.done, last - float(stream.noise[self.done - 1]))
            fresh[part] = stream.extend(exact[part])
        return fresh, kept

    def _cells(self, rows: list[tuple], first: int, count: int) -> tuple[list, list, list]:
        """The step (from `first`), partition and row of each of the step query's rows in
        steps first..first+count-1 and the stream's partitions."""
        width = len(self.stream.partition_values)
        where = {_key(v): i for i, v in enumerate(self.stream.partition_values)}
        steps, parts, kept = [], [], []
        for row in rows:
            step = self.stream.domain.index(row[0]) - first
            part = where.get(_key(row[1])) if width > 1 else 0
            if part is not None and 0 <= step < count:
                steps.append(step)
                parts.append(part)
                kept.append(row)
        return steps, parts, kept

    def _totals(self, rows: list[tuple], count: int) -> tuple[np.ndarray, np.ndarray]:
        """The exact total of each partition and of the first `count` steps, and their
        digests (0 where the step query has none). A digest is below 2^31 times the
        rows counted: int64."""
        shape = (len(self.stream.partition_values), count)
        exact, digests = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
        steps, parts, kept = self._cells(rows, 0, count)
        if kept:
            at = (np.array(parts, dtype=np.int64), np.array(steps, dtype=np.int64))
            np.add.at(exact, at, exact_integers([row[self._value] for row in kept]))
            if self.digested:
                np.add.at(digests, at, [int(row[self._value + 1] or 0) for row in kept])
        return exact, digests

    def _check_history(self, measured: np.ndarray, digests: np.ndarray) -> None:
        """End the stream if a released step's exact total, or its digest, is not the one
        stored with it.

        The stream then stores that it ended (the first changed step for the data
        owner, who holds the data anyway) and raises; every later run refuses it from
        that record, without reading the data. See docs/continual.md for what the end
        discloses and why it is at most once per stream.
        """
        if not self.done:
            return
        stored = [self.past.exact, *([self.past.digest] if self.digested else [])]
        if any(kept is None or any(len(part) != self.done for part in kept) for kept in stored):
            raise _not_continued(self.stream, "its stored steps carry no exact totals to check")
        differs = np.array(stored[0], dtype=np.int64) != measured
        if self.digested:
            differs |= np.array(stored[1], dtype=np.int64) != digests
        changed = np.flatnonzero(differs.any(axis=0))
        if changed.size:
            step = int(changed[0])
            record = {
                "first_changed_step": step,
                "label": self.stream.domain.text(self.stream.domain.label(step)),
                "released_steps": self.done,
                "ended_at": clock().isoformat(),
            }
            self._stored.keep(f"{self.prefix}{_ENDED}", json.dumps(record))
            raise _ended(self.stream)

    def _bounded_by_record(self, rows: list[tuple]) -> tuple[np.ndarray, dict[str, str]]:
        """The new steps' exact totals, each unit keeping of its new groups (one row of
        the step query each, earliest first) only as many as its record has left, and the
        groups each unit used now (encoded for the stored tick)."""
        new = self.steps - self.done
        exact = np.zeros((len(self.stream.partition_values), new), dtype=np.int64)
        steps, parts, kept = self._cells(rows, self.done, new)
        if not kept:
            return exact, _encode_used(_NO_UNITS)
        secret = bytes.fromhex(self.meta["units"])
        keys: dict[Any, int] = {}
        units = np.array(
            [keys[u] if u in keys else keys.setdefault(u, _unit_key(secret, u))
             for u in (row[self._value - 1] for row in kept)],
            dtype=np.int64,
        )  # fmt: skip
        values = exact_integers([row[self._value] for row in kept])
        step, part = np.array(steps, dtype=np.int64), np.array(parts, dtype=np.int64)
        order = np.lexsort((part, step, units))  # each unit's groups, earliest first
        units, step, part, values = units[order], step[order], part[order], values[order]
        record = self.past.record
        left = self.stream.table.max_groups_per_unit - record.used(units)
        first = np.r_[True, units[1:] != units[:-1]]
        index = np.arange(units.size)
        rank = index - np.maximum.accumulate(np.where(first, index, 0))
        keep = rank < left
        np.add.at(exact, (part[keep], step[keep]), values[keep])
        used, groups = np.unique(units[keep], return_counts=True)
        return exact, _encode_used(_Record(used, groups))

    def _noise(self, part: int) -> np.ndarray:
        """The stream's noise for one partition, from the cache or derived from its key:
        the tree's eta, or the factorization's z (in lattice units)."""
        stream = self.stream
        cached = (stream.identity, self.key, part, stream.sensitivity, stream.domain.horizon)
        noise = _noises.get(cached)
        if noise is None:
            noise = stream.counter.noise(keyed_generator(self.key, part))
            noise.flags.writeable = False
            _noises.put(cached, noise, len(noise))
        return noise

    def _columns(self) -> list[str]:
        return [name for name, _ in self.stream.shape.outputs]

    def _rows(self, values: np.ndarray) -> list[tuple]:
        """One row per step and partition, in step order, from the (partitions, steps) values."""
        width, count = values.shape
        grid = self.stream.grid
        # counts rounded half to even, sums scaled by a power of two: exact, in one numpy call
        shown = np.rint(values).astype(np.int64) if grid is None else values * grid.step
        cells = {
            "order": [label for label in self.stream.labels(count) for _ in range(width)],
            "partition": self.stream.partition_values * count,
            "total": shown.T.ravel().tolist(),  # step by step, partitions within a step
        }
        return list(zip(*(cells[kind] for _, kind in self.stream.shape.outputs), strict=True))

    def _accuracy(self) -> dict[str, Accuracy]:
        return {self.stream.shape.alias: self.stream.accuracy}

    def explain(self) -> list[tuple[str, str]]:
        stream = self.stream
        deviation, unit = stream.deviation, stream.unit
        charged = f"{stream.cost}, once for the whole horizon"
        # The stream's secret keys which rows a step keeps and its digest, at every tick:
        # shown, it would let a writer aim a change at the digest. The query shown has
        # this plan's own secret instead, which no release uses.
        context = self._context
        sql = self.sql and stream.step_sql(self.done, self.steps, context, context.seed)
        return [
            ("sql", sql or "none: every complete step is already released"),
            ("mechanism", f"{stream.counter.name}, {stream.choice.reason}"),
            (
                "horizon",
                f"{stream.domain.horizon} steps of {stream.domain.spec.step} from "
                f"{stream.domain.start}; {self.steps} complete, {self.done} released before",
            ),
            ("cost", charged if self.key is None else f"none: the stream was charged ({charged})"),
            ("sensitivity", f"{stream.sensitivity * unit:g} per unit over the whole stream"),
            (  # not the record's size: how many units it holds is not noisy
                "history",
                "mutable: each unit bounded by a record of the groups it used"
                if stream.mutable
                else "append-only, checked: a released step whose rows change ends the stream",
            ),
            (
                "per-step error",
                f"standard deviation {deviation.mean() * unit:.4g} on average, "
                f"{deviation.max() * unit:.4g} at most",
            ),
        ]


@dataclass(frozen=True)
class _Record:
    """What each unit of a `history: mutable` stream has used: the groups (steps, or steps
    and partitions) counted for it so far, by the unit's key (`_unit_key`), keys sorted.

    Two units whose keys collide (64 bits: about 3e-8 for a million units) share one
    record: each is bounded by less, never by more.
    """

    keys: np.ndarray  # int64, sorted, unique
    groups: np.ndarray  # int64, beside keys

    def used(self, keys: np.ndarray) -> np.ndarray:
        """The groups each of `keys` used (0 for a unit not seen before)."""
        if not self.keys.size:
            return np.zeros(keys.size, dtype=np.int64)
        at = np.searchsorted(self.keys, keys)
        found = at < self.keys.size
        found[found] = self.keys[at[found]] == keys[found]
        return np.where(found, self.groups[np.minimum(at, self.keys.size - 1)], 0)

    def plus(self, other: _Record) -> _Record:
        """This record with `other`'s groups added (one tick's, its keys sorted and unique)."""
        at = np.searchsorted(self.keys, other.keys)
        found = at < self.keys.size
        found[found] = self.keys[at[found]] == other.keys[found]
        groups = self.groups.copy()  # records are shared with the ticks of other threads
        groups[at[found]] += other.groups[found]
        fresh = ~found
        return _Record(
            np.insert(self.keys, at[fresh], other.keys[fresh]),
            np.insert(groups, at[fresh], other.groups[fresh]),
        )


_NO_UNITS = _Record(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def _unit_key(secret: bytes, unit: Any) -> int:
    """A unit's key in its stream's record: HMAC-SHA256 under the stream's secret, first 8
    bytes (the raw unit is never stored; the record's size, 16 bytes a unit in memory)."""
    digest = hmac.digest(secret, repr(unit).encode(), "sha256")
    return int.from_bytes(digest[:8], "little", signed=True)


def _encode_used(record: _Record) -> dict[str, str]:
    """A tick's groups per unit for the stored tick: little-endian int64 keys and int32
    counts, base64 (a tenth of JSON's digits, decoded by numpy in one call)."""
    return {
        "units": base64.b64encode(record.keys.astype("<i8").tobytes()).decode(),
        "groups": base64.b64encode(record.groups.astype("<i4").tobytes()).decode(),
    }


def _decode_used(used: dict[str, str]) -> _Record:
    return _Record(
        np.frombuffer(base64.b64decode(used["units"]), dtype="<i8").astype(np.int64),
        np.frombuffer(base64.b64decode(used["groups"]), dtype="<i4").astype(np.int64),
    )


@dataclass(frozen=True)
class _Past:
    """A stream's stored ticks, decoded: the values released so far (partitions, steps);
    the exact per-step values (per partition, Python integers) the check compares with
    and a factorization computes its later steps from, and its q; the record of what
    each unit used (`history: mutable`); and whether the stream ended."""

    values: np.ndarray
    exact: tuple[list[int], ...] | None = None
    quantized: tuple[list[int], ...] | None = None
    record: _Record = _NO_UNITS
    digest: tuple[list[int], ...] | None = None
    ended: bool = False


def _released(stored: Any, prefix: str, key: int | None, width: int) -> _Past:
    """The values released so far, per partition, from the stored ticks in step order.

    The ledger never changes or drops one stored tick (clearing the cache drops
    the stream's meta with them, and the stream starts again under a new key),
    so the values decoded at an earlier tick of this process are kept, by
    ledger, analyst, stream and key, and only the ticks stored after the last
    one decoded are read: a tick's cost does not grow with the stream's age.
    (The names after the prefix are zero-padded digits, `from` and digits, or
    `meta` and `meta:ended`, which any database collation sorts as Python does.)

    Each tick must start where the ones before it end: ledgers written before
    ticks were named by their first step (`<prefix><last step>`) could hold two
    ticks built on the same steps, and such a stream is not released again.

    A tick is an object: its releases, its steps' exact values, a factorization's q,
    and the groups units used (`history: mutable`); ticks stored before the exact
    values were kept are the list of their releases.
    """
    kept_as = (*stored.owner, prefix, key)
    last, past = _decoded.get(kept_as) or ("", _Past(np.zeros((width, 0))))
    fresh = stored.find(prefix, after=last)
    fresh.pop(f"{prefix}meta", None)  # sorts after the ticks' names
    if fresh.pop(f"{prefix}{_ENDED}", None) is not None:
        return replace(past, ended=True)
    if not fresh:
        return past
    ticks, done = [past.values], past.values.shape[1]
    exact = [list(v) for v in past.exact] if past.exact is not None else None
    quantized = [list(v) for v in past.quantized] if past.quantized is not None else None
    digest = [list(v) for v in past.digest] if past.digest is not None else None
    record = past.record
    for name, payload in sorted(fresh.items()):  # zero-padded: old names sort first, as they came
        decoded = json.loads(payload)
        if isinstance(decoded, dict):
            exact = _appended(exact, decoded["exact"], width)
            if "quantized" in decoded:
                quantized = _appended(quantized, decoded["quantized"], width)
            if "digest" in decoded:
                digest = _appended(digest, decoded["digest"], width)
            if "used" in decoded:
                record = record.plus(_decode_used(decoded["used"]))
            decoded = decoded["released"]
        tick = np.array(decoded, dtype=np.float64).reshape(width, -1)
        suffix = name.rsplit(":", 1)[1]
        start = (
            int(suffix[len(_FROM) :]) if suffix.startswith(_FROM) else int(suffix) - tick.shape[1]
        )
        if start != done:
            raise IntegrityError(
                f"the stored steps of stream {name.split(':')[1]} do not follow each other "
                f"(a tick from step {start} after {done} steps): it is not released again. "
                "Instead: ask the data owner to bump data_version in the policy, which starts "
                "a new stream (and charges it once)"
            )
        ticks.append(tick)
        done += tick.shape[1]
        last = name
    values = np.concatenate(ticks, axis=1)
    values.flags.writeable = False  # shared with later ticks of the process
    past = _Past(
        values,
        tuple(exact) if exact is not None else None,
        tuple(quantized) if quantized is not None else None,
        record,
        tuple(digest) if digest is not None else None,
    )
    # Python integers (about 36 bytes each) beside the 8-byte floats; 16 bytes a unit
    weight = values.size * (1 + 5 * sum(v is not None for v in (exact, quantized, digest)))
    _decoded.put(kept_as, (last, past), weight + 2 * record.keys.size)
    return past


def _appended(kept: list[list[int]] | None, more: list[list[int]], width: int) -> list[list[int]]:
    """Per-partition lists of a stream's ticks with one more tick's appended, in place."""
    kept = kept if kept is not None else [[] for _ in range(width)]
    for part in range(width):
        kept[part].extend(more[part])
    return kept


def _ended(stream: _Stream) -> IntegrityError:
    column = f"{stream.table.name}.{stream.domain.column.name}"
    return IntegrityError(
        f"stream {stream.identity} has ended: a step it released no longer has the exact "
        "bounded total it was released from, so rows of released steps were updated, "
        "deleted or inserted late (the stream's bound on each unit holds only while they "
        "are not). Nothing more is released from it, and nothing says which step changed. "
        f"Instead: ask the data owner to declare history: mutable in the continual entry of "
        f"{column} (each unit is then bounded by a record of what it used), or to bump "
        "data_version in the policy: either starts a new stream, charged once afresh"
    )


def _not_continued(stream: _Stream, why: str) -> IntegrityError:
    return IntegrityError(
        f"stream {stream.identity} is not continued: {why}. Instead: ask the data owner to "
        "bump data_version in the policy, which starts a new stream (and charges it once)"
    )


def _key(value: Any) -> Any:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


__all__ = ["RunningPlan", "clock", "plan_running"]
