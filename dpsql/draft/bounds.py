"""`--suggest-bounds EPSILON`: DP estimates of the bounds new users get wrong, written into
the draft with what they cost.

For each private table whose unit may have several rows: how many rows a unit has
(`max_rows_per_unit`) and in how many groups of one column it appears (the most
distinct values it has in any of the table's text, bool and date columns:
`max_groups_per_unit`), each the UNIT_QUANTILE of the per-unit counts. For each
plain numeric column: `lower` and `upper`, the VALUE_QUANTILE of the per-unit
maxima (of -x for the lower bound, read back negated), so clamping touches few
units.

Each estimate is one release of the exponential-mechanism quantile
(mechanisms/quantiles.py) from a histogram the database computes over a fixed grid
of round numbers: one value per unit (so adding or removing a unit, with all its
rows, moves one count by one), one row per bucket back, never a row of data. The
epsilon is split evenly over the estimates (sequential composition) and charged
once, in full, to the owner's budget in the ledger, before any of them runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpsql.accounting import Cost
from dpsql.draft.guess import TableDraft, identifier_name
from dpsql.draft.queries import UnitRelation, histogram, in_dialect, quoted
from dpsql.errors import BudgetExhausted
from dpsql.mechanisms.quantiles import exponential_quantile, quantile_cost
from dpsql.mechanisms.samplers import secure_generator
from dpsql.policy import MAX_PER_UNIT, NUMERIC_TYPES
from dpsql.session import Session

# Rows and groups per unit: the bound that keeps every row of 95% of units.
UNIT_QUANTILE = Fraction(95, 100)
# Value bounds: clamping changes the values of about 5% of units, on each side. Nearer 1,
# the estimate needs more units or epsilon: candidates past the largest value are only
# (1 - q) n ranks from the target (mechanisms/quantiles.py).
VALUE_QUANTILE = Fraction(95, 100)
# The base measure's exponent per grid step away from zero: e^-2 a decade, so that a weak
# estimate errs towards the nearer round numbers (mechanisms/quantiles.py says why). Weaker,
# an upper bound at a column's largest value (where every larger candidate is as good to
# the mechanism) wandered decades up; stronger, few units pulled it to zero.
_PRIOR_STEP = Fraction(1, 5)
# The grids' round numbers: 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 times a power of ten (bounds
# an owner can read at a glance; neighbouring candidates differ by at most a third).
_MANTISSAS = (10, 12, 15, 20, 25, 30, 40, 50, 60, 80)
# Magnitudes 1 .. 8e12. None below 1: the base measure's pull towards zero grows with every
# decade offered below the data, and with 0.001 .. 0.8 offered a weak estimate of prices
# near 1,000 came out 0; a column of values below 1 gets the bound 1.
_DECADES = range(0, 13)


def _round_numbers(whole: bool) -> list[Fraction]:
    numbers = sorted(
        {Fraction(m, 10) * Fraction(10) ** k for k in _DECADES for m in _MANTISSAS}
        | ({Fraction(n) for n in range(1, 10)} if whole else set())
    )
    return [n for n in numbers if not whole or n.denominator == 1]


def value_grid(kind: str) -> tuple[int | float, ...]:
    """The candidate bounds of a numeric column: 0 and the round numbers, both signs
    (whole ones for an int column), so a lower bound is read on -x with the same grid."""
    whole = kind == "int"
    magnitudes = [int(n) if whole else float(n) for n in _round_numbers(whole)]
    return (*(-m for m in reversed(magnitudes)), 0 if whole else 0.0, *magnitudes)


COUNT_GRID = tuple(int(n) for n in _round_numbers(True) if n <= MAX_PER_UNIT)


class EstimatesOverBudget(BudgetExhausted):
    """The owner's budget does not cover `--suggest-bounds`: said in the command's terms."""

    def _message(self, lower: str = "") -> str:
        return (
            f"--suggest-bounds costs {self.cost}, but analyst '{self.analyst}' has only "
            f"{self.remaining} left (its --owner-budget, by default the --suggest-bounds "
            "EPSILON, less what earlier drafts charged to this ledger); give a smaller "
            "--suggest-bounds, or a larger --owner-budget (the total written into the draft)"
        )


@dataclass(frozen=True)
class Estimate:
    """One DP quantile the draft asks for."""

    table: str
    column: str | None  # None: max_rows / max_groups of the table
    side: str  # "upper", "lower", "rows" or "groups"
    values: str  # the query of one value `v` per unit, in DuckDB's dialect
    grid: tuple[int | float, ...]
    q: Fraction
    what: str  # what it estimates, for the comment beside the value

    @property
    def sql(self) -> str:
        """The histogram of `values` over `grid`: one row per non-empty bucket."""
        return histogram(self.values, self.grid)

    @property
    def prior(self) -> list[Fraction]:
        """Steps from the grid's smallest magnitude, as the base measure's exponent."""
        smallest = min(range(len(self.grid)), key=lambda i: abs(self.grid[i]))
        return [_PRIOR_STEP * abs(i - smallest) for i in range(len(self.grid))]


def plan(tables: list[TableDraft]) -> list[Estimate]:
    """The estimates worth making for the drafted tables (public ones need none)."""
    by_name = {t.name: t for t in tables}
    estimates = []
    for table in tables:
        if table.public:
            continue
        relation = UnitRelation(table, by_name)
        # a row-level table's rows are its units: their values as they are
        one_per_unit = relation.per_row if relation.row_level else relation.per_unit
        if not relation.row_level and not table.unique_unit:
            estimates.append(
                Estimate(table.name, None, "rows", one_per_unit("COUNT(*)"), COUNT_GRID,
                         UNIT_QUANTILE, "rows per unit")
            )  # fmt: skip
            keys = [c.name for c in table.columns.values() if _group_key(c.kind, c.private)]
            if keys:
                distinct = ", ".join(f"COUNT(DISTINCT r.{quoted(k)})" for k in keys)
                estimates.append(
                    Estimate(table.name, None, "groups", one_per_unit(f"GREATEST({distinct}, 1)"),
                             COUNT_GRID, UNIT_QUANTILE,
                             f"groups per unit (distinct values of {', '.join(keys)})")
                )  # fmt: skip
        unit = "row" if relation.row_level else "unit"
        for column in table.columns.values():
            if column.kind not in NUMERIC_TYPES or column.private or identifier_name(column.name):
                continue  # an id (one kept plain to join a public table) is summed by nobody
            x = f"CAST(r.{quoted(column.name)} AS DOUBLE)"
            for side, value, extreme in (("upper", x, "largest"), ("lower", f"-{x}", "smallest")):
                values = one_per_unit(value if relation.row_level else f"MAX({value})")
                estimates.append(
                    Estimate(table.name, column.name, side, values, value_grid(column.kind),
                             VALUE_QUANTILE, f"{extreme} value per {unit}")
                )  # fmt: skip
    return estimates


def _group_key(kind: str, private: bool) -> bool:
    return not private and kind in ("string", "bool", "date")


def suggest(
    session: Session, tables: list[TableDraft], epsilon: float, seed: int | None = None
) -> Cost:
    """Charge `epsilon` to the session's analyst, then make every estimate `plan` asks for
    and write each into `tables` with its share of the cost; returns what was charged."""
    estimates = plan(tables)
    if not estimates:
        return Cost()
    share = Cost.of(epsilon).epsilon / len(estimates)
    # Sequential composition, charged at once before any estimate runs: exactly `epsilon`,
    # since the shares are Fractions.
    cost = sum((quantile_cost(share) for _ in estimates), Cost())
    try:
        session.ledger.charge(
            session.analyst,
            cost,
            session.total,
            f"dpsql policy init --suggest-bounds: {len(estimates)} estimates",
            dataset_budget=session.policy.dataset_budget,
        )
    except BudgetExhausted as exc:
        raise EstimatesOverBudget(exc.analyst, exc.cost, exc.remaining) from None
    rng = secure_generator(seed)
    by_name = {t.name: t for t in tables}
    chosen: dict[tuple[str, str | None, str], Any] = {}
    for estimate in estimates:
        _, rows = session.adapter.execute(in_dialect(estimate.sql, session.adapter.dialect))
        counts = [0] * len(estimate.grid)
        for bucket, count in rows:
            counts[int(bucket)] += int(count)
        index = exponential_quantile(counts, estimate.q, share, rng, estimate.prior)
        chosen[estimate.table, estimate.column, estimate.side] = estimate.grid[index]
        _note(by_name[estimate.table], estimate, share)
    for name in {e.table for e in estimates if e.side == "rows"}:
        if (name, None, "groups") not in chosen:
            by_name[name].bound_notes.append(
                "max_groups_per_unit stays 1: no text, bool or date column to group by; "
                "raise it to the groups a unit adds to when you group by another column"
            )
    _apply(by_name, chosen)
    return cost


def _note(table: TableDraft, estimate: Estimate, share: Fraction) -> None:
    percent = f"{float(estimate.q) * 100:g}th percentile"
    if estimate.side == "lower":
        percent = f"{100 - float(estimate.q) * 100:g}th percentile"
    text = (
        f"{estimate.side}: DP estimate ({percent} of {estimate.what}, epsilon {float(share):.4g})"
    )
    if estimate.column is None:
        table.bound_notes.append(text)
    else:
        table.columns[estimate.column].notes.append(text)


def _apply(tables: dict[str, TableDraft], chosen: dict[tuple[str, str | None, str], Any]) -> None:
    for (name, column, side), value in chosen.items():
        table = tables[name]
        if side == "rows":
            table.max_rows = value
        elif side == "groups":
            table.max_groups = value
        elif side == "upper":
            lower = 0 - chosen[name, column, "lower"]  # 0 - 0.0 is 0.0, never -0.0
            spec = table.columns[column].spec
            spec["lower"], spec["upper"] = min(lower, value), max(lower, value)
            notes = table.columns[column].notes
            notes[:] = [n for n in notes if not n.startswith("no bounds yet")]
            notes.append("values outside [lower, upper] are clamped into it")
