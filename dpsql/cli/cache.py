"""`dpsql cache`: show and clear what the ledger stores beside the charges.

    dpsql cache show  --database visits.duckdb --policy policy.yaml
    dpsql cache clear --database visits.duckdb --policy policy.yaml
    dpsql cache clear --database visits.duckdb --policy policy.yaml --kind answers --analyst bob

The ledger keeps noisy answers (so a repeated query gets the same answer,
free), range synopses and the noise running streams have released. When the
data changes, the owner clears them: the next query of each kind is charged
and answered afresh. Charges always stay. Without `--analyst`, every
analyst's are shown or cleared.

It administers every analyst's stored releases, so it may read the policy
(`dpsql.policy`, for its analysts' names); the rest goes through the Session.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from dpsql.cli.common import add_actions, add_connection_options, open_from, require_source
from dpsql.session import STORED_KINDS, Session

_AFTER_CLEARING = {
    "answers": "repeated queries are charged and answered afresh",
    "synopses": "the next range query on each column builds (and charges) a new synopsis",
    "streams": "the next tick of each stream starts it again (and charges it once)",
}


def register(subparsers: Any) -> None:
    """Add `cache show | clear` to the main parser."""
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
        add_connection_options(
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


def _open(args: argparse.Namespace) -> tuple[Session, bool]:
    """A Session for the analyst named, or, for every analyst's, for any one of the
    policy's analysts: showing and clearing charge nothing."""
    every = args.analyst is None
    if every:
        from dpsql import demo
        from dpsql.policy import load_policy  # this command's one reach past the Session

        require_source(args)
        policy = load_policy(demo.DEMO_POLICY if args.demo else args.policy)
        args = argparse.Namespace(**vars(args) | {"analyst": min(policy.analysts)})
    return open_from(args), every


def _run_show(args: argparse.Namespace) -> int:
    session, every = _open(args)
    with session:
        stored = session.stored(every_analyst=every)
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
    session, every = _open(args)
    with session:
        dropped = session.clear_stored(kinds, every_analyst=every)
    whose = "every analyst" if every else args.analyst
    for kind, count in dropped.items():
        after = f"; {_AFTER_CLEARING[kind]}" if count else ""
        print(f"{kind}: dropped {count:,} (of {whose}){after}")
    print("charges stay in the ledger")
    return 0
