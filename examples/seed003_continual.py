"""Seed 003's experiment done right: per-step error of continual counters, and a Zipf histogram.

Five counters release all T running counts of a stream, many times over:

- approximate DP at (epsilon, delta) = (0.5, 1e-10), through rho-zCDP with the
  largest rho within it (the CKS conversion, as dpsql charges streams): the
  binary tree with Gaussian node noise (plain sums and Honaker's online
  estimator) and the square-root factorisation;
- pure epsilon = 1: the binary tree with Laplace node noise, plain and Honaker.

For each horizon T and Bernoulli stream (p in {0, 2^-4, ..., 2^-10}) we report
the maximum and the mean over t of the per-step mean squared error (and RMSE),
not the absolute mean noise (which tends to 0), beside the closed forms of
dpsql.mechanisms.continual and the figures of the shared reference
(mechanisms.md section 3, given in zCDP units of 2 rho = 1: the zCDP columns
are also shown multiplied by 2 rho, which is exact since variance scales as
1 / (2 rho)).

**Simulation noise.** The noise here is numpy's *float32* Gaussian and
Laplace (SFC64 generator, vectorised over batches of runs, the
factorisation's L z by one FFT per run), because only the variance is
measured; dpsql's releases use the exact discrete samplers. The error of
these additive mechanisms does not depend on the stream, which the p column
shows; so every p is run at the smallest T, and p = 0 at the larger ones.

    python examples/seed003_continual.py --logs 10,12,14,16,18,20 --reps 10000 \\
        --json seed003.jsonl

CPU per run: about 45 ms at 2^18 and 0.2 to 0.3 s at 2^20 (most of it the
factorisation's FFT and drawing the trees' 2T node values), so 10^4 runs of
every horizon take about an hour of one core; several processes with other
seeds (`--logs 20 --seed 4 ...`) can share a horizon and be pooled with
`--from-json ... --pool run.20.npz other.20.npz`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from dpsql.accounting import zcdp_rho
from dpsql.mechanisms.continual import BinaryTree, Factorization

try:
    from examples import figures
except ImportError:  # run as a script from examples/
    import figures

IMG = Path(__file__).resolve().parent.parent / "docs" / "img"
PS = [0.0] + [2.0**-k for k in range(4, 11)]
EPSILON, DELTA = 0.5, 1e-10  # the approximate-DP comparison
PURE_EPSILON = 1.0
ZCDP = ("zCDP binary tree", "zCDP online Honaker", "zCDP sqrt factorization")
PURE = ("pure binary tree", "pure online Honaker")
# mechanisms.md section 3 (computed there in closed form): (max, mean) variance
# over t; zCDP in units of 2 rho = 1, pure in units of epsilon = 1
REFERENCE = {
    "zCDP binary tree": {10: (110, 55), 12: (156, 78), 14: (210, 105), 16: (272, 136),
                         18: (342, 171), 20: (420, 210)},
    "zCDP online Honaker": {10: (63.8, 31.9), 12: (88.4, 44.2), 14: (117.0, 58.5),
                            16: (149.7, 74.8), 18: (186.3, 93.1), 20: (226.9, 113.4)},
    "zCDP sqrt factorization": {10: (10.71, 9.67), 12: (13.79, 12.61), 14: (17.27, 15.94),
                                16: (21.13, 19.66), 18: (25.38, 23.78), 20: (30.02, 28.28)},
    "pure binary tree": {10: (2420, 1210), 12: (4056, 2028), 14: (6300, 3150),
                         16: (9248, 4624), 18: (12996, 6498), 20: (17640, 8820)},
    "pure online Honaker": {10: (1404, 702), 12: (2299, 1150), 14: (3511, 1756),
                            16: (5088, 2544), 18: (7078, 3539), 20: (9529, 4764)},
}  # fmt: skip


def rho() -> float:
    """The largest rho-zCDP within (EPSILON, DELTA)-DP."""
    return zcdp_rho(EPSILON, DELTA)


def _gaussian(sd: float):
    scale = np.float32(sd)

    def draw(size: int, rng: np.random.Generator) -> np.ndarray:
        return rng.standard_normal(size, dtype=np.float32) * scale

    return draw


def _laplace(scale: float):
    b = np.float32(scale)

    def draw(size: int, rng: np.random.Generator) -> np.ndarray:
        # an exponential with a random sign is Laplace
        values = rng.standard_exponential(size, dtype=np.float32) * b
        np.negative(values, out=values, where=rng.integers(0, 2, size, dtype=np.int8) == 1)
        return values

    return draw


def counters(horizon: int) -> dict[str, BinaryTree | Factorization]:
    """The five counters; trees with the same node noise come in pairs (plain, Honaker)."""
    levels = max(0, (horizon - 1).bit_length()) + 1
    gauss = levels / (2 * rho())  # node variance: L2 sensitivity^2 = levels, over 2 rho
    lap = levels / PURE_EPSILON  # Laplace scale: L1 sensitivity = levels, over epsilon
    return {
        "zCDP binary tree": BinaryTree(horizon, gauss, _gaussian(math.sqrt(gauss)), honaker=False),
        "zCDP online Honaker": BinaryTree(horizon, gauss, _gaussian(math.sqrt(gauss))),
        "zCDP sqrt factorization": Factorization(
            horizon, rho(), 1.0,
            lambda n, s, rng: rng.standard_normal(n, dtype=np.float32) * np.float32(s),
        ),
        "pure binary tree": BinaryTree(horizon, 2 * lap**2, _laplace(lap), honaker=False),
        "pure online Honaker": BinaryTree(horizon, 2 * lap**2, _laplace(lap)),
    }  # fmt: skip


def noise_batch(
    mechanisms: dict[str, BinaryTree | Factorization], runs: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """eta for `runs` independent releases of each counter, shape (runs, T).

    A plain tree and its Honaker twin share one draw of node noise (each is
    still `runs` independent runs; only their two estimates are correlated).
    """
    out: dict[str, np.ndarray] = {}
    for plain, honaker in (ZCDP[:2], PURE):
        nodes = mechanisms[plain].nodes(rng, runs)
        out[plain] = mechanisms[plain].prefixes(nodes)
        out[honaker] = mechanisms[honaker].prefixes(nodes)
    factorization = mechanisms[ZCDP[2]]
    z = factorization.sampler(runs * factorization.horizon, factorization.sigma, rng)
    out[ZCDP[2]] = factorization.apply(z.reshape(runs, factorization.horizon))
    return out


def simulate(log: int, ps: list[float], reps: int, rng: np.random.Generator,
             checkpoint: Path | None = None, progress: float = 60.0) -> list[dict]:  # fmt: skip
    """Per-step MSE of each counter on Ber(p) streams over `reps` runs, at T = 2^log.

    Every `progress` seconds the rows so far (over the runs done) are written
    to `checkpoint`, and the per-step sums of squares beside it (.npz), so that
    a run stopped early still says how many ran, and runs of several processes
    (other seeds) can be pooled (`--pool`).
    """
    horizon = 1 << log
    mechanisms = counters(horizon)
    batch = max(1, min(reps, (1 << 22) // horizon))
    squares = {(name, p): np.zeros(horizon) for name in mechanisms for p in ps}
    done, began, shown = 0, time.perf_counter(), time.perf_counter()
    while done < reps:
        runs = min(batch, reps - done)
        for p in ps:
            # independent noise per stream: one shared draw made every p's row identical
            noise = noise_batch(mechanisms, runs, rng)
            truth = np.cumsum(rng.random((runs, horizon)) < p, axis=1) if p else None
            for name, eta in noise.items():
                # the release S_t + eta_t, as a stream releases it, minus the truth
                error = eta if truth is None else (truth + eta.astype(np.float64)) - truth
                squares[name, p] += np.einsum("rt,rt->t", error, error, dtype=np.float64)
        done += runs
        if time.perf_counter() - shown > progress:
            shown = time.perf_counter()
            print(f"  T = 2^{log}: {done} of {reps} runs, {shown - began:.0f} s", flush=True)
            if checkpoint is not None:
                _save(checkpoint, _rows(log, mechanisms, squares, done, began), squares, done)
    if checkpoint is not None:
        _save(checkpoint, _rows(log, mechanisms, squares, reps, began), squares, reps)
    return _rows(log, mechanisms, squares, reps, began)


def _save(path: Path, rows: list[dict], squares: dict, runs: int) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    arrays = {f"{name}|{p!r}": total for (name, p), total in squares.items()}
    np.savez(path.with_suffix(".npz"), runs=runs, **arrays)


def pool(paths: list[Path]) -> list[dict]:
    """Rows over the runs of several checkpoints (.npz) of one horizon, their sums pooled."""
    squares: dict = {}
    runs = 0
    for path in paths:
        with np.load(path) as saved:
            runs += int(saved["runs"])
            for label in saved.files:
                if label != "runs":
                    name, p = label.split("|")
                    key = (name, float(p))
                    squares[key] = squares.get(key, 0) + saved[label]
    horizon = len(next(iter(squares.values())))
    return _rows(horizon.bit_length() - 1, counters(horizon), squares, runs, time.perf_counter())


def _rows(log: int, mechanisms: dict, squares: dict, reps: int, began: float) -> list[dict]:
    rows = []
    for (name, p), total in squares.items():
        mse, closed = total / reps, mechanisms[name].variance()
        unit = 2 * rho() if name in ZCDP else PURE_EPSILON**2
        reference = REFERENCE[name].get(log, (math.nan, math.nan))
        rows.append({"T": 1 << log, "mechanism": name, "p": p, "runs": reps,
                     "max": float(mse.max()), "mean": float(mse.mean()),
                     "at_peak": float(mse[np.argmax(closed)]),
                     "closed_max": float(closed.max()), "closed_mean": float(closed.mean()),
                     "unit": unit, "reference_max": reference[0], "reference_mean": reference[1],
                     "seconds": time.perf_counter() - began})  # fmt: skip
    return rows


def experiment(logs: list[int], reps: int, seed: int, log_file: Path | None = None,
               streams_at: int = 10) -> list[dict]:  # fmt: skip
    """Every horizon 2^log in `logs`, in that order: every p at 2^streams_at, p = 0 elsewhere.

    Each horizon draws from its own generator (seed, log), so horizons can run
    in any order or in separate processes.
    """
    rows = []
    for log in logs:
        rng = np.random.Generator(np.random.SFC64([seed, log]))
        checkpoint = log_file.with_suffix(f".{log}.partial") if log_file is not None else None
        fresh = simulate(log, PS if log == streams_at else [0.0], reps, rng, checkpoint)
        rows += fresh
        if log_file is not None:
            with log_file.open("a") as out:
                out.writelines(json.dumps(r) + "\n" for r in fresh)
        print(f"T = 2^{log}: {reps} runs in {fresh[0]['seconds']:.0f} s", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: measured max and mean MSE, closed form, reference (2 rho = 1 units).

    "at peak" is the measured MSE at the step where the closed form is largest:
    an unbiased estimate of the largest variance, whereas the max over t of
    T noisy estimates is biased upwards (by a few percent for the
    factorisation, whose variance is nearly flat near its end).
    """
    lines = ["| T | mechanism | p | runs | max MSE | mean MSE | max RMSE | max, normalised "
             "| at peak, normalised (closed; reference) | mean, normalised (closed; reference) |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        u = r["unit"]
        lines.append(
            f"| 2^{r['T'].bit_length() - 1} | {r['mechanism']} | {r['p']:.4g} | {r['runs']} | "
            f"{r['max']:.4g} | {r['mean']:.4g} | {math.sqrt(r['max']):.4g} | "
            f"{r['max'] * u:.4g} | "
            f"{r['at_peak'] * u:.4g} ({r['closed_max'] * u:.4g}; {r['reference_max']:.4g}) | "
            f"{r['mean'] * u:.4g} ({r['closed_mean'] * u:.4g}; {r['reference_mean']:.4g}) |"
        )
    return "\n".join(lines)


def worst_deviation(rows: list[dict]) -> tuple[float, dict]:
    """The largest relative gap between a measured largest or mean variance (normalised, the
    largest measured at the closed form's peak) and the reference."""
    gaps = [(abs(r[m] * r["unit"] / r[f"reference_{k}"] - 1), r)
            for r in rows for m, k in (("at_peak", "max"), ("mean", "mean"))
            if not math.isnan(r[f"reference_{k}"])]  # fmt: skip
    return max(gaps, key=lambda g: g[0], default=(0.0, {}))


def plot(rows: list[dict], path: Path) -> None:
    fig, axes = figures.subplots(1, 2, figsize=(13, 4.5))
    panels = ((axes[0], ZCDP, f"(epsilon, delta) = ({EPSILON}, {DELTA:g}), via zCDP"),
              (axes[1], PURE, f"pure epsilon = {PURE_EPSILON:g} (Laplace)"))  # fmt: skip
    for ax, names, title in panels:
        for name in names:
            mine = sorted((r for r in rows if r["mechanism"] == name and r["p"] == 0.0),
                          key=lambda r: r["T"])  # fmt: skip
            ts = [r["T"] for r in mine]
            colour = figures.colour(name.split(" ", 1)[1].replace("sqrt ", "").replace(
                "online ", ""))  # fmt: skip
            ax.plot(ts, [math.sqrt(r["max"]) for r in mine], "o-", color=colour,
                    label=f"{name}: max over t")  # fmt: skip
            ax.plot(ts, [math.sqrt(r["mean"]) for r in mine], "s--", color=colour, ms=4,
                    alpha=0.7, label=f"{name}: mean over t")  # fmt: skip
        ax.set(yscale="log", xlabel="horizon T (steps)", ylabel="per-step RMSE (counts)",
               title=title)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3, which="both")
        figures.legend_outside(ax, fontsize=7)
    fig.suptitle(f"Continual counting: RMSE of the running count ({rows[0]['runs']} runs per T)")
    fig.tight_layout()
    figures.save(fig, path)


def zipf_histogram(horizon: int, keys: int, seed: int, path: Path | None) -> dict[str, float]:
    """Running counts per key of a Zipf(2) stream, each key its own factorization stream.

    One item per step: a unit adds 1 to one key's stream, so the L2
    sensitivity over all keys' streams is that of one stream, and the whole
    histogram is rho-zCDP at the rho of (EPSILON, DELTA).
    """
    rng = np.random.default_rng(seed)
    items = np.minimum(rng.zipf(2.0, horizon), keys) - 1
    counter = Factorization(horizon, rho(), 1.0, lambda n, s, r: r.normal(0, s, n))
    truth = np.stack([np.cumsum(items == k) for k in range(keys)])
    noisy = truth + np.stack([counter.noise(rng) for _ in range(keys)])
    if path is not None:
        fig, ax = figures.subplots(figsize=(8, 4.5))
        # colour by key here: one mechanism (the factorization), four keys
        for k in range(min(keys, 4)):
            ax.plot(truth[k], color=f"C{k}", lw=1, label=f"key {k + 1} exact")
            ax.plot(noisy[k], color=f"C{k}", lw=0.6, alpha=0.6, label=f"key {k + 1} released")
        title = f"Continual histogram of a Zipf(2) stream, ({EPSILON}, {DELTA:g})-DP"
        ax.set(xlabel="step", ylabel="running count (items)", title=title)
        ax.grid(alpha=0.3)
        figures.legend_outside(ax)
        fig.tight_layout()
        figures.save(fig, path)
    top = int(np.argmax(noisy[:, -1]))
    return {"top key": top + 1, "released": float(noisy[top, -1]), "exact": float(truth[top, -1])}


def zipf_compare(horizon: int, keys: int, reps: int, seed: int) -> list[dict]:
    """The binary tree against the factorization on a Zipf(2) histogram stream.

    Each of `keys` keys has its own counter (one item per step, so the
    histogram is rho-zCDP at the rho of (EPSILON, DELTA), as in
    `zipf_histogram`). Over `reps` releases: the per-step RMSE of the most
    frequent key's running count (mean and max over t), and the largest error
    over all keys and steps (mean over releases), beside the closed forms.
    """
    rng = np.random.Generator(np.random.SFC64([seed, horizon]))
    items = np.minimum(rng.zipf(2.0, horizon), keys) - 1
    truth = np.stack([np.cumsum(items == k) for k in range(keys)])
    top = int(np.argmax(truth[:, -1]))
    mechanisms = counters(horizon)
    rows = []
    for name in ("zCDP binary tree", "zCDP online Honaker", "zCDP sqrt factorization"):
        counter = mechanisms[name]
        squares, worst = np.zeros(horizon), []
        for _ in range(reps):
            released = truth + np.stack([counter.noise(rng) for _ in range(keys)])
            error = released - truth
            squares += error[top] ** 2
            worst.append(np.abs(error).max())
        closed = counter.variance()
        rows.append({"mechanism": name.removeprefix("zCDP "), "T": horizon, "keys": keys,
                     "runs": reps, "top": top + 1, "top_count": int(truth[top, -1]),
                     "mean_rmse": float(np.sqrt(np.mean(squares / reps))),
                     "max_rmse": float(np.sqrt(np.max(squares / reps))),
                     "closed_mean_rmse": float(np.sqrt(np.mean(closed))),
                     "closed_max_rmse": float(np.sqrt(np.max(closed))),
                     "linf": float(np.mean(worst))})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", default="10,12,14",
                        help="the horizons' log2, in the order to run them: 20,16,18")  # fmt: skip
    parser.add_argument("--reps", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--streams-at", type=int, default=10,
                        help="the log2 horizon at which every Bernoulli stream runs")  # fmt: skip
    parser.add_argument("--json", type=Path, help="append each horizon's rows to this file")
    parser.add_argument("--from-json", type=Path, nargs="+",
                        help="only print and plot the rows of these files")  # fmt: skip
    parser.add_argument("--pool", type=Path, nargs="+",
                        help="with --from-json: add rows pooled from these .npz files")  # fmt: skip
    parser.add_argument("--out", type=Path, default=IMG, help="folder for the PNGs ('' for none)")
    args = parser.parse_args(argv)
    print(f"float32 numpy noise (only the variance is measured); rho = {rho():.6g} "
          f"for ({EPSILON}, {DELTA:g}), i.e. 2 rho = {2 * rho():.6g}", flush=True)  # fmt: skip
    if args.from_json is not None:
        rows = [json.loads(line) for path in args.from_json
                for line in path.read_text().splitlines() if line]  # fmt: skip
        rows += pool(args.pool) if args.pool else []
    else:
        logs = [int(v) for v in args.logs.split(",")]
        rows = experiment(logs, args.reps, args.seed, args.json, args.streams_at)
    rows.sort(key=lambda r: (r["T"], (*ZCDP, *PURE).index(r["mechanism"]), r["p"]))
    print(table(rows))
    gap, row = worst_deviation(rows)
    if row:
        print(f"largest gap to the reference: {gap:.2%} ({row['mechanism']}, T = {row['T']})")
    save = args.out if str(args.out) else None
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        plot(rows, save / "seed003_continual.png")
    hist = zipf_histogram(1 << 10, 20, args.seed,
                          save / "seed003_zipf.png" if save else None)  # fmt: skip
    print(f"Zipf histogram: {hist}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
