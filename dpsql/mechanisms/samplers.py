"""Turn cryptographic random words into exactly distributed integers: this module's one job.

Nothing here decides an outcome with floating point. Every decision compares a
uniform random word with a threshold that is the exact binary expansion of an
irrational probability, computed with rigorous interval bounds (stdlib
`decimal` for exp, Python integers for the rest). When the word equals the
threshold, further words are drawn and compared with the next bits of the
expansion, so every outcome has exactly its mathematical probability.

Discrete Laplace (two-sided geometric) noise is drawn by inverse-CDF lookup on
tables of such thresholds: |Z| = 1 + G with G geometric, and G is split into
independent base-L digits (G mod L is a truncated geometric, G div L is
geometric with parameter a^L), so that each table stays a few thousand entries
whatever the scale. Every sample costs the same fixed sequence of numpy
operations and the same number of random words (1 when scale <= 128, 2 up to
2^20, then one more per further factor of 8192); only ties with a threshold
and the far tail (together below 2^-48 per sample, see
`slow_path_probability`) take an exact Python slow path. Values are never
drawn one at a time in Python integers, even a single one: CPython's integer
arithmetic takes time that depends on the numbers (small ones are cached, large
ones take more digits and allocations), which measurably leaked the noise value
through a call's time. Table lookups still touch memory at value-dependent
addresses, so cache state can shift a single call's time by ~0.2 us (see
benchmarks/bench_samplers.py); single values are therefore served from a pool
drawn ahead (pool.py), which also spreads the fixed cost of the numpy
operations (8-20 us on 2 cores whatever the size up to a few hundred values:
20-40 operations at 0.3-0.5 us each, so each one left out counts).
"""

from __future__ import annotations

import abc
import functools
import itertools
import math
import os
import secrets
import weakref
from collections.abc import Callable
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext
from fractions import Fraction

import numpy as np
from randomgen import AESCounter

from dpsql.errors import InternalError
from dpsql.mechanisms.pool import NoisePool, PoolableGenerator

_MAX64 = (1 << 64) - 1
_MASK64 = _MAX64
_HALF = 1 << 63  # outcome words are 63-bit uniforms in [0, 2^63)
_PAD = np.uint64(_HALF)  # an empty bucket's threshold: above every 63-bit word, never tied


def constant(value: int | float, dtype: type[np.generic]) -> np.ndarray:
    """`value` as a read-only 0-d array, for an operand of the samplers' array arithmetic.

    numpy 2 converts a Python or numpy scalar operand on every ufunc call, which
    costs ~0.2 us more than a 0-d array of the other operand's dtype; a small
    draw runs 20-50 such operations, so this is a fifth of its fixed cost. The
    result's dtype is the same as with the scalar.
    """
    array = np.array(value, dtype=dtype)
    array.flags.writeable = False
    return array


_ONE = constant(1, np.uint64)
_ZERO = constant(0, np.uint64)
_LOW53 = constant((1 << 53) - 1, np.uint64)
_SHIFT32 = constant(32, np.uint64)
_LOW32 = constant((1 << 32) - 1, np.uint64)
_CLEAR11 = constant(_MAX64 ^ 2047, np.uint64)
_SIGN_SHIFT = constant(63, np.int64)
_SIGNS = np.array([1, -1], dtype=np.int64)  # indexed by a word's low bit
_SIGNS.flags.writeable = False
CHUNK = 1 << 14  # elements per pass: the temporaries of one pass stay in L2 cache
_TABLE_PRECISION = 128  # first try for table bounds; doubled when a floor is ambiguous
_MAX_PRECISION = 1 << 16  # bits; only an exactly dyadic value could need more
_TOP_SCALE = 128  # scale of the geometric read by the last table
_MAX_DIGIT = 8192  # outcomes per digit: 2 words cover scales up to 128 * 8192 = 2^20
_MAX_SCALE = Fraction(1 << 48)  # keeps every sample and intermediate far inside int64


def secure_generator(seed: int | None = None) -> np.random.Generator:
    """A numpy Generator over a cryptographic stream keyed by the OS, or a seeded one for tests.

    seed=None: AES-128 in counter mode keyed with 128 bits from `secrets`.
    randomgen's AESCounter is a standard CSPRNG construction that runs on AES-NI
    and plugs into numpy as a BitGenerator, so vectorised draws read it at
    hundreds of millions of words per second; a hand-written AES-CTR would be
    slower and would need its own review. An int seed gives PCG64, which is not
    cryptographic and exists only so tests are reproducible. Either way the
    samplers keep a pool of values drawn ahead for it (pool.py).
    """
    if seed is None:
        rng = PoolableGenerator(AESCounter(key=secrets.randbits(128)))
        _OS_KEYED.add(rng)
        return rng
    return PoolableGenerator(np.random.PCG64(seed))


_OS_KEYED: weakref.WeakSet[PoolableGenerator] = weakref.WeakSet()


def _rekey_after_fork() -> None:
    """A forked child gets copies of its parent's generators, key and counter: both would
    add the same noise to different queries, and the difference of two releases would be
    exact. The child's OS-keyed generators take fresh keys (seeded ones stay reproducible)."""
    for rng in list(_OS_KEYED):
        rng.bit_generator.seed(key=secrets.randbits(128))


os.register_at_fork(after_in_child=_rekey_after_fork)


def _draw_words(rng: np.random.Generator, shape: int | tuple[int, ...]) -> np.ndarray:
    """Uniform 64-bit words straight from the bit generator (a tenth of the call overhead
    of Generator.integers, which matters for single-value queries)."""
    return rng.bit_generator.random_raw(shape)


def signed(magnitude: np.ndarray, words: np.ndarray) -> np.ndarray:
    """`magnitude` negated where the word's low bit is set (a fair sign when the rest of the
    word was used for something else)."""
    return _SIGNS.take(words & _ONE) * magnitude


def _ceil_shift(value: int, bits: int) -> int:
    return -((-value) >> bits)


def _ceil_div(numerator: int, denominator: int) -> int:
    return -((-numerator) // denominator)


class ExactReal:
    """A real number known through rigorous bounds at any binary precision.

    `bounds(n)` returns integers (lo, hi) with lo <= x * 2^n <= hi; the width
    must shrink as n grows. Arithmetic builds new bounds by directed rounding,
    so the bounds of a formula stay rigorous.
    """

    __slots__ = ("_bounds", "_floors")

    def __init__(self, bounds: Callable[[int], tuple[int, int]]) -> None:
        self._bounds = bounds
        self._floors: dict[int, int] = {}

    def bounds(self, precision: int) -> tuple[int, int]:
        return self._bounds(precision)

    @classmethod
    def rational(cls, value: int | Fraction) -> ExactReal:
        exact = Fraction(value)

        def bounds(precision: int) -> tuple[int, int]:
            scaled = exact * (1 << precision)
            return math.floor(scaled), math.ceil(scaled)

        return cls(bounds)

    @classmethod
    def exp_neg(cls, x: int | Fraction) -> ExactReal:
        """e^-x for a rational x >= 0."""
        exact = Fraction(x)
        if exact < 0:
            raise ValueError("exp_neg needs x >= 0")
        if exact == 0:
            return cls.rational(1)

        def bounds(precision: int) -> tuple[int, int]:
            digits = precision * 30103 // 100000 + exact.numerator.bit_length() // 3 + 12
            with localcontext() as ctx:
                ctx.prec, ctx.Emin, ctx.Emax = digits, MIN_EMIN, MAX_EMAX
                num, den = Decimal(exact.numerator), Decimal(exact.denominator)
                ctx.rounding = ROUND_FLOOR
                arg_low = num / den
                ctx.rounding = ROUND_CEILING
                arg_high = num / den
                # Decimal's exp is correctly rounded (within half an ulp) whatever the
                # context's rounding mode; one full ulp relative is a safe margin.
                small = (-arg_high).exp()
                large = (-arg_low).exp()
            ulp = Fraction(1, 10 ** (digits - 1))
            scale = 1 << precision
            low = Fraction(small) * (1 - ulp) * scale
            high = Fraction(large) * (1 + ulp) * scale
            return math.floor(low), math.ceil(high)

        return cls(bounds)

    def _binary(self, other: ExactReal | int | Fraction, combine: Callable) -> ExactReal:
        right = other if isinstance(other, ExactReal) else ExactReal.rational(other)
        return ExactReal(lambda precision: combine(self, right, precision))

    def __add__(self, other: ExactReal | int | Fraction) -> ExactReal:
        return self._binary(other, _add_bounds)

    def __radd__(self, other: int | Fraction) -> ExactReal:
        return self._binary(other, _add_bounds)

    def __sub__(self, other: ExactReal | int | Fraction) -> ExactReal:
        return self._binary(other, _sub_bounds)

    def __rsub__(self, other: int | Fraction) -> ExactReal:
        return ExactReal.rational(other) - self

    def __mul__(self, other: ExactReal | int | Fraction) -> ExactReal:
        return self._binary(other, _mul_bounds)

    def __rmul__(self, other: int | Fraction) -> ExactReal:
        return self._binary(other, _mul_bounds)

    def __truediv__(self, other: ExactReal | int | Fraction) -> ExactReal:
        return self._binary(other, _div_bounds)

    def __rtruediv__(self, other: int | Fraction) -> ExactReal:
        return ExactReal.rational(other) / self

    def floor_scaled(self, bits: int) -> int:
        """floor(x * 2^bits), exactly: precision grows until the bounds agree."""
        if bits not in self._floors:
            precision = bits + 64
            while True:
                low, high = self.bounds(precision)
                shift = precision - bits
                if low >> shift == high >> shift:
                    self._floors[bits] = low >> shift
                    break
                precision = _more_precision(precision)
        return self._floors[bits]

    def exceeds(self, value: Fraction) -> bool:
        """Whether x > value; x must differ from value (true of every irrational x)."""
        precision = 64
        while True:
            low, high = self.bounds(precision)
            target = math.floor(value * (1 << precision))
            if low > target:
                return True
            if high <= target:
                return False
            precision = _more_precision(precision)


def _more_precision(precision: int) -> int:
    if precision >= _MAX_PRECISION:
        raise InternalError("exact comparison did not resolve: the value looks rational")
    return precision * 2


_GUARD = 8  # extra bits asked of operands, so one rounding step rarely forces a retry


def _add_bounds(left: ExactReal, right: ExactReal, precision: int) -> tuple[int, int]:
    a_lo, a_hi = left.bounds(precision + _GUARD)
    b_lo, b_hi = right.bounds(precision + _GUARD)
    return (a_lo + b_lo) >> _GUARD, _ceil_shift(a_hi + b_hi, _GUARD)


def _sub_bounds(left: ExactReal, right: ExactReal, precision: int) -> tuple[int, int]:
    a_lo, a_hi = left.bounds(precision + _GUARD)
    b_lo, b_hi = right.bounds(precision + _GUARD)
    return (a_lo - b_hi) >> _GUARD, _ceil_shift(a_hi - b_lo, _GUARD)


def _mul_bounds(left: ExactReal, right: ExactReal, precision: int) -> tuple[int, int]:
    inner = precision + _GUARD
    a_lo, a_hi = left.bounds(inner)
    b_lo, b_hi = right.bounds(inner)
    products = (a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi)
    shift = inner + _GUARD
    return min(products) >> shift, _ceil_shift(max(products), shift)


def _div_bounds(left: ExactReal, right: ExactReal, precision: int) -> tuple[int, int]:
    inner = precision + _GUARD
    while True:
        b_lo, b_hi = right.bounds(inner)
        if b_lo > 0 or b_hi < 0:
            break
        inner = _more_precision(inner)
    a_lo, a_hi = left.bounds(inner)
    # a/b * 2^precision = (A / 2^inner) / (B / 2^inner) * 2^precision = (A << precision) / B
    candidates = [(a << precision, b) for a in (a_lo, a_hi) for b in (b_lo, b_hi)]
    low = min(num // den for num, den in candidates)
    high = max(_ceil_div(num, den) for num, den in candidates)
    return low, high


def _resolve_below(x: ExactReal, prefix_bits: int, rng: np.random.Generator) -> bool:
    """Whether V < x, for a uniform V known to share its first `prefix_bits` bits with x.

    Each further 64-bit word of V is compared with the next 64 bits of x; the
    first difference decides. A fresh tie has probability 2^-64 each time.
    """
    bits = prefix_bits
    while True:
        bits += 64
        word = int(_draw_words(rng, 1)[0])
        digit = x.floor_scaled(bits) & _MASK64
        if word != digit:
            return word < digit


def below(p: ExactReal, word: int, rng: np.random.Generator) -> bool:
    """Whether V < p for the uniform V whose first 64 bits are `word`, exactly."""
    threshold = p.floor_scaled(64)
    if word != threshold:
        return word < threshold
    return _resolve_below(p, 64, rng)


def bernoulli(p: ExactReal, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` independent exact Bernoulli(p) decisions, for an irrational p in (0, 1).

    A decision is V < p for a uniform real V whose binary digits are random
    64-bit words: the first word is compared with floor(p * 2^64) for all
    elements at once; the rare tied elements (probability 2^-64 each) read
    further words in a Python loop.
    """
    threshold = p.floor_scaled(64)
    if not 0 <= threshold <= _MAX64:
        raise ValueError("bernoulli needs 0 < p < 1")
    words = _draw_words(rng, size)
    limit = np.uint64(threshold)
    out = words < limit
    for index in (words == limit).nonzero()[0]:
        out[index] = _resolve_below(p, 64, rng)
    return out


class Sampler(abc.ABC):
    """An exact sampler of one distribution, drawn with a fixed sequence of numpy operations.

    `chunk` draws up to chunk_size values (its fixed cost, 8-20 us, dominates
    below a few hundred values); `draw(size, rng)` draws any number a chunk at a
    time, and `sample` is `draw` behind a noise pool (pool.py). Every value costs
    the same operations on the same number of words, whatever it turns out to be
    (only ties and the far tail take an exact slow path). Their elements are found
    with ndarray.nonzero: np.flatnonzero's Python wrappers cost ~1 us a call, a
    tenth of a small draw.
    """

    chunk_size = CHUNK  # values per `chunk` call

    def __init__(self) -> None:
        self.sample = NoisePool(self.draw)  # draw(size, rng), small requests served from a pool

    @abc.abstractmethod
    def chunk(self, size: int, rng: np.random.Generator) -> np.ndarray:
        """`size` <= chunk_size values as int64, vectorised."""

    def draw(self, size: int, rng: np.random.Generator) -> np.ndarray:
        """`size` int64 values; large sizes chunk_size at a time, so that each pass's
        temporaries stay in cache (and below the allocator's 128 KB mmap threshold, past which
        every temporary would be fresh pages, faulted in one by one: twice the time)."""
        if size < 0:
            raise ValueError("size must be >= 0")
        step = self.chunk_size
        if size <= step:
            return self.chunk(size, rng)
        out = np.empty(size, dtype=np.int64)
        for start in range(0, size, step):
            stop = min(size, start + step)
            out[start:stop] = self.chunk(stop - start, rng)
        return out


class SortedCuts:
    """An outcome index #{cut points <= V} by bisection among the thresholds floor(2^63 * cut).

    searchsorted runs the same number of steps for every element, give or take
    one (the table has a fixed size), and tiny gaps between cuts cost no memory,
    unlike the guide table of `cut_table`. The word's low bit is left free for
    the caller.
    """

    def __init__(self, floors: list[int], cut: Callable[[int], ExactReal]) -> None:
        if not all(a < b for a, b in itertools.pairwise([0, *floors, _HALF])):
            raise InternalError("cut points must be strictly increasing inside (0, 1)")
        self._cut = cut
        self._thr = np.array(floors, dtype=np.uint64)
        self._below = np.array([_MAX64, *floors], dtype=np.uint64)  # thr[index - 1], or none

    def index(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Outcome indices and the mask of elements tied with a threshold."""
        u = words >> _ONE
        # the ndarray method: np.searchsorted's Python wrappers cost 0.6 us more
        index = self._thr.searchsorted(u, side="right")
        return index, self._below.take(index) == u

    def exact_index(self, word: int, rng: np.random.Generator) -> int:
        u = word >> 1
        index = int(np.searchsorted(self._thr, np.uint64(u), side="right"))
        if index and u == int(self._thr[index - 1]):  # V may still be below that cut
            return index - _resolve_below(self._cut(index - 1), 63, rng)
        return index


def few_cuts(cuts: list[ExactReal]) -> SortedCuts:
    """A SortedCuts over a handful of exact cut points."""
    return SortedCuts([cut.floor_scaled(63) for cut in cuts], cuts.__getitem__)


def ratio_cuts(
    b: ExactReal, numerators: list[tuple[int, int]], denominator: tuple[int, int]
) -> tuple[list[int], Callable[[int], ExactReal]]:
    """floor(2^63 * cut) of the cuts (A + B b) / (C + D b), and each cut as an ExactReal.

    Each cut is monotone in b (the denominator stays positive), so its bounds
    are its values at the two ends of b's interval: one integer division each,
    however many cuts there are.
    """
    c, d = denominator

    def build(precision: int) -> tuple[list, list]:
        one = 1 << precision
        ends = b.bounds(precision)
        low, high = [], []
        for a, slope in numerators:
            values = [((a * one + slope * x) << precision, c * one + d * x) for x in ends]
            low.append(min(num // den for num, den in values))
            high.append(max(_ceil_div(num, den) for num, den in values))
        return low, high

    def cut(index: int) -> ExactReal:
        a, slope = numerators[index]
        return (a + slope * b) / (c + d * b)

    return _exact_table(build), cut


def cut_table(
    floors: list[int], cut: Callable[[int], ExactReal], max_buckets: int = 1 << 17
) -> _FiniteLevel | SortedCuts:
    """Constant-time lookup among increasing cut floors: a guide table of buckets (a few
    operations a value) when one of at most `max_buckets` buckets can hold every cut
    alone, else bisection."""
    gap = min((high - low for low, high in itertools.pairwise(floors)), default=_HALF)
    if floors and floors[0] > 0 and gap > 0 and _HALF // gap < max_buckets // 2:
        return _FiniteLevel(floors, cut)
    return SortedCuts(floors, cut)


def uniform_below(n: np.ndarray, words: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """floor(V * n) for each word, V = 0.word(next words...), n in [1, 2^32): exactly uniform.

    floor(word * n / 2^64) is computed from 32-bit halves (numpy has no 128-bit
    product). Later words of V can still carry into it only when the low 64 bits
    of word * n exceed 2^64 - n (probability n / 2^64); those elements read
    further words in Python until the floor is determined.
    """
    n = np.asarray(n, dtype=np.uint64)
    t = (words >> _SHIFT32) * n + (((words & _LOW32) * n) >> _SHIFT32)
    index = (t >> _SHIFT32).astype(np.int64)
    undecided = words * n > _ZERO - n  # wrapping products: the low 64 bits
    for at in undecided.nonzero()[0]:
        count = n[at] if n.ndim else n
        index[at] = _uniform_exact(int(words[at]), int(count), rng)
    return index


def _uniform_exact(word: int, n: int, rng: np.random.Generator) -> int:
    value, bits = word, 64
    while (low := (value * n) >> bits) != ((value + 1) * n - 1) >> bits:
        value = (value << 64) | int(_draw_words(rng, 1)[0])
        bits += 64
    return low


# ----------------------------------------------------------------------------------------------
# Threshold tables. Each level maps a 63-bit uniform u (the top 63 bits of a word, standing for
# V = u / 2^63 + later words) to an outcome index c = #{cut points <= V}, with the cut points
# held as T = floor(2^63 * cut). A guide over buckets of u (monotone in u, fine enough that a
# bucket holds at most one T) gives c = base[bucket] + (u >= thr[bucket]) in a fixed number of
# numpy operations; u == thr is the only undecided case (a tie).


def _guide(table: np.ndarray, buckets: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """base[b] = number of thresholds in buckets below b; thr[b] = the one in b, or _PAD."""
    if table.size and not np.all(np.diff(buckets) > 0):
        raise InternalError("a guide bucket holds two thresholds")
    base = np.searchsorted(buckets, np.arange(count, dtype=np.int64), side="left")
    thr = np.full(count, _PAD, dtype=np.uint64)
    thr[buckets] = table
    return base.astype(np.int64), thr


class _LogBuckets:
    """Octave of u and its next `mantissa_bits` bits, via the bits of an exact float64.

    float64 holds u exactly once the bits it could not represent are cleared:
    below 2^53 none need to be (|1 keeps 0 out of the subnormals), above it the
    low 11 do. Both changes are monotone in u, so the bucket is monotone in u,
    and no rounding mode can move a value between buckets. The larger of the two
    candidates is the right one on each side of 2^53 (u & ~2047 <= u <= u | 1
    below it, (u mod 2^53) | 1 < 2^53 <= u & ~2047 above): two cheap ufuncs
    where np.where and its comparison cost 0.6 us more.
    """

    def __init__(self, mantissa_bits: int) -> None:
        self.mantissa_bits = mantissa_bits
        self._shift = constant(52 - mantissa_bits, np.int64)
        self._offset = constant(1023 << mantissa_bits, np.int64)

    def of(self, u: np.ndarray) -> np.ndarray:
        exact = np.maximum(u & _CLEAR11, (u & _LOW53) | _ONE)
        return (exact.astype(np.float64).view(np.int64) >> self._shift) - self._offset


def _powers(base_lo: int, base_hi: int, count: int, precision: int) -> tuple[list, list]:
    """Bounds of base^0 .. base^count (times 2^precision) by repeated directed multiplication."""
    low, high = [1 << precision], [1 << precision]
    for _ in range(count):
        low.append((low[-1] * base_lo) >> precision)
        high.append(_ceil_shift(high[-1] * base_hi, precision))
    return low, high


def _floors63(low: list[int], high: list[int], precision: int) -> list[int] | None:
    """floor(2^63 * cut) for each cut, or None when the bounds leave any of them ambiguous."""
    shift = precision - 63
    floors = [value >> shift for value in low]
    if any(floor != value >> shift for floor, value in zip(floors, high, strict=True)):
        return None
    return floors


def _exact_table(build: Callable[[int], tuple[list, list]]) -> list[int]:
    precision = _TABLE_PRECISION
    while (floors := _floors63(*build(precision), precision)) is None:
        precision = _more_precision(precision)
    return floors


def _truncated_cdf(beta: ExactReal, length: int, precision: int) -> tuple[list, list]:
    """Bounds of (1 - beta^d) / (1 - beta^length) for d = 0 .. length."""
    one = 1 << precision
    b_lo, b_hi = beta.bounds(precision)
    p_lo, p_hi = _powers(b_lo, b_hi, length, precision)
    den_lo, den_hi = one - p_hi[length], one - p_lo[length]
    low = [((one - value) << precision) // den_hi for value in p_hi]
    high = [_ceil_div((one - value) << precision, den_lo) for value in p_lo]
    return low, high


def _truncated_cdf_exact(beta_rate: Fraction, length: int, d: int) -> ExactReal:
    """(1 - beta^d) / (1 - beta^length) with beta = e^-beta_rate, for the slow path."""
    return (1 - ExactReal.exp_neg(d * beta_rate)) / (1 - ExactReal.exp_neg(length * beta_rate))


class _FiniteLevel:
    """A few thousand roughly evenly spaced cut points, bucketed by the top bits of u."""

    def __init__(self, floors: list[int], cut: Callable[[int], ExactReal]) -> None:
        gap = min((b - a for a, b in itertools.pairwise(floors)), default=_HALF)
        shift = min(62, gap.bit_length() - 1)  # buckets of width 2^shift <= gap hold one cut each
        table = np.array(floors, dtype=np.uint64)
        self._shift = constant(shift + 1, np.uint64)  # applied to the whole 64-bit word
        self._base, self._thr = _guide(
            table, (table >> np.uint64(shift)).astype(np.int64), 1 << (63 - shift)
        )
        self._cut = cut
        self.cuts = len(floors)

    def index(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Outcome indices and the mask of elements tied with a threshold."""
        u = words >> _ONE
        bucket = (words >> self._shift).view(np.int64)
        thr = self._thr.take(bucket)
        return self._base.take(bucket) + (u >= thr), u == thr

    def exact_index(self, word: int, rng: np.random.Generator) -> int:
        u = word >> 1
        bucket = word >> int(self._shift)
        base, thr = int(self._base[bucket]), int(self._thr[bucket])
        if u != thr:
            return base + (u > thr)
        return base + (not _resolve_below(self._cut(base), 63, rng))


class _TailLevel:
    """M = #{k >= 1 : V < C * beta^k}, a geometric tail: cut points crowd towards 0.

    Buckets are octaves of u split into 2^m parts (2^m > scale of beta, so a
    bucket holds at most one cut), 63 * 2^m buckets in all. Below 2^(tail_bits - 63) the cuts
    are closer together than one unit of u; that region (probability
    2^(tail_bits - 63)) is resolved exactly by drawing further words.
    """

    def __init__(self, coefficient: ExactReal, rate: Fraction) -> None:
        self._coefficient = coefficient
        self._rate = rate
        descending = _exact_table(self._bounds)
        table = np.array(descending[::-1], dtype=np.uint64)
        mantissa_bits = max(0, math.ceil(math.log2(max(1.0, float(1 / rate))))) + 1
        self._buckets = _LogBuckets(mantissa_bits)
        buckets = self._buckets.of(table) if table.size else np.zeros(0, np.int64)
        clash = np.flatnonzero(np.diff(buckets) <= 0)
        tail_bits = max(1, int(table[clash[-1]]).bit_length()) if clash.size else 1
        keep = table >= np.uint64(1 << tail_bits)
        table, buckets = table[keep], buckets[keep]
        self._tail_bucket = constant(tail_bits << mantissa_bits, np.int64)
        self.tail_bits = tail_bits
        self.cuts = int(table.size)
        base, self._thr = _guide(table, buckets, 63 << mantissa_bits)
        self._count_minus_base = self.cuts - base

    def _bounds(self, precision: int) -> tuple[list, list]:
        """Bounds of C * beta^k for k = 1, 2, ... while floor(2^63 * cut) can be >= 1."""
        c_lo, c_hi = self._coefficient.bounds(precision)
        b_lo, b_hi = ExactReal.exp_neg(self._rate).bounds(precision)
        stop = 1 << (precision - 63)
        low, high = [], []
        p_lo, p_hi = c_lo, c_hi
        while True:
            p_lo, p_hi = (p_lo * b_lo) >> precision, _ceil_shift(p_hi * b_hi, precision)
            if p_hi < stop:
                return low, high
            low.append(p_lo)
            high.append(p_hi)

    def _cut(self, k: int) -> ExactReal:
        return self._coefficient * ExactReal.exp_neg(k * self._rate)

    def values(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """M for each word, and the mask of elements tied or in the far tail."""
        u = words >> _ONE
        bucket = self._buckets.of(u)
        thr = self._thr.take(bucket)
        value = self._count_minus_base.take(bucket) - (u >= thr)
        return value, (u == thr) | (bucket < self._tail_bucket)

    def exact_value(self, word: int, rng: np.random.Generator) -> int:
        u = word >> 1
        if u < 1 << self.tail_bits:
            return self._tail_value(u, rng)
        bucket = int(self._buckets.of(np.array([u], dtype=np.uint64))[0])
        value, thr = int(self._count_minus_base[bucket]), int(self._thr[bucket])
        if u != thr:
            return value - (u > thr)
        # the tied cut is the (value)-th from the top, i.e. k = value
        return value - (not _resolve_below(self._cut(value), 63, rng))

    def _count_above(self, x: Fraction) -> int:
        """#{k >= 1 : C * beta^k > x} for a dyadic x > 0."""
        c_lo, _ = self._coefficient.bounds(64)
        guess = (math.log(c_lo / 2**64) - math.log(x.numerator) + math.log(x.denominator)) / float(
            self._rate
        )
        k = max(0, int(guess))
        while k >= 1 and not self._cut(k).exceeds(x):
            k -= 1
        while self._cut(k + 1).exceeds(x):
            k += 1
        return k

    def _tail_value(self, u: int, rng: np.random.Generator) -> int:
        """M exactly, for V in the far tail: refine V word by word until M is determined."""
        low, width = Fraction(u, _HALF), Fraction(1, _HALF)
        while True:
            # every cut above low + width is above V, and every cut above V is above low
            # (low = 0 bounds nothing: infinitely many cuts lie above it)
            if low > 0 and (least := self._count_above(low + width)) == self._count_above(low):
                return least
            width /= 1 << 64
            low += int(_draw_words(rng, 1)[0]) * width


class LaplaceSampler(Sampler):
    """Exact discrete Laplace of one scale t: P(Z = k) proportional to a^|k|, a = e^(-1/t).

    |Z| is 0 with probability p0 = (1-a)/(1+a), else 1 + G with G geometric(a)
    and a fair sign. For t <= _TOP_SCALE one word gives the sign (its low bit)
    and |Z| from one tail table. Above, G = R0 + L0*(R1 + L1*(... + H)) with
    independent digits: the first word picks zero-or-(sign, 1 + R0) from 2*L0
    nearly even cuts; each next word picks a truncated-geometric digit; the
    last word picks H, geometric with parameter a^(L0*L1*...), from a tail table.
    """

    def __init__(self, scale: Fraction) -> None:
        super().__init__()
        rate = 1 / scale  # a = e^-rate
        self.scale = scale
        a = ExactReal.exp_neg(rate)
        if scale <= _TOP_SCALE:
            self._first = None
            self._digits: list[tuple[_FiniteLevel, int]] = []
            self._top = _TailLevel(2 / (1 + a), rate)
            self.words_per_sample = 1
            return
        spread = scale / _TOP_SCALE
        levels = max(1, math.ceil(math.log(float(spread)) / math.log(_MAX_DIGIT)))
        length = math.ceil(float(spread) ** (1 / levels))
        self._first_length = length
        self._length = constant(length, np.int64)
        self._first = self._first_level(a, rate, length)
        multiplier, self._digits = length, []
        for _ in range(levels - 1):
            self._digits.append((self._digit_level(multiplier * rate, length), multiplier))
            multiplier *= length
        self._top_multiplier = multiplier
        # (level, row of words) of the digits from the last to the first: G's digits in Horner order
        self._horner = [(level, row + 1) for row, (level, _) in enumerate(self._digits)][::-1]
        self._top = _TailLevel(ExactReal.rational(1), multiplier * rate)
        self.words_per_sample = levels + 1
        self.chunk_size = CHUNK // self.words_per_sample  # the words of a chunk: one pass's size
        # outcome index of the first level -> (signed 1 + R0, signed L0) ; index 0 is Z = 0
        steps = np.arange(1, length + 1, dtype=np.int64)
        self._first_value = np.concatenate([[0], steps, -steps])
        self._first_sign = np.concatenate(
            [[0], np.full(length, length), np.full(length, -length)]
        ).astype(np.int64)

    @staticmethod
    def _first_level(a: ExactReal, rate: Fraction, length: int) -> _FiniteLevel:
        """Cuts p0, p0 + h*F(j) (j = 1..L0), s + h*F(j) (j = 1..L0-1).

        h = a/(1+a) is each sign's share of P(Z != 0), s = p0 + h = 1/(1+a),
        and F(j) = (1-a^j)/(1-a^L0) is the CDF of the truncated geometric R0.
        """
        p0, half, second = (1 - a) / (1 + a), a / (1 + a), 1 / (1 + a)

        def build(precision: int) -> tuple[list, list]:
            f_lo, f_hi = _truncated_cdf(a, length, precision)
            z_lo, z_hi = p0.bounds(precision)
            s_lo, s_hi = second.bounds(precision)
            h_lo, h_hi = half.bounds(precision)
            low, high = [z_lo], [z_hi]
            for start_lo, start_hi, last in ((z_lo, z_hi, length), (s_lo, s_hi, length - 1)):
                low += [start_lo + ((h_lo * f_lo[j]) >> precision) for j in range(1, last + 1)]
                high += [
                    start_hi + _ceil_shift(h_hi * f_hi[j], precision) for j in range(1, last + 1)
                ]
            return low, high

        def cut(index: int) -> ExactReal:
            if index == 0:
                return p0
            start, j = (p0, index) if index <= length else (second, index - length)
            return start + half * _truncated_cdf_exact(rate, length, j)

        return _FiniteLevel(_exact_table(build), cut)

    @staticmethod
    def _digit_level(beta_rate: Fraction, length: int) -> _FiniteLevel:
        """Cuts F(d) = (1-beta^d)/(1-beta^L), d = 1..L-1, of a truncated geometric digit."""
        beta = ExactReal.exp_neg(beta_rate)

        def build(precision: int) -> tuple[list, list]:
            low, high = _truncated_cdf(beta, length, precision)
            return low[1:length], high[1:length]

        return _FiniteLevel(
            _exact_table(build), lambda index: _truncated_cdf_exact(beta_rate, length, index + 1)
        )

    def slow_path_probability(self) -> float:
        """P(a sample needs the Python slow path): ties with any cut, or the far tail."""
        cuts = self._top.cuts + sum(level.cuts for level, _ in self._digits)
        cuts += self._first.cuts if self._first is not None else 0
        return (cuts + (1 << self._top.tail_bits)) / _HALF

    def chunk(self, size: int, rng: np.random.Generator) -> np.ndarray:
        words = _draw_words(rng, (self.words_per_sample, size))
        values, slow = self._fast(words)
        for index in slow.nonzero()[0]:
            values[index] = self._exact([int(w) for w in words[:, index]], rng)
        return values

    def _fast(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        top, slow = self._top.values(words[-1])
        if self._first is None:
            return signed(top, words[0]), slow
        inner = top
        for level, row in self._horner:
            digit, tie = level.index(words[row])
            inner = digit + inner * self._length
            slow |= tie
        first, tie = self._first.index(words[0])
        slow |= tie
        return self._first_value.take(first) + self._first_sign.take(first) * inner, slow

    def _exact(self, words: list[int], rng: np.random.Generator) -> int:
        """One sample in Python integers, resolving ties and the tail exactly."""
        top = self._top.exact_value(words[-1], rng)
        if self._first is None:
            return -top if words[0] & 1 else top
        inner = top
        for (level, _), word in zip(reversed(self._digits), words[-2:0:-1], strict=True):
            inner = level.exact_index(word, rng) + inner * self._first_length
        first = self._first.exact_index(words[0], rng)
        return int(self._first_value[first]) + int(self._first_sign[first]) * inner


@functools.lru_cache(maxsize=32)  # a plan holds up to ~1.5 MB of tables
def _plan(scale: Fraction) -> LaplaceSampler:
    return LaplaceSampler(scale)


def exact_laplace(scale: int | Fraction) -> LaplaceSampler:
    """The exact discrete Laplace sampler of one scale, for callers that sample it again and
    again (a single value then skips the checks and the lookup).

    The scale is taken as an exact rational (pass Fraction(float) for a float).
    Tables for a scale are built once (tens of milliseconds) and cached.
    """
    exact = Fraction(scale)
    if not 0 < exact <= _MAX_SCALE:
        raise ValueError(f"discrete Laplace scale must be in (0, 2^48], got {scale}")
    return _plan(exact)


def laplace_sampler(scale: int | Fraction) -> Callable[[int, np.random.Generator], np.ndarray]:
    """The pooled draw(size, rng) of `exact_laplace(scale)`."""
    return exact_laplace(scale).sample


def discrete_laplace(scale: int | Fraction, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` exact draws of discrete Laplace noise: P(k) proportional to exp(-|k|/scale)."""
    if size < 0:
        raise ValueError("size must be >= 0")
    return laplace_sampler(scale)(size, rng)


def slow_path_probability(scale: int | Fraction) -> float:
    """Upper bound on P(one sample at this scale takes the exact Python slow path)."""
    return _plan(Fraction(scale)).slow_path_probability()


class GeometricSampler(Sampler):
    """Exact G >= 0 with P(G >= k) = e^(-rate * k), for the staircase's block index.

    When 1/rate <= _TOP_SCALE, G is the count of one tail table (one word, and
    none of the discrete Laplace's sign work); below that rate the table would
    be too large, and G is a folded discrete Laplace of scale 1/rate (Y if
    Y >= 0 else -Y - 1), whose tables are split into digits.
    """

    def __init__(self, rate: Fraction) -> None:
        super().__init__()
        self._tail = _TailLevel(ExactReal.rational(1), rate) if rate >= 1 / _TOP_SCALE else None
        self._laplace = None if self._tail else exact_laplace(1 / rate)

    def chunk(self, size: int, rng: np.random.Generator) -> np.ndarray:
        if self._tail is None:
            folded = self._laplace.chunk(size, rng)
            return folded ^ (folded >> _SIGN_SHIFT)
        words = _draw_words(rng, size)
        values, slow = self._tail.values(words)
        for index in slow.nonzero()[0]:
            values[index] = self._tail.exact_value(int(words[index]), rng)
        return values


@functools.lru_cache(maxsize=32)
def exact_geometric(rate: Fraction) -> GeometricSampler:
    """The exact geometric sampler of one rate > 0 (1/rate at most 2^48), built once."""
    return GeometricSampler(rate)
