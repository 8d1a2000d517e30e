"""Histogram encoding: a one-hot vector plus Laplace-shaped noise on every coordinate.

Reports are integer vectors k * onehot(x) + Z with Z i.i.d. discrete Laplace,
P[Z = z] proportional to alpha^|z|, alpha = exp(-eps / (2k)). Two one-hot
vectors are 2k apart in L1, so the ratio is exactly e^eps. Integer reports on
a grid of resolution 1/k replace seed 004's raw-float numpy Laplace (whose
floating-point outputs leak, Mironov 2012); k = 8 keeps the grid fine enough
for thresholding.

Two server-side aggregations of the same reports:
- summation (SHE): count = sum of coordinate v / k; Var = n * 2 alpha / (1 - alpha)^2 / k^2.
- thresholding (THE): a report supports v when its coordinate is >= tau; a pure
  protocol with p* = P[k + Z >= tau], q* = P[Z >= tau]. tau defaults to the grid
  threshold that minimises q*(1-q*)/(p*-q*)^2 (it lies between k/2 and k, the
  continuous optimum's (1/2, 1)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from dpsql.ldp.base import FrequencyOracle, split_fields
from dpsql.mechanisms.samplers import laplace_sampler

_CHUNK_ELEMENTS = 1 << 21


class HistogramEncoding(FrequencyOracle):
    """SHE (`kind="she"`) or THE (`kind="the"`, optional `threshold` in value units)."""

    def __init__(
        self,
        epsilon: float,
        domain,
        kind: str = "she",
        resolution: int = 8,
        threshold: float | None = None,
    ):
        super().__init__(epsilon, domain)
        if kind not in ("she", "the"):
            raise ValueError(f"unknown histogram encoding {kind!r}")
        if threshold is not None and kind != "the":
            raise TypeError("a threshold applies to thresholding (the) only")
        self.name = kind
        self.k = int(resolution)
        self.alpha = math.exp(-self.epsilon / (2 * self.k))
        self.noise_variance = 2 * self.alpha / (1 - self.alpha) ** 2
        # Exact discrete Laplace, P(z) proportional to exp(-|z| eps / (2k)): no floating-point
        # outcome decisions (numpy's geometric is only as exact as a double's logarithm).
        self._noise = laplace_sampler(Fraction(2 * self.k) / Fraction(self.epsilon))
        if kind == "the":
            if threshold is None:
                taus = np.arange(1, self.k + 1)
                self.tau = int(taus[np.argmin([self._the_var(t) for t in taus])])
            else:
                self.tau = math.floor(threshold * self.k) + 1
            self.p_star = self._tail(self.tau - self.k)
            self.q_star = self._tail(self.tau)

    def _tail(self, m: int) -> float:
        """P[Z >= m] for discrete Laplace Z."""
        if m >= 1:
            return self.alpha**m / (1 + self.alpha)
        return 1 - self.alpha ** (1 - m) / (1 + self.alpha)

    def _the_var(self, tau: int) -> float:
        p, q = self._tail(tau - self.k), self._tail(tau)
        return q * (1 - q) / (p - q) ** 2

    def perturb_indices(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        out = np.empty((idx.size, self.d), dtype=np.int32)
        step = max(1, _CHUNK_ELEMENTS // self.d)
        for start in range(0, idx.size, step):
            part = idx[start : start + step]
            noise = self._noise(part.size * self.d, rng).reshape(part.size, self.d)
            noise[np.arange(part.size), part] += self.k
            out[start : start + part.size] = noise
        return out

    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        """SHE: per-coordinate SUM; THE: per-coordinate COUNT of values >= tau."""
        reports = np.asarray(reports)
        if self.name == "she":
            return reports.sum(axis=0, dtype=np.int64)
        return (reports >= self.tau).sum(axis=0, dtype=np.int64)

    def estimate_from_counts(self, counts: np.ndarray, n: int) -> np.ndarray:
        counts = np.asarray(counts, dtype=np.float64)
        if self.name == "she":
            return counts / self.k
        return (counts - n * self.q_star) / (self.p_star - self.q_star)

    def simulate_counts(self, true_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Draw `aggregate`'s output from its exact distribution, for experiments only.

        Equal in distribution to perturbing c_v reports of each value v and
        aggregating them, because noise is independent across people and
        coordinates, so each column is a sum of independent terms:
        - SHE: a discrete Laplace is G1 - G2 for i.i.d. geometric G (failures,
          success probability 1 - alpha), and a sum of n of them is negative
          binomial, so the column sum is k c_v + NB(n, 1 - alpha) - NB(n, 1 - alpha);
        - THE: the column count is Binomial(c_v, p*) + Binomial(n - c_v, q*).
        Columns are independent. numpy's (floating-point) samplers are fine
        here: this simulates an experiment and releases nothing; `perturb` is the
        client path and stays exact.
        """
        c = np.asarray(true_counts, dtype=np.int64)
        n = int(c.sum())
        if self.name == "she":
            size = c.shape
            return (
                self.k * c
                + rng.negative_binomial(n, 1 - self.alpha, size)
                - rng.negative_binomial(n, 1 - self.alpha, size)
            )
        return rng.binomial(c, self.p_star) + rng.binomial(n - c, self.q_star)

    def variance(self, n: int, count: float = 0.0) -> float:
        if self.name == "she":
            return n * self.noise_variance / self.k**2
        p, q = self.p_star, self.q_star
        return (count * p * (1 - p) + (n - count) * q * (1 - q)) / (p - q) ** 2

    @property
    def message_bits(self) -> int:
        return 16 * self.d  # an int16 per coordinate; |Z| > 32767 has negligible probability

    def server_cost(self, n: int) -> float:
        return float(n) * self.d

    def _window(self) -> np.ndarray:
        return np.arange(-2 * self.k, 3 * self.k + 1)

    def channel(self) -> np.ndarray:
        """P[report | x] for reports with every coordinate in [-2k, 3k] (a truncated
        alphabet: rows do not sum to 1, but every ratio is exact)."""
        w = self._window()
        grids = np.stack(np.meshgrid(*([w] * self.d), indexing="ij"), axis=-1).reshape(-1, self.d)
        norm = (1 - self.alpha) / (1 + self.alpha)
        out = np.empty((self.d, len(grids)))
        for x in range(self.d):
            shift = np.zeros(self.d, dtype=np.int64)
            shift[x] = self.k
            out[x] = np.prod(norm * self.alpha ** np.abs(grids - shift), axis=1)
        return out

    def output_index(self, reports: np.ndarray) -> np.ndarray:
        w = self._window()
        pos = np.asarray(reports, dtype=np.int64) - w[0]
        inside = ((pos >= 0) & (pos < w.size)).all(axis=1)
        flat = pos @ (w.size ** np.arange(self.d - 1, -1, -1))
        return np.where(inside, flat, -1)

    def format_reports(self, reports: np.ndarray) -> list[str]:
        return [";".join(map(str, row)) for row in np.asarray(reports).tolist()]

    def parse_reports(self, fields: Sequence[str]) -> np.ndarray:
        return np.asarray(split_fields(fields, ";", self.d), dtype=np.int32).reshape(-1, self.d)
