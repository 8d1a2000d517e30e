"""Seed 000's range-count experiment, done right: flat against b-ary trees, with correct noise.

    python examples/seed000_ranges.py             # the full grid; writes docs/img/seed000_*.png
    python examples/seed000_ranges.py --tiny      # a quick run (the test uses it)

Seed 000 (Friis 2021) compared a flat noisy histogram with a hierarchical one
but noised each tree node with log2(levels)/epsilon; correct is
levels/epsilon. Here: RMSE against range length for flat and trees with
b in {2, 4, 8, 16}, without and with consistency, for several epsilons and
domain sizes, on a synthetic six-year daily visitor series (longer domains
repeat its pattern hourly) and on PUMS age and income; empirical RMSE beside
the closed form, and the break-even length where the consistent tree starts
to beat flat for each b. Beside each Laplace tree, the Gaussian variant at the
same (epsilon, delta) (rho-zCDP, L2 sensitivity sqrt(levels) instead of
levels): it wins once the tree has more levels than about epsilon^2 / (4 rho).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from dpsql.accounting import zcdp_rho
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.mechanisms.tree import HierarchicalHistogram, range_weights

ROOT = Path(__file__).resolve().parent.parent
PUMS = Path(os.environ.get("DPSQL_PUMS_DIR", ROOT.parent / "shared" / "data" / "pums"))


def visitor_series(bins: int, rng: np.random.Generator) -> np.ndarray:
    """Daily library visits: weekly and yearly seasonality, closed days, Poisson noise."""
    day = np.arange(bins)
    rate = 400 * (1 + 0.3 * np.sin(2 * np.pi * day / 365.25)) * np.where(day % 7 == 6, 0.2, 1)
    return rng.poisson(rate)


def pums_series() -> dict[str, np.ndarray]:
    path = PUMS / "PUMS.csv"
    if not path.exists():
        return {}
    data = np.genfromtxt(path, delimiter=",", names=True)
    return {
        "pums_age": np.bincount(data["age"].astype(int), minlength=101)[:101],
        "pums_income": np.bincount(
            np.clip(data["income"] // 1000, 0, 500).astype(int), minlength=501
        ),
    }


def lengths_for(bins: int) -> list[int]:
    points = np.unique(np.geomspace(1, bins, num=12).astype(int))
    return [int(r) for r in points]


def measure(counts, epsilon, delta, branchings, lengths, trials, ranges, rng) -> list[dict]:
    """Empirical and closed-form RMSE per (method, length), averaged over random starts."""
    bins = len(counts)
    rho = zcdp_rho(epsilon, delta)
    prefix = np.concatenate([[0], np.cumsum(counts)])
    flat_noise = DiscreteLaplace(1, epsilon)
    rows = []
    for length in lengths:
        starts = rng.integers(0, bins - length + 1, ranges)
        stops = starts + length
        truth = prefix[stops] - prefix[starts]
        errors = {"flat": []}
        for _ in range(trials):
            noisy = np.concatenate([[0], np.cumsum(flat_noise.sample(counts, rng))])
            errors["flat"].append(noisy[stops] - noisy[starts] - truth)
        closed = {"flat": length * flat_noise.variance()}
        for b in branchings:
            raw, consistent = [], []
            for _ in range(trials):
                tree = HierarchicalHistogram.build(counts, b, epsilon, rng)
                consistent.append(tree.prefix[stops] - tree.prefix[starts] - truth)
                raw.append([tree.answer(int(s), int(e), consistent=False).value - t
                            for s, e, t in zip(starts, stops, truth, strict=True)])  # fmt: skip
            errors[f"tree b={b}"] = raw
            errors[f"tree b={b} + consistency"] = consistent
            closed[f"tree b={b}"] = np.mean(
                [tree.answer(int(s), int(e), consistent=False).variance
                 for s, e in zip(starts, stops, strict=True)]
            )  # fmt: skip
            squares, _ = range_weights(tree.shape, starts, stops)
            closed[f"tree b={b} + consistency"] = np.mean(squares) * tree.node_variance
            gaussian = []
            for _ in range(trials):
                tree = HierarchicalHistogram.build_gaussian(counts, b, rho, rng)
                gaussian.append(tree.prefix[stops] - tree.prefix[starts] - truth)
            errors[f"gaussian b={b} + consistency"] = gaussian
            closed[f"gaussian b={b} + consistency"] = np.mean(squares) * tree.node_variance
        for method, values in errors.items():
            rows.append({
                "epsilon": epsilon, "bins": bins, "length": length, "method": method,
                "empirical": float(np.sqrt(np.mean(np.square(values)))),
                "closed": float(np.sqrt(closed[method])),
            })  # fmt: skip
    return rows


def break_even(rows: list[dict], method: str) -> int | None:
    """The shortest length from which `method`'s closed-form RMSE stays below flat's."""
    flat = {r["length"]: r["closed"] for r in rows if r["method"] == "flat"}
    mine = sorted((r["length"], r["closed"]) for r in rows if r["method"] == method)
    wins = [length for length, value in mine if value < flat[length]]
    losing = [length for length, value in mine if value >= flat[length]]
    later = [w for w in wins if not losing or w > max(losing)]
    return min(later) if later else None


def gaussian_ratio(rows: list[dict], branching: int) -> float:
    """Closed-form RMSE of the Gaussian consistent tree over the Laplace one (the same at
    every length: both are the same estimator, only the node variance differs)."""
    closed = {r["method"]: r["closed"] for r in rows if r["length"] == rows[-1]["length"]}
    b = branching
    return closed[f"gaussian b={b} + consistency"] / closed[f"tree b={b} + consistency"]


def plot(rows: list[dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    # colour by branching, style by method: raw dotted, consistent solid, Gaussian dashed
    branchings = sorted({r["method"].split()[1] for r in rows if " b=" in r["method"]},
                        key=lambda b: int(b[2:]))  # fmt: skip
    colours = {b: f"C{i}" for i, b in enumerate(branchings)}
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        lengths = [r["length"] for r in mine]
        kind = method.split()[0]
        style = {"flat": "-", "tree": ":", "gaussian": "--"}[kind]
        style = "-" if kind == "tree" and "consistency" in method else style
        colour = "black" if kind == "flat" else colours[method.split()[1]]
        axis.plot(lengths, [r["empirical"] for r in mine], style, color=colour, marker="o", ms=3,
                  label=method)  # fmt: skip
        axis.plot(lengths, [r["closed"] for r in mine], "x", color=colour, ms=5)
    axis.set(xscale="log", yscale="log", xlabel="range length (bins)", ylabel="RMSE")
    axis.set_title(f"{title} (lines: empirical, x: closed form)", fontsize=9)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a quick run at small sizes")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--delta", type=float, default=1e-6, help="the Gaussian trees' delta")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    if args.tiny:
        sizes, epsilons, branchings, trials, ranges = [32, 256], [1.0], [2, 16], 2, 20
    else:
        sizes, epsilons = [32, 256, 2191, 65_536], [0.2, 0.5, 1.0, 2.0]
        branchings, trials, ranges = [2, 4, 8, 16], 3, 200
    datasets = {f"visits_{n}": visitor_series(n, rng) for n in sizes}
    datasets.update(pums_series() if not args.tiny else {})
    args.out.mkdir(parents=True, exist_ok=True)
    print("| data | bins | epsilon | " + " | ".join(f"break-even b={b}" for b in branchings)
          + " | " + " | ".join(f"Gaussian / Laplace b={b}" for b in branchings) + " |")  # fmt: skip
    print("|---" * (3 + 2 * len(branchings)) + "|")
    for name, counts in datasets.items():
        for epsilon in epsilons:
            rows = measure(counts, epsilon, args.delta, branchings, lengths_for(len(counts)),
                           trials, ranges, rng)  # fmt: skip
            evens = [break_even(rows, f"tree b={b} + consistency") for b in branchings]
            ratios = [f"{gaussian_ratio(rows, b):.2f}" for b in branchings]
            print(f"| {name} | {len(counts)} | {epsilon} | "
                  + " | ".join(str(e) if e else "never" for e in evens) + " | "
                  + " | ".join(ratios) + " |")  # fmt: skip
            if epsilon == 1.0:
                title = f"{name}, epsilon 1, Gaussian delta {args.delta:g}"
                plot(rows, title, args.out / f"seed000_{name}.png")


if __name__ == "__main__":
    main()
