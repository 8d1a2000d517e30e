"""Order statistics: MIN, MAX, MEDIAN, PERCENTILE_CONT/DISC and quantile_cont/disc, planned
as a bounded histogram the database computes and an exact exponential mechanism in Python.

The rewrite is the one of COUNT(col) (sql/rewrite.py: the analyst's WHERE, each unit's
rows bounded to max_rows_per_unit per group and max_groups_per_unit groups by the keyed
hash), grouped by one more key: the bucket of the column's value over its declared
domain [lower, upper], clamped into it. One row per group and bucket comes back, never
a row of data; NULLs fall in no bucket (SQL's aggregates ignore them). Each quantile
is then `mechanisms.quantiles.exponential_quantile` over the buckets, with the rank
sensitivity of one unit: max_rows_per_unit values per group, times
max_groups_per_unit groups when the keys are grouped (composition, as the noisy counts
are).

A query with other aggregates (COUNT, SUM, AVG, VAR, STDDEV), or grouped by keys with
no public domain, is two releases (`QuantileStages`): first the direct plan of its
other aggregates, which selects the keys from the data (partition selection) when
they have no public domain, then the histogram of the keys that first release holds.
The query's epsilon is split evenly over every measurement of both (each noisy
measurement, the key selection, each quantile fraction) and charged once, before
either runs; the second release reads the data only through its own mechanism, and
which keys it releases is a post-processing of the first (sequential, adaptive
composition). The select list, HAVING, ORDER BY and LIMIT are then evaluated over the
released values (sql/postprocess.py), so they spend nothing.

A released quantile is a bucket of the grid, fixed by the policy and epsilon before the
data are read, released as its top (the upper edge; for int and date columns the largest
value in it): the point whose rank, the values in it and below, the mechanism scores.
PERCENTILE_CONT and PERCENTILE_DISC release the same (no value is interpolated from the
data). MIN and MAX are the quantiles MIN_Q and 1 - MIN_Q (docs/mechanisms.md says why a
DP MIN is not the data's minimum).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.accounting import Cost, set_aside, split_epsilon
from dpsql.errors import QueryRefused
from dpsql.mechanisms.base import OutOfRange
from dpsql.mechanisms.quantile_bounds import QuantileBounds, most_edges
from dpsql.mechanisms.quantiles import exponential_quantile, rank_error_bound
from dpsql.policy import Table
from dpsql.results import Accuracy, Release
from dpsql.sql.analysis import KEY_PREFIX, VALUE_PREFIX, Aggregate, Analysis, Measurement, Output
from dpsql.sql.analyze import analyze
from dpsql.sql.check import ORDER_STATISTICS
from dpsql.sql.keys import canonical_keys, key_kinds
from dpsql.sql.plan import (
    DirectPlan,
    Plan,
    _check_domain_size,
    _keys_passing_where,
    beyond_the_sampler,
    key_order,
)
from dpsql.sql.postprocess import project_rows
from dpsql.sql.quantile_grids import (
    WINDOW,
    Grid,
    Refined,
    declared_domain,
    lattice,
    uniform_grid,
)
from dpsql.sql.resolve import output_name
from dpsql.sql.rewrite import rewrite
from dpsql.sql.scalars import StagedPlan

MIN_Q = Fraction(1, 100)  # MIN and MAX are the 1st and 99th percentiles
# A refined quantile's first stage spends 1 / FIRST_STAGE of its epsilon: it need only
# land within sql/quantile_grids.WINDOW buckets of the quantile (docs/mechanisms.md).
FIRST_STAGE = 20
PICK_PREFIX = "__dpsql_pick"  # a first stage's released bucket, per quantile
# With SET dpsql.quantile_interval = on, each quantile spends 1 / INTERVAL_SHARE of its
# epsilon on its 95% value interval (mechanisms/quantile_bounds.py)
INTERVAL_SHARE = 10


@dataclass(frozen=True)
class Quantile:
    """One released quantile (or list of them) of the select list."""

    qs: tuple[Fraction, ...]
    listed: bool  # written as a list: released as a list
    name: str  # as written, for EXPLAIN and refusals


def plan_quantiles(select: exp.Select, table: Table, context: Any) -> Plan | None:
    """The plan of a query releasing order statistics; None for any other query."""
    if select.find(*ORDER_STATISTICS) is None:
        return None
    from dpsql.sql import bounded_table  # the package imports this module's planner

    for clause in ("where", "group"):
        part = select.args.get(clause)
        if part is not None and part.find(*ORDER_STATISTICS) is not None:
            raise _refuse(
                part,
                f"a quantile in {'GROUP BY' if clause == 'group' else 'WHERE'} is not supported",
                "select the quantile; HAVING and ORDER BY may read it",
            )
    analysis = analyze(select, bounded_table(table, context), quantiles=True)
    names = [output_name(item) for item in select.expressions]
    return quantile_plan(analysis, context, names)


def quantile_plan(analysis: Analysis, context: Any, names: list[str]) -> Plan:
    """The plan of an analysed query with quantile aggregates: one histogram alone when
    nothing else is measured and the keys are public (or absent), else two stages."""
    column, specs = _specs(analysis)
    options = context.options
    quantiles = sum(len(spec.qs) for spec in specs.values())
    direct = _direct_analysis(analysis)
    selection = analysis.grouped and not analysis.public_keys
    if not direct.measurements and not selection:
        return quantile_histograms(analysis, column, specs, context, names, options.epsilon)
    measured = len(direct.measurements) + selection
    # one equal share per measurement of either stage, read in binary by both
    share = split_epsilon(options.epsilon, measured + quantiles, binary_too=True)
    first = DirectPlan(
        direct,
        replace(options, epsilon=_portion(share, measured)),
        context.dialect,
        context.seed,
    )
    second_seed = (context.seed * 1_000_003 + 1) % 2**62  # a secret of its own

    def second(keys: list[tuple] | None) -> Plan:
        return quantile_histograms(
            analysis,
            column,
            specs,
            replace(context, seed=second_seed),
            names,
            _portion(share, quantiles),
            keys,
        )

    # planned before the first release: its keys are then the policy's, or none yet
    outer = second([] if selection else None)
    return QuantileStages([first], outer, [], lambda _: outer, plan_keys=second)


def _portion(share: float, parts: int) -> float:
    """The largest float within `parts` shares, as the ledger reads decimals: a stage's
    epsilon, which the stage splits again into (at least) `share` each."""
    portion = share * parts
    while Fraction(repr(portion)) > parts * Fraction(repr(share)):
        portion = math.nextafter(portion, 0.0)
    return portion


def _direct_indexes(analysis: Analysis) -> dict[int, int]:
    """Each aggregate that is not a quantile, by its index: its index in the first release."""
    kept = (i for i, agg in enumerate(analysis.aggregates) if agg.function != "quantile")
    return {index: position for position, index in enumerate(kept)}


def _direct_analysis(analysis: Analysis) -> Analysis:
    """The query's other aggregates, released by a DirectPlan as plain columns: each key,
    then each aggregate that is not a quantile (quantiles measure nothing, so the
    measurements are the query's own)."""
    kept = [agg for agg in analysis.aggregates if agg.function != "quantile"]
    outputs = [
        Output(f"{KEY_PREFIX}{i}", exp.column(f"{KEY_PREFIX}{i}"))
        for i in range(len(analysis.keys))
    ] + [Output(f"{VALUE_PREFIX}{j}", exp.column(f"{VALUE_PREFIX}{j}")) for j in range(len(kept))]
    return replace(
        analysis, aggregates=kept, outputs=outputs, having=None, order=[], limit=None, offset=None
    )


def _specs(analysis: Analysis) -> tuple[exp.Column, dict[int, Quantile]]:
    """The one column the quantiles read, and each quantile by its aggregate's index."""
    specs: dict[int, Quantile] = {}
    columns: dict[str, exp.Column] = {}
    for index, aggregate in enumerate(analysis.aggregates):
        if aggregate.function == "quantile":
            column, specs[index] = _quantile(aggregate.node)
            columns[column.name.lower()] = column
    if len(columns) > 1:
        raise QueryRefused(
            f"quantiles of several columns ({', '.join(sorted(columns))})",
            "one query builds one histogram, of one column",
            "query each column's quantiles separately",
        )
    return next(iter(columns.values())), specs


def _quantile(node: exp.Expression) -> tuple[exp.Column, Quantile]:
    """The column and the quantiles of one order-statistic aggregate."""
    name = node.sql()[:60]
    if isinstance(node, exp.WithinGroup):
        inner, order = node.this, node.expression
        if not isinstance(inner, exp.PercentileCont | exp.PercentileDisc):
            raise _refuse(node, "only PERCENTILE_CONT/DISC take WITHIN GROUP", _HINT)
        ordered = order.expressions if isinstance(order, exp.Order) else []
        if len(ordered) != 1 or ordered[0].args.get("desc"):
            raise _refuse(node, "it needs one ascending ORDER BY column", _HINT)
        argument, fraction = ordered[0].this, inner.this
    elif isinstance(node, exp.PercentileCont | exp.PercentileDisc):
        argument, fraction = node.this, node.expression
    else:
        argument = node.this
        q = {exp.Min: MIN_Q, exp.Max: 1 - MIN_Q}.get(type(node), Fraction(1, 2))
        fraction = exp.Literal.number(str(q.numerator / q.denominator))
    if not isinstance(argument, exp.Column):
        raise _refuse(node, "a quantile reads one bounded column", "write e.g. MEDIAN(income)")
    listed = isinstance(fraction, exp.Array)
    values = fraction.expressions if listed else [fraction]
    qs = tuple(_fraction(value, name) for value in values)
    if isinstance(node, exp.Min | exp.Max):
        qs = (MIN_Q if isinstance(node, exp.Min) else 1 - MIN_Q,)
    return argument, Quantile(qs, listed, name)


_HINT = "write PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY col) or quantile_cont(col, 0.5)"


def _fraction(value: exp.Expression, name: str) -> Fraction:
    if not (isinstance(value, exp.Literal) and value.is_number):
        raise QueryRefused(
            f"the quantile {name}",
            f"its fraction {value.sql()[:30]} is not a constant number",
            "write a constant between 0 and 1, e.g. quantile_cont(income, 0.9)",
        )
    q = Fraction(value.this)
    if not 0 < q < 1:
        raise QueryRefused(
            f"the quantile {name}",
            f"its fraction {value.this} is outside (0, 1)",
            "write a fraction strictly between 0 and 1; for the extremes use MIN or MAX",
        )
    return q


def _refuse(node: exp.Expression, reason: str, hint: str) -> QueryRefused:
    return QueryRefused(f"the aggregate {node.sql()[:60]}", reason, hint)


def quantile_histograms(
    analysis: Analysis,
    column: exp.Column,
    specs: dict[int, Quantile],
    context: Any,
    names: list[str],
    epsilon: float,
    given: list[tuple] | None = None,
) -> Plan:
    """The quantiles' histogram plan at `epsilon`: one histogram over a uniform grid, or,
    where a bucket of it may hold many rows, two (RefinedQuantiles)."""
    keys = _released_keys(analysis, given)
    parts = sum(len(spec.qs) for spec in specs.values())
    share = Fraction(split_epsilon(epsilon, parts, binary_too=True))
    domain = declared_domain(column, analysis.table)
    windows = max(1, len(keys) * parts)
    found = lattice(domain, share, windows)
    whole = (analysis, column, specs, context, names)
    if found is None:
        return QuantilePlan(*whole, epsilon, given, grid=uniform_grid(domain, share))
    first, rest = set_aside(epsilon, FIRST_STAGE)
    coarse = QuantilePlan(*whole, first, given, grid=found.coarse, picks=True)

    def refine(picks: set[int], counted: dict[tuple, np.ndarray] | None = None) -> QuantilePlan:
        grid = found.refined(picks, windows)
        return QuantilePlan(*whole, rest, given, grid=grid, first=counted)

    return RefinedQuantiles([coarse], refine(set()), [], refine, charged=Cost.of(epsilon, 0))


def _released_keys(analysis: Analysis, given: list[tuple] | None) -> list[tuple]:
    """The groups a quantile plan releases: `given`, or the policy's public keys (in
    key order), or the one group of an ungrouped query."""
    if given is not None:
        return list(given)
    if not analysis.grouped:
        return [()]
    _check_domain_size(analysis)
    domains = [key.domain for key in analysis.keys]
    keys = _keys_passing_where(analysis, list(itertools.product(*domains)))
    return [keys[i] for i in key_order(keys)]


@dataclass
class QuantilePlan:
    """Quantiles of one column, per group: a bounded histogram over `grid`, then the
    exponential mechanism per group and quantile (pure `epsilon`, split evenly over the
    quantiles).

    `given`: the groups to release, from an earlier release (QuantileStages); None: the
    policy's public keys (or the one group of an ungrouped query), and the select list,
    HAVING, ORDER BY and LIMIT are evaluated here. With `given`, the release holds the
    keys and each quantile aggregate's values, for QuantileStages to combine. `picks`:
    the first stage of RefinedQuantiles, whose release is each group's and quantile's
    candidate index, for the second stage's grid. `first`: that first stage's exact
    histograms (by key), read in the same snapshot: the second stage then reads only
    the rows of the groups it splits, and takes every other group's count from them."""

    analysis: Analysis
    column: exp.Column
    specs: dict[int, Quantile]  # by aggregate index
    context: Any
    names: list[str]  # the select list's names as written
    epsilon: float
    given: list[tuple] | None = None
    notes: list[str] = field(default_factory=list)
    grid: Grid | Refined | None = None
    picks: bool = False
    first: dict[tuple, np.ndarray] | None = None

    def __post_init__(self) -> None:
        analysis, table = self.analysis, self.analysis.table
        self.kinds = key_kinds(analysis)
        self.keys = _released_keys(analysis, self.given)
        parts = sum(len(spec.qs) for spec in self.specs.values())
        # the mechanism reads its share in binary: within the charged decimal too
        self.share = split_epsilon(self.epsilon, parts, binary_too=True)
        rows = table.max_rows_per_unit if table.privacy_unit else 1
        groups = table.max_groups_per_unit if analysis.grouped and table.privacy_unit else 1
        self.sensitivity = rows * groups
        # a value interval: numbers only (Accuracy's intervals are floats), one value a
        # row (a list's column has no single interval), and only where values release
        self.bounded = (
            self.context.options.quantile_interval == "on"
            and not self.picks
            and table.column(self.column.name).type in ("int", "float")
            and not any(spec.listed for spec in self.specs.values())
        )
        if self.grid is None:
            self.grid = uniform_grid(declared_domain(self.column, table), self.picking)
        self._bounds  # noqa: B018 -- refuses, before the charge, noise it cannot draw
        self.cost = Cost.of(self.epsilon, 0)
        counted = replace(
            analysis,
            measurements=[Measurement("count", self.column)],
            aggregates=[],
            outputs=[],
            having=None,
            order=[],
            limit=None,
            offset=None,
        )
        windows = self.first is not None
        self.sql = rewrite(
            counted,
            {},
            self.context.dialect,
            self.context.seed,  # the first stage's: each unit's rows chosen alike
            with_units=False,
            bucket=(self.grid.window_bucket if windows else self.grid.bucket)(self.column, table),
            bucket_rows=self.grid.in_windows(self.column, table) if windows else None,
        )

    @property
    def known_groups(self) -> int | None:
        return len(self.keys) if self.given is None or not self.analysis.grouped else None

    def histograms(self, rows: list[tuple]) -> dict[tuple, np.ndarray]:
        """Each released group's bucket counts, from the database's rows (a key outside
        the released ones, or a NULL bucket, counts nowhere)."""
        width = len(self.analysis.keys)
        table = np.zeros((len(self.keys), self.grid.size), dtype=np.int64)
        if width:
            slot = {key: i for i, key in enumerate(self.keys)}
            keys = canonical_keys([row[:width] for row in rows], self.kinds)
            kept = [
                (slot[key], row[width], row[width + 1])
                for key, row in zip(keys, rows, strict=True)
                if row[width] is not None and key in slot
            ]
        else:  # one group: each row is (bucket, count)
            kept = [(0, b, n) for b, n in rows if b is not None]
        if kept:
            groups, buckets, counts = (
                np.array(column, dtype=np.int64) for column in zip(*kept, strict=True)
            )
            np.add.at(table, (groups, self.grid.indexes(buckets)), counts)
        if self.first is not None:  # the groups kept whole: the first stage's counts
            whole, candidates = self.grid.whole_groups
            for i, key in enumerate(self.keys):
                table[i, candidates] += self.first[key][whole]
        return {key: table[i] for i, key in enumerate(self.keys)}

    @property
    def picking(self) -> Fraction:
        """Each quantile's epsilon for its exponential mechanism (all of its share, less
        the value interval's)."""
        share = Fraction(self.share)
        return share - share / INTERVAL_SHARE if self.bounded else share

    def quantiles(
        self, histograms: dict[tuple, np.ndarray], rng: np.random.Generator
    ) -> tuple[dict[int, list], dict[int, list]]:
        """Each quantile aggregate's released values (`picks`: candidate indexes), one per
        group of `self.keys`; and, where `bounded`, each one's 95% value interval."""
        epsilon = self.picking
        priors = {
            q: self.grid.prior(q, epsilon, self.sensitivity)
            for spec in self.specs.values()
            for q in spec.qs
        }
        bounds = self._bounds
        released: dict[int, list] = {index: [] for index in self.specs}
        intervals: dict[int, list] = {index: [] for index in self.specs} if self.bounded else {}
        for key in self.keys:
            counts = histograms[key]
            for index, spec in self.specs.items():
                picked = [
                    exponential_quantile(counts, q, epsilon, rng, priors[q], self.sensitivity)
                    for q in spec.qs
                ]
                values = picked if self.picks else [self.grid.value(i) for i in picked]
                released[index].append(values if spec.listed or self.picks else values[0])
                if self.bounded:
                    ((q,), (pick,)) = spec.qs, picked
                    edges = bounds[q].release(counts, self.grid.positions, pick, rng)
                    intervals[index].append(self._interval(edges))
        return released, intervals

    @property
    def span(self) -> int:
        return int(self.grid.positions[-1]) + 1

    @functools.cached_property
    def _bounds(self) -> dict[Fraction, QuantileBounds]:
        """Each quantile's value interval (none unless `bounded`), its noise built when
        the plan is: one it cannot draw is refused before the charge."""
        if not self.bounded:
            return {}
        aside = Fraction(self.share) - self.picking
        found = {
            q: QuantileBounds(q, aside, self.sensitivity, self.span)
            for spec in self.specs.values()
            for q in spec.qs
        }
        for bounds in found.values():
            try:
                bounds.noise.prepare()
            except OutOfRange as exc:
                larger = "SET dpsql.epsilon to a larger value or dpsql.quantile_interval = off"
                raise beyond_the_sampler("laplace", float(aside), exc, larger) from None
        return found

    def _interval(self, edges: tuple[int | None, int | None]) -> tuple[float, float]:
        """The values bounding a quantile, from its bounds' edges (None: the domain's end)."""
        lower, upper = self.grid.ends()
        low, high = edges
        return (
            float(lower if low is None else self.grid.value(low)),
            float(upper if high is None else self.grid.value(high)),
        )

    def release(self, columns: list[str], rows: list[tuple], rng: np.random.Generator) -> Release:
        return self.release_counts(self.histograms(rows), rng)

    def release_counts(
        self, histograms: dict[tuple, np.ndarray], rng: np.random.Generator
    ) -> Release:
        """The release of the exact histograms by key (`histograms`)."""
        released, intervals = self.quantiles(histograms, rng)
        if self.picks:  # RefinedQuantiles reads them: each group's picks, flat
            picks = [
                tuple(i for index in released for i in released[index][g])
                for g in range(len(self.keys))
            ]
            return Release([PICK_PREFIX], [(p,) for p in picks])
        if self.given is not None:  # QuantileStages combines it with the first release
            width = len(self.analysis.keys)
            names = [f"{KEY_PREFIX}{i}" for i in range(width)]
            names += [f"{VALUE_PREFIX}{index}" for index in released]
            out = [(*key, *(released[i][g] for i in released)) for g, key in enumerate(self.keys)]
            accuracy = {
                f"{VALUE_PREFIX}{index}": self._accuracy(self.specs[index].qs, found)
                for index, found in intervals.items()
            }
            return Release(names, out, accuracy=accuracy, notes=[self._note()])
        values = [_column(released[index]) for index in range(len(self.analysis.aggregates))]
        _, out_rows, groups = project_rows(self.analysis, self.keys, values)
        notes = [self._note(), *self.notes]
        kept = {index: [found[g] for g in groups] for index, found in intervals.items()}
        return Release(self.names, out_rows, accuracy=self.accuracy(kept), notes=notes)

    def accuracy(self, intervals: dict[int, list] | None = None) -> dict[str, Accuracy]:
        """The accuracy of each output that is a quantile as such, by its name; with
        `intervals` (by aggregate index, one per released row), its value intervals."""
        index = {id(aggregate): i for i, aggregate in enumerate(self.analysis.aggregates)}
        found = intervals or {}
        return {
            name: self._accuracy(
                self.specs[index[id(aggregate)]].qs, found.get(index[id(aggregate)])
            )
            for name, (_, aggregate) in zip(self.names, _outputs(self.analysis), strict=True)
            if aggregate is not None and aggregate.function == "quantile"
        }

    def _rank_bound(self, qs: Sequence[Fraction] | None = None) -> float:
        """The 95% rank bound of the quantile fractions `qs` (all the plan's: None), the
        widest of them (the one farthest from the median)."""
        qs = qs or [q for spec in self.specs.values() for q in spec.qs]
        q = max(qs, key=lambda q: max(q, 1 - q))
        return rank_error_bound(self.picking, self.sensitivity, self.grid.most, 0.05, q)

    def _accuracy(
        self, qs: Sequence[Fraction], intervals: list[tuple[float, float]] | None = None
    ) -> Accuracy:
        bound = self._rank_bound(qs)
        spread = max(max(q, 1 - q) for q in qs) * self.sensitivity
        values = (
            "; the interval holds the quantile with probability 95%: " + self._interval_text()
            if intervals is not None
            else ""
        )
        return Accuracy(
            mechanism="exponential",
            scale=float(2 * spread / self.picking),
            interval95=None,
            sensitivity=self.sensitivity,
            note=(
                f"95%: the value's rank is within {bound:.0f} of q·n (n: the group's "
                f"non-NULL values), beyond the grid's best bucket; {self.grid.describe()}" + values
            ),
            intervals=None if intervals is None else tuple(intervals),
            rank_interval95=bound,
        )

    def _interval_text(self) -> str:
        aside = float(Fraction(self.share) - self.picking)
        return (
            f"noisy rank distances at up to {most_edges(self.span)} edges around the release "
            f"(epsilon {aside:g} of its {self.share:g})"
        )

    def _note(self) -> str:
        return (
            f"quantiles by the exponential mechanism over {self.grid.describe()} "
            f"(rank sensitivity {self.sensitivity}, epsilon {self.share:g} each); a released "
            "value is a bucket of that grid, not a value of the data; an empty group "
            "releases a bucket chosen uniformly at random"
        )

    def explain(self) -> list[tuple[str, str]]:
        bound = self._rank_bound()
        lines = [
            ("sql", self.sql),
            ("cost", f"epsilon {self.epsilon:g} (pure)"),
            ("mechanism", "exponential mechanism over a bounded histogram, sampled exactly"),
            ("buckets", self.grid.describe()),
            ("rank sensitivity", str(self.sensitivity)),
            ("epsilon per quantile", f"{self.share:g}"),
            ("95% rank error", f"within {bound:.0f} ranks of the best bucket's"),
        ]
        if self.bounded:
            lines.append(("95% value interval", self._interval_text()))
        for spec in self.specs.values():
            fractions = ", ".join(f"{float(q):g}" for q in spec.qs)
            lines.append((
                f"measure {spec.name}",
                f"exponential, q {fractions}, epsilon {self.share:g} each, rank "
                f"sensitivity {self.sensitivity}",
            ))  # fmt: skip
        if self.analysis.grouped:
            where = "from the first release" if self.given is not None else "public domain"
            lines.append(("group keys", f"{where}: one quantile release per key"))
        return lines + [("note", note) for note in self.notes]


@dataclass
class RefinedQuantiles(StagedPlan):
    """Quantiles in two stages (sql/quantile_grids.py): the first (`parts`, 1 /
    FIRST_STAGE of the epsilon) picks each group's and quantile's bucket of a coarse
    grid; the second (`outer` before the picks, `finish_outer` after) releases over a
    grid refined around every pick, weighted by width. Both read the data through their
    own mechanism; the second's grid is a post-processing of the first's release, so
    the two compose sequentially (adaptively) to the epsilon `charged` once, before
    either runs."""

    charged: Cost = field(default_factory=lambda: Cost.of(0, 0))
    notes: list[str] = field(default_factory=list)  # as DirectPlan's: how it was read

    @property
    def cost(self) -> Cost:
        return self.charged

    def release_with(self, release: Callable[[Plan], Release], shared: bool = False) -> Release:
        """Both stages; in one snapshot (`shared`), the second reads only the rows of the
        groups it splits, its other groups' counts the first stage's, kept exact (never
        released) for it: each row is counted once, as by one histogram of the snapshot."""
        if not shared:
            return super().release_with(release)
        (coarse,) = self.parts
        stage = _KeptHistograms(coarse)
        first = release(stage)
        picks = {pick for (found,) in first.rows for pick in found}
        return self.combine([first], release(self.finish_outer(picks, stage.histograms)))

    @property
    def names(self) -> list[str]:
        return self.outer.names

    @property
    def share(self) -> float:
        return self.outer.share

    @property
    def sensitivity(self) -> int:
        return self.outer.sensitivity

    def accuracy(self) -> dict[str, Accuracy]:
        return self.outer.accuracy()

    def finish(self, releases: Sequence[Release]) -> Plan:
        (first,) = releases
        return self.finish_outer({pick for (picks,) in first.rows for pick in picks})

    def combine(self, parts: Sequence[Release], outer: Release) -> Release:
        return replace(outer, notes=[*outer.notes, *self.notes])

    def explain(self) -> list[tuple[str, str]]:
        (first,) = self.parts
        fine = self.outer.grid
        lines = [
            ("sql", first.sql),
            ("cost", f"epsilon {float(self.cost.epsilon):g} (pure)"),
            ("mechanism", "exponential mechanism in two stages, each over a bounded "
             "histogram, sampled exactly"),
            ("buckets", first.grid.describe()),
            ("stage 1", f"picks a bucket per group and quantile, epsilon {first.share:g} each"),
            ("stage 2", f"the {2 * WINDOW + 1} buckets around each pick split, "
             f"{fine.lattice.rings()}, the rest whole, "
             f"each candidate weighed by its width; epsilon {self.outer.share:g} each; "
             "its SQL is stage 1's with that bucket; where the database gives one "
             "snapshot to both stages (DuckDB, PostgreSQL), it reads only the windows' "
             "rows and takes the other buckets' counts from stage 1's histogram"),
        ]  # fmt: skip
        kept = {"sql", "cost", "mechanism", "buckets"}
        lines += [line for line in self.outer.explain() if line[0] not in kept]
        return lines + [("note", note) for note in self.notes]


@dataclass
class _KeptHistograms:
    """One release of a first stage (`plan`), keeping its exact histograms for the
    second stage of the same release (RefinedQuantiles.release_with)."""

    plan: QuantilePlan
    histograms: dict[tuple, np.ndarray] = field(default_factory=dict)

    @property
    def sql(self) -> str:
        return self.plan.sql

    def release(self, columns: list[str], rows: list[tuple], rng: np.random.Generator) -> Release:
        self.histograms = self.plan.histograms(rows)
        return self.plan.release_counts(self.histograms, rng)


def _outputs(analysis: Analysis) -> list[tuple[Output, Aggregate | None]]:
    """Each output, with the aggregate it is as such (None for a key or an expression)."""
    found = []
    for output in analysis.outputs:
        name = output.expression.name if isinstance(output.expression, exp.Column) else ""
        index = int(name.removeprefix(VALUE_PREFIX)) if name.startswith(VALUE_PREFIX) else None
        found.append((output, None if index is None else analysis.aggregates[index]))
    return found


def _column(values: list) -> np.ndarray:
    """Released values as an array post-processing reads (objects for dates and lists)."""
    if values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return np.asarray(values)
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


@dataclass
class QuantileStages(StagedPlan):
    """Quantiles beside other aggregates, or per group of keys from the data: the direct
    plan of the other aggregates (and the key selection) first, then the quantiles of
    the keys it released, combined and post-processed (the module docstring)."""

    plan_keys: Callable[[list[tuple] | None], QuantilePlan] | None = None
    notes: list[str] = field(default_factory=list)  # as DirectPlan's: how it was read

    def finish(self, releases: Sequence[Release]) -> Plan:
        (first,) = releases
        width = len(self.outer.analysis.keys)
        final = self.plan_keys([tuple(row[:width]) for row in first.rows])
        if final.cost != self.outer.cost:
            raise RuntimeError("the quantiles' cost changed with their keys; nothing more was run")
        return final

    def combine(self, parts: Sequence[Release], outer: Release) -> Release:
        (first,) = parts
        analysis = self.outer.analysis
        width = len(analysis.keys)
        keys = [tuple(row[:width]) for row in first.rows]
        # each aggregate's column in the release holding it: the quantiles' or the first
        others = _direct_indexes(analysis)
        at = {name: i for i, name in enumerate(outer.columns)}
        first_at = {name: i for i, name in enumerate(first.columns)}
        values = []
        for index in range(len(analysis.aggregates)):
            if index in others:
                column = first_at[f"{VALUE_PREFIX}{others[index]}"]
                values.append(np.asarray([row[column] for row in first.rows]))
            else:
                column = at[f"{VALUE_PREFIX}{index}"]
                values.append(_column([row[column] for row in outer.rows]))
        _, rows, groups = project_rows(analysis, keys, values)
        accuracy = self.outer.accuracy()
        for name, (_, aggregate) in zip(self.outer.names, _outputs(analysis), strict=True):
            index = next((i for i, a in enumerate(analysis.aggregates) if a is aggregate), None)
            released = first if index in others else outer  # a quantile's: its intervals
            found = released.accuracy.get(f"{VALUE_PREFIX}{others.get(index, index)}")
            if found is not None:
                accuracy[name] = _reindexed(found, groups)
        notes = first.notes + outer.notes + self.notes
        return Release(self.outer.names, rows, accuracy=accuracy, notes=notes)

    def explain(self) -> list[tuple[str, str]]:
        (first,) = self.parts
        rows: list[tuple[str, str]] = [("release 1", "the other aggregates and the group keys")]
        rows.extend((f"  {item}", detail) for item, detail in first.explain())
        rows.append(("release 2", "the quantiles, of the keys release 1 holds"))
        rows.extend((f"  {item}", detail) for item, detail in self.outer.explain())
        rows.append((
            "budget",
            f"epsilon split evenly over every measurement of both releases, charged once "
            f"before either runs: total {self.cost}",
        ))  # fmt: skip
        return rows + [("note", note) for note in self.notes]


def _reindexed(accuracy: Accuracy, groups: list[int]) -> Accuracy:
    """`accuracy` of the first release's rows, for the final rows (each from `groups`)."""
    if accuracy.intervals is None:
        return accuracy
    return replace(accuracy, intervals=tuple(accuracy.intervals[g] for g in groups))
