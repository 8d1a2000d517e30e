"""`dpsql synopsis`: list, build and drop an analyst's range-count synopses.

    dpsql synopsis list  --database visits.duckdb --policy policy.yaml
    dpsql synopsis build --database visits.duckdb --policy policy.yaml visits.day
    dpsql synopsis drop  --database visits.duckdb --policy policy.yaml visits.day

A synopsis is per analyst (budgets are). `build` charges its cost once
(epsilon, or rho for a Gaussian synopsis);
`drop` forgets the stored synopsis, but the charge stays in the ledger, and
the next range query on the column builds (and charges) a new one.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from dpsql.cli.common import add_actions, add_connection_options, open_from

if TYPE_CHECKING:
    from dpsql.accounting import Cost  # what a synopsis's status says it costs


def register(subparsers: Any) -> None:
    """Add `synopsis list | build | drop` to the main parser."""
    actions = add_actions(
        subparsers, "synopsis", "list, build or drop range-count synopses",
        "Range counts on a column with a synopsis in the policy are answered from one noisy "
        "hierarchical histogram, charged once per analyst.",
        (
            ("list", _run_list, "show each declared synopsis, its cost and age"),
            ("build", _run_build, "build a synopsis now (charges its cost once)"),
            ("drop", _run_drop, "forget a synopsis (its charge stays)"),
        ),
    )  # fmt: skip
    for name, action in actions.items():
        add_connection_options(action)
        if name != "list":
            action.add_argument("name", help="table.column, e.g. visits.day")


def _target(name: str) -> tuple[str, str]:
    table, dot, column = name.rpartition(".")
    if not dot or not table or not column:
        raise SystemExit(f"dpsql synopsis: give the synopsis as table.column, got {name!r}")
    return table, column


def _cost(cost: Cost) -> str:
    if cost.rho:
        return f"rho {float(cost.rho):.6g} (zCDP)"
    return f"epsilon {float(cost.epsilon):g}"


def _age(built: str | None) -> str:
    if built is None:
        return "not built"
    seconds = (dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(built)).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{max(seconds, 0):.0f} s"


def _run_list(args: argparse.Namespace) -> int:
    with open_from(args) as session:
        statuses = session.synopses()
    table = Table(title=f"synopses of {args.analyst}", header_style="bold")
    for column in ("synopsis", "shape", "cost", "age"):
        table.add_column(column)
    for status in statuses:
        cost = _cost(status.cost) + (" (paid)" if status.built else "")
        table.add_row(status.name, status.shape, cost, _age(status.built))
    Console().print(table)
    if not statuses:
        Console().print("[dim]the policy declares no synopsis (add 'synopsis:' to a column)[/]")
    return 0


def _run_build(args: argparse.Namespace) -> int:
    with open_from(args) as session:
        before = len(session.charges())
        status = session.build_synopsis(*_target(args.name))
        charged = len(session.charges()) > before
    verb, cost = ("built", _cost(status.cost)) if charged else ("already built", "nothing")
    print(f"{status.name}: {verb} {status.built}, {status.shape}; charged {cost}")
    return 0


def _run_drop(args: argparse.Namespace) -> int:
    with open_from(args) as session:
        dropped = session.drop_synopsis(*_target(args.name))
    print(
        f"{args.name}: dropped (its charge stays; the next range query builds a new one)"
        if dropped
        else f"{args.name}: was not built"
    )
    return 0
