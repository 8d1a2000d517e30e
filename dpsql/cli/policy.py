"""`dpsql policy init`: draft a policy from a database's schema (dpsql/draft/ does the work).

dpsql policy init --database sales.duckdb -o policy.yaml
dpsql policy init --database sales.duckdb --public products --suggest-bounds 0.5 -o policy.yaml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dpsql.cli.common import add_actions, number_in
from dpsql.policy import MAX_EPSILON


def register(commands: Any) -> None:
    """Add `policy` (its action `init`) to the `dpsql` parser."""
    (init,) = add_actions(
        commands,
        "policy",
        help="draft a privacy policy from a database's schema",
        description="Work with privacy policies.",
        actions=[
            (
                "init",
                _init,
                "Draft a policy from a database's schema: every table and column with its "
                "type, privacy units and references guessed from keys and names, "
                "identifiers and free text private, with comments saying what each "
                "choice means. Bounds are left to you, or suggested by a small DP "
                "estimate charged to your own budget (--suggest-bounds).",
            )
        ],
    ).values()
    init.add_argument(
        "--database",
        required=True,
        help="a DuckDB file, or a URL: postgresql://..., any SQLAlchemy URL",
    )
    init.add_argument(
        "-o", "--output", required=True, type=Path, help="the policy file to write ('-' prints it)"
    )
    init.add_argument("--force", action="store_true", help="overwrite the output file")
    init.add_argument(
        "--table",
        action="append",
        default=[],
        metavar="TABLE",
        help="draft only this table (repeat for several; default: all)",
    )
    init.add_argument(
        "--public",
        action="append",
        default=[],
        metavar="TABLE",
        help="a table that holds no person's data (products, calendars): "
        "drafted public, read freely and answered exactly",
    )
    init.add_argument(
        "--read-domains",
        action="store_true",
        help="read the values of text columns with few of them from the data "
        "(exactly, not DP) and list them as public key domains",
    )
    estimate = init.add_argument_group("suggested bounds (DP, charged)")
    estimate.add_argument(
        "--suggest-bounds",
        metavar="EPSILON",
        type=number_in(float, 1e-9, MAX_EPSILON),
        help="spend EPSILON on DP estimates of numeric ranges and of rows "
        "and groups per unit, written into the draft",
    )
    estimate.add_argument(
        "--analyst",
        default="owner",
        help="whose budget to charge (default: owner; written into the draft's analysts)",
    )
    estimate.add_argument(
        "--owner-budget",
        metavar="EPSILON",
        type=number_in(float, 1e-9, MAX_EPSILON),
        help="that analyst's total budget, written into the draft (default: the "
        "--suggest-bounds EPSILON, so that one run spends it: each run draws fresh noise, "
        "and averaged runs would be more precise than any one was charged for)",
    )
    estimate.add_argument(
        "--ledger",
        help="the budget ledger to charge, named in the draft "
        "(default: beside a DuckDB file; needed for a URL)",
    )


def _init(args: argparse.Namespace) -> int:
    from dpsql.draft import Suggestion, draft_policy

    output: Path = args.output
    to_stdout = str(output) == "-"
    if not to_stdout and output.exists() and not args.force:
        raise SystemExit(
            f"dpsql policy init: {output} exists; give another -o, or --force to overwrite it"
        )
    suggestion = None
    if args.suggest_bounds is not None:
        suggestion = Suggestion(
            args.suggest_bounds,
            args.analyst,
            args.owner_budget,
            ledger=args.ledger,
        )
    draft = draft_policy(
        args.database,
        tables=args.table,
        public=args.public,
        domains=args.read_domains,
        suggestion=suggestion,
    )
    if to_stdout:
        sys.stdout.write(draft.text)
        return 0
    try:
        output.write_text(draft.text, encoding="utf-8")
    except OSError as exc:
        raise SystemExit(
            f"dpsql policy init: cannot write {output}: {exc.strerror or exc}; give a path "
            "you can write"
        ) from None
    print(f"wrote {output}: {len(draft.tables)} tables")
    if draft.spent is not None:
        print(
            f"charged epsilon {float(draft.spent.epsilon):g} to analyst {args.analyst} "
            f"(ledger {draft.ledger})"
        )
    if draft.left_open:
        print("left for you (see the comments in the file):")
        for item in draft.left_open:
            print(f"  - {item}")
    print(
        f'try: dpsql query --database {args.database} --policy {output} "SELECT COUNT(*) '
        f'FROM {draft.tables[0].name}"'
    )
    return 0
