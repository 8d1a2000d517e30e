"""Plans: the bounded SQL to run, its privacy cost, and how to release its result.

A plan is the small protocol of DESIGN section 1: `sql`, `cost`,
`release(columns, rows, rng)` and `explain()`. `DirectPlan` answers an
aggregate query with noisy measurements; `ConstantPlan` answers a statement
that touches no table. The Session never branches on the kind of plan:
`release_stream` hands a plan the database's result batch by batch.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Protocol

import numpy as np
from sqlglot import exp

from dpsql.accounting import Cost, round_up, set_aside, split_epsilon, zcdp_rho
from dpsql.errors import QueryRefused, TooManyGroups
from dpsql.mechanisms.base import NoiseMechanism, OutOfRange, drawable
from dpsql.mechanisms.choice import choose
from dpsql.mechanisms.gaussian import DiscreteGaussian
from dpsql.mechanisms.grid import GRID_LIMIT
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.mechanisms.selection import PartitionSelection
from dpsql.mechanisms.staircase import Staircase
from dpsql.mechanisms.tree import l2_sensitivity
from dpsql.policy import MAX_PUBLIC_KEYS
from dpsql.results import Accuracy, Release
from dpsql.sql import dispersion, proofs
from dpsql.sql.analysis import KEY_PREFIX, VALUE_PREFIX, Aggregate, Analysis
from dpsql.sql.avg_interval import AvgWidths, avg_intervals, avg_widths, clamp
from dpsql.sql.bounding import SHARE_PARTS, BoundingNote
from dpsql.sql.intervals import Interval
from dpsql.sql.keys import canonical_keys, key_kinds
from dpsql.sql.postprocess import RELEASED, project, project_rows, query_released
from dpsql.sql.ranges import conjuncts
from dpsql.sql.rewrite import SumGrid, rewrite

# Grid resolution: a SUM is released in steps of about (noise scale) / 2^20, so
# rounding adds a relative error of at most one part in a million to the noise.
GRID_BITS = 20
# A row adds at most 2^ROW_STEP_BITS grid steps to a SUM, so a total over up to
# 2^SUMMED_ROW_BITS rows (1.1 trillion) is within GRID_LIMIT (2^62), where the
# samplers add noise exactly (sum_grid); a larger total is saturated there
# (exact_integers).
ROW_STEP_BITS = 22
SUMMED_ROW_BITS = 40
MIN_GRID_EXPONENT = -1000  # 2^-1000 is still a normal float: steps never round to zero


def beyond_the_sampler(
    mechanism: str,
    epsilon: float,
    error: OutOfRange,
    larger: str = "SET dpsql.epsilon to a larger value",
) -> QueryRefused:
    """The refusal, before the charge, of an epsilon that puts a measurement's noise
    beyond what its sampler draws exactly; `larger` says where the epsilon is set."""
    if mechanism == "staircase" and epsilon > 1:
        hint = "SET dpsql.mechanism = 'laplace', which draws at any epsilon dpsql accepts"
    else:
        hint = f"{larger}: at this one the noise would swamp any answer"
    return QueryRefused(f"{mechanism} noise at epsilon {epsilon:g}", str(error), hint)


@dataclass(frozen=True)
class Options:
    """Per-query privacy options (policy defaults, connect() or SET dpsql.*)."""

    epsilon: float
    delta: float
    mechanism: str = "laplace"
    ldp_postprocess: str = "none"  # for tables of local reports: dpsql.ldp.METHODS
    # running totals: 'binary' or 'factorization', or 'policy' for each column's own choice
    continual: str = "policy"
    # contribution bounds for this query's private tables (None: each table's own)
    max_rows_per_unit: int | None = None
    max_groups_per_unit: int | None = None
    # 'on': a query whose rows are bounded spends 1/SHARE_PARTS of its epsilon on the
    # bounding note (sql/bounding.py); 'off' gives it to the measurements
    bounding_note: str = "on"
    # 'on': each quantile of a number spends 1/10 of its epsilon on its 95% value interval
    # (sql/quantiles.py); 'off' releases the rank interval alone
    quantile_interval: str = "off"


class Plan(Protocol):
    sql: str | None
    cost: Cost

    def release(
        self, columns: list[str], rows: list[tuple], rng: np.random.Generator
    ) -> Release: ...

    def explain(self) -> list[tuple[str, str]]: ...


NO_TABLE_NOTE = "no table is read: the statement is answered as is"


@dataclass
class ConstantPlan:
    """A statement without a table (SELECT 1, SELECT version()): run as is, free."""

    sql: str
    cost: Cost = field(default_factory=Cost)

    def release(self, columns: list[str], rows: list[tuple], rng: np.random.Generator) -> Release:
        return Release(columns, rows, notes=[NO_TABLE_NOTE])

    def explain(self) -> list[tuple[str, str]]:
        return [("sql", self.sql), ("cost", "none: the statement reads no table")]


class _Batched:
    """A plan that releases its result batch by batch (release_stream hands it the
    batches); `release` is that of one batch."""

    def release(self, columns: list[str], rows: list[tuple], rng: np.random.Generator) -> Release:
        return self.release_batches(columns, [rows], rng)


class DomainPlan(_Batched):
    """Group keys of public domains without aggregates (`SELECT educ FROM t GROUP BY educ`,
    `SELECT DISTINCT educ FROM t`): the keys of the policy's domains that the query's
    conditions on those keys allow. Free: the answer is the policy's, nothing of the data
    is read (analyze refuses a condition on any other column, which would make it the
    data's)."""

    sql = None
    cost = Cost()

    def __init__(self, analysis: Analysis):
        _check_domain_size(analysis)
        self.analysis = analysis
        domains = [key.domain for key in analysis.keys]
        keys = _keys_passing_where(analysis, list(itertools.product(*domains)))
        self.keys = [keys[i] for i in key_order(keys)]

    @property
    def known_groups(self) -> int:
        return len(self.keys)

    def release_batches(
        self,
        columns: list[str],
        batches: Iterable[list[tuple]],
        rng: np.random.Generator,
        max_groups: int | None = None,
    ) -> Release:
        check_groups(len(self.keys), max_groups, charged=False)
        names, rows = project(self.analysis, self.keys, [])
        return Release(names, rows, notes=[_DOMAIN_NOTE])

    def explain(self) -> list[tuple[str, str]]:
        return [
            ("sql", "none: no data is read"),
            ("cost", "none: the keys are the policy's public domain"),
            ("group keys", f"{len(self.keys)} of the public domain, those the WHERE allows"),
        ]


_DOMAIN_NOTE = (
    "the keys are the policy's public domain (those the conditions on them allow): no data "
    "was read and nothing was charged; add COUNT(*) to see which groups have rows"
)


@dataclass(frozen=True)
class _Measure:
    """One calibrated measurement: its noise and, for SUMs, its grid step."""

    noise: NoiseMechanism
    step: float = 1.0  # released value = noisy integer * step
    reason: str = ""  # why 'auto' chose this mechanism


@dataclass(frozen=True)
class _Fixed:
    """The parts of a DirectPlan's release that depend on the plan alone."""

    released: tuple[tuple[str, Aggregate], ...]  # released_aggregates, in output order
    accuracy: dict[str, Accuracy]  # by released column: DirectPlan._column_accuracy
    keys: list[tuple] | None = None  # the public keys, in release order (key_order)
    position: dict[tuple, int] | None = None  # each public key's place in `keys`, by _normal
    # the place of each key as the database returned it, where every value is a plain int
    # or str (_fill_domain): filled as releases meet them, at most one per public key
    places: dict[tuple, int] = field(default_factory=dict)


# The same few recur query after query, and each costs ~30 us to build; as many as the
# samplers' own caches keep, since a cached mechanism keeps its sampler's tables alive.
@functools.lru_cache(maxsize=32)
def _prepared_noise(
    name: str, l1: int, l2: float | Fraction, epsilon: float, delta: float
) -> NoiseMechanism:
    """The noise mechanism `name` for these sensitivities and (epsilon, delta), prepared: a
    draw that cannot be made fails here (OutOfRange), before the charge. Shared by every
    plan that asks for the same: a prepared mechanism is never changed."""
    if name == "staircase":
        noise: NoiseMechanism = Staircase(l1, epsilon)
    elif name == "gaussian":
        if delta <= 0:
            raise QueryRefused(
                "the Gaussian mechanism with delta = 0",
                "Gaussian noise gives (epsilon, delta)-DP only for delta > 0",
                "SET dpsql.delta = 1e-6 (within your budget's delta), or SET "
                "dpsql.mechanism = 'laplace'",
            )
        rho = zcdp_rho(epsilon, delta)
        if not rho:
            raise OutOfRange(f"no zCDP rho converts to within delta {delta:g}")
        noise = DiscreteGaussian(l2, rho)
    else:
        noise = DiscreteLaplace(l1, epsilon)
    noise.prepare()
    return noise


_AVG_NOTE = (
    "noisy SUM / noisy COUNT: a 95% interval per row, conservative (each of the two "
    "measurements' 97.5% intervals, combined, within the column's bounds)"
)


class DirectPlan(_Batched):
    """A noisy answer to an aggregate query, measured directly on the table."""

    def __init__(self, analysis: Analysis, options: Options, dialect: str, seed: int):
        self.analysis = analysis
        self.options = options
        self.notes: list[str] = []  # why a special planner left the query to this plan
        table = analysis.table
        # The released keys of a GROUP BY over public domains, fixed by the policy
        # and the query alone; None without GROUP BY or with keys from the data.
        self.public_keys: list[tuple] | None = None
        if analysis.grouped and analysis.public_keys:
            _check_domain_size(analysis)
            domains = [key.domain for key in analysis.keys]
            self.public_keys = _keys_passing_where(analysis, list(itertools.product(*domains)))
        self.kinds = key_kinds(analysis)  # refuses keys with no canonical form
        self.selection = None if analysis.public_keys else self._selection_needed(options)
        parts = len(analysis.measurements) + (self.selection is not None)
        # a note where the rewrite bounds rows: a unit not kept unique (sql/bounding.py)
        noted = bool(table.privacy_unit) and not table.unique_unit and options.bounding_note == "on"
        self.note_epsilon, epsilon = (
            set_aside(options.epsilon, SHARE_PARTS) if noted else (0.0, options.epsilon)
        )
        self.share = split_epsilon(epsilon, parts, binary_too=self.selection is not None)
        if self.selection is not None:
            self.selection = PartitionSelection(self.share, options.delta, self._groups_per_unit)
            try:
                self.selection.prepare()
            except OutOfRange as exc:
                raise beyond_the_sampler("laplace", self.share, exc) from None
        grids: dict[int, SumGrid] = {}
        self.measures: list[_Measure] = []
        rows_per_unit = table.max_rows_per_unit if table.privacy_unit else 1
        groups = self._groups_per_unit
        for measurement in analysis.measurements:
            if measurement.kind == "sum":
                try:
                    grid, per_group = sum_grid(
                        measurement.bounds, rows_per_unit, groups, self.share
                    )
                except OverflowError:  # bounds near a double's range, times what a unit adds
                    raise QueryRefused(
                        f"SUM/AVG of {measurement.argument.sql()[:60]}",
                        "its bounds times the rows and groups one unit may add are beyond a "
                        "double's range: no noise can be drawn for it",
                        "sum a scaled value (SUM(x / 1e6)), or ask the data owner for "
                        "tighter bounds on the column",
                    ) from None
                grids[len(self.measures)] = grid
                self.measures.append(self._measure(per_group, grid.step))
            else:
                self.measures.append(
                    self._measure(1 if measurement.kind == "count_units" else rows_per_unit)
                )
        self._avg_widths = {
            aggregate.measurements: self._avg_widths_of(aggregate)
            for aggregate in analysis.aggregates
            if aggregate.function == "avg"
        }
        self._spread_widths = {
            aggregate.measurements: self._spread_widths_of(aggregate)
            for aggregate in analysis.aggregates
            if aggregate.function in dispersion.NAMES
        }
        self.bounding = self._bounding_note() if noted else None
        pure = sum((m.noise.cost for m in self.measures), Cost())
        if self.selection is not None:
            pure = pure + self.selection.cost
        if self.bounding is not None:
            pure = pure + self.bounding.cost
        self.cost = pure if pure.rho else Cost.of(options.epsilon, pure.delta)
        cap = self.bounding.cap if self.bounding is not None else None
        self.sql = rewrite(
            analysis, grids, dialect, seed, with_units=self.selection is not None, before_cap=cap
        )
        self._fixed = self._fixed_parts()

    def _fixed_parts(self) -> _Fixed:
        """What every release reads that the plan alone fixes, found once: a plan-cache hit
        shares it with every copy (it holds nothing of the data nor of any noise drawn)."""
        released = tuple(released_aggregates(self.analysis))
        accuracy = {name: self._column_accuracy(aggregate) for name, aggregate in released}
        if self.public_keys is None:
            return _Fixed(released, accuracy)
        order = key_order(self.public_keys)
        place = np.empty(len(order), dtype=np.int64)
        place[order] = np.arange(len(order))
        # a key's last place wins, as a dict of the keys in the domain's order keeps it
        position = {_normal(key): int(place[i]) for i, key in enumerate(self.public_keys)}
        return _Fixed(released, accuracy, [self.public_keys[i] for i in order], position)

    def _measure(self, per_group: int, step: float = 1.0) -> _Measure:
        """The noise for one measurement: each unit moves at most `per_group` (in grid
        steps) in each of at most `_groups_per_unit` groups."""
        groups = self._groups_per_unit
        # the L2 sensitivity rounded up to a rational: a float sqrt may round down, and
        # the Gaussian's sigma would then be a little short of what the charge covers
        l1, l2 = per_group * groups, l2_sensitivity(groups, per_group)
        name, reason = self.options.mechanism, ""
        if name == "auto":  # compared in the column's units, so the reason reads naturally
            name, reason = choose(l1 * step, l2 * step, self.share, self.options.delta, self._cells)
        try:
            noise = _prepared_noise(name, l1, l2, self.share, self.options.delta)
        except OutOfRange as exc:
            raise beyond_the_sampler(name, self.share, exc) from None
        return _Measure(noise, step, reason)

    def _bounding_note(self) -> BoundingNote:
        """The bounding note's measurement, prepared before the charge (sql/bounding.py)."""
        rows, groups = self.analysis.table.max_rows_per_unit, self._groups_per_unit
        cap = BoundingNote.cap_for(rows, groups)
        # Gaussian (zCDP) with the query's other Gaussian measurements, else Laplace
        name = "gaussian" if self.options.mechanism == "gaussian" else "laplace"
        try:
            noise = _prepared_noise(name, cap, cap, self.note_epsilon, self.options.delta)
        except OutOfRange as exc:
            raise beyond_the_sampler(name, self.note_epsilon, exc) from None
        return BoundingNote(noise, rows, groups, self.analysis.grouped)

    def _avg_widths_of(self, aggregate: Aggregate) -> AvgWidths:
        """The half-widths an AVG's intervals need, found now: an exact search that fails
        on extreme parameters must fail before the charge."""
        total, count = (self.measures[i] for i in aggregate.measurements)
        try:
            with drawable(f"the 95% interval of {total.noise.name} noise"):
                return avg_widths(total.noise, total.step, count.noise)
        except OutOfRange as exc:
            raise beyond_the_sampler(total.noise.name, self.share, exc) from None

    def _spread_widths_of(self, aggregate: Aggregate) -> dispersion.Widths:
        """The half-widths a VAR/STDDEV's intervals need, found before the charge."""
        count, total, squares = (self.measures[i] for i in aggregate.measurements)
        try:
            with drawable(f"the 95% interval of {total.noise.name} noise"):
                return dispersion.widths(
                    count.noise, (total.noise, total.step), (squares.noise, squares.step)
                )
        except OutOfRange as exc:
            raise beyond_the_sampler(total.noise.name, self.share, exc) from None

    @property
    def known_groups(self) -> int | None:
        """How many groups the release has when the policy alone fixes it, before any
        charge (None: the keys come from the data)."""
        if self.selection is not None:
            return None
        return 1 if self.public_keys is None else len(self.public_keys)

    @property
    def _cells(self) -> int:
        """How many values the release has (1 when the keys come from the data)."""
        if not self.analysis.grouped or not self.analysis.public_keys:
            return 1
        return math.prod(len(key.domain) for key in self.analysis.keys)

    @property
    def _groups_per_unit(self) -> int:
        table = self.analysis.table
        return table.max_groups_per_unit if self.analysis.grouped and table.privacy_unit else 1

    def _selection_needed(self, options: Options) -> bool | None:
        if options.delta <= 0:
            raise QueryRefused(
                "GROUP BY on keys without a public domain",
                "releasing keys found in the data needs delta > 0 (partition selection)",
                "declare the key's values in the policy ('values: [...]' or integer "
                "lower/upper with 'public: true'), or give the analyst a delta",
            )
        return True

    def release_batches(
        self,
        columns: list[str],
        batches: Iterable[list[tuple]],
        rng: np.random.Generator,
        max_groups: int | None = None,
    ) -> Release:
        """The release of a result read batch by batch: keys from the data are selected
        per batch and only passing keys are kept, so memory follows the released groups,
        not the groups in the data. Refuses more than `max_groups` released groups."""
        analysis = self.analysis
        width = len(analysis.keys)
        measured = width + len(self.measures)
        notes = list(self.notes)
        totals = [0, 0]  # the bounding note's: rows before the bounding (capped), kept
        if self.bounding is not None:
            batches = self.bounding.counted(batches, totals)
        if self.selection is not None:
            keys, noisy = self._select(batches, rng, max_groups)
            notes.append(
                f"group keys come from the data: a key is released only when its noisy count of "
                f"distinct units reaches {self.selection.tau}; groups below were suppressed"
            )
        else:
            if self._fixed.keys is not None:  # at most the domain, whatever the data
                keys = self._fixed.keys
                exact = _fill_domain(self._fixed, batches, self.kinds, measured)
            else:
                rows = [row for batch in batches for row in batch]
                keys = canonical_keys([row[:width] for row in rows], self.kinds)
                exact = _integer_matrix([row[width:measured] for row in rows], len(self.measures))
            check_groups(len(keys), max_groups)
            noisy = [m.noise.sample(exact[:, i], rng) for i, m in enumerate(self.measures)]
        values = [self._aggregate_values(agg, noisy) for agg in analysis.aggregates]
        # public keys come in their order; keys from the data are sorted (one group is)
        order = key_order(keys) if self._fixed.keys is None and len(keys) > 1 else None
        if order is not None:
            keys = [keys[i] for i in order]
            values = [column[order] for column in values]
        result_columns, result_rows, groups = project_rows(analysis, keys, values)
        # each final row's group in the noisy arrays, for the accuracy that varies per group
        source = np.asarray(groups, dtype=np.int64)
        if order is not None:
            source = order[source]
        if self.bounding is not None:
            notes.extend(self.bounding.notes(totals, rng))
        return Release(result_columns, result_rows, self._accuracy(noisy, source), notes)

    def _select(
        self, batches: Iterable[list[tuple]], rng: np.random.Generator, max_groups: int | None
    ) -> tuple[list[tuple], list[np.ndarray]]:
        """Noisy values and partition selection, batch by batch; the passing keys and values.

        Each key's noise and threshold test are independent of every other key's,
        so drawing them per batch gives the same distribution as drawing them at once.
        """
        width = len(self.analysis.keys)
        measured = width + len(self.measures)
        keys: list[tuple] = []
        parts: list[list[np.ndarray]] = [[np.zeros(0, dtype=np.int64)] for _ in self.measures]
        for batch in batches:
            if not batch:
                continue
            # columns at C speed: a GROUP BY on a near-unique column has millions of rows
            columns = list(zip(*batch, strict=True))
            noisy = [
                m.noise.sample(exact_integers(columns[width + i]), rng)
                for i, m in enumerate(self.measures)
            ]
            keep = self.selection.keep(exact_integers(columns[measured]), rng)
            passing = itertools.compress(zip(*columns[:width], strict=True), keep)
            keys.extend(canonical_keys(list(passing), self.kinds))
            for part, values in zip(parts, noisy, strict=True):
                part.append(values[keep])
            check_groups(len(keys), max_groups)
        return keys, [np.concatenate(part) for part in parts]

    def _aggregate_values(self, aggregate: Aggregate, noisy: list[np.ndarray]) -> np.ndarray:
        first = self.measures[aggregate.measurements[0]]
        values = noisy[aggregate.measurements[0]]
        if aggregate.function == "count":
            return values
        total = values * first.step if first.step != 1.0 else values.astype(np.float64)
        if aggregate.function == "sum":
            return total
        if aggregate.function in dispersion.NAMES:
            return dispersion.estimate(aggregate.function, *self._spread(aggregate, noisy))
        count = noisy[aggregate.measurements[1]]
        mean = aggregate.centre + total / np.maximum(count, 1)
        # dividing noisy values is post-processing; clamping to the bounds too
        return clamp(mean, aggregate.bounds.lower, aggregate.bounds.upper)

    def _spread(
        self, aggregate: Aggregate, noisy: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Interval]:
        """A VAR/STDDEV's noisy COUNT, centred SUM and SUM of squares (in the column's
        units), and the argument's bounds."""
        count, total, squares = (noisy[i] * self.measures[i].step for i in aggregate.measurements)
        return count, total, squares, aggregate.bounds

    def _accuracy(self, noisy: list[np.ndarray], source: np.ndarray) -> dict[str, Accuracy]:
        """Each released aggregate's accuracy; `source` is each final row's index in `noisy`."""
        fixed = self._fixed.accuracy
        return {
            name: self._row_accuracy(aggregate, fixed[name], noisy, source)
            if aggregate.function == "avg" or aggregate.function in dispersion.NAMES
            else fixed[name]
            for name, aggregate in self._fixed.released
        }

    def _column_accuracy(self, aggregate: Aggregate) -> Accuracy:
        """An aggregate's accuracy as far as the plan fixes it: all of it for a column-wide
        interval, all but the per-row intervals for AVG and VAR/STDDEV."""
        measure = self.measures[aggregate.measurements[0]]
        noise = measure.noise
        if aggregate.function in dispersion.NAMES:
            squares = self.measures[aggregate.measurements[2]]
            return Accuracy(
                squares.noise.name,
                float(squares.noise.scale) * squares.step,
                None,
                squares.noise.sensitivity * squares.step,
                dispersion.NOTE,
            )
        scale = float(noise.scale) * measure.step
        sensitivity = noise.sensitivity * measure.step
        if aggregate.function == "avg":
            return Accuracy(noise.name, scale, None, sensitivity, _AVG_NOTE)
        reason = f"chosen by auto: {measure.reason}" if measure.reason else ""
        return Accuracy(noise.name, scale, noise.interval95() * measure.step, sensitivity, reason)

    def _row_accuracy(
        self, aggregate: Aggregate, fixed: Accuracy, noisy: list[np.ndarray], source: np.ndarray
    ) -> Accuracy:
        """`fixed` with the per-row 95% intervals of an AVG or VAR/STDDEV in this release."""
        if aggregate.function in dispersion.NAMES:
            low, high = dispersion.intervals(
                aggregate.function,
                *self._spread(aggregate, noisy)[:3],
                self._spread_widths[aggregate.measurements],
                aggregate.bounds,
            )
        else:
            total, count = (noisy[i] for i in aggregate.measurements)
            m = aggregate.centre  # the interval of the centred mean, shifted back
            bounds = (aggregate.bounds.lower - m, aggregate.bounds.upper - m)
            step = self.measures[aggregate.measurements[0]].step
            low, high = avg_intervals(
                total * step, count, self._avg_widths[aggregate.measurements], bounds
            )
            low, high = low + m, high + m
        intervals = tuple(zip(low[source].tolist(), high[source].tolist(), strict=True))
        return Accuracy(
            fixed.mechanism, fixed.scale, None, fixed.sensitivity, fixed.note, intervals
        )

    def explain(self) -> list[tuple[str, str]]:
        analysis = self.analysis
        table = analysis.table
        if table.unique_unit:
            unit = (f"user-level: privacy unit {table.privacy_unit}, which the database keeps "
                    "unique (one row per unit), so no bounding is needed")  # fmt: skip
        elif table.privacy_unit:
            unit = (f"user-level: privacy unit {table.privacy_unit}, at most "
                    f"{table.max_groups_per_unit} groups and {table.max_rows_per_unit} rows per "
                    "group for each unit")  # fmt: skip
        else:
            unit = "row-level: each row is its own unit"
        lines = [
            ("sql", self.sql),
            (
                "cost",
                f"{self.cost} ({len(self.measures)} "
                f"measurement{'' if len(self.measures) == 1 else 's'}"
                f"{' + key selection' if self.selection else ''}, epsilon "
                f"{round_up(Fraction(self.share)):.6g} each"
                f"{' + bounding note' if self.bounding else ''})",
            ),
            ("privacy", unit),
        ]
        for measurement, measure in zip(analysis.measurements, self.measures, strict=True):
            noise = measure.noise
            detail = (
                f"{noise.name}, sensitivity {noise.sensitivity * measure.step:g}, scale "
                f"{float(noise.scale) * measure.step:.6g}, 95% within "
                f"+/-{noise.interval95() * measure.step:.6g}"
            )
            if measure.reason:
                detail += f"; chosen by auto: {measure.reason}"
            if measurement.note:
                detail += f"; {measurement.note}"
            if measure.step != 1.0:
                detail += f"; released on a grid of {measure.step!r}"
            lines.append((f"measure {measurement.key}", detail))
        if self.bounding is not None:
            lines.append(("measure bounding note", self.bounding.explanation(self.note_epsilon)))
        for widths in self._avg_widths.values():
            lines.append((
                "AVG interval",
                f"per row, conservative: the SUM's 97.5% half-width {widths.total:.6g} and the "
                f"COUNT's {widths.count:g} combined, within the column's bounds",
            ))  # fmt: skip
        for spread in self._spread_widths.values():
            lines.append(("VAR/STDDEV interval", dispersion.explanation(spread)))
        if analysis.grouped:
            lines.append(("group keys", self._keys_explanation()))
        lines += [("clamps", line) for line in proofs.explanations(analysis)]
        return lines + [("note", note) for note in self.notes]

    def _keys_explanation(self) -> str:
        if self.selection is None:
            return (
                "public domain (the policy's, or a public table's): every key is released, "
                "empty groups included"
            )
        return (
            f"from the data: released when the noisy count of distinct units reaches "
            f"{self.selection.tau} (epsilon {self.selection.epsilon:.6g}, delta "
            f"{self.selection.delta:g})"
        )


def sum_grid(
    bounds: Interval, contributions: int, totals: int, epsilon: float
) -> tuple[SumGrid, int]:
    """A SUM's power-of-two grid step, and how far one unit moves one total, in grid steps.

    One unit adds at most `contributions` rows to each of at most `totals` totals
    (groups). Each clamped value is divided by the step and rounded in SQL, so it
    lies in [floor(lower/step), ceil(upper/step)]: the sum is an exact integer and
    the released values all lie on one grid, whatever the data. The step is about
    the noise scale / 2^GRID_BITS, but never so fine that one row adds more than
    2^ROW_STEP_BITS steps: a total of up to 2^SUMMED_ROW_BITS rows then stays below
    GRID_LIMIT (2^62), an exact int64 with room for the noise (and within Spark's
    BIGINT SUM).
    """
    magnitude = bounds.magnitude * contributions * totals
    if magnitude == 0:
        return SumGrid(1.0, bounds), 1
    # log2 of each, not of the quotient: a tiny bound over a large epsilon underflows to 0
    exponent = math.floor(math.log2(magnitude) - math.log2(epsilon)) - GRID_BITS
    # frexp: magnitude < 2^e exactly, so a row's value is below 2^ROW_STEP_BITS steps
    _, row_exponent = math.frexp(bounds.magnitude)
    exponent = max(exponent, row_exponent - ROW_STEP_BITS, MIN_GRID_EXPONENT)
    if bounds.integer:
        exponent = max(exponent, 0)
    step = math.ldexp(1.0, exponent)
    low = math.floor(Fraction(bounds.lower) / Fraction(step))
    high = math.ceil(Fraction(bounds.upper) / Fraction(step))
    return SumGrid(step, bounds), max(1, contributions * max(abs(low), abs(high)))


def _integer_matrix(rows: list[tuple] | tuple[tuple, ...], width: int) -> np.ndarray:
    """Rows of exact aggregates as an int64 matrix, converted a column at a time."""
    matrix = np.zeros((len(rows), width), dtype=np.int64)
    for i, column in enumerate(zip(*rows, strict=True)):
        matrix[:, i] = exact_integers(column)
    return matrix


def exact_integers(values: Sequence) -> np.ndarray:
    """One column of exact aggregates as int64: they arrive as int, HUGEINT or Decimal, and
    NULL (an empty SUM) is 0.

    A total beyond +/-GRID_LIMIT is taken as GRID_LIMIT: clamping a total moves it
    no further than the data moved it, so the noise still covers every change,
    and the noise added next cannot overflow. Without it, a total too large for
    int64 raised an error after the charge: an answer, depending on the data,
    without noise.
    """
    try:
        column = np.array(values, dtype=np.int64)  # plain ints, converted in C
    except (TypeError, OverflowError):  # NULL, HUGEINT or Decimal: one at a time
        return np.array(
            [max(-GRID_LIMIT, min(GRID_LIMIT, int(v or 0))) for v in values], dtype=np.int64
        )
    # two ufuncs in place: np.clip's Python wrapper costs more than both on a few values
    np.maximum(column, -GRID_LIMIT, out=column)
    return np.minimum(column, GRID_LIMIT, out=column)


def _check_domain_size(analysis: Analysis) -> None:
    """Refuse, before anything is charged, a release of more public keys than dpsql allows."""
    size = math.prod(len(key.domain) for key in analysis.keys)
    if size > MAX_PUBLIC_KEYS:
        raise QueryRefused(
            f"a GROUP BY over a public domain of {size:,} keys",
            f"dpsql releases at most {MAX_PUBLIC_KEYS:,} groups per query",
            "group by fewer or coarser columns",
        )


def _fill_domain(
    fixed: _Fixed, batches: Iterable[list[tuple]], kinds: list[str], measured: int
) -> np.ndarray:
    """The result's measurements at each public key's place (`fixed.position`, by `_normal`
    key), zeros for the groups the data lacks; result rows of keys outside the domain are
    dropped."""
    width = len(kinds)
    filled = np.zeros((len(fixed.keys), measured - width), dtype=np.int64)
    places = fixed.places
    for batch in batches:
        indices, values = [], []
        for row in batch:
            key = row[:width]
            index = places.get(key)
            if index is None:
                index = _place(fixed, key, kinds)
                if index is None:
                    continue
            indices.append(index)
            values.append(row[width:measured])
        if indices:
            filled[indices] = _integer_matrix(values, measured - width)
    return filled


def _place(fixed: _Fixed, key: tuple, kinds: list[str]) -> int | None:
    """The place of a key the database returned among the public keys (None: outside the
    domain), kept in `fixed.places` when every value is a plain int or str.

    Found by canonical_value and _normal, which cost more than a release's noise on a
    few dozen groups. A kept key is looked up by Python's equality, which is exact
    between ints and between strs (True, 1.0 and Decimal are never kept: they equal
    1 there), so a kept place is the one this function found for that same key.
    """
    (canonical,) = canonical_keys([key], kinds)
    index = fixed.position.get(_normal(canonical))
    if index is not None and all(type(v) is int or type(v) is str for v in key):
        fixed.places[key] = index
    return index


def _keys_passing_where(analysis: Analysis, keys: list[tuple]) -> list[tuple]:
    """The public keys that the query's conditions on the key columns alone allow.

    `WHERE educ >= 14 GROUP BY educ` releases educ 14..16, not the whole domain:
    deciding which public keys can match uses only the policy, so it is free.
    """
    names = {
        key.expression.name: f"{KEY_PREFIX}{i}"
        for i, key in enumerate(analysis.keys)
        if isinstance(key.expression, exp.Column)
    }
    conditions = [
        condition
        for condition in conjuncts(analysis.where)
        if {column.name for column in condition.find_all(exp.Column)} <= set(names)
    ]
    if not conditions or not keys:
        return keys

    def renamed(node: exp.Expression) -> exp.Expression:
        return exp.column(names[node.name]) if isinstance(node, exp.Column) else node

    query = exp.select("__dpsql_row").from_(RELEASED)
    for condition in conditions:
        query = query.where(condition.transform(renamed), copy=False)
    columns = {
        column: np.array([key[i] for key in keys], dtype=object)
        for i, column in enumerate(f"{KEY_PREFIX}{i}" for i in range(len(analysis.keys)))
    }
    columns["__dpsql_row"] = np.arange(len(keys))
    return [keys[row] for (row,) in sorted(query_released(columns, query))]


def check_groups(count: int, max_groups: int | None, *, charged: bool = True) -> None:
    """Refuse a release of more than `max_groups` groups (None: no limit).

    `count` must be known from the release alone (post-processing): never the
    number of groups the database returned before partition selection.
    """
    if max_groups is not None and count > max_groups:
        raise TooManyGroups(max_groups, charged=charged)


def check_known_groups(plan: Plan, max_groups: int | None) -> None:
    """Refuse, before its charge, a plan whose release has more than `max_groups` groups
    when the policy alone fixes how many (public keys): refused after the charge, it
    would cost the analyst budget for nothing. Other plans are checked as they release."""
    known = getattr(plan, "known_groups", None)
    if known is not None:
        check_groups(known, max_groups, charged=False)


def release_stream(
    plan: Plan,
    columns: list[str],
    batches: Iterable[list[tuple]],
    rng: np.random.Generator,
    max_groups: int | None = None,
) -> Release:
    """`plan`'s release of a result read in batches, with at most `max_groups` groups.

    A plan with `release_batches` (DirectPlan) consumes the batches itself;
    other plans release keys from public domains or stored state, so their
    result is bounded by the policy and is handed over whole, uncapped: a cap
    checked after the charge would refuse a stream or synopsis before its state
    is stored, and every rerun would be charged again.
    """
    streaming = getattr(plan, "release_batches", None)
    if streaming is not None:
        return streaming(columns, batches, rng, max_groups)
    rows: list[tuple] = []
    for batch in batches:
        rows.extend(batch)
        if isinstance(plan, ConstantPlan):  # reads no table: its row count is public
            check_groups(len(rows), max_groups)
    return plan.release(columns, rows, rng)


def _normal(key: tuple) -> tuple:
    """Key values compared across Python types (1 == 1.0, Decimal)."""
    return tuple(
        float(v) if isinstance(v, int | float | Decimal) and not isinstance(v, bool) else v
        for v in key
    )


def released_aggregates(analysis: Analysis) -> Iterator[tuple[str, Aggregate]]:
    """The output columns that are a released aggregate as such, with that aggregate."""
    for output in analysis.outputs:
        name = output.expression.name if output.expression.key == "column" else ""
        if name.startswith(VALUE_PREFIX):
            yield output.name, analysis.aggregates[int(name.removeprefix(VALUE_PREFIX))]


def key_order(keys: list[tuple]) -> np.ndarray:
    """Groups in ascending key order, NULLs last, so releases read predictably."""

    def sort_key(index: int) -> tuple:
        return tuple((value is None, str(type(value)), value if value is not None else 0)
                     for value in keys[index])  # fmt: skip

    try:
        return np.array(sorted(range(len(keys)), key=sort_key), dtype=np.int64)
    except TypeError:
        return np.arange(len(keys))
