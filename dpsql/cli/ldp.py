"""`dpsql ldp`: perturb values on the client, estimate and advise on the server.

    dpsql ldp perturb --mechanism oue --epsilon 2 --domain domain.txt < values.csv > reports.csv
    dpsql ldp estimate --mechanism oue --epsilon 2 --domain domain.txt < reports.csv
    dpsql ldp advise --domain-size 1085 --epsilon 2 --users 2750000

`register(subparsers)` wires these into the main `dpsql` parser; `main(argv)`
runs them on their own. The one subcommand over dpsql/ldp/ rather than a Session:
local DP needs no database, policy or budget, so it may import `dpsql.ldp`.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any

import numpy as np

from dpsql.cli.common import number_in
from dpsql.ldp import MECHANISMS, METHODS, mechanism, postprocess
from dpsql.ldp.advise import compare, fastest_close, grr_threshold, recommend
from dpsql.ldp.base import FrequencyOracle, secure_generator

_BATCH = 1 << 16
_PROGRESS_BYTES = 1 << 20  # files smaller than this finish before a bar is worth drawing


def _options(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, _, raw = pair.partition("=")
        for cast in (int, float):
            try:
                out[key] = cast(raw)
                break
            except ValueError:
                continue
        else:
            out[key] = raw
    return out


def _build(args: argparse.Namespace) -> tuple[FrequencyOracle, list[str]]:
    if args.domain:
        with open(args.domain, encoding="utf-8") as fh:
            labels = [line.rstrip("\r\n") for line in fh if line.strip()]
        domain: Any = labels
    elif args.domain_size:
        labels = [str(v) for v in range(args.domain_size)]
        domain = labels
    else:
        raise SystemExit("give --domain FILE or --domain-size N")
    return mechanism(args.mechanism, args.epsilon, domain, **_options(args.option)), labels


def _progress(stream: IO[str], label: str):
    """A rich progress bar over the bytes of `stream` when it is a large file, else None."""
    try:
        size = os.fstat(stream.fileno()).st_size
    except (OSError, io.UnsupportedOperation, AttributeError, ValueError):
        return None
    if size < _PROGRESS_BYTES:
        return None
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn(label),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    return bar, bar.add_task(label, total=size)


def _batches(rows: Iterator[list[str]]) -> Iterator[list[list[str]]]:
    batch: list[list[str]] = []
    for row in rows:
        if row:
            batch.append(row)
        if len(batch) >= _BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _stream(args: argparse.Namespace, stdin: IO[str], work) -> None:
    """Read stdin in batches, call work(batch), advancing a progress bar on big files."""
    tracker = _progress(stdin, args.command_label)
    rows = csv.reader(stdin)
    if tracker is None:
        for batch in _batches(rows):
            work(batch)
        return
    bar, task = tracker
    with bar:
        for batch in _batches(rows):
            work(batch)
            try:
                bar.update(task, completed=os.lseek(stdin.fileno(), 0, os.SEEK_CUR))
            except OSError:
                bar.update(task, advance=0)


def cmd_perturb(args: argparse.Namespace, stdin: IO[str], stdout: IO[str]) -> int:
    m, labels = _build(args)
    known = set(labels)
    rng = secure_generator(args.seed)
    writer = csv.writer(stdout, lineterminator="\n")
    writer.writerow(["report"])
    state = {"first": True}

    def work(batch: list[list[str]]) -> None:
        values = [row[args.column] for row in batch]
        if state["first"]:
            state["first"] = False
            if values and values[0] not in known:  # a header row
                values = values[1:]
        if values:
            reports = m.perturb_indices(m.domain.index(values), rng)
            stdout.write("".join(f"{field}\n" for field in m.format_reports(reports)))

    args.command_label = "perturbing"
    _stream(args, stdin, work)
    return 0


def cmd_estimate(args: argparse.Namespace, stdin: IO[str], stdout: IO[str]) -> int:
    m, labels = _build(args)
    parts: list[np.ndarray] = []
    total = 0
    state = {"first": True}

    def work(batch: list[list[str]]) -> None:
        nonlocal total
        fields = [row[0] for row in batch]
        if state["first"]:
            state["first"] = False
            if fields and fields[0] == "report":
                fields = fields[1:]
        try:
            reports = m.parse_reports(fields)
        except ValueError as exc:
            raise ValueError(
                f"cannot read the reports as {args.mechanism} reports ({exc}); give the CSV "
                f"that 'dpsql ldp perturb -m {args.mechanism}' wrote, with the same domain"
            ) from None
        total += len(reports)
        parts.append(m.aggregate(reports))

    args.command_label = "counting"
    _stream(args, stdin, work)
    counts = np.sum(parts, axis=0) if parts else m.aggregate(m.parse_reports([]))
    est = postprocess(m.estimate_from_counts(counts, total), args.postprocess, total)
    writer = csv.writer(stdout, lineterminator="\n")
    writer.writerow(["value", "estimate"])
    writer.writerows(zip(labels, (f"{v:.2f}" for v in est), strict=True))
    return 0


def cmd_advise(args: argparse.Namespace, stdin: IO[str], stdout: IO[str]) -> int:
    from rich.console import Console
    from rich.table import Table

    rows = compare(args.domain_size, args.epsilon, args.users)
    best = recommend(rows)
    low = rows[0].rmse
    table = Table(title=f"d = {args.domain_size:,}, epsilon = {args.epsilon:g}, n = {args.users:,}")
    for col in ("mechanism", "RMSE per count", "x best", "message bits", "server ops"):
        table.add_column(col, justify="left" if col == "mechanism" else "right")
    for r in rows:
        mark = " *" if r is best else ""
        table.add_row(
            r.name + mark,
            f"{r.rmse:,.1f}",
            f"{r.relative(low):.2f}",
            f"{r.message_bits:,}",
            f"{r.server_cost:.3g}",
        )
    console = Console(file=stdout, width=100)
    console.print(table)
    threshold = grr_threshold(args.epsilon)
    console.print(
        f"recommended: {best.name} (expected RMSE {best.rmse:,.1f} per count; "
        f"randomised response can only win when d < 3e^eps + 2 = {threshold:,.1f})"
    )
    quick = fastest_close(rows)
    if quick is not best:
        console.print(
            f"if server time matters: {quick.name} ({quick.relative(best.rmse):.2f}x "
            f"the RMSE, {best.server_cost / quick.server_cost:,.0f}x fewer operations)"
        )
    return 0


def _on_standard_streams(args: argparse.Namespace) -> int:
    """How `dpsql ldp ...` runs an action: `dpsql.cli.main` calls `run(args)`. A bad
    option or input (the oracles' ValueErrors say which) is one line, not a traceback."""
    try:
        return args.handler(args, sys.stdin, sys.stdout)
    except ValueError as exc:
        raise SystemExit(f"dpsql ldp {args.ldp_command}: {exc}") from None


def register(subparsers: Any) -> None:
    """Add the `ldp` command (perturb, estimate, advise) to a parent parser's subparsers."""
    ldp = subparsers.add_parser("ldp", help="local differential privacy: perturb, estimate, advise")
    sub = ldp.add_subparsers(dest="ldp_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--mechanism", "-m", required=True, help=f"one of {', '.join(MECHANISMS)}")
        p.add_argument("--epsilon", "-e", type=float, required=True)
        p.add_argument("--domain", help="file with one domain value per line, in order")
        p.add_argument("--domain-size", type=int, help="domain 0..N-1 instead of --domain")
        p.add_argument(
            "--option",
            "-o",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="mechanism option, e.g. branching=4 (repeatable)",
        )

    perturb = sub.add_parser("perturb", help="randomise values (one per line of stdin)")
    common(perturb)
    perturb.add_argument("--column", type=int, default=0, help="CSV column of the value")
    perturb.add_argument("--seed", type=int, help=argparse.SUPPRESS)  # tests only
    perturb.set_defaults(handler=cmd_perturb, run=_on_standard_streams)

    estimate = sub.add_parser("estimate", help="de-biased counts from a reports CSV on stdin")
    common(estimate)
    estimate.add_argument("--postprocess", choices=METHODS, default="none")
    estimate.set_defaults(handler=cmd_estimate, run=_on_standard_streams)

    advise = sub.add_parser("advise", help="expected error and cost of each mechanism")
    advise.add_argument("--domain-size", type=number_in(int, 2), required=True)
    advise.add_argument("--epsilon", "-e", type=float, required=True)
    advise.add_argument("--users", "-n", type=number_in(int, 1), required=True)
    advise.set_defaults(handler=cmd_advise, run=_on_standard_streams)


def main(
    argv: Sequence[str] | None = None, stdin: IO[str] | None = None, stdout: IO[str] | None = None
) -> int:
    """Run `dpsql ldp ...` on its own (argv starts after `ldp`, or with it)."""
    parser = argparse.ArgumentParser(prog="dpsql")
    register(parser.add_subparsers(dest="command", required=True))
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "ldp":
        argv.insert(0, "ldp")
    args = parser.parse_args(argv)
    return args.handler(args, stdin or sys.stdin, stdout or sys.stdout)


if __name__ == "__main__":
    raise SystemExit(main())
