"""Seed 001's headline comparison: central DP against local DP on origin-destination counts.

On the synthetic census-shaped data of dpsql.ldp.synthetic (n = 2,750,238
people; 1,085 county cells, 6 of them empty; 9,796,900 fine cells, 2.93%
non-empty), for each epsilon:

- central: the Laplace histogram (discrete Laplace on every cell of the
  public domain, empty cells included) and the stability histogram (discrete
  Laplace on the non-empty cells only, released when the noisy count
  reaches tau, at delta = 1 / (2n));
- local: the frequency oracles of dpsql.ldp (GRR, OUE, OLH, Hadamard
  response, 1-bit Hadamard), under each post-processing method.

Measured: RMSE over all cells (counts), maximum error, running time, the
estimated rank of the true top 10, and the number of cells released as 0
after each post-processing; then the two subsets of seed 001 section 5.5
(the same 26,244-cell domain with 218,860 and with 38,630 people) at
epsilon 5. Like the seed, neighbouring data sets differ by one person's
substituted commute: an L1 sensitivity of 2 for the central histograms (the
local oracles protect any change of one person's report by construction).

    python examples/seed001_central.py --size quick   # or full / smoke
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Iterable
from fractions import Fraction
from pathlib import Path

import numpy as np

from dpsql import ldp
from dpsql.ldp.synthetic import PEOPLE, county_counts, people_from_counts, sparse_counts
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.mechanisms.selection import threshold

try:
    from examples import figures
except ImportError:  # run as a script from examples/
    import figures

ROOT = Path(__file__).resolve().parent.parent
SENSITIVITY = 2  # substitution neighbours, as in the seed
CENTRAL = ("laplace", "stability")
LOCAL = {"county": ("grr", "oue", "olh", "hr", "hm"), "sparse": ("grr", "oue", "hr", "hm")}
SIZES = {
    "smoke": {"epsilons": (1.0, 5.0), "levels": ("county",), "people": 200_000},
    "quick": {"epsilons": (0.5, 1.0, 2.0, 3.0, 5.0), "levels": ("county", "sparse"),
              "sparse_epsilons": (0.5, 5.0), "people": PEOPLE},
    "full": {"epsilons": tuple(np.arange(0.5, 5.01, 0.5)), "levels": ("county", "sparse"),
             "people": PEOPLE},
}  # fmt: skip
SUBSET_PEOPLE = {"D (Dublin City EDs)": 218_860, "R (Cavan + Leitrim)": 38_630}
SUBSET_CELLS = 162 * 162
# Seed 001 (digest-001.md section 6): running times in seconds, county and fine level.
SEED_SECONDS = {
    "county": {"laplace": 4, "stability": 5, "grr": 9, "oue": 274, "olh": 2296, "hr": 20},
    "sparse": {"laplace": 328.69, "stability": 18, "grr": 7, "oue": 154_272, "hr": 32},
}
# Seed 001 Table 5.1 (county, epsilon 0.5): estimated rank of the true top 10.
SEED_TOP10_COUNTY_05 = {
    "laplace": list(range(1, 11)), "stability": list(range(1, 11)),
    "grr": [1, 2, 172, 188, 560, 99, 173, 130, 484, 176],
    "oue": [1, 2, 3, 6, 5, 4, 9, 8, 11, 12], "olh": [1, 2, 3, 6, 5, 4, 7, 8, 16, 10],
    "hr": [1, 2, 3, 4, 6, 5, 8, 9, 13, 16],
}  # fmt: skip
# Seed 001 section 6.3: cells released as 0 at county level, epsilon 5, base-pos.
SEED_ZEROS_COUNTY_5 = {"stability": 96, "oue": 329, "olh": 338, "hr": 363, "laplace": 6}
# (The seed's "Hadamard mechanism" ran pure-LDP's Hadamard response: its figures are hr's.)


def central(name: str, epsilon: float, truth: np.ndarray, rng) -> np.ndarray:
    """The released histogram of a central mechanism (discrete noise, exact arithmetic)."""
    noise = DiscreteLaplace(SENSITIVITY, Fraction(epsilon))
    if name == "laplace":
        return noise.sample(truth, rng).astype(np.float64)
    # Stability histogram: only non-empty cells are noised, a noisy count below tau is
    # withheld (released as 0). P(1 + Z >= tau) <= delta / 2 per cell, and a substitution
    # creates at most one new non-empty cell.
    delta = 1 / (2 * truth.sum())
    tau = threshold(epsilon, delta, SENSITIVITY)
    out = np.zeros(truth.size)
    cells = np.flatnonzero(truth)
    noisy = noise.sample(truth[cells], rng)
    out[cells] = np.where(noisy >= tau, noisy, 0)
    return out


def local(name: str, epsilon: float, truth: np.ndarray, people, rng) -> np.ndarray:
    m = ldp.mechanism(name, epsilon, truth.size)
    if people is None:
        return m.estimate_from_counts(m.simulate_counts(truth, rng), int(truth.sum()))
    return m.estimate(m.perturb_indices(people, rng))


def closed_rmse(name: str, epsilon: float, truth: np.ndarray) -> float:
    """RMSE over the cells before any post-processing, from the closed-form variances."""
    if name == "laplace":
        return math.sqrt(DiscreteLaplace(SENSITIVITY, Fraction(epsilon)).variance())
    if name in ("stability", "hr"):
        # no closed form: HR's exact variance needs each block's mass, the threshold's
        # depends on which cells it suppresses
        return math.nan
    m, n = ldp.mechanism(name, epsilon, truth.size), int(truth.sum())
    values, weights = np.unique(truth, return_counts=True)
    variances = np.array([m.variance(n, float(v)) for v in values])
    return float(np.sqrt(np.sum(variances * weights) / truth.size))


def ranks_of(estimate: np.ndarray, cells: np.ndarray) -> list[int]:
    """1 + the number of cells estimated strictly higher (ties share the best rank)."""
    return [int(np.count_nonzero(estimate > estimate[c])) + 1 for c in cells]


def metrics(released: np.ndarray, truth: np.ndarray, top: np.ndarray) -> dict:
    error = released - truth
    return {"rmse": float(np.sqrt(np.mean(error**2))), "max": float(np.abs(error).max()),
            "zeros": int(np.count_nonzero(released == 0)), "ranks": ranks_of(released, top),
            "true_zeros": int(np.count_nonzero(truth == 0))}  # fmt: skip


def level_rows(level: str, truth: np.ndarray, epsilons: Iterable[float], mechanisms,
               rng, step: Callable[[], None]) -> list[dict]:  # fmt: skip
    """One row per (mechanism, epsilon, post-processing)."""
    n = int(truth.sum())
    top = np.argsort(-truth, kind="stable")[:10]
    people = people_from_counts(truth)
    rows = []
    for mech in mechanisms:
        for eps in epsilons:
            eps = float(eps)
            began = time.perf_counter()
            if mech in CENTRAL:
                estimate = central(mech, eps, truth, rng)
                methods = ("none", "base-pos") if mech == "laplace" else ("none",)
            else:
                # unary encoding over a large domain: O(n d) per-person bits, so its counts
                # are drawn from their exact distribution instead
                exact_counts = mech == "oue" and truth.size > 5_000
                estimate = local(mech, eps, truth, None if exact_counts else people, rng)
                methods = ldp.METHODS
            seconds = time.perf_counter() - began
            closed = closed_rmse(mech, eps, truth)
            tau = threshold(eps, 1 / (2 * n), SENSITIVITY)
            below = int(np.count_nonzero((truth > 0) & (truth < tau)))
            for method in methods:
                released = ldp.postprocess(estimate, method, n) if method != "none" else estimate
                rows.append({"level": level, "mechanism": mech, "epsilon": eps, "post": method,
                             "seconds": seconds, "closed": closed, "tau": tau,
                             "below_tau": below,
                             **metrics(released, truth, top)})  # fmt: skip
            step()
    return rows


def subset_counts(people: int, seed: int) -> np.ndarray:
    """A 162 x 162 origin-destination table: a heavy diagonal and a Zipf-like tail."""
    rng = np.random.default_rng(seed)
    side = 162
    weight = rng.pareto(1.2, (side, side)) + 1e-3
    weight[np.arange(side), np.arange(side)] *= 40
    return rng.multinomial(people, (weight / weight.sum()).reshape(-1))


def run(size: str, img: Path, progress: Callable[[int, str], Callable[[], None]]) -> str:
    """Every part of the experiment at `size`; the markdown section for docs/experiments.md."""
    setting = SIZES[size]
    rng = ldp.secure_generator()
    data = {"county": county_counts(people=setting["people"])}
    if "sparse" in setting["levels"]:
        data["sparse"] = sparse_counts()
    rows = []
    for level in setting["levels"]:
        epsilons = setting.get(f"{level}_epsilons", setting["epsilons"])
        mechanisms = CENTRAL + LOCAL[level]
        step = progress(len(mechanisms) * len(epsilons), f"seed 001 {level}")
        rows += level_rows(level, data[level], epsilons, mechanisms, rng, step)
    subsets = []
    step = progress(len(SUBSET_PEOPLE), "seed 001 subsets")
    for name, people in SUBSET_PEOPLE.items():
        truth = subset_counts(people, seed=5)
        subsets += [dict(r, level=name) for r in level_rows(
            name, truth, (5.0,), CENTRAL + LOCAL["county"], rng, lambda: None)]  # fmt: skip
        step()
    figures_made = [plot_level(rows, level, img) for level in setting["levels"]]
    return page(rows, subsets, setting, figures_made, img)


def plot_level(rows: list[dict], level: str, img: Path) -> Path:
    fig, axes = figures.subplots(1, 3, figsize=(14, 4.2))
    mechanisms = dict.fromkeys(r["mechanism"] for r in rows if r["level"] == level)
    for mech in mechanisms:
        post = "none"
        mine = [r for r in rows if r["level"] == level and r["mechanism"] == mech
                and r["post"] == post]  # fmt: skip
        eps = [r["epsilon"] for r in mine]
        style = "-" if mech in CENTRAL else "--"
        for axis, key in zip(axes, ("rmse", "max", "seconds"), strict=True):
            axis.plot(eps, [max(r[key], 1e-3) for r in mine], style, marker="o", ms=3,
                      color=figures.colour(mech), label=mech)  # fmt: skip
    labels = ("RMSE over all cells (people)", "maximum error (people)",
              "running time (s)")  # fmt: skip
    for axis, label in zip(axes, labels, strict=True):
        axis.set(xlabel="epsilon", ylabel=label, yscale="log")
        axis.grid(alpha=0.3, which="both")
    figures.legend_outside(axes[2], title="solid: central\ndashed: local")
    domain = "1,085 county cells" if level == "county" else "9,796,900 fine cells"
    fig.suptitle(f"Seed 001, {level} level ({domain}): central against local, "
                 "no post-processing")  # fmt: skip
    fig.tight_layout()
    return figures.save(fig, img / f"seed001_{level}.png")


# Seed 001 section 5.1: which central mechanism had the lower RMSE and maximum error.
SEED_CENTRAL = {
    "county": "the stability histogram had the lower RMSE and Laplace the lower maximum error",
    "sparse": "Laplace had the lower RMSE and the stability histogram the lower maximum error",
}


def central_note(rows, level, eps_list) -> str:
    """The seed's Laplace-against-stability finding beside what these rows show."""

    def where(key, post):
        won = [e for e in eps_list if _row(rows, level, "stability", e)[key]
               < _row(rows, level, "laplace", e, post)[key]]  # fmt: skip
        return ("eps " + ", ".join(f"{e:g}" for e in won)) if won else "no epsilon"

    return (f"Laplace against the stability histogram: at the seed's {level} level "
            f"{SEED_CENTRAL[level]}. Here the stability histogram's RMSE is the lower at "
            f"{where('rmse', 'none')} (against Laplace clamped at 0, as the seed's code "
            f"released it: {where('rmse', 'base-pos')}), its maximum error the lower at "
            f"{where('max', 'none')}. The synthetic tables' small cells are not the census's, "
            "and the threshold's error comes from them.")  # fmt: skip


def best_local(rows, level, eps) -> float:
    return min(r["rmse"] for r in rows if r["level"] == level and r["epsilon"] == eps
               and r["mechanism"] not in CENTRAL and r["post"] == "none")  # fmt: skip


def _row(rows, level, mech, eps, post="none"):
    return next(r for r in rows if r["level"] == level and r["mechanism"] == mech
                and r["epsilon"] == eps and r["post"] == post)  # fmt: skip


def page(rows, subsets, setting, made, img) -> str:
    out = ["## Seed 001: central against local frequency estimation", "",
           "Script: `examples/seed001_central.py`. Data: synthetic, shaped like the seed's "
           "census commuting table (`dpsql.ldp.synthetic`), n = "
           f"{int(setting['people']):,} people. Sensitivity 2 (substitution, as in the seed): "
           "the Laplace histogram adds discrete Laplace of scale 2/epsilon to every cell; the "
           "stability histogram to the non-empty cells only and releases a cell when its noisy "
           "count reaches tau, at delta = 1/(2n). Closed form: sqrt(2) scale for Laplace, the "
           "oracle's variance formula averaged over the cells for the local ones. "
           "One run per cell of the tables.", "",
           "**Departures from the seed.** The data are synthetic (same n, domain sizes, "
           "empty-cell counts and heavy tail as the census table, not the census). The "
           "stability threshold tau is the exact one for discrete Laplace noise, P(1 + Z >= "
           "tau) <= delta/2 (the seed's code used 2 ln(2/delta)/eps + 1/n, slightly too low). "
           "GRR is the correct randomised response (the seed's client sent a second, stale "
           "report for every truthful respondent). The seed's 'Hadamard mechanism' ran "
           "Hadamard response, so its figures stand beside `hr`; `hm` is the 1-bit Hadamard "
           "mechanism, whose variance never falls below about n. The seed clamped Laplace "
           "at 0 without saying so; here 'none' is the raw release and base-pos the clamp. "
           "No budget is composed across the runs (each is its own experiment, as in the "
           "seed).", ""]  # fmt: skip
    for level in setting["levels"]:
        eps_list = sorted({r["epsilon"] for r in rows if r["level"] == level})
        mechs = list(dict.fromkeys(r["mechanism"] for r in rows if r["level"] == level))
        out += [f"### {level} level: RMSE (closed form) / maximum error, no post-processing",
                "", "| mechanism | " + " | ".join(f"eps {e:g}" for e in eps_list) + " |",
                "|---|" + "---:|" * len(eps_list)]  # fmt: skip
        for mech in mechs:
            cells = []
            for e in eps_list:
                r = _row(rows, level, mech, e)
                closed = "" if math.isnan(r["closed"]) else f" ({r['closed']:,.1f})"
                cells.append(f"{r['rmse']:,.1f}{closed} / {r['max']:,.0f}")
            out.append(f"| {mech} | " + " | ".join(cells) + " |")
        ratios = ", ".join(
            f"{best_local(rows, level, e) / _row(rows, level, 'laplace', e)['rmse']:,.0f}x"
            f" at eps {e:g}"
            for e in eps_list
        )
        figure = made[setting["levels"].index(level)].name
        out += ["", "Central against local: the best local oracle's RMSE over the Laplace "
                f"histogram's is {ratios}.", "", central_note(rows, level, eps_list), "",
                f"![seed 001 {level}](img/{figure})", "",
                "Running time (seconds, mean over epsilon; the seed's on its 2018 laptop "
                "beside it; dpsql's local times simulate all n clients in one process):", "",
                "| mechanism | dpsql | seed 001 |", "|---|---:|---:|"]  # fmt: skip
        for mech in mechs:
            secs = np.mean([r["seconds"] for r in rows if r["level"] == level
                            and r["mechanism"] == mech and r["post"] == "none"])  # fmt: skip
            seed = SEED_SECONDS[level].get(mech)
            out.append(f"| {mech} | {secs:.2f} | {'—' if seed is None else f'{seed:,}'} |")
        out.append("")
        out += ranks_table(rows, level, eps_list, mechs)
        out += zeros_table(rows, level, max(eps_list), mechs)
    out += subsets_table(subsets)
    return "\n".join(out)


def ranks_table(rows, level, eps_list, mechs) -> list[str]:
    lines = []
    for eps in (min(eps_list), max(eps_list)):
        post = "base-pos"
        lines += [f"**{level}, epsilon {eps:g}: estimated rank of the true top 10** "
                  f"(base-pos for local, none for central; ties share the best rank"
                  + ("; the seed's Table 5.1 in brackets" if level == "county" and eps == 0.5
                     else "") + ")", "",
                  "| true rank | " + " | ".join(mechs) + " |",
                  "|---|" + "---:|" * len(mechs)]  # fmt: skip
        for i in range(10):
            cells = []
            for mech in mechs:
                r = _row(rows, level, mech, eps, "none" if mech in CENTRAL else post)
                seed = SEED_TOP10_COUNTY_05.get(mech) if level == "county" and eps == 0.5 else None
                cells.append(f"{r['ranks'][i]:,}" + (f" ({seed[i]})" if seed else ""))
            lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def zeros_table(rows, level, eps, mechs) -> list[str]:
    first = _row(rows, level, mechs[0], eps)
    lines = [f"**{level}, epsilon {eps:g}: cells released as 0** (the truth has "
             f"{first['true_zeros']:,} empty cells and {first['below_tau']:,} non-empty ones "
             f"below the stability threshold tau = {first['tau']}"
             + ("; the seed's base-pos figures at epsilon 5 in brackets" if level == "county"
                else "") + ")", "",
             "| mechanism | " + " | ".join(ldp.METHODS) + " |",
             "|---|" + "---:|" * len(ldp.METHODS)]  # fmt: skip
    for mech in mechs:
        cells = []
        for method in ldp.METHODS:
            found = [r for r in rows if r["level"] == level and r["mechanism"] == mech
                     and r["epsilon"] == eps and r["post"] == method]  # fmt: skip
            seed = SEED_ZEROS_COUNTY_5.get(mech) if level == "county" and eps == 5 else None
            show = method == ("none" if mech == "stability" else "base-pos")
            cells.append("—" if not found else f"{found[0]['zeros']:,}"
                         + (f" ({seed})" if seed and show else ""))  # fmt: skip
        lines.append(f"| {mech} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def subsets_table(subsets) -> list[str]:
    names = list(SUBSET_PEOPLE)
    mechs = list(dict.fromkeys(r["mechanism"] for r in subsets))
    lines = ["### Subsets by number of reports (epsilon 5, 26,244 cells each)", "",
             "Seed 001 section 5.5 found every mechanism's RMSE lower on the smaller subset R "
             "and expected the opposite. On counts a local oracle's RMSE grows like sqrt(n) "
             "and a central one does not depend on n; on frequencies (RMSE / n) the local "
             "error falls like 1/sqrt(n). No post-processing.", "",
             "| mechanism | " + " | ".join(f"RMSE {k.split()[0]} (n = {SUBSET_PEOPLE[k]:,})"
                                          for k in names)
             + " | ratio D / R | sqrt(n_D / n_R) |", "|---|---:|---:|---:|---:|"]  # fmt: skip
    ratio = math.sqrt(SUBSET_PEOPLE[names[0]] / SUBSET_PEOPLE[names[1]])
    for mech in mechs:
        values = [next(r["rmse"] for r in subsets if r["level"] == k and r["mechanism"] == mech
                       and r["post"] == "none") for k in names]  # fmt: skip
        lines.append(f"| {mech} | {values[0]:,.1f} | {values[1]:,.1f} | "
                     f"{values[0] / values[1]:.2f} | {ratio:.2f} |")  # fmt: skip
    lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="quick")
    parser.add_argument("--img", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    print(run(args.size, args.img, lambda total, label: lambda: None))


if __name__ == "__main__":
    main()
