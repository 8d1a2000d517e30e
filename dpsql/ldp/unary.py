"""Unary encodings: one bit per domain value, each flipped independently.

The true value's bit is 1 with probability p, every other bit with
probability q; the report is epsilon-LDP with epsilon = ln(p(1-q) / (q(1-p))).
Symmetric unary encoding (basic one-time RAPPOR) uses p = e^(eps/2) / (e^(eps/2) + 1),
q = 1 - p; optimised unary encoding (OUE) uses p = 1/2, q = 1/(e^eps + 1).
Both are this one class with different (p, q). Reports are bit-packed rows
(little-endian bit order), d bits per person.

The Bernoulli bits are drawn from single random bytes compared with the
first byte of the probability, falling back to a full double only on a tie
(1 draw in 256): exact to double precision and about 8x cheaper than one
double per bit, which is what makes a million reports a second possible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dpsql.ldp.base import PureProtocol

# Rows per chunk: a few MB of bytes, so buffers are recycled instead of being
# faulted in fresh (page faults cost more than the arithmetic here).
_CHUNK_BYTES = 1 << 22


def bernoulli_bits(rng: np.random.Generator, shape: tuple[int, int], prob: float) -> np.ndarray:
    """A boolean array of independent Bernoulli(prob) draws."""
    size = shape[0] * shape[1]
    raw = rng.bit_generator.random_raw((size + 7) // 8).view(np.uint8)[:size]
    scaled = prob * 256.0  # exact: a power-of-two scaling
    head = int(scaled)
    bits = raw < head
    ties = np.flatnonzero(raw == head)
    if ties.size:
        bits[ties] = rng.random(ties.size) < scaled - head
    return bits.reshape(shape)


def rows_per_chunk(d: int) -> int:
    return max(1, _CHUNK_BYTES // d)


def randomize_onehot(
    idx: np.ndarray, d: int, p: float, q: float, rng: np.random.Generator
) -> np.ndarray:
    """Packed rows: bit idx[i] is 1 with probability p, every other bit with probability q."""
    idx = np.asarray(idx, dtype=np.int64)
    out = np.empty((idx.size, (d + 7) // 8), dtype=np.uint8)
    step = rows_per_chunk(d)
    for start in range(0, idx.size, step):
        part = idx[start : start + step]
        bits = bernoulli_bits(rng, (part.size, d), q)
        bits[np.arange(part.size), part] = rng.random(part.size) < p
        out[start : start + part.size] = np.packbits(bits, axis=1, bitorder="little")
    return out


def randomize_packed(
    packed: np.ndarray, d: int, p_one: float, p_zero: float, rng: np.random.Generator
) -> np.ndarray:
    """Packed rows: each set bit stays 1 with probability p_one, each clear bit becomes 1
    with probability p_zero."""
    packed = np.asarray(packed, dtype=np.uint8)
    out = np.empty_like(packed)
    step = rows_per_chunk(d)
    for start in range(0, len(packed), step):
        bits = np.unpackbits(packed[start : start + step], axis=1, count=d, bitorder="little")
        shape = bits.shape
        fresh = np.where(
            bits == 1, bernoulli_bits(rng, shape, p_one), bernoulli_bits(rng, shape, p_zero)
        )
        out[start : start + shape[0]] = np.packbits(fresh, axis=1, bitorder="little")
    return out


def unary_channel(d: int, p: float, q: float) -> np.ndarray:
    """P[bit pattern | x] for all 2^d patterns; pattern k has bit j = (k >> j) & 1."""
    patterns = (np.arange(2**d)[:, None] >> np.arange(d)[None, :]) & 1
    out = np.empty((d, 2**d))
    for x in range(d):
        prob = np.full(d, q)
        prob[x] = p
        out[x] = np.prod(np.where(patterns == 1, prob, 1 - prob), axis=1)
    return out


class UnaryEncoding(PureProtocol):
    """Unary encoding with bit probabilities (p, q); `kind` is "oue" or "sue"."""

    def __init__(self, epsilon: float, domain, kind: str = "oue", **options):
        super().__init__(epsilon, domain)
        if options:
            raise TypeError(f"unexpected options for unary encoding: {sorted(options)}")
        e = math.exp(self.epsilon)
        if kind == "oue":
            p, q = 0.5, 1.0 / (e + 1.0)
        elif kind == "sue":
            half = math.exp(self.epsilon / 2)
            p = half / (half + 1.0)
            q = 1.0 - p
        else:
            raise ValueError(f"unknown unary encoding {kind!r}")
        self.name = kind
        self.p_star, self.q_star = p, q

    @property
    def row_bytes(self) -> int:
        return (self.d + 7) // 8

    def perturb_indices(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return randomize_onehot(idx, self.d, self.p_star, self.q_star, rng)

    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        """Number of reports with bit v set, for every v (a per-bit SUM in SQL)."""
        reports = np.asarray(reports, dtype=np.uint8)
        counts = np.zeros(self.d, dtype=np.int64)
        step = rows_per_chunk(self.d)
        for start in range(0, len(reports), step):
            bits = np.unpackbits(
                reports[start : start + step], axis=1, count=self.d, bitorder="little"
            )
            counts += bits.sum(axis=0, dtype=np.int64)
        return counts

    def simulate_counts(self, true_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Draw `aggregate`'s output straight from its exact distribution.

        Bits are independent across people and positions, so the count of set
        bits at v is Binomial(c_v, p) + Binomial(n - c_v, q), independently
        over v. Experiments use this sparse-aware shortcut on domains where the
        n * d bits cannot be materialised; it is not a deployable protocol
        (the reports themselves would still be d bits each).
        """
        c = np.asarray(true_counts, dtype=np.int64)
        n = int(c.sum())
        return rng.binomial(c, self.p_star) + rng.binomial(n - c, self.q_star)

    @property
    def message_bits(self) -> int:
        return self.d

    def server_cost(self, n: int) -> float:
        return float(n) * self.d

    def channel(self) -> np.ndarray:
        return unary_channel(self.d, self.p_star, self.q_star)

    def output_index(self, reports: np.ndarray) -> np.ndarray:
        bits = np.unpackbits(
            np.asarray(reports, np.uint8), axis=1, count=self.d, bitorder="little"
        ).astype(np.int64)
        return bits @ (1 << np.arange(self.d, dtype=np.int64))

    def format_reports(self, reports: np.ndarray) -> list[str]:
        return [row.tobytes().hex() for row in np.asarray(reports, np.uint8)]

    def parse_reports(self, fields: Sequence[str]) -> np.ndarray:
        if not len(fields):
            return np.zeros((0, self.row_bytes), np.uint8)
        raw = np.frombuffer(bytes.fromhex("".join(fields)), dtype=np.uint8)
        return raw.reshape(len(fields), self.row_bytes)
