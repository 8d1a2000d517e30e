"""The `dpsql watch` command: a standing running-total query, printed tick by tick.

dpsql watch --database events.duckdb --policy policy.yaml --every 1h \\
    [--continual factorization] \\
    "SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) AS so_far FROM events GROUP BY day"
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from rich.console import Console

from dpsql.errors import ProgrammingError
from dpsql.policy import CONTINUAL_MECHANISMS

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def interval_seconds(text: str) -> float:
    """'90s', '15m', '1h', '1d' (or plain seconds) as seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise ProgrammingError(f"--every takes an interval like 30s, 15m, 1h or 1d, got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def register(subparsers: Any) -> None:
    """Add the `watch` command to the `dpsql` parser."""
    from dpsql.cli import _add_connection_options

    watch = subparsers.add_parser(
        "watch", help="release a running total now and again as new steps complete",
        description="Register a running-total query: its stream is charged once, then each "
        "tick prints the running totals of the steps completed since the last tick, for free.",
    )  # fmt: skip
    _add_connection_options(watch)
    watch.add_argument("sql", help="a running-total query (SUM(COUNT(*)) OVER (ORDER BY day))")
    watch.add_argument("--every", default="1h", help="time between ticks: 30s, 15m, 1h, 1d")
    watch.add_argument("--ticks", type=int, help="stop after this many ticks (default: never)")
    watch.add_argument(
        "--continual", choices=CONTINUAL_MECHANISMS,
        help="the stream's mechanism (default: the policy's); as SET dpsql.continual",
    )  # fmt: skip
    watch.set_defaults(run=_run_watch)


def _run_watch(args: argparse.Namespace) -> int:
    from dpsql.cli import _connect

    every = interval_seconds(args.every)
    console = Console()
    with _connect(args, continual=args.continual) as connection:
        for release in connection.watch(args.sql, every, args.ticks):
            for row in release.rows:
                console.print("\t".join(str(v) for v in row), highlight=False)
            console.print(f"[dim]tick: {len(release.rows)} new rows[/]", highlight=False)
    return 0
