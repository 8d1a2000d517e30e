"""`dpsql query`: run one private query and print its noisy answer (or the release as JSON).

dpsql query --demo "SELECT sex, COUNT(*) FROM census GROUP BY sex"
dpsql query --database pums.duckdb --policy policy.yaml --json "SELECT AVG(income) FROM pums"
dpsql query --demo --csv "SELECT sex, AVG(income) FROM census GROUP BY sex" > means.csv

The table and CSV show each value to the precision its 95% interval supports
(results.noisy_text); --json gives the full values and intervals, for programs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console

from dpsql.cli.common import add_connection_options, demo_reset_hint, open_from
from dpsql.errors import BudgetExhausted
from dpsql.shell import render


def register(commands: Any) -> None:
    """Add `query` to the `dpsql` parser."""
    query = commands.add_parser(
        "query", help="run one private query and print the noisy answer",
        description="Run one SQL query through dpsql. The answer is noisy; each noisy column "
        "shows its 95% interval, and the query's cost is charged to your budget (repeating "
        "the same query returns the same answer for free).",
    )  # fmt: skip
    add_connection_options(query)
    query.add_argument("sql", help='the query, e.g. "SELECT COUNT(*) FROM census"')
    query.add_argument("--epsilon", type=float, help="privacy cost of this query (default: policy)")
    output = query.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the release as JSON")
    output.add_argument(
        "--csv", action="store_true",
        help="print the rows as CSV, each noisy column followed by its 95%% interval",
    )  # fmt: skip
    query.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    with open_from(args, epsilon=args.epsilon) as session:
        before = session.budget()
        try:
            release = session.execute(args.sql)
        except BudgetExhausted as exc:
            Console(stderr=True).print(
                f"[bold red]{type(exc).__name__}:[/] {exc.advice(*_budget_words(args))}",
                highlight=False,
            )
            return 1
        rows = release.rows if release.columns else []
        budget = session.budget()
        if args.json:
            print(json.dumps({
                "columns": list(release.columns),
                "rows": rows,
                "accuracy": {k: vars(v) for k, v in release.accuracy.items()},
                "notes": release.notes,
                "budget": vars(budget),
            }, default=str, indent=2))  # fmt: skip
            return 0
        notes = [*release.notes, *render.accuracy_notes(release.accuracy)]
        if args.csv:  # the notes go to stderr, so that stdout is the CSV alone
            render.write_csv(sys.stdout, release.columns, rows, release.accuracy)
            for note in notes:
                print(f"note: {note}", file=sys.stderr)
            return 0
        console = Console()
        if release.columns:
            console.print(render.result_table(release.columns, rows, release.accuracy))
        for note in notes:
            console.print(f"[dim]note: {note}[/]", highlight=False)
        console.print(f"[dim]{render.cost_line(before, budget)}[/]", highlight=False)
    return 0


def _budget_words(args: argparse.Namespace) -> tuple[str, str | None]:
    """How this command lowers a query's cost, and how to start the demo's budget afresh."""
    return "--epsilon <smaller value>", demo_reset_hint(args)
