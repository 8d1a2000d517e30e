"""Hadamard-based oracles, decoded with a fast Walsh-Hadamard transform in O(n + K log K).

Hadamard response (Acharya, Sun, Zhang 2019). The output alphabet [K] is split
into B blocks of size b (powers of two; B = 2^floor(log2 min(2d, e^eps)),
b = 2^ceil(log2(d/B + 1)), as in the paper's general-epsilon version). Value x
lives in block k = x // (b-1) as Hadamard row s = x % (b-1) + 1, and owns the
set C_x = {(k, j) : H_b[s, j] = +1} of b/2 outputs. The report is an output
y in [K] with P[y | x] = e^eps / Z on C_x and 1 / Z elsewhere,
Z = (b/2) e^eps + K - b/2: the ratio is exactly e^eps, and a report costs log2 K bits.
Decoding: D[k, s] = sum_j N[k, j] H_b[s, j] (one FWHT per block of the output
histogram N) has expectation c_x (b/2)(e^eps - 1)/Z and no contribution from
other values, so c_x = D * Z / ((b/2)(e^eps - 1)) is unbiased.

Its variance depends on the data, not only on c_x: every report that lands in
x's block adds +-1 to D, so Var = scale^2 E[N_k] - c_x, where N_k is the number
of reports in the block and E[N_k] = n b / Z + m_k (b/2)(e^eps - 1)/Z grows with
m_k, the people holding any value of the block (derivation at `variance`). The
closed form is exact given m_k; without it, `variance` is the bound at m_k = n;
`variance_from_counts` estimates it without bias from the reports themselves.

One-bit Hadamard mechanism. A person with x draws j uniform in [K]
(K = 2^ceil(log2 d)), and sends j with the bit H_K[x, j] kept with probability
e^eps/(e^eps + 1), flipped otherwise. With W[j] the sum of the signed bits
received at j, c_v = FWHT(W)[v] / (p - q) is unbiased and
Var = n / (p - q)^2 - c_v.
"""

from __future__ import annotations

import functools
import math
from abc import abstractmethod

import numpy as np

from dpsql.ldp.base import FrequencyOracle, IntegerReports, bits_for
from dpsql.ldp.unary import bernoulli_bools, keep_probability
from dpsql.mechanisms.samplers import ExactReal


def fwht(values: np.ndarray) -> np.ndarray:
    """Walsh-Hadamard transform (Sylvester order, unnormalised) along the last axis."""
    src = np.array(values, dtype=np.float64)
    rows, size = src.reshape(-1, src.shape[-1]).shape
    if size & (size - 1):
        raise ValueError("the transform length must be a power of two")
    dst = np.empty_like(src)
    half = 1
    while half < size:
        a = src.reshape(rows, -1, 2, half)
        b = dst.reshape(rows, -1, 2, half)
        np.add(a[:, :, 0], a[:, :, 1], out=b[:, :, 0])
        np.subtract(a[:, :, 0], a[:, :, 1], out=b[:, :, 1])
        src, dst = dst, src
        half *= 2
    return src


def _parity(x: np.ndarray) -> np.ndarray:
    return np.bitwise_count(x) & 1


def _lowest_bit(x: np.ndarray) -> np.ndarray:
    return x & -x


def _next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(n)))


class HadamardResponse(IntegerReports, FrequencyOracle):
    """Hadamard response: one output index of log2 K bits per person."""

    name = "hr"

    def __init__(self, epsilon: float, domain, blocks: int | None = None):
        super().__init__(epsilon, domain)
        e = math.exp(self.epsilon)
        if blocks is None:
            blocks = 1 << max(0, math.floor(math.log2(min(2 * self.d, e))))
        if blocks < 1 or blocks & (blocks - 1):
            raise ValueError("the number of blocks must be a power of two")
        self.blocks = blocks
        self.block_size = _next_pow2(self.d / blocks + 1)
        self.size = self.blocks * self.block_size
        half = self.block_size // 2
        self.norm = half * e + self.size - half
        self.p_own = half * e / self.norm  # P[y in C_x | x]
        self.scale = self.norm / (half * (e - 1))

    @functools.cached_property
    def _keep(self) -> ExactReal:
        """p_own = (b/2) e^eps / ((b/2) e^eps + size - b/2), randomised response over
        2 * blocks - 1 others, exactly: `rng.random() < p_own` rounded p_own up (to 1 at
        d = 2 and epsilon 40, where the report was then always the true value)."""
        return keep_probability(self.epsilon, 2 * self.blocks - 1)

    def _place(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        per_block = self.block_size - 1
        return idx // per_block, idx % per_block + 1

    def perturb_indices(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        n = idx.size
        b = self.block_size
        block, row = self._place(idx)
        own = bernoulli_bools(self._keep, n, rng)
        j = rng.integers(0, b, size=n)
        # Flipping a bit that row s has set toggles parity(s & j): a bijection
        # between C_x and the rest of the block, so j stays uniform on either side.
        want_odd = ~own
        j ^= np.where(_parity(row & j).astype(bool) != want_odd, _lowest_bit(row), 0)
        inside = block * b + j
        # Outside C_x: the b/2 odd-parity slots of x's block or any slot of another block.
        r = rng.integers(0, self.size - b // 2, size=n)
        elsewhere = r < (self.blocks - 1) * b
        other_block = r // b
        other_block += other_block >= block
        outside = np.where(elsewhere, other_block * b + r % b, inside)
        return np.where(own, inside, outside)

    @property
    def outputs(self) -> int:
        return self.size

    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        """Histogram of output indices (COUNT(*) GROUP BY report in SQL)."""
        return np.bincount(np.asarray(reports, dtype=np.int64), minlength=self.size)

    def estimate_from_counts(self, counts: np.ndarray, n: int) -> np.ndarray:
        spectrum = fwht(np.asarray(counts, dtype=np.float64).reshape(self.blocks, -1))
        block, row = self._place(np.arange(self.d))
        return spectrum[block, row] * self.scale

    def variance(
        self, n: int, count: float | np.ndarray = 0.0, block_count: float | np.ndarray | None = None
    ) -> float | np.ndarray:
        """Variance of one value's estimate: exact given `block_count`, the people (of n)
        holding any value of its block, its own `count` included. Without it, the
        largest variance any data with that count can give (everyone in the block), a
        data-free upper bound: the old default n / B understated skewed data by up to
        (e^eps + 1) / 2 and, where the values fill only some blocks, uniform data too.

        Why: D = sum_i Z_i over people, with Z_i = H_b[s, j_i] if person i's report
        lands in the block (j_i its slot there) and 0 otherwise; people are independent,
        so Var D = sum_i (E[Z_i^2] - E[Z_i]^2). Z_i^2 is 1 exactly when the report is in
        the block: sum_i E[Z_i^2] = E[N_k] = n b / Z + m_k (b/2)(e^eps - 1) / Z (b slots
        at 1/Z each for everyone, b/2 of them e^eps/Z for the block's own people).
        E[Z_i] is (b/2)(e^eps - 1)/Z = 1/scale for the value's own people and 0 for
        everyone else (other rows of H_b are orthogonal to row s, other blocks add 0).
        Times scale^2: Var = scale^2 n b / Z + scale m_k - count.
        """
        if block_count is None:
            block_count = self._largest_block_mass(n, count)
        return self.scale**2 * self._expected_block_reports(n, block_count) - count

    def _expected_block_reports(
        self, n: int, block_count: float | np.ndarray
    ) -> float | np.ndarray:
        """E[N_k]: how many of n reports land in a block whose values m_k people hold."""
        # Everyone hits the block's b slots at 1/Z each; the block's own people hit
        # their b/2 slots at e^eps/Z instead, (b/2)(e^eps - 1)/Z = 1/scale more.
        return n * self.block_size / self.norm + block_count / self.scale

    def _largest_block_mass(self, n: int, count: float | np.ndarray) -> float | np.ndarray:
        """The most people a value's block can hold: n, unless a block holds one value
        (b = 2), where it holds that value's count and no one else."""
        return count if self.block_size == 2 else n

    def uniform_variance(self, n: int) -> float:
        """Exact at n / d people per value: the fullest block holds min(b - 1, d) values
        (n / B, the old figure, is less wherever the values fill only some blocks)."""
        fullest = min(self.block_size - 1, self.d) * n / self.d
        return float(self.variance(n, n / self.d, fullest))

    def variance_from_counts(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Per value, an unbiased estimate of its variance from the reports' histogram
        `counts`: scale^2 N_k - c_x, with N_k the reports counted in the value's block
        and c_x the value's estimate. Unbiased because E[N_k] is exactly the variance's
        data-dependent part (see `variance`) and c_x is unbiased; never negative, since
        |c_x| = scale |D| <= scale N_k <= scale^2 N_k. Chosen over the data-free bound
        (up to (e^eps + 1) / 2 times too wide) because the block's mass is in the
        reports for free: this is post-processing, it spends no budget. Its relative
        error is that of a count of reports, about 1 / sqrt(N_k)."""
        in_block = self._block_reports(counts)
        return self.scale**2 * in_block - self.estimate_from_counts(counts, n)

    def _block_reports(self, counts: np.ndarray) -> np.ndarray:
        """Per value, N_k: the reports in `counts` that landed in the value's block."""
        per_block = np.asarray(counts, dtype=np.float64).reshape(self.blocks, -1).sum(axis=1)
        return per_block[self._place(np.arange(self.d))[0]]

    def correlated_cells(self, counts: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Per value, its block and what a weighted sum over two or more of the block's
        values may add per unit of squared weight beyond their own variances (an
        estimate, from the reports' histogram `counts`, of scale * m_k).

        Why: for rows s != s' of one block, a report's Z^s Z^s' = H_b[s xor s', j], whose
        mean is 1/scale for the people at row s xor s' and 0 for everyone else, while
        E[Z^s] E[Z^s'] = 0 (no one holds both). So Cov = scale c_{s xor s'} >= 0: values
        that share a block are positively correlated (a sum over the three values of a
        block of four had 1.5 times their summed variances). The matrix c_{s xor s'} is
        a dyadic convolution: H_b diagonalises it, with eigenvalues FWHT(c)_j, all within
        [-m_k, m_k]. So w' Cov w <= scale m_k |w|^2 for any weights; estimates in other
        blocks are uncorrelated (a report lands in one block). scale m_k is estimated
        without bias as scale^2 (N_k - n b / Z) (see `variance`), clipped at 0."""
        shared = self.scale**2 * (self._block_reports(counts) - n * self.block_size / self.norm)
        return self._place(np.arange(self.d))[0], np.maximum(shared, 0.0)

    @property
    def message_bits(self) -> int:
        return bits_for(self.size)

    def server_cost(self, n: int) -> float:
        return float(n + self.size * math.log2(self.block_size))

    def channel(self) -> np.ndarray:
        e = math.exp(self.epsilon)
        block, row = self._place(np.arange(self.d))
        y = np.arange(self.size)
        same_block = (y[None, :] // self.block_size) == block[:, None]
        plus = _parity(row[:, None] & (y[None, :] % self.block_size)) == 0
        return np.where(same_block & plus, e, 1.0) / self.norm


class OneBitProjection(IntegerReports, FrequencyOracle):
    """A report of (a uniform row j, one randomised sign of row j's entry for the value).

    The sign is kept with probability `keep` = e^eps / (e^eps + 1); j does not depend
    on the value, so a report is eps-LDP. Reports are codes 2 j + bit (bit 1: a +
    sign), counted with a plain GROUP BY. Subclasses give the sign matrix (`_plus`)
    and how to decode the counts.
    """

    size: int  # number of rows j
    keep: float  # e^eps / (e^eps + 1), for the estimates; drawn exactly (_keep)

    @abstractmethod
    def _plus(self, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Whether entry (row, value) of the sign matrix is +, elementwise (broadcasting)."""

    def perturb_indices(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        j = rng.integers(0, self.size, size=idx.size)
        sign = self._plus(idx, j) == bernoulli_bools(self._keep, idx.size, rng)
        return 2 * j + sign

    @functools.cached_property
    def _keep(self) -> ExactReal:
        return keep_probability(self.epsilon, 1)

    @property
    def outputs(self) -> int:
        return 2 * self.size

    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        """Histogram of report codes 2 j + bit (COUNT(*) GROUP BY report in SQL)."""
        return np.bincount(np.asarray(reports, dtype=np.int64), minlength=2 * self.size)

    @property
    def message_bits(self) -> int:
        return bits_for(self.size) + 1

    def channel(self) -> np.ndarray:
        plus = self._plus(np.arange(self.d)[:, None], np.arange(self.size)[None, :])
        out = np.empty((self.d, self.size, 2))
        out[:, :, 1] = np.where(plus, self.keep, 1 - self.keep)
        out[:, :, 0] = 1 - out[:, :, 1]
        return out.reshape(self.d, -1) / self.size


class HadamardMechanism(OneBitProjection):
    """One-bit Hadamard mechanism: (column index, one randomised sign bit) per person."""

    name = "hm"

    def __init__(self, epsilon: float, domain):
        super().__init__(epsilon, domain)
        e = math.exp(self.epsilon)
        self.size = max(2, _next_pow2(self.d))
        self.keep = e / (e + 1)
        self.gap = (e - 1) / (e + 1)  # p - q

    def _plus(self, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return _parity(values & rows) == 0  # the Hadamard matrix's sign

    def estimate_from_counts(self, counts: np.ndarray, n: int) -> np.ndarray:
        counts = np.asarray(counts, dtype=np.float64).reshape(self.size, 2)
        signed = counts[:, 1] - counts[:, 0]
        return fwht(signed)[: self.d] / self.gap

    def variance(self, n: int, count: float = 0.0) -> float:
        return n / self.gap**2 - count

    def server_cost(self, n: int) -> float:
        return float(n + self.size * math.log2(self.size))
