"""`dpsql passwd ANALYST`: set an analyst's password for `dpsql serve`.

    dpsql passwd alice --users users.txt        # add or update alice in a users file
    dpsql passwd alice                          # print the verifier for the policy
    dpsql passwd alice --policy policy.yaml     # ... and warn if the policy lacks alice

Asks for the password twice (or reads one line with --password-stdin) and
stores its SCRAM-SHA-256 verifier, never the password, through the wire
server's users file (dpsql/server/auth.py). No Session: nothing is charged.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from dpsql.errors import InterfaceError


def register(commands: argparse._SubParsersAction) -> None:
    """Add `passwd` to the `dpsql` parser."""
    passwd = commands.add_parser(
        "passwd", help="set an analyst's password for dpsql serve",
        description="Ask for a password twice and store its SCRAM-SHA-256 verifier (never the "
        "password) in a users file, or print it for the policy's 'analysts.<name>.password'.",
    )  # fmt: skip
    passwd.add_argument("analyst", help="the analyst's name, as in the policy")
    passwd.add_argument("--users", help="users file to add to or update (created mode 0600)")
    passwd.add_argument("--policy", help="warn when the analyst is not in this policy (a "
                        "login then succeeds, but every query is refused)")  # fmt: skip
    passwd.add_argument("--password-stdin", action="store_true",
                        help="read the password from standard input (for scripts)")  # fmt: skip
    passwd.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from dpsql.server.auth import make_verifier, write_user

    if args.policy:
        _warn_if_unknown(args.analyst, args.policy)
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"new password for {args.analyst}: ")
        if getpass.getpass("again: ") != password:
            raise InterfaceError("the passwords differ; nothing was written")
    verifier = make_verifier(password)
    if args.users:
        write_user(args.users, args.analyst, verifier)
        print(f"stored the verifier of {args.analyst} in {args.users}")
    else:
        print(f"add to the policy:\nanalysts:\n  {args.analyst}:\n    password: '{verifier}'")
    return 0


def _warn_if_unknown(analyst: str, source: str) -> None:
    """Say on stderr when the policy does not name `analyst`: their password would let
    them log in to a server that refuses all they ask."""
    from dpsql.policy import load_policy

    known = sorted(load_policy(source).analysts)
    if analyst not in known:
        print(
            f"warning: {analyst} is not an analyst of {source} (it names "
            f"{', '.join(known) or 'none'}); add them under 'analysts:' with a budget, or "
            "their queries are refused",
            file=sys.stderr,
        )
