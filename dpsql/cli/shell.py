"""`dpsql shell`: an interactive terminal for private SQL, and its non-interactive mode.

dpsql shell --demo
dpsql shell --database pums.duckdb --policy policy.yaml
dpsql shell --server postgresql://alice@127.0.0.1:5433/db
dpsql shell --demo -c "SELECT sex, COUNT(*) FROM census GROUP BY sex"
dpsql shell --demo --csv < queries.sql

`register(commands)` adds the `shell` subcommand to the `dpsql` parser and runs
the shell (dpsql/shell/) over a Session in this process, or over the wire. The
prompt itself (prompt_toolkit) is imported only when a prompt is needed, so
other commands start fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console

from dpsql.cli.common import add_connection_options, demo_reset_hint, open_from

if TYPE_CHECKING:
    from dpsql.shell.connection import ShellConnection
    from dpsql.shell.engine import Shell

_EXAMPLES = """examples:
  dpsql shell --demo
  dpsql shell --database pums.duckdb --policy policy.yaml --analyst alice
  dpsql shell --server postgresql://alice@127.0.0.1:5433/db
  dpsql shell --demo -c "SELECT sex, COUNT(*) FROM census GROUP BY sex" -c "\\budget"
  dpsql shell --demo --csv < queries.sql

Inside the shell, \\help lists the meta-commands (\\budget, \\policy, \\explain,
\\set epsilon 0.5, \\set mechanism laplace, \\set continual factorization, \\q)."""


def register(commands: argparse._SubParsersAction) -> None:
    shell = commands.add_parser(
        "shell", help="an interactive terminal for private queries (also -c and scripts)",
        description="Type SQL, get noisy answers with a '± half-width' of the 95% interval "
        "beside each value, and see what each query cost. Without -c and with a script on "
        "standard input, runs the script (statements end with ';').",
        epilog=_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    source = add_connection_options(shell)
    source.add_argument(
        "--server", metavar="URL",
        help="a running `dpsql serve`, e.g. postgresql://alice@127.0.0.1:5433/db",
    )  # fmt: skip
    run = shell.add_argument_group("what to run")
    run.add_argument(
        "-c", "--command", action="append", metavar="SQL",
        help="run SQL (or a \\meta-command) and exit; repeat for several",
    )  # fmt: skip
    run.add_argument("--csv", action="store_true", help="print answers as CSV, the rest to stderr")
    run.add_argument(
        "--continue", dest="keep_going", action="store_true",
        help="keep running after a failed statement (the exit status is still 1)",
    )  # fmt: skip
    run.add_argument("--epsilon", type=float, help="privacy cost of each query (default: policy)")
    run.add_argument("--mechanism", help="noise mechanism (default: policy)")
    shell.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from dpsql.shell.engine import Shell

    connection = _open(args)
    try:
        interactive = not args.command and sys.stdin.isatty()
        csv = sys.stdout if args.csv and not interactive else None
        shell = Shell(connection, Console(), Console(stderr=True), csv)
        shell.start()
        for name in ("epsilon", "mechanism"):
            value = getattr(args, name)
            if value is not None and not shell.run_text(f"\\set {name} {value}"):
                return 1
        if interactive:
            from dpsql.shell.repl import repl

            return repl(shell)
        return 0 if _run_script(shell, args) else 1
    finally:
        connection.close()


def _run_script(shell: Shell, args: argparse.Namespace) -> bool:
    """Each -c in turn, else standard input; False when a statement failed."""
    from dpsql.shell.engine import Quit

    scripts = [(f"command {i}, ", text) for i, text in enumerate(args.command or [], 1)]
    ok = True
    try:
        for source, text in scripts or [("", sys.stdin.read())]:
            if not shell.run_text(text, args.keep_going, source):
                ok = False
                if not args.keep_going:
                    break
    except Quit:
        pass
    return ok


def _password_prompt(url: str) -> Callable[[], str] | None:
    if not sys.stdin.isatty():
        return None  # a script cannot answer; PGPASSWORD or the URL must carry it
    import getpass

    return lambda: getpass.getpass(f"password for {url}: ")


def _open(args: argparse.Namespace) -> ShellConnection:
    from dpsql.shell.connection import LocalConnection, WireConnection

    if args.server:
        if args.demo or args.database or args.policy:
            raise SystemExit("dpsql shell: give --server, or --database/--policy/--demo, not both")
        return WireConnection(args.server, _password_prompt(args.server))
    where = "the demo census" if args.demo else str(args.database)
    return LocalConnection(open_from(args), where, reset=demo_reset_hint(args))
