"""`dpsql budget`: show an analyst's total, spent and remaining budget, read through the
Session (which reads the ledger).

dpsql budget --demo
dpsql budget --database pums.duckdb --policy policy.yaml --analyst alice
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from dpsql.cli.common import add_connection_options, open_from
from dpsql.shell import render


def register(commands: Any) -> None:
    """Add `budget` to the `dpsql` parser."""
    budget = commands.add_parser(
        "budget", help="show the analyst's spent and remaining budget",
        description="Show total, spent and remaining epsilon and delta from the ledger.",
    )  # fmt: skip
    add_connection_options(budget, analyst_help="whose budget to show")
    budget.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    with open_from(args) as session:
        budget = session.budget()
    Console().print(render.budget_table(budget))
    return 0
