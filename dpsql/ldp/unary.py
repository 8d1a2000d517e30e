"""Unary encodings: one bit per domain value, each flipped independently.

The true value's bit is 1 with probability p, every other bit with
probability q; the report is epsilon-LDP with epsilon = ln(p(1-q) / (q(1-p))).
Symmetric unary encoding (basic one-time RAPPOR) uses p = e^(eps/2) / (e^(eps/2) + 1),
q = 1 - p; optimised unary encoding (OUE) uses p = 1/2, q = 1/(e^eps + 1).
Both are this one class with different (p, q). Reports are bit-packed rows
(little-endian bit order), d bits per person.

Every bit is an exact Bernoulli draw: a uniform real U, whose binary digits
are bits of AES-CTR output, is compared with the exact binary expansion of
the probability (`dpsql.mechanisms.samplers.ExactReal`), so P[bit = 1] is the
probability itself, not its nearest double. The comparison is bit-sliced: 64
bits of a report are compared at once with word-wide AND/OR, and the result
is already the packed report. This is hand-written because numpy has no
exact Bernoulli; it is what makes a million OUE reports a second possible.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from dpsql.ldp.base import PureProtocol
from dpsql.mechanisms.samplers import ExactReal

# Words per pass: the three word buffers of a pass stay in L2 cache.
_CHUNK_WORDS = 1 << 14
# Digits compared over every word before the words with undecided bits are gathered:
# after 8 digits a bit is undecided with probability 2^-8, a 64-bit word with ~0.22.
_FULL_DIGITS = 8
_ALL_ONES = np.uint64((1 << 64) - 1)
# Digits computed at once; a lane needs more with probability 2^-256.
_EXPANSION_BITS = 256


def exact_probability(prob: float | Fraction | ExactReal) -> ExactReal:
    """`prob` as an ExactReal; a float is taken as the dyadic rational it stores."""
    if isinstance(prob, ExactReal):
        return prob
    value = Fraction(prob)
    if not 0 <= value <= 1:
        raise ValueError(f"a probability must be in [0, 1], got {prob}")
    return ExactReal.rational(value)


def _digit(prob: ExactReal, digit: int) -> int:
    """Binary digit `digit` (1 = the halves) of prob, read from one cached expansion."""
    if digit <= _EXPANSION_BITS:
        return (prob.floor_scaled(_EXPANSION_BITS) >> (_EXPANSION_BITS - digit)) & 1
    return prob.floor_scaled(digit) & 1


def _compare_digits(
    prob: ExactReal,
    digits: range,
    tied: np.ndarray,
    below: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """Compare digits `digits` of every still-tied lane of U with prob's; return the lanes
    still tied (`below` is updated in place).

    A lane stays tied while U's digits equal prob's; at the first difference
    U < prob exactly when prob's digit is 1 (and U's is 0). Over a run of equal
    digits of prob, a lane stays tied only if all its digits equal the run's, so
    one run costs one combining pass per random word plus two or three passes.
    """
    for run, same in itertools.groupby(digits, key=lambda i: _digit(prob, i)):
        # One word per digit, combined in place: equal-size buffers are recycled by the
        # allocator, while one large (digits, words) array would be faulted in afresh.
        acc = rng.bit_generator.random_raw(tied.size)
        combine = np.bitwise_and if run else np.bitwise_or
        for _ in range(len(list(same)) - 1):
            combine(acc, rng.bit_generator.random_raw(tied.size), out=acc)
        if run:  # acc: U's digits all 1, still tied; a 0 in U where prob has 1 means U < prob
            np.bitwise_and(tied, acc, out=acc)
            np.bitwise_xor(tied, acc, out=tied)
            np.bitwise_or(below, tied, out=below)
        else:  # acc: some 1 in U where prob has 0, so U > prob
            np.bitwise_and(tied, np.invert(acc, out=acc), out=acc)
        tied = acc
    return tied


def bernoulli_words(prob: ExactReal, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` uint64 words whose 64 * count bits are independent exact Bernoulli(prob)."""
    if prob.floor_scaled(0) >= 1:
        return np.full(count, _ALL_ONES)
    below = np.zeros(count, dtype=np.uint64)
    tied = np.empty(count, dtype=np.uint64)
    first = range(1, _FULL_DIGITS + 1)
    for start in range(0, count, _CHUNK_WORDS):
        part = slice(start, start + _CHUNK_WORDS)
        fresh = np.full(below[part].size, _ALL_ONES)
        tied[part] = _compare_digits(prob, first, fresh, below[part], rng)
    # The few words with an undecided lane read further digits, a few at a time; ties
    # halve each digit, so this ends after about log2(count) digits (with probability 1).
    where = np.flatnonzero(tied)
    tied, part_below = tied[where], np.zeros(where.size, dtype=np.uint64)
    digit = _FULL_DIGITS
    while where.size:
        tied = _compare_digits(prob, range(digit + 1, digit + 5), tied, part_below, rng)
        digit += 4
        done = tied == 0
        below[where[done]] |= part_below[done]
        live = ~done
        where, tied, part_below = where[live], tied[live], part_below[live]
    return below


def _little_bytes(words: np.ndarray) -> np.ndarray:
    """The bytes of uint64 words in little-endian order (bit j of a word is bit j % 8 of
    byte j // 8, numpy's bitorder="little")."""
    return words.astype("<u8", copy=False).view(np.uint8)


def bernoulli_bools(prob: ExactReal, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` exact Bernoulli(prob) draws as booleans."""
    words = bernoulli_words(prob, -(-count // 64), rng)
    return np.unpackbits(_little_bytes(words), count=count, bitorder="little").astype(bool)


def _packed_rows(prob: ExactReal, rows: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, ceil(d / 8)) packed rows of independent Bernoulli(prob) bits (padding bits 0)."""
    per_row = -(-d // 64)
    words = bernoulli_words(prob, rows * per_row, rng).reshape(rows, per_row)
    out = _little_bytes(words).reshape(rows, 8 * per_row)[:, : (d + 7) // 8]
    if d % 8:
        out[:, -1] &= (1 << (d % 8)) - 1
    return out


def keep_probability(epsilon: float, others: int) -> ExactReal:
    """e^eps / (e^eps + others) = 1 / (1 + others e^-eps), exactly: the probability that
    randomised response over `others` + 1 values keeps the true one. Drawn with
    bernoulli_bools, its ratio to each other value's is exactly e^eps; a float test
    `rng.random() < p` keeps with p rounded up to 2^-53, above e^eps by up to 3e-11."""
    return 1 / (1 + others * ExactReal.exp_neg(Fraction(epsilon)))


def odds_probability(x: Fraction) -> ExactReal:
    """e^-x / (1 + e^-x) = 1 / (e^x + 1), exactly, for x >= 0."""
    tail = ExactReal.exp_neg(x)
    return tail / (1 + tail)


def _as_float(x: ExactReal) -> float:
    return x.floor_scaled(64) / 2.0**64


def rows_per_chunk(d: int) -> int:
    # Rows of about 2^17 words: enough to amortise the tie stage's fixed cost.
    return max(1, 64 * _CHUNK_WORDS // ((d + 7) // 8))


def randomize_onehot(
    idx: np.ndarray, d: int, p: ExactReal, q: ExactReal, rng: np.random.Generator
) -> np.ndarray:
    """Packed rows: bit idx[i] is 1 with probability p, every other bit with probability q."""
    idx = np.asarray(idx, dtype=np.int64)
    out = np.empty((idx.size, (d + 7) // 8), dtype=np.uint8)
    step = rows_per_chunk(d)
    for start in range(0, idx.size, step):
        part = idx[start : start + step]
        rows = _packed_rows(q, part.size, d, rng)
        at = (np.arange(part.size), part >> 3)
        mask = (1 << (part & 7)).astype(np.uint8)
        keep = bernoulli_bools(p, part.size, rng)
        rows[at] = (rows[at] & ~mask) | np.where(keep, mask, 0).astype(np.uint8)
        out[start : start + part.size] = rows
    return out


def randomize_packed(
    packed: np.ndarray, d: int, p_one: ExactReal, p_zero: ExactReal, rng: np.random.Generator
) -> np.ndarray:
    """Packed rows: each set bit stays 1 with probability p_one, each clear bit becomes 1
    with probability p_zero."""
    packed = np.asarray(packed, dtype=np.uint8)
    out = np.empty_like(packed)
    step = rows_per_chunk(d)
    for start in range(0, len(packed), step):
        bits = packed[start : start + step]
        ones = _packed_rows(p_one, len(bits), d, rng)
        zeros = _packed_rows(p_zero, len(bits), d, rng)
        out[start : start + len(bits)] = (bits & ones) | (~bits & zeros)
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
        if kind == "oue":
            # q = 1 / (e^eps + 1) = e^-eps / (1 + e^-eps), so that (1 - q) / q = e^eps exactly.
            p = exact_probability(0.5)
            q = odds_probability(Fraction(self.epsilon))
        elif kind == "sue":
            q = odds_probability(Fraction(self.epsilon) / 2)
            p = 1 - q
        else:
            raise ValueError(f"unknown unary encoding {kind!r}")
        self.name = kind
        self.set_probabilities(p, q)

    def set_probabilities(self, p: ExactReal, q: ExactReal) -> None:
        """Bit probabilities: exact ones for sampling, doubles for the estimator."""
        self.p_exact, self.q_exact = p, q
        self.p_star, self.q_star = _as_float(p), _as_float(q)

    @property
    def row_bytes(self) -> int:
        return (self.d + 7) // 8

    def perturb_indices(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return randomize_onehot(idx, self.d, self.p_exact, self.q_exact, rng)

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
        if any(len(field) != 2 * self.row_bytes for field in fields):
            # joined, two fields of the wrong lengths read as reports, and shifted the rest
            raise ValueError(f"a report is not {2 * self.row_bytes} hexadecimal digits")
        raw = np.frombuffer(bytes.fromhex("".join(fields)), dtype=np.uint8)
        return raw.reshape(len(fields), self.row_bytes)

    def valid_reports(self, reports: np.ndarray) -> np.ndarray:
        """No bit set beyond the d values (the randomiser leaves them 0)."""
        reports = np.asarray(reports, dtype=np.uint8).reshape(-1, self.row_bytes)
        spare = 8 * self.row_bytes - self.d
        if not spare or not len(reports):
            return np.ones(len(reports), dtype=bool)
        return (reports[:, -1] >> (8 - spare)) == 0
