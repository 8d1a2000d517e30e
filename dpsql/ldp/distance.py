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

Reports are drawn from the exact channel (every probability above is rational):
a uniform's first 53 bits pick the report from the float CDF unless they fall
near one of its steps, where the exact CDF and more random bits decide. Drawn
from the float CDF alone, a report's probabilities were off by up to about
1e-13, beyond the ratio the window allows.
"""

from __future__ import annotations

import bisect
import decimal
import math
from fractions import Fraction

import numpy as np

from dpsql.ldp.base import FrequencyOracle, IntegerReports, bits_for

# The float CDF is within d * 2^-51 of the exact one (a few roundings per entry, one per
# term of the running sum; the channel is d x d, so d is far below 2^20): a draw whose
# first 53 bits lie farther than this from every step of it is decided by them alone.
_MARGIN = 2.0**-30
_TOP = 1 << 53  # the first bits of a uniform draw, a float's worth
_MORE = 1 << 62  # the bits each refinement of a draw near a step adds


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
        self._exact_rows: dict[int, list[Fraction]] = {}  # _exact_cdf's, by value

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
        """Reports i with probability P[x, i] exactly: u's first 53 bits pick i, the number
        of CDF steps at or below u, wherever no step lies within _MARGIN of them."""
        idx = np.asarray(idx, dtype=np.int64)
        top = rng.integers(0, _TOP, size=idx.size, dtype=np.int64)
        u = top / _TOP  # exact: u lies in [u, u + 2^-53)
        out = np.empty(idx.size, dtype=np.int64)
        for value in np.unique(idx):  # one vectorised inverse-CDF draw per distinct value
            mine = np.flatnonzero(idx == value)
            cdf = self._cdf[value]
            below = np.searchsorted(cdf, u[mine] - _MARGIN, side="right")
            above = np.searchsorted(cdf, u[mine] + 1 / _TOP + _MARGIN, side="right")
            out[mine] = below
            for k in mine[below != above]:  # near a step: the exact CDF decides
                out[k] = self._exact_draw(int(value), int(top[k]), rng)
        return out

    def _exact_draw(self, value: int, top: int, rng: np.random.Generator) -> int:
        """The report for a uniform u in [top, top + 1) / 2^53, refined by more random bits
        until no step of the exact CDF lies inside the interval u is known to lie in."""
        steps = self._exact_cdf(value)
        low, width = Fraction(top, _TOP), Fraction(1, _TOP)
        while True:
            count = bisect.bisect_right(steps, low)  # steps at or below every u here
            if count == len(steps) or steps[count] >= low + width:
                return count
            low += width * int(rng.integers(0, _MORE, dtype=np.int64)) / _MORE
            width /= _MORE

    def _exact_cdf(self, value: int) -> list[Fraction]:
        """The exact CDF of row `value` but its last step (1), as _build_channel makes it;
        kept by the oracle (an lru_cache on the method kept oracles alive)."""
        steps = self._exact_rows.get(value)
        if steps is None:
            steps = self._exact_rows[value] = self._exact_steps(value)
        return steps

    def _exact_steps(self, value: int) -> list[Fraction]:
        theta, d = self.theta, self.d
        a = Fraction(theta * (theta + 1), 3 * theta**2 - theta + d - 1)
        gaps = [min(abs(i - value), theta) for i in range(d)]
        row = [a if gap == 0 else a / (gap * (gap + 1)) for gap in gaps]
        spread = (1 - sum(row)) / (d - 1)  # window mass that fell outside the domain
        row = [p if gap == 0 else p + spread for p, gap in zip(row, gaps, strict=True)]
        steps, total = [], Fraction(0)
        for p in row[:-1]:
            total += p
            steps.append(total)
        return steps

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
