"""`dpsql demo DIRECTORY`: write the demo database and its policy to a folder.

dpsql demo ./demo        # census.duckdb and policy.yaml, to try other tools on
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(commands: Any) -> None:
    """Add `demo` to the `dpsql` parser."""
    demo = commands.add_parser(
        "demo", help="write the demo database and policy to a folder",
        description="Write census.duckdb (a synthetic census-like table) and policy.yaml, "
        "to use with --database/--policy or other tools.",
    )  # fmt: skip
    demo.add_argument("directory", type=Path, help="folder to write into")
    demo.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
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
