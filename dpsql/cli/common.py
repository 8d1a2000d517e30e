"""What several `dpsql` subcommands share: the options naming what to connect to, the
Session they open, and argparse helpers (a bounded number, a command of actions).

Not a subcommand itself: each subcommand is a module of its own beside this one.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any

from dpsql.session import Session, open_session


def number_in(kind: type, low: float, high: float = math.inf) -> Callable[[str], float]:
    """An argparse type: a finite `kind` number within [low, high], or a message saying
    so (argparse prints it with the option's name and the usage)."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            noun = "whole number" if kind is int else "number"
            raise argparse.ArgumentTypeError(f"expected a {noun}, got {text!r}") from None
        if not low <= value <= high or not math.isfinite(value):  # NaN fails both
            upper = "" if high == math.inf else f" and at most {high:g}"
            raise argparse.ArgumentTypeError(f"must be at least {low:g}{upper}, got {text}")
        return value

    return parse


def add_actions(
    commands: Any,
    name: str,
    help: str,
    description: str,
    actions: Sequence[tuple[str, Callable[[argparse.Namespace], int], str]],
    **parser_options: Any,
) -> dict[str, argparse.ArgumentParser]:
    """`dpsql <name> <action>`: a command whose actions each run one function. Returns
    each action's parser by name, for the arguments of its own."""
    command = commands.add_parser(name, help=help, description=description)
    choices = command.add_subparsers(title="actions", metavar="ACTION", required=True)
    parsers = {}
    for action, run, text in actions:
        parsers[action] = choices.add_parser(action, help=text, description=text, **parser_options)
        parsers[action].set_defaults(run=run)
    return parsers


def add_connection_options(
    parser: argparse.ArgumentParser,
    analyst_help: str = "whose budget to charge",
    analyst_default: str | None = "default",
) -> argparse._ArgumentGroup:
    """The options naming the database, policy, analyst and ledger; returns their group."""
    source = parser.add_argument_group("what to connect to")
    source.add_argument(
        "--demo", action="store_true",
        help="use the built-in synthetic census table (table 'census') and its policy",
    )  # fmt: skip
    source.add_argument(
        "--database",
        help="a DuckDB file, or a URL: postgresql://..., any SQLAlchemy URL, spark://local[2], "
        "sc://host:15002",
    )
    source.add_argument("--policy", help="privacy policy YAML file")
    source.add_argument("--analyst", default=analyst_default, help=analyst_help)
    source.add_argument("--ledger", help="budget ledger file (default: from the policy)")
    return source


def require_source(args: argparse.Namespace) -> None:
    """Refuse a command line that names neither the demo nor a database and policy."""
    if not args.demo and (not args.database or not args.policy):
        raise SystemExit("dpsql: give --database and --policy, or --demo for the built-in data")


def open_from(args: argparse.Namespace, **options: Any) -> Session:
    """The Session the connection options name (the demo's, or --database and --policy),
    for --analyst, with the Session's starting `options` (epsilon=, continual=, ...)."""
    require_source(args)
    if args.demo:
        from dpsql import demo

        return open_session(
            demo.demo_connection(), demo.DEMO_POLICY, args.analyst,
            ledger=args.ledger or demo.demo_ledger_path(), **options,
        )  # fmt: skip
    return open_session(args.database, args.policy, args.analyst, ledger=args.ledger, **options)


def demo_reset_hint(args: argparse.Namespace) -> str | None:
    """On the demo, whose ledger is the analyst's own, how to start its budget afresh."""
    if getattr(args, "demo", False) and not getattr(args, "ledger", None):
        from dpsql import demo

        return f"To start the demo's budget afresh, delete {demo.demo_ledger_path()}."
    return None
