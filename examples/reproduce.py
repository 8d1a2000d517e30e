"""Every seed experiment in one command: runs them and writes docs/experiments.md with its figures.

    python examples/reproduce.py            # the full sizes (much longer; not timed here)
    python examples/reproduce.py --quick    # under ten minutes on 2 cores
    python examples/reproduce.py --smoke --out /tmp/page   # seconds (the test's size)

For each seed the page gives each experiment's table (the seed's figure, where
it has one, beside dpsql's and the closed form) and its plot, and says where
dpsql departs from the seed, next to the figure. Progress bars go to stderr.
The figures go to <out>/img/experiments/, the page to <out>/experiments.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures
import ldp_seed004
import seed000_local
import seed001_central
import seed002_adult
import seed002_staircase
import seed003_continual
import seed004_central

ROOT = Path(__file__).resolve().parent.parent
# Per size: seed 002's draws, seed 003's horizons and runs, seed 004's runs and sizes.
SIZES = {
    "smoke": {"samples": 2_000, "logs": [4, 6], "reps": 200, "zipf": (256, 10, 20),
              "ldp_reps": 2, "ldp_sizes": (1_000, 10_000), "ldp_epsilons": (1.0, 4.0)},
    "quick": {"samples": 200_000, "logs": [10, 12, 14], "reps": 2_000, "zipf": (2048, 20, 200),
              "ldp_reps": 10, "ldp_sizes": (500, 2_000, 10_000, 20_000),
              "ldp_epsilons": (0.5, 1.0, 2.0, 3.0, 4.0, 5.0)},
    "full": {"samples": 1_000_000, "logs": [10, 12, 14, 16], "reps": 10_000,
             "zipf": (2048, 20, 2_000), "ldp_reps": 30, "ldp_sizes": ldp_seed004.SIZES,
             "ldp_epsilons": ldp_seed004.EPSILONS},
}  # fmt: skip
Progress = Callable[[int, str], Callable[[], None]]


def bars() -> Progress:
    """progress(total, label) -> step(): one tqdm bar per experiment part."""

    def progress(total: int, label: str) -> Callable[[], None]:
        bar = tqdm(total=total, desc=label, unit="step", leave=True, file=sys.stderr)

        def step() -> None:
            bar.update(1)
            if bar.n >= bar.total:
                bar.close()

        return step

    return progress


def seed002(size: str, img: Path, progress: Progress) -> str:
    step = progress(1, "seed 002 staircase")
    samples = SIZES[size]["samples"]
    with contextlib.redirect_stdout(io.StringIO()):
        text = seed002_staircase.main(["--samples", str(samples),
                                       "--out", str(img / "seed002_staircase.png")])  # fmt: skip
    step()
    return "\n".join([
        "## Seed 002: Laplace against the staircase mechanism", "",
        "Script: `examples/seed002_staircase.py`. The seed timed one float draw per call and "
        "never measured accuracy; here the exact, secure grid samplers' speed, and the "
        "expected absolute error and variance of a SUM, empirical beside the closed form. "
        "The staircase/Laplace E|X| ratio lands on the closed form's 0.96 / 0.85 / 0.41 / "
        "0.067 at epsilon 1 / 2 / 5 / 10: at the seed's epsilon 0.1 the staircase gains "
        "0.04%.", "", text, "", "![seed 002](img/seed002_staircase.png)", "",
        seed002_adult.run(size, img, progress),
    ])  # fmt: skip


def seed003(size: str, img: Path, progress: Progress) -> str:
    setting = SIZES[size]
    logs = setting["logs"]
    step = progress(len(logs) + 1, "seed 003 continual")
    rows = []
    with contextlib.redirect_stdout(io.StringIO()):
        for log in logs:
            rows += seed003_continual.experiment([log], setting["reps"], 3, streams_at=logs[0])
            step()
    order = (*seed003_continual.ZCDP, *seed003_continual.PURE)
    rows.sort(key=lambda r: (r["T"], order.index(r["mechanism"]), r["p"]))
    seed003_continual.plot(rows, img / "seed003_continual.png")
    horizon, keys, reps = setting["zipf"]
    zipf = seed003_continual.zipf_compare(horizon, keys, reps, 3)
    seed003_continual.zipf_histogram(horizon, keys, 3, img / "seed003_zipf.png")
    step()
    gap, worst = seed003_continual.worst_deviation(rows)
    lines = [
        "## Seed 003: continual counting, binary tree against factorization", "",
        "Script: `examples/seed003_continual.py`. The seed's README reports no numbers and "
        "its 'error' is |mean noise| over repetitions, which tends to 0; here the per-step "
        "MSE over releases, beside the closed forms of `dpsql.mechanisms.continual` and the "
        "reference figures (mechanisms.md section 3, in units of 2 rho = 1). "
        "**Departures:** the README's noise formula S_t + L_t R(t) z is wrong (L_t R(t) is an "
        "all-ones row); dpsql releases S_t + (L z)_t with z scaled by the column norm "
        "sqrt(sum f(k)^2) of R (DESIGN section 6), Gaussian at the rho of (0.5, 1e-10) "
        "(the CKS conversion). Every Bernoulli stream (p) now gets its own noise draw, so the "
        "p rows differ by sampling error only; the additive mechanisms' error does not depend "
        "on the stream, which the rows show.", "",
        seed003_continual.table(rows), "",
        f"Largest gap to the reference: {gap:.2%} ({worst.get('mechanism', '—')}, "
        f"T = {worst.get('T', '—')}; with {setting['reps']:,} runs the sampling error of a mean "
        f"MSE is about {1 / math.sqrt(setting['reps']):.1%} and of a maximum larger).", "",
        "![seed 003](img/seed003_continual.png)", "",
        f"### Zipf histogram stream (T = {horizon:,}, {keys} keys, {reps:,} releases)", "",
        "Each key its own counter; one item per step, so the whole histogram is "
        "rho-zCDP. Error of the most frequent key's running count (key "
        f"{zipf[0]['top']}, {zipf[0]['top_count']:,} at the end), closed form in brackets, "
        "and the largest error over all keys and steps.", "",
        "| mechanism | per-step RMSE, mean over t | per-step RMSE, max over t | "
        "mean largest error (all keys, all t) |", "|---|---:|---:|---:|",
    ]  # fmt: skip
    for r in zipf:
        lines.append(
            f"| {r['mechanism']} | {r['mean_rmse']:.1f} ({r['closed_mean_rmse']:.1f}) | "
            f"{r['max_rmse']:.1f} ({r['closed_max_rmse']:.1f}) | {r['linf']:.1f} |"
        )
    lines += ["", "![seed 003 zipf](img/seed003_zipf.png)", ""]
    return "\n".join(lines)


def seed004(size: str, img: Path, progress: Progress) -> str:
    setting = SIZES[size]
    ldp_seed004.REPS = setting["ldp_reps"]
    protocols = ldp_seed004.PROTOCOLS
    sizes, epsilons = setting["ldp_sizes"], setting["ldp_epsilons"]
    step = progress(len(protocols), "seed 004 protocols")
    rng = np.random.default_rng(2021)
    by_n, by_eps = {}, {}
    for p in protocols:
        by_n[p] = np.array([ldp_seed004.errors(p, math.log(12), n, rng) for n in sizes])
        by_eps[p] = np.array([ldp_seed004.errors(p, e, 10_000, rng) for e in epsilons])
        step()
    fig, axes = figures.subplots(2, 3, figsize=(15, 8))
    for col, metric in enumerate(("L1", "L2", "EMD")):
        for p in protocols:
            kw = {"marker": "o", "ms": 3, "color": figures.colour(p), "label": p}
            axes[0, col].plot(sizes, by_n[p][:, col], **kw)
            axes[1, col].plot(epsilons, by_eps[p][:, col], **kw)
        label = f"{metric} distance (frequencies)"
        axes[0, col].set(xscale="log", yscale="log", xlabel="number of reports n",
                         ylabel=label, title="epsilon = ln 12")  # fmt: skip
        axes[1, col].set(yscale="log", xlabel="epsilon", ylabel=label, title="n = 10,000")
    for axis in axes.flat:
        axis.grid(alpha=0.3, which="both")
    figures.legend_outside(axes[0, 2])
    fig.tight_layout()
    figures.save(fig, img / "seed004.png")
    lines = [
        "## Seed 004: local protocols by L1, L2 and earth mover's distance", "",
        "Script: `examples/ldp_seed004.py` (its functions, at this page's size). d = 50 "
        "skewed 'ages', norm-sub post-processing, errors on frequencies, mean of "
        f"{setting['ldp_reps']} runs. **Departures:** RAPPOR with the estimator of both "
        "randomisation steps, distance-sensitive encoding with normalised edges (the seed's "
        "leaked 13.06 > 12 at eps = ln 12), random-matrix entries +-1/sqrt(m) (the seed's "
        "uniform entries made estimates three times too small); these are DESIGN section 6's "
        "corrections. The seed gives its results as figures only, so no seed numbers stand "
        "beside these.", "",
        "| protocol | " + " | ".join(f"{m} n={n:,}" for m in ("L1", "EMD") for n in sizes[-2:])
        + " |", "|---|" + "---:|" * 4,
    ]  # fmt: skip
    for p in protocols:
        cells = [by_n[p][i, c] for c in (0, 2) for i in (len(sizes) - 2, len(sizes) - 1)]
        lines.append(f"| {p} | " + " | ".join(f"{v:.4f}" for v in cells) + " |")
    lines += [
        "", "![seed 004](img/seed004.png)", "",
        "**Why the random-matrix curve is flat.** " + ldp_seed004.bias_note()
        + " The seed found RM 'does not follow the logarithmic curve': this is why.", "",
        seed004_central.run(size, img, progress),
    ]  # fmt: skip
    return "\n".join(lines)


PARTS: list[tuple[str, Callable[[str, Path, Progress], str]]] = [
    ("seed 000", seed000_local.run),
    ("seed 001", seed001_central.run),
    ("seed 002", seed002),
    ("seed 003", seed003),
    ("seed 004", seed004),
]


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", const="quick", dest="size")
    size.add_argument("--smoke", action="store_const", const="smoke", dest="size",
                      help="tiny sizes, seconds: checks that everything runs")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "docs",
                        help="page: OUT/experiments.md, figures: OUT/img/experiments/")  # fmt: skip
    parser.add_argument("--only", nargs="+", choices=[name.split()[1] for name, _ in PARTS],
                        help="run only these seeds (the page then holds only them)")  # fmt: skip
    args = parser.parse_args(argv)
    size = args.size or "full"
    # A folder of its own, so a --quick run never replaces the README's full-size figures.
    img = args.out / "img" / "experiments"
    img.mkdir(parents=True, exist_ok=True)
    sections, took = [], []
    for name, part in PARTS:
        if args.only and name.split()[1] not in args.only:
            continue
        began = time.perf_counter()
        # the parts link their figures as img/<name>, relative to a page beside img/
        sections.append(part(size, img, bars()).replace("](img/", "](img/experiments/"))
        took.append((name, time.perf_counter() - began))
    command = "python examples/reproduce.py" + ("" if size == "full" else f" --{size}")
    head = [
        "# The seed experiments, reproduced", "",
        f"Generated by `{command}` (sizes: {size}); do not edit by hand. Each section "
        "names its script, the seed's figure where the seed gives one, dpsql's result and "
        "the closed form, and where dpsql departs from the seed. The seeds' digests are "
        "the project's reading notes; every data set here is synthetic, generated with the "
        "seed's shape.", "",
        "| part | seconds |", "|---|---:|",
        *[f"| {name} | {seconds:.0f} |" for name, seconds in took], "",
    ]  # fmt: skip
    page = args.out / "experiments.md"
    page.write_text("\n".join(head + sections))
    print(f"wrote {page} ({sum(s for _, s in took):.0f} s)")
    return page


if __name__ == "__main__":
    main()
