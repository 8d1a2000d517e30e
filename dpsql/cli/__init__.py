"""The `dpsql` command: parse the command line and run one subcommand (this package's job).

dpsql query --demo "SELECT sex, COUNT(*) FROM census GROUP BY sex"
dpsql query --database pums.duckdb --policy policy.yaml "SELECT AVG(income) FROM pums"
dpsql budget --demo
dpsql demo ./demo        # writes census.duckdb and policy.yaml to try other tools on
dpsql policy init --database sales.duckdb -o policy.yaml

One module per subcommand, named as the subcommand, each with `register(commands)`
adding its parser: query, budget, demo, policy, ldp, shell, serve, passwd, watch,
synopsis, cache (SUBCOMMANDS, the order `dpsql --help` lists them). common.py holds what
several share (the connection options, and opening a Session from them).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rich.console import Console

from dpsql import __version__
from dpsql.errors import Error

#: The subcommands, in the order `dpsql --help` lists them: each is the module
#: dpsql/cli/<name>.py (tests/test_layout.py checks that the two lists agree).
SUBCOMMANDS = (
    "query", "budget", "demo", "policy", "ldp", "shell", "serve", "passwd", "watch", "synopsis",
    "cache",
)  # fmt: skip


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
    parser.add_argument("--version", action="version", version=f"dpsql {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"dpsql.cli.{name}").register(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
