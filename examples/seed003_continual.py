"""Seed 003's experiment done right: per-step error of continual counters, and a Zipf histogram.

For each horizon T and each Bernoulli stream (p in {0, 2^-4, ..., 2^-10}) the
counters release all T running counts many times; we report the maximum and
the mean over t of the per-step RMSE (not the absolute mean noise, which
tends to 0), next to the closed forms of dpsql.mechanisms.continual. The
noise here is numpy's float Gaussian/Laplace because the point is the
variance; releases in dpsql use the exact samplers. The error of these
additive mechanisms does not depend on the stream, which the p column shows.

    python examples/seed003_continual.py --max-log 14 --reps 10000
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from dpsql.mechanisms.continual import BinaryTree, Factorization

IMG = Path(__file__).resolve().parent.parent / "docs" / "img"
PS = [0.0] + [2.0**-k for k in range(4, 11)]


def counters(horizon: int) -> dict[str, object]:
    """The four counters of mechanisms.md section 3: zCDP with 2 rho = 1, and pure epsilon = 1."""
    levels = max(0, (horizon - 1).bit_length()) + 1
    gauss = levels / 1.0  # node variance levels * Delta^2 / (2 rho), 2 rho = 1
    lap = levels / 1.0  # Laplace scale levels * Delta / epsilon, epsilon = 1

    def gaussian(size, rng):
        return rng.normal(0, np.sqrt(gauss), size)

    def laplace(size, rng):
        return rng.laplace(0, lap, size)

    return {
        "zCDP binary tree": BinaryTree(horizon, gauss, gaussian, honaker=False),
        "zCDP sqrt factorization": Factorization(
            horizon, 0.5, 1.0, lambda n, s, rng: rng.normal(0, s, n)
        ),
        "pure binary tree": BinaryTree(horizon, 2 * lap**2, laplace, honaker=False),
        "pure online Honaker": BinaryTree(horizon, 2 * lap**2, laplace),
    }


def per_step_mse(counter, horizon: int, p: float, reps: int, rng) -> np.ndarray:
    """Mean squared error of each step's release over `reps` independent runs on Ber(p) streams."""
    total = np.zeros(horizon)
    for _ in range(reps):
        truth = np.cumsum(rng.random(horizon) < p)
        release = truth + counter.noise(rng)  # S_t + eta_t, as a stream releases it
        total += (release - truth) ** 2
    return total / reps


def experiment(logs: range, reps: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for log in logs:
        horizon = 1 << log
        for name, counter in counters(horizon).items():
            closed = counter.variance()
            for p in PS if log == logs[0] else [0.0]:
                mse = per_step_mse(counter, horizon, p, reps, rng)
                rows.append({"T": horizon, "mechanism": name, "p": p,
                             "max": float(mse.max()), "mean": float(mse.mean()),
                             "closed_max": float(closed.max()),
                             "closed_mean": float(closed.mean())})  # fmt: skip
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| T | mechanism | p | max MSE (closed) | mean MSE (closed) | max RMSE |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| 2^{r['T'].bit_length() - 1} | {r['mechanism']} | {r['p']:.4g} | "
            f"{r['max']:.4g} ({r['closed_max']:.4g}) | {r['mean']:.4g} ({r['closed_mean']:.4g}) | "
            f"{np.sqrt(r['max']):.4g} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r["mechanism"] for r in rows):
        mine = [r for r in rows if r["mechanism"] == name and r["p"] == 0.0]
        ax.plot([r["T"] for r in mine], [np.sqrt(r["max"]) for r in mine], "o-", label=name)
    ax.set(xscale="log", yscale="log", xlabel="horizon T", ylabel="max over t of per-step RMSE",
           title="Continual counting: zCDP (2 rho = 1) and pure epsilon = 1")  # fmt: skip
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def zipf_histogram(horizon: int, keys: int, seed: int, path: Path | None) -> dict[int, float]:
    """Running counts per key of a Zipf(2) stream, each key its own factorization stream.

    One item per step: a unit adds 1 to one key's stream, so the L2
    sensitivity over all keys' streams is that of one stream.
    """
    rng = np.random.default_rng(seed)
    items = np.minimum(rng.zipf(2.0, horizon), keys) - 1
    counter = Factorization(horizon, 0.5, 1.0, lambda n, s, r: r.normal(0, s, n))
    truth = np.stack([np.cumsum(items == k) for k in range(keys)])
    noisy = truth + np.stack([counter.noise(rng) for _ in range(keys)])
    if path is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for k in range(min(keys, 4)):
            ax.plot(truth[k], color=f"C{k}", lw=1, label=f"key {k + 1} exact")
            ax.plot(noisy[k], color=f"C{k}", lw=0.6, alpha=0.6, label=f"key {k + 1} released")
        ax.set(xlabel="step", ylabel="running count", title="Continual histogram, Zipf(2) stream")
        ax.legend(ncol=2, fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
    top = int(np.argmax(noisy[:, -1]))
    return {"top key": top + 1, "released": float(noisy[top, -1]), "exact": float(truth[top, -1])}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-log", type=int, default=10)
    parser.add_argument("--max-log", type=int, default=14)
    parser.add_argument("--reps", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--out", type=Path, default=IMG, help="folder for the PNGs ('' for none)")
    args = parser.parse_args(argv)
    rows = experiment(range(args.min_log, args.max_log + 1, 2), args.reps, args.seed)
    print(table(rows))
    save = args.out if str(args.out) else None
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        plot(rows, save / "seed003_continual.png")
    hist = zipf_histogram(1 << args.min_log, 20, args.seed,
                          save / "seed003_zipf.png" if save else None)  # fmt: skip
    print(f"Zipf histogram: {hist}")


if __name__ == "__main__":
    main()
