"""The `dpsql cache` command: show and clear what the ledger stores beside the charges.

    dpsql cache show  --database visits.duckdb --policy policy.yaml
    dpsql cache clear --database visits.duckdb --policy policy.yaml
    dpsql cache clear --database visits.duckdb --policy policy.yaml --kind answers --analyst bob

The ledger keeps noisy answers (so a repeated query gets the same answer,
free), range synopses and the noise running streams have released. When the
data changes, the owner clears them: the next query of each kind is charged
and answered afresh. Charges always stay. Without `--analyst`, every
analyst's are shown or cleared.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from dpsql.session import STORED_KINDS

_AFTER_CLEARING = {
    "answers": "repeated queries are charged and answered afresh",
    "synopses": "the next range query on each column builds (and charges) a new synopsis",
    "streams": "the next tick of each stream starts it again (and charges it once)",
}


def register(subparsers: Any) -> None:
    """Add `cache show | clear` to the main parser."""
    from dpsql.cli import _add_connection_options, add_actions

    actions = add_actions(
        subparsers, "cache", "show or clear stored answers, synopses and streams",
        "The ledger keeps noisy answers for repeats, range synopses and the noise released by "
        "running streams. Clear them when the data changes (or set data_version in the "
        "policy); charges always stay.",
        (
            ("show", _run_show, "count what the ledger stores, per analyst and kind"),
            ("clear", _run_clear, "drop stored answers, synopses and streams (charges stay)"),
        ),
        epilog=_EPILOG,
    )  # fmt: skip
    for action in actions.values():
        # every analyst's unless --analyst names one: the data changed for all of them
        _add_connection_options(
            action, "whose stored releases (default: every analyst's)", analyst_default=None
        )
    actions["clear"].add_argument(
        "--kind", action="append", choices=STORED_KINDS,
        help="what to drop (repeat for several; default: all three)",
    )  # fmt: skip


_EPILOG = (
    "Without --analyst, every analyst's. A running `dpsql serve` keeps answering the repeats "
    "it already holds in memory until it restarts; to have it answer afresh, change "
    "data_version in the policy and restart it."
)


def _connect(args: argparse.Namespace) -> Any:
    """A connection for the analyst named, or, for every analyst's, for any one of the
    policy's analysts: showing and clearing charge nothing."""
    from dpsql.cli import _connect as connect
    from dpsql.cli import _require_source

    every = args.analyst is None
    if every:
        from dpsql import demo
        from dpsql.policy import load_policy

        _require_source(args)
        policy = load_policy(demo.DEMO_POLICY if args.demo else args.policy)
        args = argparse.Namespace(**vars(args) | {"analyst": min(policy.analysts)})
    return connect(args), every


def _run_show(args: argparse.Namespace) -> int:
    connection, every = _connect(args)
    with connection:
        stored = connection.session.stored(every_analyst=every)
    console = Console()
    if not stored:
        console.print("nothing stored: no answer, synopsis or stream (charges are not shown)")
        return 0
    table = Table(title="stored in the ledger (charges not shown)", header_style="bold")
    for column in ("analyst", "kind", "count", "newest (UTC)"):
        table.add_column(column, justify="right" if column == "count" else "left")
    for item in stored:
        table.add_row(item.analyst, item.kind, f"{item.count:,}", item.newest[:19])
    console.print(table)
    return 0


def _run_clear(args: argparse.Namespace) -> int:
    kinds = args.kind or STORED_KINDS
    connection, every = _connect(args)
    with connection:
        dropped = connection.session.clear_stored(kinds, every_analyst=every)
    whose = "every analyst" if every else args.analyst
    for kind, count in dropped.items():
        after = f"; {_AFTER_CLEARING[kind]}" if count else ""
        print(f"{kind}: dropped {count:,} (of {whose}){after}")
    print("charges stay in the ledger")
    return 0
