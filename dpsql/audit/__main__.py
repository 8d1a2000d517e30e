"""`python -m dpsql.audit`: audit the mechanisms and query shapes and print a verdict table."""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from dpsql.audit.events import Finding
from dpsql.audit.mechanisms import audit_mechanism, catalog, claim
from dpsql.audit.queries import QUERIES, audit_query
from dpsql.mechanisms.samplers import secure_generator

EPILOG = """\
How to read the table: "audited eps >=" is a lower bound on the epsilon the
release really spends, valid with the stated confidence for the whole table
at once (Bonferroni over its rows). A bound above the claim proves the claim
false; a bound below it is no proof of privacy, only a failure to find a
leak with this many runs. Honest Laplace at epsilon 1 with 10^6 runs audits
at about 0.99, which shows what the auditor can see. The two "broken_"
mechanisms are wrong on purpose: the table must flag them.

Exit status: 0 when every honest row passes and every broken one is flagged,
1 otherwise.

Examples:
  python -m dpsql.audit                                  everything, defaults
  python -m dpsql.audit --queries none --runs 2000000    mechanisms only, more power
  python -m dpsql.audit --mechanisms none --queries count,group_by --epsilon 2
"""


@dataclass(frozen=True)
class Row:
    """One audited target and what the audit found."""

    name: str
    honest: bool
    epsilon: float
    delta: float
    finding: Finding

    @property
    def flagged(self) -> bool:
        return self.finding.epsilon_bound > self.epsilon

    @property
    def ok(self) -> bool:
        return self.flagged != self.honest


def _parser() -> argparse.ArgumentParser:
    mechanisms = ", ".join(target.name for target in catalog())
    parser = argparse.ArgumentParser(
        prog="python -m dpsql.audit",
        description=textwrap.fill(
            "Audit dpsql's noise mechanisms and whole queries for privacy leaks. Each "
            "target runs many times on neighbouring inputs (x and x + sensitivity for a "
            "mechanism; two databases that differ by all rows of one person for a query); the "
            "event that best separates the outputs, chosen on half the runs and counted on the "
            "other half, gives a statistically valid lower bound on epsilon.",
            width=78,
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    choices = "comma-separated, 'all' or 'none' (default all)"
    options = [  # (flag, type, default, help)
        ("--mechanisms", str, "all", f"{choices}: {mechanisms}"),
        ("--queries", str, "all", f"{choices}: {', '.join(QUERIES)}"),
        ("--runs", int, 1_000_000, "runs per input for each mechanism (default 10^6; "
         "power grows with runs)"),
        ("--query-runs", int, 100_000, "releases per database for each query (default 10^5)"),
        ("--epsilon", float, 1.0, "claimed epsilon (default 1)"),
        ("--delta", float, 1e-6, "delta at which zCDP (Gaussian) claims are converted and "
         "audited (default 1e-6)"),
        ("--confidence", float, 0.999, "confidence for the whole table (default 0.999)"),
    ]  # fmt: skip
    for flag, kind, default, text in options:
        parser.add_argument(flag, type=kind, default=default, help=text)
    parser.add_argument("--seed", type=int, help="fixed seed, for reproducible runs (tests only)")
    parser.add_argument(
        "--per-release", action="store_true",
        help="call the plan's release once per run instead of once for all runs (slow)",
    )  # fmt: skip
    return parser


def _pick(choice: str, known: list[str], kind: str) -> list[str]:
    if choice == "all":
        return known
    if choice == "none":
        return []
    names = [name.strip() for name in choice.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(
            f"unknown {kind}: {', '.join(unknown)}; choose from {', '.join(known)}, all or none"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 0 < args.confidence < 1 or args.epsilon <= 0 or not 0 < args.delta < 1:
        raise SystemExit("need 0 < confidence < 1, epsilon > 0 and 0 < delta < 1")
    if min(args.runs, args.query_runs) < 20:
        raise SystemExit("need at least 20 runs per input (--runs, --query-runs)")
    targets = {target.name: target for target in catalog()}
    mechanisms = _pick(args.mechanisms, list(targets), "mechanism")
    queries = _pick(args.queries, list(QUERIES), "query")
    if not mechanisms and not queries:
        raise SystemExit("nothing to audit: name some --mechanisms or --queries")
    # Bonferroni: every row's bound holds at once with the stated confidence
    each = 1 - (1 - args.confidence) / (len(mechanisms) + len(queries))
    rng = secure_generator(args.seed)
    rows = []
    with Progress(transient=True, console=Console(stderr=True)) as progress:
        task = progress.add_task("auditing", total=len(mechanisms) + len(queries))
        for name in mechanisms:
            progress.update(task, description=f"mechanism {name}")
            target = targets[name]
            mechanism = target.build(target.sensitivity, args.epsilon, args.delta)
            finding = audit_mechanism(mechanism, args.runs, rng, delta=args.delta, confidence=each)
            epsilon, delta = claim(mechanism.cost, args.delta)
            rows.append(Row(name, target.honest, epsilon, delta, finding))
            progress.advance(task)
        for name in queries:
            progress.update(task, description=f"query {name}")
            epsilon, delta, finding = audit_query(
                QUERIES[name], args.query_runs, epsilon=args.epsilon, confidence=each,
                seed=args.seed, per_release=args.per_release,
            )  # fmt: skip
            rows.append(Row(f"query {name}", True, epsilon, delta, finding))
            progress.advance(task)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a log file or pipe: no need to wrap at 80 columns
    console.print(_table(rows, args.confidence))
    return 0 if all(row.ok for row in rows) else 1


def _table(rows: list[Row], confidence: float) -> Table:
    table = Table(title=f"Privacy audit: bounds hold jointly with {confidence:.4g} confidence")
    table.add_column("target", no_wrap=True)
    for column in ("claimed eps (delta)", "audited eps >=", "of claim"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("verdict")
    table.add_column("distinguishing event (runs in it: x / x')")
    for row in rows:
        finding = row.finding
        if row.flagged:
            verdict = "[red]VIOLATION[/]" if row.honest else "[green]flagged (broken on purpose)[/]"
        else:
            verdict = "[green]ok[/]" if row.honest else "[red]NOT FLAGGED[/]"
        claimed = f"{row.epsilon:.4g}" + (f" ({row.delta:.2g})" if row.delta else "")
        table.add_row(
            row.name, claimed, f"{finding.epsilon_bound:.4f}",
            f"{finding.epsilon_bound / row.epsilon:.0%}", verdict,
            escape(f"{finding.event} ({finding.hits} / {finding.other_hits} of {finding.trials})"),
        )  # fmt: skip
    return table


if __name__ == "__main__":
    sys.exit(main())
