"""`dpsql watch`: a standing running-total query, printed tick by tick.

dpsql watch --database events.duckdb --policy policy.yaml --every 1h \\
    [--continual factorization] \\
    "SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) AS so_far FROM events GROUP BY day"

`--every` is a positive interval of at most 365 days (MAX_WATCH_INTERVAL) and `--ticks`
a whole number of at least 1 (leave it out to watch until stopped); the parser
refuses anything else with a line saying what to write, before anything runs.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from rich.console import Console

from dpsql.cli.common import add_connection_options, number_in, open_from
from dpsql.errors import ProgrammingError
from dpsql.session import CHOICES, MAX_WATCH_INTERVAL

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def interval_seconds(text: str) -> float:
    """'90s', '15m', '1h', '1d' (or plain seconds) as seconds, more than 0 and at most a year."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    seconds = 0.0 if match is None else float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not 0 < seconds <= MAX_WATCH_INTERVAL:
        raise ProgrammingError(
            f"--every takes an interval like 30s, 15m, 1h or 1d (more than 0, at most 365d), "
            f"got {text!r}"
        )
    return seconds


def _every(text: str) -> float:
    """The argparse type of --every: its message, printed after `argument --every: `."""
    try:
        return interval_seconds(text)
    except ProgrammingError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--every ")) from None


def _ticks(text: str) -> int:
    """The argparse type of --ticks: a whole number of at least 1. Not 0, which would
    print nothing and might be meant as 'never stop' (as some tools read it)."""
    try:
        return int(number_in(int, 1)(text))
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(
            f"{exc} (leave --ticks out to watch until stopped)"
        ) from None


def register(subparsers: Any) -> None:
    """Add the `watch` command to the `dpsql` parser."""
    watch = subparsers.add_parser(
        "watch", help="release a running total now and again as new steps complete",
        description="Register a running-total query: its stream is charged once, then each "
        "tick prints the running totals of the steps completed since the last tick, for free.",
    )  # fmt: skip
    add_connection_options(watch)
    watch.add_argument("sql", help="a running-total query (SUM(COUNT(*)) OVER (ORDER BY day))")
    watch.add_argument(
        "--every", type=_every, default="1h", metavar="INTERVAL",
        help="time between ticks: 30s, 15m, 1h, 1d (at most 365d; default: 1h)",
    )  # fmt: skip
    watch.add_argument(
        "--ticks", type=_ticks, metavar="N",
        help="stop after N ticks, N at least 1 (default: never stop)",
    )  # fmt: skip
    watch.add_argument(
        "--continual", choices=CHOICES["continual"],
        help="the stream's mechanism (default, or policy: the policy's); as SET dpsql.continual",
    )  # fmt: skip
    watch.set_defaults(run=_run_watch)


def _run_watch(args: argparse.Namespace) -> int:
    console = Console()
    with open_from(args, continual=args.continual) as session:
        for release in session.watch(args.sql, args.every, args.ticks):
            for row in release.rows:
                console.print("\t".join(str(v) for v in row), highlight=False)
            console.print(f"[dim]tick: {len(release.rows)} new rows[/]", highlight=False)
    return 0
