"""Generalised randomised response (direct encoding, k-RR): report the true value or another.

P[report = x | x] = e^eps / (e^eps + d - 1) and each other value gets
1 / (e^eps + d - 1); the ratio is exactly e^eps. The other value is drawn
from the d - 1 values other than x, never from all d (drawing from all d is
the seed-000 variant that leaks more than epsilon).
"""

from __future__ import annotations

import math

import numpy as np

from dpsql.ldp.base import IntegerReports, PureProtocol, bits_for
from dpsql.ldp.unary import bernoulli_bools, keep_probability


class DirectEncoding(IntegerReports, PureProtocol):
    """k-ary randomised response; best when d < 3 e^eps + 2."""

    name = "grr"

    def __init__(self, epsilon: float, domain, **options):
        super().__init__(epsilon, domain)
        if options:
            raise TypeError(f"unexpected options for {self.name}: {sorted(options)}")
        e = math.exp(self.epsilon)
        self.p_star = e / (e + self.d - 1)
        self.q_star = 1.0 / (e + self.d - 1)
        self._keep = keep_probability(self.epsilon, self.d - 1)  # p_star, exactly

    def perturb_indices(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        keep = bernoulli_bools(self._keep, idx.size, rng)
        other = rng.integers(0, self.d - 1, size=idx.size)
        # Skip over x: a uniform draw from the d - 1 values other than x.
        other += other >= idx
        return np.where(keep, idx, other)

    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        return np.bincount(np.asarray(reports, dtype=np.int64), minlength=self.d)

    @property
    def message_bits(self) -> int:
        return bits_for(self.d)

    def server_cost(self, n: int) -> float:
        return float(n + self.d)

    def channel(self) -> np.ndarray:
        out = np.full((self.d, self.d), self.q_star)
        np.fill_diagonal(out, self.p_star)
        return out
