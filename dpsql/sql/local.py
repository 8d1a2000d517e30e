"""Plans for tables of local-DP reports: de-biased estimates, no central budget.

Each row of such a table is one person's report, randomised on their device
with the table's epsilon (DESIGN section 4, `local:`), so every answer is
post-processing of epsilon-LDP data and is free. The database counts the
distinct reports (`GROUP BY report`); Python decodes them into one unbiased
estimate per domain value (`dpsql.ldp`), applies `SET dpsql.ldp_postprocess`,
and evaluates the query over the public domain: WHERE and GROUP BY may use any
allowed expression of the value, since the domain is public. COUNT(*) is the
estimated number of people, SUM(f(value)) is sum_v f(v) * estimate(v), AVG the
ratio of the two.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
from sqlglot import exp

from dpsql import ldp
from dpsql.accounting import Cost
from dpsql.errors import QueryRefused
from dpsql.policy import Column, LocalSpec, Table
from dpsql.results import Accuracy, Release
from dpsql.sql import dispersion
from dpsql.sql.analysis import KEY_PREFIX, Aggregate, Analysis, Measurement
from dpsql.sql.analyze import analyze
from dpsql.sql.plan import key_order, released_aggregates
from dpsql.sql.postprocess import RELEASED, project, query_released

if TYPE_CHECKING:
    from dpsql.sql import PlanContext

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
# Per domain value: its cell (values whose estimates may be positively correlated share
# one) and what a sum over two or more of the cell's values adds per unit squared weight.
Cells = tuple[np.ndarray, np.ndarray]


def plan_local(select: exp.Select, table: Table, context: PlanContext) -> LocalPlan | None:
    """The plan for a checked query over a table of local reports; None for any other table."""
    if table.local is None:
        return None
    return LocalPlan(table, analyze(select, _value_table(table)), context)


def _value_table(table: Table) -> Table:
    """The table as analysts see it: one public column, the reported value."""
    spec = table.local
    domain = spec.domain
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in domain)
    kind = ("int" if all(isinstance(v, int) for v in domain) else "float") if numeric else "string"
    bounds = (min(domain), max(domain)) if numeric else (None, None)
    value = Column(spec.value, kind, lower=bounds[0], upper=bounds[1], values=domain)
    return replace(table, columns={spec.value.lower(): value})


class LocalPlan:
    """Estimates from local reports: the database counts reports, Python decodes them."""

    cost = Cost()

    def __init__(self, table: Table, analysis: Analysis, context: PlanContext):
        self.spec: LocalSpec = table.local
        self.analysis = analysis
        self.method = context.options.ldp_postprocess
        for aggregate in analysis.aggregates:
            if aggregate.function in dispersion.NAMES:
                raise QueryRefused(
                    f"{aggregate.function.upper()} over local reports",
                    "each report is randomized on the device: dpsql estimates counts, sums and "
                    "means from them, not a spread",
                    "estimate the value's distribution, COUNT(*) ... GROUP BY value, and "
                    "compute the spread from it",
                )
        for measurement in analysis.measurements:
            if measurement.kind in ("count_units", "count_distinct"):
                raise QueryRefused(
                    "COUNT(DISTINCT ...) over local reports",
                    "the reports carry no identity to count",
                    "write COUNT(*): it estimates the number of people",
                )
        options = {"branching": self.spec.branching} if self.spec.mechanism == "hh" else {}
        self.oracle = ldp.mechanism(
            self.spec.mechanism, self.spec.epsilon, self.spec.domain, **options
        )
        report = exp.column(self.spec.report, quoted=True)
        self.sql = (
            exp.select(
                exp.Cast(this=report, to=exp.DataType.build("text")).as_("report"),
                exp.Count(this=exp.Star()).as_("reports"),
            )
            .from_(exp.to_table(table.name))
            .where(exp.Not(this=exp.Is(this=report.copy(), expression=exp.Null())))
            .group_by(exp.Literal.number(1))
            .sql(dialect=context.dialect)
        )

    def release(self, columns: list[str], rows: list[tuple], rng: np.random.Generator) -> Release:
        estimate, variance, cells, n = self._estimate(rows)
        keys, sums, variances = self._measure(estimate, variance, cells)
        values = [self._aggregate_values(agg, sums) for agg in self.analysis.aggregates]
        order = key_order(keys)
        keys = [keys[i] for i in order]
        values = [v[order] if len(order) else v for v in values]
        variances = [v[order] if len(order) else v for v in variances]
        names, result = project(self.analysis, keys, values)
        return Release(names, result, self._accuracy(variances), self._notes(n))

    def _estimate(self, rows: list[tuple]) -> tuple[np.ndarray, np.ndarray, Cells, int]:
        """Per domain value: the (post-processed) estimate, its variance and its
        correlated cell (`_cells`); n reports."""
        aggregate, n = self._aggregate(rows)
        if n == 0:
            zeros = np.zeros(self.oracle.d)
            return zeros, zeros, (np.zeros(self.oracle.d, dtype=np.int64), zeros), 0
        unbiased = self.oracle.estimate_from_counts(aggregate, n)
        plug_in = np.clip(unbiased, 0, n)
        variances = self._variances(aggregate, n, plug_in)
        cells = self._cells(aggregate, n)
        return ldp.postprocess(unbiased, self.method, n), variances, cells, n

    def _aggregate(self, rows: list[tuple]) -> tuple[np.ndarray, int]:
        """The oracle's aggregate of the reports and how many there are. The database
        counted each distinct report once; expanded by its count, they are the report
        multiset the oracle's counting step expects. A row that is not one report its
        randomiser could have sent (a value a client uploaded unrandomised, an index
        beyond the domain, two reports in one field) is left out: refusing the whole
        table for it, or failing, told every analyst whether one existed, for free; and
        counted, a seed beyond OLH's moved one value by P / g people, a negative bucket
        made the count allocate without bound (found by audits)."""
        fields = [str(row[0]) for row in rows]
        counts = np.array([int(row[1]) for row in rows], dtype=np.int64)
        parsed = self._parsed(fields)
        if parsed is None:  # some field is not one report: read them one at a time
            readable = [i for i, field in enumerate(fields) if self._parsed([field]) is not None]
            fields, counts = [fields[i] for i in readable], counts[readable]
            parsed = self._parsed(fields)
        kept = self.oracle.valid_reports(parsed)
        counts = counts[kept]
        return self.oracle.aggregate(np.repeat(parsed[kept], counts, axis=0)), int(counts.sum())

    def _parsed(self, fields: list[str]) -> np.ndarray | None:
        """`fields` read as one report each, or None if any is not."""
        try:
            parsed = self.oracle.parse_reports(fields)
        except (ValueError, IndexError, TypeError, OverflowError):
            return None
        return parsed if len(parsed) == len(fields) else None

    def _variances(self, aggregate: np.ndarray, n: int, counts: np.ndarray) -> np.ndarray:
        """Each estimate's variance: estimated from the reports' `aggregate` where it
        depends on more of the data than the value's count (Hadamard response: its
        block's mass, which the closed form at the plugged-in count alone cannot know),
        else at the plugged-in counts, without a loop where possible."""
        from_reports = getattr(self.oracle, "variance_from_counts", None)
        if from_reports is not None:
            return np.asarray(from_reports(aggregate, n), dtype=float)
        covariance = getattr(self.oracle, "covariance", None)
        if covariance is not None:  # exact for the whole estimated distribution, one matrix
            return np.diag(covariance(counts)).copy()
        try:  # most closed forms are plain arithmetic in the count
            return np.broadcast_to(self.oracle.variance(n, counts), counts.shape).astype(float)
        except ValueError:  # a closed form that branches on the count takes one at a time
            return np.array([self.oracle.variance(n, float(c)) for c in counts])

    def _cells(self, aggregate: np.ndarray, n: int) -> Cells:
        """Per value, its cell and the bound a sum over two or more of the cell's values
        adds per unit squared weight for their correlation (Hadamard response: values
        of one block are positively correlated; `correlated_cells`). Every other oracle
        puts all values in one cell with nothing added. Their estimates are uncorrelated
        (unary and histogram encodings, hm: each person's coordinates are independent)
        or negatively correlated (grr: one report per person; olh in the measured
        cases), so summing the variances is exact or conservative. Not so for dse, whose
        inverted channel correlates some pairs positively (a pair's variance up to 1.55
        times the sum at epsilon 2); its contiguous ranges stay conservative."""
        correlated = getattr(self.oracle, "correlated_cells", None)
        if correlated is not None:
            return correlated(aggregate, n)
        return np.zeros(self.oracle.d, dtype=np.int64), np.zeros(self.oracle.d)

    def _measure(
        self, estimate: np.ndarray, variance: np.ndarray, cells: Cells
    ) -> tuple[list[tuple], list[np.ndarray], list[np.ndarray]]:
        """Per group: each measurement's estimate and variance, evaluated over the domain.
        The variance is summed per (group, cell) first, so a group holding two or more
        values of one cell gets its correlation bound added (see `_cells`); a group of
        one value, as in GROUP BY value, gets exactly that value's variance."""
        analysis = self.analysis
        value = exp.column(self.spec.value, quoted=True)
        keys = [f"{KEY_PREFIX}{i}" for i in range(len(analysis.keys))]
        items = [
            key.expression.copy().as_(alias) for key, alias in zip(analysis.keys, keys, strict=True)
        ]
        outer = [exp.column(alias) for alias in keys]
        for i, measurement in enumerate(analysis.measurements):
            items += _cell_sums(_weight(measurement), i)
            outer += [exp.func("sum", exp.column(f"__{v}{i}")).as_(f"__{v}{i}") for v in "mv"]
        inner = exp.select(*items).from_(RELEASED)
        if analysis.where is not None:
            inner = inner.where(analysis.where.copy())
        inner = inner.group_by(*[key.expression.copy() for key in analysis.keys], "__cell")
        query = exp.select(*outer).from_(inner.subquery("__cells"))
        if keys:
            query = query.group_by(*[exp.column(alias) for alias in keys])
        domain = np.array(self.spec.domain, dtype=object)
        columns = {
            value.name: domain,
            "__estimate": estimate,
            "__variance": variance,
            "__cell": cells[0],
            "__shared": cells[1],
        }
        rows = query_released(columns, query)
        width = len(analysis.keys)
        if not rows and not width:  # nothing in the domain passes WHERE
            rows = [(0.0, 0.0) * len(analysis.measurements)]
        keys = [row[:width] for row in rows]
        sums = [np.array([row[width + 2 * i] or 0.0 for row in rows], dtype=np.float64)
                for i in range(len(analysis.measurements))]  # fmt: skip
        variances = [np.array([row[width + 2 * i + 1] or 0.0 for row in rows], dtype=np.float64)
                     for i in range(len(analysis.measurements))]  # fmt: skip
        return keys, sums, variances

    def _aggregate_values(self, aggregate: Aggregate, sums: list[np.ndarray]) -> np.ndarray:
        first = sums[aggregate.measurements[0]]
        if aggregate.function != "avg":
            return first
        count = sums[aggregate.measurements[1]]
        mean = aggregate.centre + first / np.maximum(count, 1.0)
        return np.clip(mean, aggregate.bounds.lower, aggregate.bounds.upper)

    def _accuracy(self, variances: list[np.ndarray]) -> dict[str, Accuracy]:
        result = {}
        for name, aggregate in released_aggregates(self.analysis):
            if aggregate.function == "avg":
                result[name] = self._describe(math.nan, "a ratio of two estimates")
                continue
            spread = variances[aggregate.measurements[0]]
            worst = math.sqrt(float(spread.max())) if spread.size else 0.0
            result[name] = self._describe(worst, "largest over the released rows")
        return result

    def _describe(self, sd: float, which: str) -> Accuracy:
        finite = math.isfinite(sd)
        return Accuracy(
            mechanism=f"local {self.spec.mechanism}",
            scale=sd if finite else 0.0,
            interval95=Z95 * sd if finite else None,
            sensitivity=0.0,
            note=f"local DP (epsilon {self.spec.epsilon:g} spent on the clients); the interval "
            f"is the normal approximation of the unbiased estimate, {which}"
            + ("" if self.method == "none" else f", before {self.method} post-processing"),
        )

    def _notes(self, n: int) -> list[str]:
        return [
            f"estimated from {n} local reports ({self.spec.mechanism}, epsilon "
            f"{self.spec.epsilon:g}; rows that are not such reports are left out); no "
            "central budget is charged"
        ]

    def explain(self) -> list[tuple[str, str]]:
        return [
            ("plan", f"local-DP estimate over the reports in {self.spec.report}"),
            ("sql", self.sql),
            (
                "cost",
                f"none: each report was randomised on its owner's device with epsilon "
                f"{self.spec.epsilon:g} ({self.spec.mechanism}); estimates are post-processing",
            ),
            ("post-processing", self.method),
        ]


def _cell_sums(weight: exp.Expression, i: int) -> list[exp.Expression]:
    """Per (group, cell): the measurement's estimate and its variance, with the cell's
    correlation bound added when two or more of its values are in the group."""
    squared = weight.copy() * weight.copy()
    own = exp.func("sum", squared * exp.column("__variance"))
    shared = exp.Case(
        ifs=[
            exp.If(
                this=exp.GT(this=exp.Count(this=exp.Star()), expression=exp.convert(1)),
                true=exp.func("sum", squared.copy() * exp.column("__shared")),
            )
        ],
        default=exp.convert(0),
    )
    return [
        exp.func("sum", weight * exp.column("__estimate")).as_(f"__m{i}"),
        (own + shared).as_(f"__v{i}"),
    ]


def _weight(measurement: Measurement) -> exp.Expression:
    """What one person holding the value contributes to a measurement."""
    if measurement.kind == "sum":
        return exp.func("coalesce", exp.cast(measurement.clamped.copy(), "double"), exp.convert(0))
    if measurement.argument is None:
        return exp.convert(1)
    return exp.Case(
        ifs=[
            exp.If(
                this=exp.Is(this=measurement.argument.copy(), expression=exp.Null()),
                true=exp.convert(0),
            )
        ],
        default=exp.convert(1),
    )
