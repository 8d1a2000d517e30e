"""Distance-sensitive encoding (seed 004's own protocol), corrected, for ordinal values.

A person holding x reports i with probability a when i = x, a / (c (c + 1))
with c = min(theta, |i - x|) otherwise: nearby values are likelier, values
beyond the window theta all get s = a / (theta (theta + 1)). The worst ratio
of a column is a / s = theta (theta + 1) <= e^eps, so
theta = floor((sqrt(4 e^eps + 1) - 1) / 2), which needs eps >= ln 2;
a = theta (theta + 1) / (3 theta^2 - theta + d - 1) makes an interior row sum
to one.

Corrections to the seed (digest 002-004):
- Near the domain edges part of the window falls outside the domain; that
  missing mass is spread evenly over the d - 1 values other than x, so every
  row sums to one and the true value keeps exactly a. (The seed's code
  renormalised with a mis-scaled weight, which gave the true value more than
  a and broke epsilon at the edges.)
- The seed counted exact matches and divided by the window mass, a biased
  kernel-smoothed histogram. Here the estimate inverts the channel:
  E[report counts] = P^T f, so f_hat = solve(P^T, counts) is unbiased.
"""

from __future__ import annotations

import decimal
import math

import numpy as np

from dpsql.ldp.base import FrequencyOracle, IntegerReports, bits_for


def _window(epsilon: float) -> int:
    """The largest theta with theta (theta + 1) <= e^eps, decided in 50 digits: the float
    formula, nudged up by 1e-12, could give theta (theta + 1) just above e^eps (ln of a
    whole number is irrational, so 50 digits never tie)."""
    theta = math.floor((math.sqrt(4 * math.exp(epsilon) + 1) - 1) / 2)
    with decimal.localcontext() as context:
        context.prec = 50
        bound = decimal.Decimal(epsilon)  # the float's exact value

        def fits(t: int) -> bool:
            return t < 1 or decimal.Decimal(t * (t + 1)).ln() <= bound

        while not fits(theta):
            theta -= 1
        while fits(theta + 1):
            theta += 1
    return theta


class DistanceSensitiveEncoding(IntegerReports, FrequencyOracle):
    """Reports a value near the true one; unbiased by inverting the d x d channel."""

    name = "dse"

    def __init__(self, epsilon: float, domain, **options):
        super().__init__(epsilon, domain)
        if options:
            raise TypeError(f"unexpected options for {self.name}: {sorted(options)}")
        theta = _window(self.epsilon)
        if theta < 1:
            raise ValueError(
                f"distance-sensitive encoding needs epsilon >= ln 2 = 0.693, got {self.epsilon:g}; "
                "use 'grr' or 'oue' for smaller epsilon"
            )
        self.theta = theta
        self.a = theta * (theta + 1) / (3 * theta**2 - theta + self.d - 1)
        self._channel = self._build_channel()
        self._cdf = np.cumsum(self._channel, axis=1)
        self._cdf[:, -1] = 1.0
        self._inverse_t = np.linalg.inv(self._channel.T)

    @property
    def effective_epsilon(self) -> float:
        """ln(theta (theta + 1)): the epsilon actually used (at most the one asked for)."""
        return math.log(self.theta * (self.theta + 1))

    def _build_channel(self) -> np.ndarray:
        x = np.arange(self.d)
        gap = np.minimum(np.abs(x[:, None] - x[None, :]), self.theta)
        rows = np.where(gap == 0, self.a, self.a / np.maximum(gap * (gap + 1), 1))
        missing = 1.0 - rows.sum(axis=1)  # window mass that fell outside the domain
        rows += np.where(gap == 0, 0.0, (missing / (self.d - 1))[:, None])
        return rows

    def perturb_indices(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        u = rng.random(idx.size)
        out = np.empty(idx.size, dtype=np.int64)
        for value in np.unique(idx):  # one vectorised inverse-CDF draw per distinct value
            mine = idx == value
            out[mine] = np.searchsorted(self._cdf[value], u[mine], side="right")
        return np.minimum(out, self.d - 1)

    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        return np.bincount(np.asarray(reports, dtype=np.int64), minlength=self.d)

    def estimate_from_counts(self, counts: np.ndarray, n: int) -> np.ndarray:
        return self._inverse_t @ np.asarray(counts, dtype=np.float64)

    def covariance(self, counts: np.ndarray) -> np.ndarray:
        """Exact covariance of the estimate when the true counts are `counts`."""
        f = np.asarray(counts, dtype=np.float64)
        mean = self._channel.T @ f
        report_cov = np.diag(mean) - (self._channel.T * f) @ self._channel
        return self._inverse_t @ report_cov @ self._inverse_t.T

    def variance(self, n: int, count: float = 0.0) -> float:
        """Variance of the middle value's estimate, the others sharing n - count evenly."""
        f = np.full(self.d, (n - count) / (self.d - 1))
        f[self.d // 2] = count
        return float(self.covariance(f)[self.d // 2, self.d // 2])

    @property
    def message_bits(self) -> int:
        return bits_for(self.d)

    def server_cost(self, n: int) -> float:
        return float(n + self.d**2)

    def channel(self) -> np.ndarray:
        return self._channel.copy()
