"""Synthetic origin-destination counts shaped like seed 001's census commuting data.

Not the census: public-domain shapes only, for the benchmark and the
experiments. n = 2,750,238 people (the POWSCAR total).
- county level: 31 origins x 35 destinations = 1,085 cells, a strong
  diagonal (people mostly work in their own county), gravity-model flows
  elsewhere, exactly 6 empty cells;
- sparse level: 3,130^2 = 9,796,900 cells, 287,116 non-empty (2.93%), a heavy
  tail (about half the non-empty cells hold one person, the largest 5,871).
"""

from __future__ import annotations

import numpy as np

PEOPLE = 2_750_238
COUNTY_SHAPE = (31, 35)
SPARSE_SIDE = 3_130
SPARSE_NONZERO = 287_116
SPARSE_MAX = 5_871


def county_counts(seed: int = 0, people: int = PEOPLE) -> np.ndarray:
    """Counts over the 1,085 county cells (origin-major order)."""
    rng = np.random.default_rng(seed)
    origins, dests = COUNTY_SHAPE
    pop = rng.lognormal(0.0, 0.9, origins)
    place = rng.uniform(0, 10, (origins, 2))
    dist = np.linalg.norm(place[:, None, :] - place[None, :, :], axis=2)
    weight = np.empty(COUNTY_SHAPE)
    weight[:, :origins] = pop[:, None] * pop[None, :] * np.exp(-dist / 3)
    weight[np.arange(origins), np.arange(origins)] = pop**2 * 12.0
    # Four destination-only places (abroad, no fixed place, ...): small, everywhere.
    weight[:, origins:] = pop[:, None] * rng.uniform(0.005, 0.05, dests - origins)
    flat = weight.reshape(-1)
    flat[np.argsort(flat)[:6]] = 0.0
    return rng.multinomial(people, flat / flat.sum())


def sparse_counts(seed: int = 0, people: int = PEOPLE) -> np.ndarray:
    """Counts over the 9,796,900 cells of the fine level (int32, mostly zero)."""
    rng = np.random.default_rng(seed)
    # floor of a Pareto(alpha) truncated at SPARSE_MAX: P(count = 1) ~ 1 - 2^-alpha;
    # alpha is set by bisection so the counts add up to `people`.
    u = rng.random(SPARSE_NONZERO)
    top = SPARSE_MAX + 1.0

    def draw(alpha: float) -> np.ndarray:
        x = (1 - u * (1 - top**-alpha)) ** (-1 / alpha)
        return np.minimum(np.floor(x), SPARSE_MAX).astype(np.int64)

    lo, hi = 0.1, 3.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if draw(mid).sum() > people else (lo, mid)
    counts = draw(hi)
    counts[np.argmax(counts)] = SPARSE_MAX
    # The last few people go to (or come from) the largest cells below the maximum.
    order = np.argsort(counts)[::-1][1:]
    short = people - int(counts.sum())
    counts[order[: abs(short)]] += np.sign(short)
    cells = rng.choice(SPARSE_SIDE * SPARSE_SIDE, size=SPARSE_NONZERO, replace=False)
    out = np.zeros(SPARSE_SIDE * SPARSE_SIDE, dtype=np.int32)
    out[cells] = counts
    return out


def people_from_counts(counts: np.ndarray) -> np.ndarray:
    """One value (cell index) per person."""
    return np.repeat(np.arange(counts.size, dtype=np.int64), counts)
