"""Optimised local hashing (OLH): hash the value into g buckets, randomise the bucket.

Each person draws their own hash h(x) = ((a x + b) mod P) mod g from the
universal family over the prime field Z_P (P = smallest prime >= d), names it
by a seed encoding (a, b), and applies randomised response over [g] to h(x)
with p = e^eps / (e^eps + g - 1). Given the hash, the ratio is exactly e^eps;
the hash does not depend on x. g = round(e^eps) + 1 (Wang et al.'s optimum).

Why a field of size about d: the family is exactly pairwise independent on
Z_P, so two distinct values collide with the same known probability
(sum_r c_r (c_r - 1) / (P (P - 1)), c_r = #{t < P : t = r mod g}), which makes
q* exact and the estimator exactly unbiased. It also lets the server list the
values a report supports, {a^-1 (t - b) mod P : t = y mod g}, instead of
hashing all d values for every report: O(n d / g) work rather than O(n d).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dpsql.ldp.base import PureProtocol, bits_for, split_fields
from dpsql.ldp.unary import bernoulli_bools, keep_probability

_CHUNK_ELEMENTS = 1 << 22


def next_prime(n: int) -> int:
    """The smallest prime >= n (n is at most a few hundred million here)."""
    candidate = max(2, n)
    while True:
        if candidate < 4 or all(candidate % k for k in range(2, math.isqrt(candidate) + 1)):
            return candidate
        candidate += 1


def _mod_inverse(a: np.ndarray, prime: int) -> np.ndarray:
    """a^(P-2) mod P elementwise (Fermat); products stay below P^2 < 2^63."""
    result = np.ones_like(a)
    base = a % prime
    exponent = prime - 2
    while exponent:
        if exponent & 1:
            result = result * base % prime
        base = base * base % prime
        exponent >>= 1
    return result


class LocalHashing(PureProtocol):
    """OLH with a seeded universal hash family; reports are (seed, bucket) pairs."""

    name = "olh"

    def __init__(self, epsilon: float, domain, g: int | None = None):
        super().__init__(epsilon, domain)
        e = math.exp(self.epsilon)
        self.g = int(g) if g is not None else round(e) + 1
        if self.g < 2:
            raise ValueError("OLH needs g >= 2 buckets")
        self.prime = next_prime(self.d)
        if self.prime >= 3_037_000_000:  # keep a * x below 2^63
            raise ValueError("domain too large for OLH's field arithmetic")
        self.p_star = e / (e + self.g - 1)
        self._keep = keep_probability(self.epsilon, self.g - 1)  # p_star, exactly
        q = 1.0 / (e + self.g - 1)
        sizes = np.array(
            [(self.prime - 1 - r) // self.g + 1 for r in range(min(self.g, self.prime))],
            dtype=np.float64,
        )
        collide = float(np.sum(sizes * (sizes - 1))) / (self.prime * (self.prime - 1))
        self.q_star = q + (self.p_star - q) * collide
        self._q = q

    def _hash(self, seeds: np.ndarray, x: np.ndarray) -> np.ndarray:
        a = seeds // self.prime + 1
        b = seeds % self.prime
        return (a * x + b) % self.prime % self.g

    def perturb_indices(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        n = idx.size
        seeds = rng.integers(0, (self.prime - 1) * self.prime, size=n, dtype=np.int64)
        bucket = self._hash(seeds, idx)
        keep = bernoulli_bools(self._keep, n, rng)
        other = rng.integers(0, self.g - 1, size=n)
        other += other >= bucket
        return np.stack([seeds, np.where(keep, bucket, other)], axis=1)

    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        """Support counts: for each v, how many reports (seed, y) have h_seed(v) = y."""
        reports = np.asarray(reports, dtype=np.int64).reshape(-1, 2)
        seeds, y = reports.T
        prime, g = self.prime, self.g
        a_inv = _mod_inverse(seeds // prime + 1, prime)
        # The values a report supports, a^-1 (y + k g - b) mod P for y + k g < P, form an
        # arithmetic progression mod P: first + k * stride, k < length.
        first = a_inv * ((y - seeds % prime) % prime) % prime
        stride = a_inv * g % prime
        length = (prime - 1 - y) // g + 1
        if (prime - 1) * prime * math.log2(prime) < len(reports) * prime / g:
            totals = self._count_by_convolution(first, seeds // prime, length)
        else:
            totals = self._count_directly(first, stride, length)
        return totals[: self.d]

    def _count_directly(self, first, stride, length) -> np.ndarray:
        """O(n P / g): list every supported value of every report."""
        prime = self.prime
        steps = np.arange(length.max(initial=1), dtype=np.int64)
        totals = np.zeros(prime, dtype=np.int64)
        chunk = max(1, _CHUNK_ELEMENTS // steps.size)
        for i in range(0, first.size, chunk):
            v = (first[i : i + chunk, None] + steps[None, :] * stride[i : i + chunk, None]) % prime
            inside = steps[None, :] < length[i : i + chunk, None]
            totals += np.bincount(v[inside], minlength=prime)
        return totals

    def _count_by_convolution(self, first, a_index, length) -> np.ndarray:
        """O(n + P^2 log P): reports sharing a and a progression length support shifted
        copies of one set, so per (a, length) the counts are a cyclic convolution of the
        histogram of `first` with that set's indicator. Wins when P is small (county level)."""
        prime, g = self.prime, self.g
        lengths = np.unique(length)
        cls = np.searchsorted(lengths, length)
        rows = (prime - 1) * lengths.size
        hist = np.bincount(
            (a_index * lengths.size + cls) * prime + first, minlength=rows * prime
        ).reshape(rows, prime)
        a = np.repeat(np.arange(1, prime, dtype=np.int64), lengths.size)
        stride = _mod_inverse(a, prime) * g % prime
        row_len = np.tile(lengths, prime - 1)
        pattern = np.zeros((rows, prime))
        steps = np.arange(lengths.max(), dtype=np.int64)
        members = steps[None, :] * stride[:, None] % prime
        inside = steps[None, :] < row_len[:, None]
        pattern[np.nonzero(inside)[0], members[inside]] = 1.0
        spectrum = (np.fft.rfft(hist, axis=1) * np.fft.rfft(pattern, axis=1)).sum(axis=0)
        return np.rint(np.fft.irfft(spectrum, n=prime)).astype(np.int64)

    @property
    def message_bits(self) -> int:
        return bits_for(self.prime * (self.prime - 1)) + bits_for(self.g)

    def server_cost(self, n: int) -> float:
        return float(n) * math.ceil(self.prime / self.g) + self.d

    def channel(self) -> np.ndarray:
        seeds = np.arange((self.prime - 1) * self.prime, dtype=np.int64)
        out = np.empty((self.d, seeds.size * self.g))
        for x in range(self.d):
            h = self._hash(seeds, np.int64(x))
            block = np.full((seeds.size, self.g), self._q)
            block[np.arange(seeds.size), h] = self.p_star
            out[x] = block.reshape(-1) / seeds.size
        return out

    def output_index(self, reports: np.ndarray) -> np.ndarray:
        reports = np.asarray(reports, dtype=np.int64)
        return reports[:, 0] * self.g + reports[:, 1]

    def format_reports(self, reports: np.ndarray) -> list[str]:
        return [f"{s}:{y}" for s, y in np.asarray(reports, dtype=np.int64).tolist()]

    def parse_reports(self, fields: Sequence[str]) -> np.ndarray:
        return np.asarray(split_fields(fields, ":", 2), dtype=np.int64).reshape(-1, 2)

    def valid_reports(self, reports: np.ndarray) -> np.ndarray:
        """A seed its randomiser draws (a seed beyond them made a = 0: a report supporting
        one value P / g times over) and a bucket below g (a negative one made counting
        allocate without bound)."""
        seeds, y = np.asarray(reports, dtype=np.int64).reshape(-1, 2).T
        return (seeds >= 0) & (seeds < (self.prime - 1) * self.prime) & (y >= 0) & (y < self.g)
