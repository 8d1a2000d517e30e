"""Seed 000's local experiments, and central against local on the same figure.

On the synthetic daily-visits series of examples/seed000_ranges.py (one
person per visit, so n is about 400 per day), for domains of 32, 512 and
2,048 days:

1. RMSE against range length for the local flat histograms (GRR and OLH
   over the whole domain, ranges summed from the per-day estimates) and the
   local hierarchical histograms (dpsql.ldp.LocalHierarchy, b = 2 and 4,
   raw node sums and consistent), beside the central flat histogram and
   central trees (dpsql.mechanisms.tree) at the same epsilon;
2. RMSE against epsilon and 1/epsilon at one domain and range length, with
   the fitted exponent k of RMSE ~ (1/epsilon)^k;
3. the break-even length from which the central tree beats flat, for the raw
   tree (node sums) and the consistent one, from the closed forms averaged
   over start positions, beside the seed's formula 2B ceil(log_B N)^2 and
   the digest's raw-tree values (computed with the root level counted).

    python examples/seed000_local.py --size quick   # or full / smoke
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
from matplotlib import ticker

from dpsql import ldp
from dpsql.ldp.synthetic import people_from_counts
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.mechanisms.tree import TreeShape, decompose, laplace_node_noise, range_weights

try:
    from examples import figures
    from examples.seed000_ranges import measure, visitor_series
except ImportError:  # run as a script from examples/
    import figures
    from seed000_ranges import measure, visitor_series

ROOT = Path(__file__).resolve().parent.parent
SIZES = {
    "smoke": {"bins": (32,), "trials": 1, "ranges": 20, "epsilons": (0.5, 2.0),
              "sweep_bins": 32, "scan_step": 4, "branchings": (2, 4)},
    "quick": {"bins": (32, 512, 2048), "trials": 2, "ranges": 60,
              "epsilons": (0.2, 0.4, 0.6, 0.8, 1.0, 1.4, 2.0), "sweep_bins": 512,
              "scan_step": 8, "branchings": (2, 4)},
    "full": {"bins": (32, 512, 2048), "trials": 5, "ranges": 200,
             "epsilons": (0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 2.0), "sweep_bins": 512,
             "scan_step": 1, "branchings": (2, 4)},
}  # fmt: skip
LOCAL_FLAT = ("grr", "olh")
# digest-000-003.md section 5: the raw Laplace tree's break-even r at epsilon 1, with the
# root measured (h + 1 levels); Table 2 of the seed: its formula 2 B ceil(log_B N)^2.
DIGEST_RAW = {2048: {2: 1727, 3: 779, 4: 677, 8: 529, 16: 498}, 512: {2: 512, 4: 511, 8: 288}}
SCAN_BRANCHINGS = (2, 3, 4, 8, 16)
SWEEP_LENGTH = 128
LINES = "central: solid (raw tree dotted)\nlocal: dashed (raw tree dash-dot)"


def lengths_for(bins: int) -> list[int]:
    """Up to 90% of the domain: a whole-domain local range is exact (n is public)."""
    return [int(r) for r in np.unique(np.geomspace(1, 0.9 * bins, num=10).astype(int))]


def local_rows(counts, epsilon, branchings, lengths, trials, ranges, rng) -> list[dict]:
    """Empirical RMSE per (method, length) of the local flat and hierarchical histograms."""
    bins, people = len(counts), people_from_counts(counts)
    n = people.size
    prefix = np.concatenate([[0], np.cumsum(counts)])
    plans = [(r, rng.integers(0, bins - r + 1, ranges)) for r in lengths]
    errors: dict[tuple[str, int], list[np.ndarray]] = {}

    def add(method, estimate_prefix):
        for r, starts in plans:
            truth = prefix[starts + r] - prefix[starts]
            got = estimate_prefix(starts, starts + r)
            errors.setdefault((method, r), []).append(got - truth)

    for _ in range(trials):
        for name in LOCAL_FLAT:
            m = ldp.mechanism(name, epsilon, bins)
            cum = np.concatenate([[0.0], np.cumsum(m.estimate(m.perturb_indices(people, rng)))])
            add(f"local flat {name}", lambda a, e, cum=cum: cum[e] - cum[a])
        for b in branchings:
            m = ldp.LocalHierarchy(epsilon, bins, branching=b)
            aggregate = m.aggregate(m.perturb_indices(people, rng))
            raw = m.estimate_levels(aggregate, n)
            add(f"local hh b={b}", lambda a, e, raw=raw, m=m: np.array(
                [m.range_count(raw, int(s), int(t)) for s, t in zip(a, e, strict=True)]
            ))  # fmt: skip
            leaves = m.consistent(aggregate, n)[-1][:bins]
            cum = np.concatenate([[0.0], np.cumsum(leaves)])
            add(f"local hh b={b} + consistency", lambda a, e, cum=cum: cum[e] - cum[a])
    return [{"epsilon": epsilon, "bins": bins, "length": r, "method": method,
             "empirical": float(np.sqrt(np.mean(np.square(values)))), "closed": math.nan}
            for (method, r), values in errors.items()]  # fmt: skip


def central_rows(counts, epsilon, branchings, lengths, trials, ranges, rng) -> list[dict]:
    rows = measure(counts, epsilon, 1e-6, branchings, lengths, trials, ranges, rng)
    return [r for r in rows if not r["method"].startswith("gaussian")]


def rename(method: str) -> str:
    return method if method.startswith("local") else f"central {method}"


def break_even(bins: int, branching: int, step: int, epsilon: float = 1.0) -> dict[str, int]:
    """(first r, r from which it stays) where the tree's closed-form variance, averaged
    over up to 200 start positions, is below flat's: raw node sums and consistent."""
    shape = TreeShape(bins, branching)
    node = laplace_node_noise(shape, epsilon, 1).variance()
    cell = DiscreteLaplace(1, epsilon).variance()
    lengths = sorted(set(range(1, bins + 1, step)) | {bins})
    wins = {"raw": [], "consistent": []}
    for r in lengths:
        starts = np.unique(np.linspace(0, bins - r, min(200, bins - r + 1)).astype(np.int64))
        nodes = np.mean([min(r, len(decompose(shape, int(s), int(s) + r))) for s in starts])
        squares, _ = range_weights(shape, starts, starts + r)
        wins["raw"].append(nodes * node < r * cell)
        wins["consistent"].append(np.mean(squares) * node < r * cell)
    out = {}
    for kind, won in wins.items():
        lost = [r for r, w in zip(lengths, won, strict=True) if not w]
        first = [r for r, w in zip(lengths, won, strict=True) if w]
        later = [r for r in first if not lost or r > lost[-1]]
        out[kind] = (first[0] if first else None, later[0] if later else None)
    return out


def exponent(xs, ys) -> float:
    """The slope k of log RMSE against log(1/epsilon)."""
    return float(np.polyfit(np.log(1 / np.asarray(xs)), np.log(np.asarray(ys)), 1)[0])


def run(size: str, img: Path, progress: Callable[[int, str], Callable[[], None]]) -> str:
    setting = SIZES[size]
    rng = np.random.default_rng(2021)
    branchings = setting["branchings"]
    by_bins = {}
    step = progress(len(setting["bins"]), "seed 000 local, by length")
    for bins in setting["bins"]:
        counts = visitor_series(bins, rng)
        args = (branchings, lengths_for(bins), setting["trials"], setting["ranges"], rng)
        rows = central_rows(counts, 1.0, *args) + local_rows(counts, 1.0, *args)
        by_bins[bins] = [dict(r, method=rename(r["method"])) for r in rows]
        step()
    sweep_bins = setting["sweep_bins"]
    length = min(SWEEP_LENGTH, sweep_bins // 2)
    counts = visitor_series(sweep_bins, rng)
    sweep = []
    step = progress(len(setting["epsilons"]), "seed 000 local, by epsilon")
    for eps in setting["epsilons"]:
        args = (branchings[-1:], [length], setting["trials"], setting["ranges"], rng)
        rows = central_rows(counts, eps, *args) + local_rows(counts, eps, *args)
        sweep += [dict(r, method=rename(r["method"])) for r in rows]
        step()
    scan_bins = [b for b in (512, 2048) if b in setting["bins"]] or [setting["bins"][-1]]
    step = progress(len(scan_bins) * len(SCAN_BRANCHINGS), "seed 000 break-even")
    evens = {}
    for bins in scan_bins:
        for b in SCAN_BRANCHINGS:
            evens[bins, b] = break_even(bins, b, setting["scan_step"])
            step()
    paths = [plot_lengths(rows, bins, img) for bins, rows in by_bins.items()]
    paths.append(plot_sweep(sweep, sweep_bins, length, img))
    return page(by_bins, sweep, sweep_bins, length, evens, setting, paths)


def _style(method: str) -> tuple[str, str]:
    """Colour by mechanism (flat, GRR, OLH) or branching; line by central/local, raw/consistent."""
    local = method.startswith("local")
    whole = "consistency" in method or "flat" in method
    line = ("--" if whole else "-.") if local else ("-" if whole else ":")
    return figures.colour(method.replace("local flat", "").replace("central flat", "flat")), line


def plot_lengths(rows, bins, img) -> Path:
    fig, axis = figures.subplots(figsize=(8, 4.8))
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        colour, line = _style(method)
        marker = "s" if method.startswith("local") else "o"
        axis.plot([r["length"] for r in mine], [r["empirical"] for r in mine], line,
                  color=colour, marker=marker, ms=3, label=method)  # fmt: skip
    axis.set(xscale="log", yscale="log", xlabel="range length (days)",
             ylabel="RMSE of the range count (visits)",
             title=f"Seed 000: {bins} days, epsilon 1, central against local")  # fmt: skip
    axis.grid(alpha=0.3, which="both")
    figures.legend_outside(axis, title=LINES)
    return figures.save(fig, img / f"seed000_local_{bins}.png")


def plot_sweep(rows, bins, length, img) -> Path:
    fig, axes = figures.subplots(1, 2, figsize=(12, 4.5))
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["epsilon"])
        colour, line = _style(method)
        eps = np.array([r["epsilon"] for r in mine])
        values = [r["empirical"] for r in mine]
        axes[0].plot(eps, values, line, color=colour, marker="o", ms=3, label=method)
        axes[1].plot(1 / eps, values, line, color=colour, marker="o", ms=3, label=method)
    axes[0].set(xlabel="epsilon", ylabel="RMSE (visits)", yscale="log")
    axes[1].set(xlabel="1 / epsilon", ylabel="RMSE (visits)", xscale="log", yscale="log")
    for axis in axes:
        axis.grid(alpha=0.3, which="both")
    axes[1].xaxis.set_major_formatter(ticker.ScalarFormatter())
    axes[1].xaxis.set_minor_formatter(ticker.NullFormatter())
    axes[1].set_xticks([0.5, 1, 2, 5])
    figures.legend_outside(axes[1], title=LINES)
    fig.suptitle(f"Seed 000: RMSE against epsilon, {bins} days, ranges of {length} days")
    fig.tight_layout()
    return figures.save(fig, img / "seed000_epsilon.png")


def page(by_bins, sweep, sweep_bins, length, evens, setting, paths) -> str:
    out = ["## Seed 000: local range counting, and central against local", "",
           "Script: `examples/seed000_local.py`. Data: the synthetic daily-visits series of "
           "`examples/seed000_ranges.py`, one person per visit. Local: GRR and OLH over "
           "the days (a range sums the per-day estimates), and `dpsql.ldp.LocalHierarchy` "
           "(each person reports one uniformly chosen level through a correct oracle: GRR "
           "where the level has fewer than 3e^eps + 2 nodes, OLH above), raw node sums and "
           "consistent. Central: discrete Laplace flat histogram and b-ary trees with node "
           f"scale levels/epsilon. {setting['trials']} releases x {setting['ranges']} random "
           "ranges per point.", "",
           "**Departures from the seed, next to the figures.** (1) Seed 000's local oracle "
           "kept the value or drew uniformly from all g values (the true one included), which "
           "leaks ln(1 + g e^eps / (g - 1)) > eps; dpsql's oracles are exact eps-LDP, so "
           "its local errors are larger than the seed's at the same nominal epsilon. "
           "(2) Seed 000's central tree used noise scale log2(levels)/epsilon, 2.3-3.4x too "
           "little; dpsql's uses levels/epsilon (DESIGN section 6). "
           "(3) dpsql's central tree does not measure "
           "the root (levels = height, not height + 1: the root is the total, which a range "
           "shorter than the domain never needs), and a raw answer sums the leaves when that "
           "takes fewer nodes. (4) The seed has no consistency step; the '+ consistency' "
           "curves (generalised least squares over the tree: every parent the sum of its "
           "children) are dpsql's addition, free post-processing. "
           "(5) The local hierarchy's levels are chosen uniformly over the levels "
           "below the root and scaled by n / n_level, not multiplied by (h + 1).", ""]  # fmt: skip
    for (bins, rows), path in zip(by_bins.items(), paths, strict=False):
        lengths = sorted({r["length"] for r in rows})
        show = [lengths[0], lengths[len(lengths) // 2], lengths[-1]]
        methods = list(dict.fromkeys(r["method"] for r in rows))
        out += [f"### {bins} days, epsilon 1: RMSE (closed form) by range length", "",
                "| method | " + " | ".join(f"r = {r:,}" for r in show) + " |",
                "|---|" + "---:|" * len(show)]  # fmt: skip
        for method in methods:
            cells = []
            for r in show:
                row = next(x for x in rows if x["method"] == method and x["length"] == r)
                closed = "" if math.isnan(row["closed"]) else f" ({row['closed']:,.1f})"
                cells.append(f"{row['empirical']:,.1f}{closed}")
            out.append(f"| {method} | " + " | ".join(cells) + " |")
        out += ["", f"![seed 000 local {bins}](img/{path.name})", ""]
    out += ["The seed's findings, beside these tables: it saw the local flat error rise and "
            "then fall with the length (a whole-domain range is exact, the n reports being "
            "public): here the fall shows only close to the whole domain (r = 0.9 N is the "
            "longest shown). It saw lower degrees do better for the local hierarchy and higher "
            "ones for the central tree (compare the b rows), and central errors 'around 0 to "
            "200' against local 'in the 10s of thousands' (its data had more people per day).",
            "", f"### Error against epsilon ({sweep_bins} days, ranges of {length} days)", "",
            "| method | " + " | ".join(f"eps {e:g}" for e in sorted({r['epsilon'] for r in sweep}))
            + " | k in RMSE ~ (1/eps)^k |",
            "|---|" + "---:|" * (len({r['epsilon'] for r in sweep}) + 1)]  # fmt: skip
    for method in dict.fromkeys(r["method"] for r in sweep):
        mine = sorted((r for r in sweep if r["method"] == method), key=lambda r: r["epsilon"])
        k = exponent([r["epsilon"] for r in mine], [r["empirical"] for r in mine])
        out.append(f"| {method} | " + " | ".join(f"{r['empirical']:,.1f}" for r in mine)
                   + f" | {k:.2f} |")  # fmt: skip
    out += ["", f"![seed 000 epsilon](img/{paths[-1].name})", "",
            "Central errors scale exactly as 1/epsilon (k = 1; the seed's regression gave "
            "R^2 = .99 against 1/epsilon). Local errors grow faster at small epsilon, like "
            "(e^eps + 1)/(e^eps - 1) ~ 2/eps times the oracle's spread, and the seed's "
            "conclusion's '1/eps^2' for the central hierarchy contradicts its own section "
            "10.4.", "", "### Break-even length: where the central tree starts to beat flat "
            "(epsilon 1, Laplace)", "",
            "Closed forms averaged over up to 200 start positions, every "
            f"{setting['scan_step']} lengths; each cell is 'first length where the tree "
            "wins / length from which it always wins', 'never' when it loses up to the whole "
            "domain. The digest's raw values (first win) count the root as a level (h + 1 "
            "levels); dpsql measures h levels, so its raw tree breaks even sooner. The "
            "seed's formula is far too optimistic for correctly calibrated central trees.", "",
            "| days | b | raw tree (dpsql) | raw tree (digest, with root) | consistent tree | "
            "seed formula 2b ceil(log_b N)^2 |", "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for (bins, b), found in evens.items():
        formula = 2 * b * math.ceil(math.log(bins, b) - 1e-12) ** 2
        digest = DIGEST_RAW.get(bins, {}).get(b)
        raw, consistent = (
            " / ".join(str(v or "never") for v in found[k]) for k in ("raw", "consistent")
        )
        out.append(f"| {bins:,} | {b} | {raw} | {digest or '—'} | {consistent} | "
                   f"{formula:,} |")  # fmt: skip
    out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="quick")
    parser.add_argument("--img", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    print(run(args.size, args.img, lambda total, label: lambda: None))


if __name__ == "__main__":
    main()
