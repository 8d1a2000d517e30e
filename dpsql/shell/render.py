"""How results look in a terminal: noisy values with their 95% interval, budgets, policies.

Shared by `dpsql shell` and `dpsql query`, so both show a release the same
way; each value is written by results.noisy_text (or csv_cells), at the
precision its interval supports. Everything here is a pure function from data
to rich renderables or text; nothing connects or runs a query.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import IO, Any

from rich.table import Table

from dpsql.results import Accuracy, csv_cells, csv_header, format_value, noisy_text
from dpsql.session import Budget


def result_table(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], accuracy: Mapping[str, Accuracy]
) -> Table:
    """The rows as a table; a noisy column's values carry their 95% interval."""
    table = Table(show_header=True, header_style="bold")
    for index, name in enumerate(columns):
        numeric = all(isinstance(row[index], int | float | Decimal | None) for row in rows)
        table.add_column(name, justify="right" if numeric else "left")
    for index, row in enumerate(rows):
        cells = [
            noisy_text(value, accuracy.get(name), index)
            for name, value in zip(columns, row, strict=True)
        ]
        table.add_row(*cells)
    return table


def accuracy_notes(accuracy: Mapping[str, Accuracy]) -> list[str]:
    """One line per noisy column whose interval is not one half-width for every row."""
    return [
        f"{name}: {item.note or 'the 95% interval varies per row'} "
        f"({item.mechanism}, noise scale {format_value(item.scale)})"
        for name, item in accuracy.items()
        if item.interval95 is None
    ]


def write_csv(
    out: IO[str],
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    accuracy: Mapping[str, Accuracy],
) -> None:
    """The rows as CSV, each value at the precision its interval supports; a noisy column
    is followed by `<column>_interval95` (its half-width) or, where the interval differs
    per row, by `<column>_low95` and `<column>_high95`."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([cell for name in columns for cell in csv_header(name, accuracy.get(name))])
    for index, row in enumerate(rows):
        writer.writerow(
            [
                cell
                for name, value in zip(columns, row, strict=True)
                for cell in csv_cells(value, accuracy.get(name), index)
            ]
        )


def budget_line(budget: Budget) -> str:
    """The analyst's remaining budget in one line."""
    return (
        f"budget of {budget.analyst}: epsilon {budget.epsilon_remaining:.4g} of "
        f"{budget.epsilon_total:.4g} remaining, delta {budget.delta_remaining:.3g} of "
        f"{budget.delta_total:.3g}"
    )


def cost_line(before: Budget | None, after: Budget) -> str:
    """What the last statement spent (the change in spent budget) and what remains."""
    if before is None:
        return budget_line(after)
    epsilon = after.epsilon_spent - before.epsilon_spent
    delta = after.delta_spent - before.delta_spent
    if epsilon <= 0 and delta <= 0:
        spent = "cost: nothing charged (answered from an earlier release)"
    else:
        spent = f"cost: epsilon {epsilon:.4g}, delta {delta:.3g}"
    return f"{spent} · {budget_line(after)}"


def budget_table(budget: Budget) -> Table:
    """Total, spent and remaining epsilon and delta."""
    table = Table(title=f"privacy budget of {budget.analyst}", header_style="bold")
    for column in ("", "total", "spent", "remaining"):
        table.add_column(column, justify="right")
    table.add_row("epsilon", f"{budget.epsilon_total:.6g}", f"{budget.epsilon_spent:.6g}",
                  f"{budget.epsilon_remaining:.6g}")  # fmt: skip
    table.add_row("delta", f"{budget.delta_total:.3g}", f"{budget.delta_spent:.3g}",
                  f"{budget.delta_remaining:.3g}")  # fmt: skip
    return table
