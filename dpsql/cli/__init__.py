"""The `dpsql` command: run private queries, show budgets, write the demo.

dpsql query --demo "SELECT sex, COUNT(*) FROM census GROUP BY sex"
dpsql query --database pums.duckdb --policy policy.yaml "SELECT AVG(income) FROM pums"
dpsql budget --demo
dpsql demo ./demo        # writes census.duckdb and policy.yaml to try other tools on
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from dpsql.errors import Error
from dpsql.shell import render


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        return args.run(args) or 0
    except Error as exc:
        Console(stderr=True).print(f"[bold red]{type(exc).__name__}:[/] {exc}", highlight=False)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpsql",
        description="Differentially private answers to ordinary aggregate SQL, with an "
        "enforced privacy budget.",
        epilog='Start with: dpsql query --demo "SELECT sex, COUNT(*) FROM census GROUP BY sex"',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    query = commands.add_parser(
        "query", help="run one private query and print the noisy answer",
        description="Run one SQL query through dpsql. The answer is noisy; each noisy column "
        "shows its 95% interval, and the query's cost is charged to your budget (repeating "
        "the same query returns the same answer for free).",
    )  # fmt: skip
    _add_connection_options(query)
    query.add_argument("sql", help='the query, e.g. "SELECT COUNT(*) FROM census"')
    query.add_argument("--epsilon", type=float, help="privacy cost of this query (default: policy)")
    query.add_argument("--json", action="store_true", help="print the release as JSON")
    query.set_defaults(run=_run_query)

    budget = commands.add_parser(
        "budget", help="show the analyst's spent and remaining budget",
        description="Show total, spent and remaining epsilon and delta from the ledger.",
    )  # fmt: skip
    _add_connection_options(budget)
    budget.set_defaults(run=_run_budget)

    demo = commands.add_parser(
        "demo", help="write the demo database and policy to a folder",
        description="Write census.duckdb (a synthetic census-like table) and policy.yaml, "
        "to use with --database/--policy or other tools.",
    )  # fmt: skip
    demo.add_argument("directory", type=Path, help="folder to write into")
    demo.set_defaults(run=_run_demo)

    for module in _COMMAND_MODULES:
        importlib.import_module(module).register(commands)
    return parser


# Modules that add commands of their own: each has `register(commands)`, which
# adds its subparsers, so a feature's command line lives beside the feature.
_COMMAND_MODULES = (
    "dpsql.cli.ldp", "dpsql.cli.shell", "dpsql.cli.serve", "dpsql.cli.watch",
    "dpsql.cli.synopsis", "dpsql.cli.cache",
)  # fmt: skip


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


def _add_connection_options(
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


def _require_source(args: argparse.Namespace) -> None:
    """Refuse a command line that names neither the demo nor a database and policy."""
    if not args.demo and (not args.database or not args.policy):
        raise SystemExit("dpsql: give --database and --policy, or --demo for the built-in data")


def _connect(args: argparse.Namespace, **options: Any) -> Any:
    import dpsql

    _require_source(args)
    if args.demo:
        from dpsql import demo

        return dpsql.connect(
            demo.demo_connection(), policy=demo.DEMO_POLICY, analyst=args.analyst,
            ledger=args.ledger or demo.demo_ledger_path(), **options,
        )  # fmt: skip
    return dpsql.connect(
        args.database, policy=args.policy, analyst=args.analyst, ledger=args.ledger, **options
    )


def _run_query(args: argparse.Namespace) -> int:
    with _connect(args, epsilon=args.epsilon) as connection:
        cursor = connection.execute(args.sql)
        rows = cursor.fetchall() if cursor.description else []
        budget = connection.budget()
        if args.json:
            print(json.dumps({
                "columns": [d[0] for d in cursor.description or []],
                "rows": rows,
                "accuracy": {k: vars(v) for k, v in cursor.accuracy.items()},
                "notes": cursor.notes,
                "budget": vars(budget),
            }, default=str, indent=2))  # fmt: skip
            return 0
        console = Console()
        if cursor.description:
            names = [d[0] for d in cursor.description]
            console.print(render.result_table(names, rows, cursor.accuracy))
        for note in cursor.notes:
            console.print(f"[dim]note: {note}[/]", highlight=False)
        console.print(f"[dim]{render.budget_line(budget)}[/]", highlight=False)
    return 0


def _run_budget(args: argparse.Namespace) -> int:
    with _connect(args) as connection:
        budget = connection.budget()
    Console().print(render.budget_table(budget))
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    from dpsql.demo import write_demo

    try:
        database, policy = write_demo(args.directory)
    except OSError as exc:
        raise SystemExit(
            f"dpsql demo: cannot write to {args.directory}: {exc.strerror or exc}; "
            "give a folder you can write"
        ) from None
    print(f"wrote {database} and {policy}\ntry: dpsql query --database {database} --policy "
          f"{policy} \"SELECT educ, AVG(income) FROM census GROUP BY educ\"")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
