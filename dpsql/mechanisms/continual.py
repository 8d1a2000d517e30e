"""Continual counting: noisy running totals over a fixed horizon of T steps (knows nothing of SQL).

Counters whose noise is drawn once from a keyed generator, so that a stream
restarted from the same key continues with the same noise and a past release
never changes. The tree's is a data-independent vector eta (one value per step),
released as S_t + eta_t; the released factorization's is z, added to an exact
integer query (`ExactFactorization`):

- `BinaryTree`: the binary (dyadic) tree mechanism. Every step lies in one
  node per level, so with `levels = ceil(log2 T) + 1` the tree has L1
  sensitivity levels * Delta and each node gets noise of scale levels*Delta/eps
  (exact discrete Laplace: pure epsilon). The plain estimator sums the
  popcount(t) nodes of the dyadic decomposition of [1, t]; the online
  variance-reduced estimator (Honaker 2015) replaces each of those nodes by
  the best linear unbiased estimate of its sum from every node of its
  (complete) subtree, computed bottom-up.
- `Factorization`: the square-root factorisation M = L L of the lower
  triangular all-ones matrix (Fichtenberger, Henzinger and Upadhyay), with L
  Toeplitz, L[i, j] = f(i - j), f(0) = 1, f(k) = f(k-1)(2k-1)/(2k). Releasing
  L (R x + z) = M x + L z with z Gaussian is rho-zCDP when z has standard
  deviation Delta * ||R||_{1->2} / sqrt(2 rho), ||R||_{1->2} = sqrt(sum f(k)^2)
  (not 1, and not the seed README's L_t R(t) z, which is the naive sum).
  `Factorization` computes the noise L z by one float FFT: it models the
  mechanism's variance (the simulations of examples/ and benchmarks/), and is
  not what dpsql releases.
- `ExactFactorization`: the factorization as dpsql releases it, rho-zCDP by the
  discrete Gaussian mechanism on the integer query q = round(R~ x / h) (R~ the
  Toeplitz matrix of f rounded to PRECISION_BITS, computed exactly in Python
  integers), released as h L (q + z), a post-processing of q + z; over at most
  EXACT_HORIZON steps. See its docstring for the proof.

The tree's release is S_t + eta_t with eta independent of the data and snapped
to a power-of-two grid, so no floating-point arithmetic ever touches the data:
adding a grid value to an integer (or grid) total is exact.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
from randomgen import AESCounter

from dpsql.mechanisms.base import OutOfRange
from dpsql.mechanisms.gaussian import discrete_gaussian
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.mechanisms.samplers import discrete_laplace

# eta is snapped to multiples of 2^-10: an added variance of 2^-20 / 12, and
# totals stay exact floats up to 2^43.
NOISE_GRID = 2.0**-10
# The largest standard deviation of a factorization's eta_t (in the counter's units) that
# `Factorization.prepare` accepts: the discrete Laplace sampler's largest scale. A draw
# beyond 2^52 (16 deviations: probability below 1e-55) would leave the floats on which
# an integer total plus eta is exact, and one of 2^15 deviations the int64 a count is
# released as; unbounded, it overflowed to inf or int64's minimum after the charge.
MAX_DEVIATION = 2.0**48

# sampler(size, rng) -> `size` independent draws of a tree's node noise
Sampler = Callable[[int, np.random.Generator], np.ndarray]
# gaussian(size, sigma, rng) -> `size` independent centred draws of standard deviation sigma
GaussianSampler = Callable[[int, float, np.random.Generator], np.ndarray]


def keyed_generator(key: int, stream: int = 0) -> np.random.Generator:
    """A deterministic cryptographic generator for stream `stream` under a 126-bit secret `key`.

    AES-128 in counter mode, each stream starting at its own 2^96-block offset:
    the same (key, stream) always gives the same noise, which is what lets a
    restarted stream continue without re-noising.
    """
    return np.random.Generator(AESCounter(key=key, counter=stream << 96))


def sqrt_coefficients(horizon: int) -> np.ndarray:
    """f(0..T-1): f(0) = 1, f(k) = f(k-1)(2k-1)/(2k) = C(2k, k) / 4^k."""
    k = np.arange(1, horizon, dtype=np.float64)
    return np.concatenate(([1.0], np.cumprod((2 * k - 1) / (2 * k))))


def column_norm_squared(horizon: int) -> float:
    """||R||_{1->2}^2 = sum_{k<T} f(k)^2: 3.4932 at T = 2048, 4.5964 at T = 2^16."""
    return float(np.sum(sqrt_coefficients(horizon) ** 2))


def _snap(values: np.ndarray) -> np.ndarray:
    return np.round(values / NOISE_GRID) * NOISE_GRID


class BinaryTree:
    """The binary tree mechanism over `horizon` steps, plain or with Honaker's estimator."""

    def __init__(
        self,
        horizon: int,
        node_variance: float,
        sampler: Sampler,
        *,
        honaker: bool = True,
        name: str = "binary tree",
    ):
        if horizon < 1:
            raise ValueError(f"the horizon must be at least 1 step, got {horizon}")
        self.horizon = horizon
        self.height = max(0, math.ceil(math.log2(horizon)))  # leaves padded to 2^height
        self.node_variance = node_variance
        self.sampler = sampler
        # A huge epsilon can round the node variance down to 0: Honaker's weights are
        # then 0/0, and plain sums are the same (noiseless) estimate.
        self.honaker = honaker and node_variance > 0
        self.name = f"{name} ({'Honaker estimator' if honaker else 'plain sums'})"

    @property
    def levels(self) -> int:
        """Levels of the tree, root included: each step lies in one node per level."""
        return self.height + 1

    def _block_variances(self) -> np.ndarray:
        """Variance of the estimate of one complete subtree's sum, by its height."""
        v = np.full(self.levels, self.node_variance)
        if self.honaker:
            for h in range(1, self.levels):
                # 1 / (1/nv + 1/(2 v)) written without reciprocals, which overflow when a
                # huge epsilon makes the variance subnormal
                v[h] = self.node_variance * 2.0 * v[h - 1] / (2.0 * v[h - 1] + self.node_variance)
        return v

    def nodes(self, rng: np.random.Generator, runs: int | None = None) -> list[np.ndarray]:
        """The node noise, level by level from the leaves: level h has 2^(height-h) nodes.

        With `runs`, each level has a leading axis of `runs` independent trees
        (one sampler call per level, so simulations need no Python loop per run).
        """
        levels = []
        for h in range(self.levels):
            width = 1 << (self.height - h)
            values = np.asarray(self.sampler(width * (runs or 1), rng))
            # integer draws become float64 (Honaker's weights); float32 draws stay float32
            values = values.astype(np.result_type(values.dtype, np.float32), copy=False)
            levels.append(values if runs is None else values.reshape(runs, width))
        return levels

    def prefixes(self, nodes: list[np.ndarray]) -> np.ndarray:
        """eta_1..eta_T (unsnapped) from the node noise of `nodes`, over its last axis.

        With Honaker's estimator each node is first replaced, bottom-up, by the
        best linear unbiased estimate of its sum from itself and its children's
        estimates. eta_t sums the estimates of the nodes of the dyadic
        decomposition of [1, t], one per set bit h of t: node (t >> h) - 1 of
        level h. That sum is built top-down in O(T): `above[b]` holds the part
        of eta_t from the levels at and above h for every t with t >> h == b.
        """
        estimates = list(nodes)
        if self.honaker:
            block = self._block_variances()
            for h in range(1, self.levels):
                # a Python float keeps float32 node noise in float32 (simulations)
                # (1/nv) / (1/nv + 1/(2 b)), without reciprocals (see _block_variances)
                weight = float(2.0 * block[h - 1] / (2.0 * block[h - 1] + self.node_variance))
                children = estimates[h - 1][..., 0::2] + estimates[h - 1][..., 1::2]
                estimates[h] = weight * estimates[h] + (1.0 - weight) * children
        top = estimates[-1]  # the root: eta_T when T = 2^height
        above = np.zeros(top.shape, dtype=top.dtype)  # t >> height == 0 for every t < 2^height
        for h in range(self.height, 0, -1):
            below = np.empty((*above.shape, 2), dtype=above.dtype)
            below[..., 0] = above  # t >> (h-1) even: bit h-1 of t is clear
            np.add(above, estimates[h - 1][..., 0::2], out=below[..., 1])
            above = below.reshape(*above.shape[:-1], -1)
        # `above` is eta_0..eta_{2^height - 1}; eta_{2^height} is the root alone
        eta = np.concatenate([above[..., 1:], top], axis=-1)
        return eta[..., : self.horizon]

    def noise(self, rng: np.random.Generator) -> np.ndarray:
        """eta_1..eta_T: the noise of each prefix estimate, snapped when Honaker weights it."""
        eta = self.prefixes(self.nodes(rng))
        return _snap(eta) if self.honaker else eta

    def variance(self) -> np.ndarray:
        """Var(eta_t) for t = 1..T in closed form."""
        block = self._block_variances()
        t = np.arange(1, self.horizon + 1)
        return sum((((t >> h) & 1) * block[h] for h in range(self.levels)), np.zeros(self.horizon))


class Factorization:
    """The square-root factorisation mechanism with Gaussian noise, `rho`-zCDP."""

    name = "square-root factorization"

    def __init__(self, horizon: int, rho: float, sensitivity: float, sampler: GaussianSampler):
        if horizon < 1:
            raise ValueError(f"the horizon must be at least 1 step, got {horizon}")
        self.horizon = horizon
        self.coefficients = sqrt_coefficients(horizon)
        self.norm = math.sqrt(float(np.sum(self.coefficients**2)))
        self.rho = rho
        # standard deviation of each z_j: L2 sensitivity of R x over sqrt(2 rho); no rho
        # (none converts to within a tiny (epsilon, delta)) is infinite noise, which
        # `prepare` refuses
        self.sigma = sensitivity * self.norm / math.sqrt(2 * rho) if rho > 0 else math.inf
        self.sampler = sampler

    def apply(self, z: np.ndarray) -> np.ndarray:
        """L z over the last axis of `z` (unsnapped), by one zero-padded FFT convolution.

        Float32 `z` is convolved in float32 (simulations); float64 otherwise.
        """
        size = 1 << (2 * self.horizon - 1).bit_length()
        spectrum = np.fft.rfft(self.coefficients.astype(z.dtype, copy=False), size)
        product = np.fft.rfft(z, size, axis=-1) * spectrum
        return np.fft.irfft(product, size, axis=-1)[..., : self.horizon]

    def noise(self, rng: np.random.Generator) -> np.ndarray:
        """eta = L z for the whole horizon, snapped to the noise grid."""
        z = np.asarray(self.sampler(self.horizon, self.sigma, rng), dtype=np.float64)
        return _snap(self.apply(z))

    def variance(self) -> np.ndarray:
        """Var(eta_t) = sigma^2 sum_{k<t} f(k)^2 for t = 1..T."""
        return self.sigma**2 * np.cumsum(self.coefficients**2)

    def prepare(self) -> None:
        """Raise OutOfRange if this noise cannot be released exactly: eta_T's standard
        deviation sigma * ||R||_{1->2}, the largest, must be at most MAX_DEVIATION.
        (The Gaussian sampler itself draws any sigma, on a lattice relative to it.)"""
        deviation = self.sigma * self.norm
        if not deviation <= MAX_DEVIATION:  # also NaN
            raise OutOfRange(
                f"Gaussian noise of standard deviation {deviation:.4g} cannot be drawn exactly "
                "(running totals are exact up to a standard deviation of 2^48)"
            )


# -- the factorization as released: exact integers up to the noise --------------------

# F(k) = f(k) * 2^PRECISION_BITS rounded to an integer: the released mechanism's R~.
PRECISION_BITS = 48
# The longest factorization stream: its first tick convolves the whole horizon exactly
# (Kronecker substitution, about a second at 2^16 steps; the product's cost grows as
# T^1.58), and each later step sums its whole prefix in Python integers.
EXACT_HORIZON = 1 << 16
# z's standard deviation is 2^36 to 2^37 lattice steps (before the rounding term): the
# rounding adds sqrt(P T) <= 2^8 sqrt(P) (P partitions) to a sensitivity of 2^36 sqrt(2 rho)
# or more, a relative 2^-28 sqrt(P / (2 rho)); sigma_z^2 stays below the sampler's 2^80
# unless rho (or the partitions' share of the rounding) is extreme, refused by prepare().
LATTICE_BITS = 36
_MAX_SIGMA2 = Fraction(1 << 80)
_DIRECT_TERMS = 1 << 23  # products (about 40 ns each) a direct convolution may cost


class NoiseMismatch(ValueError):
    """A stream's stored steps do not match the noise drawn again from its key."""


def _ceil_sqrt(value: int) -> int:
    root = math.isqrt(value)
    return root if root * root == value else root + 1


@functools.lru_cache(maxsize=4)
def integer_coefficients(horizon: int) -> tuple[int, ...]:
    """F(0..T-1): integers within 1/2 + 2^-24 of f(k) * 2^PRECISION_BITS (exactly f(k) * 2^B
    rounded, unless that is within 2^-24 of a half), from an exact integer recurrence
    with 40 guard bits: g(k) = floor(g(k-1) (2k-1) / (2k)) loses less than one guard
    unit per step. Any fixed integer sequence would do for privacy, whose bound is
    computed from F itself; this one keeps R~ within 2^-B of R."""
    guard = 40
    g = 1 << (PRECISION_BITS + guard)
    half = 1 << (guard - 1)
    values = [1 << PRECISION_BITS]
    for k in range(1, horizon):
        g = g * (2 * k - 1) // (2 * k)
        values.append((g + half) >> guard)
    return tuple(values)


def _convolve_direct(
    coefficients: Sequence[int], values: Sequence[int], start: int, stop: int
) -> list[int]:
    """c_t = sum_{i<=t} F(t-i) x_i for start <= t < stop, by exact sums over the prefix."""
    reverse = coefficients[stop - 1 :: -1] if stop else ()  # F(stop-1), ..., F(0)
    offset = len(reverse)
    return [
        sum(map(operator.mul, reverse[offset - 1 - t :], values[: t + 1]))
        for t in range(start, stop)
    ]


def _pack(values: Sequence[int], width: int) -> int:
    """sum_i values[i] 2^(8 width i) for values in [0, 2^(8 width))."""
    return int.from_bytes(b"".join(v.to_bytes(width, "little") for v in values), "little")


def _convolve_kronecker(
    coefficients: Sequence[int], values: Sequence[int], start: int, stop: int
) -> list[int]:
    """c_t for start <= t < stop by one big-integer product (Kronecker substitution).

    x is shifted by m = max(0, -min x) to be nonnegative, so every field of the product,
    sum_{i<=t} F(t-i) (x_i + m) < T max F (max x + m) < 2^(8 width), is a digit in base
    2^(8 width) with no carries; c_t is that field minus m (F(0) + ... + F(t)).
    """
    if stop <= start:
        return []
    values = list(values[:stop])
    coefficients = coefficients[:stop]
    shift = max(0, -min(values))
    shifted = [v + shift for v in values]
    bits = max(coefficients).bit_length() + max(shifted).bit_length() + stop.bit_length() + 1
    width = (bits + 7) // 8
    product = _pack(coefficients, width) * _pack(shifted, width)
    raw = product.to_bytes(width * (2 * stop), "little")
    prefix = 0
    prefixes = []
    for t in range(stop):
        prefix += coefficients[t]
        if t >= start:
            prefixes.append(prefix)
    return [
        int.from_bytes(raw[t * width : (t + 1) * width], "little") - shift * prefixes[t - start]
        for t in range(start, stop)
    ]


def convolve_exact(
    coefficients: Sequence[int], values: Sequence[int], start: int, stop: int
) -> list[int]:
    """(F * x)_t = sum_{i<=t} F(t-i) x_i for start <= t < stop, exact Python integers
    (x may be negative): direct sums for a few new steps, Kronecker substitution for many."""
    if (stop - start) * stop <= _DIRECT_TERMS:
        return _convolve_direct(coefficients, values, start, stop)
    return _convolve_kronecker(coefficients, values, start, stop)


class ExactFactorization:
    """The square-root factorization as dpsql releases it: rho-zCDP by the discrete Gaussian
    mechanism on an integer query, with floating point only in its post-processing.

    In units of a lattice h = 2^e (relative to the stream's unit: a count, or one SUM
    grid step), with F(k) the integers of `integer_coefficients` and R~ the lower
    triangular Toeplitz matrix of F(k) / 2^B:

    1. q_t = round((R~ x)_t / h), half up, computed exactly in Python integers from
       the exact per-step values x (`quantize(convolve_exact(...))`);
    2. y_t = q_t + z_t, z_t exact discrete Gaussian N_Z(0, sigma_z^2) from the key;
    3. r_t = h (L y)_t = h sum_{i<=t} f(t-i) y_i, in floating point.

    Privacy: neighbours' per-step values differ by delta with ||delta||_1 <= Delta, so
    ||R~ delta||_2 <= Delta ||R~||_{1->2}, ||R~||_{1->2} = sqrt(sum_k (F(k)/2^B)^2) (its
    first column's norm, the largest), bounded above here by a rational (`norm_bound`);
    rounding moves each q_t by less than 1/2, so a pair of neighbours' q differ by less
    than 1 per coordinate more: ||q(x) - q(x')||_2 <= Delta ||R~||_{1->2} / h + sqrt(T).
    A stream of P partitions runs one counter per partition, each with its own z, and a
    unit's Delta is spread over all of them: the q of every partition, concatenated,
    move by at most sum_p ||R~ delta_p||_2 / h + sqrt(P T) <= Delta ||R~||_{1->2} / h +
    sqrt(P T) (`sensitivity_bound`, in lattice units; rounding moves every coordinate of
    every partition a unit touches). That is an integer-valued query of that L2
    sensitivity, so y with sigma_z = that bound / sqrt(2 rho) is rho-zCDP (Canonne,
    Kamath and Steinke 2020, Theorem 14), and r, a function of y alone, is too.

    h is 2^-LATTICE_BITS of sigma_units = Delta ||R~|| / sqrt(2 rho) (rounded down to a
    power of two, exactly: math.frexp), so the sqrt(P T) term adds at most a relative
    2^-28 sqrt(P / (2 rho)) to sigma_z (at tiny rho, more: an accuracy cost only).

    Error: r_t = (L R~ x)_t + h (L e)_t + h (L z)_t with |e_i| <= 1/2 the rounding of q,
    so r_t - S_t has variance h^2 sigma_z^2 sum_{k<t} f(k)^2 (`variance`) and a
    deterministic bias below h/2 sum_{k<t} f(k) < h sqrt(t) from the rounding, plus
    (L (R~ - R) x)_t, below 2^-B sqrt(t) sum_i |x_i| from F's rounding.
    """

    name = "square-root factorization"

    def __init__(self, horizon: int, rho: float, sensitivity: int, partitions: int = 1):
        if not 1 <= horizon <= EXACT_HORIZON:
            raise ValueError(f"the horizon must be 1 to {EXACT_HORIZON} steps, got {horizon}")
        self.horizon = horizon
        self.coefficients = sqrt_coefficients(horizon)
        self.integers = integer_coefficients(horizon)
        self.norm = math.sqrt(float(np.sum(self.coefficients**2)))
        self.rho = rho
        self.delta_units = sensitivity
        # ||R~||_{1->2} rounded up to a multiple of 2^-B
        self.norm_bound = Fraction(
            _ceil_sqrt(sum(v * v for v in self.integers)), 1 << PRECISION_BITS
        )
        sigma_units = (
            sensitivity * float(self.norm_bound) / math.sqrt(2 * rho) if rho > 0 else math.inf
        )
        if math.isfinite(sigma_units) and sigma_units > 0:
            # floor(log2(sigma_units)) exactly, whatever the platform's log2 rounds to
            self.exponent = math.frexp(sigma_units)[1] - 1 - LATTICE_BITS
            lattice = Fraction(2) ** self.exponent
            self.sensitivity_bound = sensitivity * self.norm_bound / lattice + _ceil_sqrt(
                partitions * horizon
            )
            exact = self.sensitivity_bound**2 / (2 * Fraction(rho))
            # rounded up to a multiple of 2^-20 (a shorter key for the sampler's plans)
            self.sigma2 = Fraction(math.ceil(exact * (1 << 20)), 1 << 20)
            self.lattice = float(lattice)
            # z's standard deviation in the stream's units
            self.sigma = self.lattice * math.sqrt(float(self.sigma2))
        else:  # no rho: infinite noise, which `prepare` refuses
            self.exponent, self.lattice, self.sigma = 0, 1.0, math.inf
            self.sensitivity_bound, self.sigma2 = Fraction(0), Fraction(0)

    def prepare(self) -> None:
        """OutOfRange unless z can be drawn exactly (sigma_z^2 <= 2^80) and the releases
        stay well inside int64 (r_T's standard deviation at most MAX_DEVIATION)."""
        deviation = self.sigma * self.norm
        if not deviation <= MAX_DEVIATION:  # also NaN
            raise OutOfRange(
                f"Gaussian noise of standard deviation {deviation:.4g} cannot be drawn exactly "
                "(running totals are exact up to a standard deviation of 2^48)"
            )
        if not 0 < self.sigma2 <= _MAX_SIGMA2:
            raise OutOfRange(
                f"Gaussian noise of variance {float(self.sigma2):.4g} lattice steps cannot be "
                "drawn exactly (the sampler's range ends at 2^80)"
            )

    def noise(self, rng: np.random.Generator) -> np.ndarray:
        """z_1..z_T: exact discrete Gaussian draws in lattice units (int64)."""
        return discrete_gaussian(self.sigma2, self.horizon, rng)

    def quantize(self, convolved: Sequence[int]) -> list[int]:
        """q_t = round(c_t 2^-B / h), half up, for c = F * x (exact)."""
        shift = PRECISION_BITS + self.exponent  # c_t / 2^shift
        if shift <= 0:
            return [c << -shift for c in convolved]
        half = 1 << (shift - 1)
        return [(c + half) >> shift for c in convolved]

    def releases(self, y: np.ndarray, start: int) -> np.ndarray:
        """r_t = h (L y)_t for start <= t < len(y), in floating point (post-processing)."""
        stop = len(y)
        if stop - start <= 32:
            f = self.coefficients
            out = [float(np.dot(f[t::-1], y[: t + 1])) for t in range(start, stop)]
            return np.array(out, dtype=np.float64) * self.lattice
        size = 1 << (2 * stop - 1).bit_length()
        spectrum = np.fft.rfft(self.coefficients[:stop], size) * np.fft.rfft(y, size)
        return np.fft.irfft(spectrum, size)[start:stop] * self.lattice

    def extend(
        self,
        exact: Sequence[int],
        quantized: Sequence[int],
        z: np.ndarray,
        new: Sequence[int],
        last_release: float | None = None,
    ) -> tuple[list[int], np.ndarray]:
        """The new steps' q and releases, given the past steps' exact values and q, z for the
        whole horizon, and the new steps' exact values. `last_release`, the last past
        step's stored release, must be what its q and z give again (NoiseMismatch if not:
        other noise, from another sampler or platform, would be a second noise on q
        already released, which no proof covers)."""
        start = len(exact)
        stop = start + len(new)
        if stop > self.horizon:
            raise ValueError(f"the stream's horizon of {self.horizon} steps is over")
        if len(quantized) != start:
            raise NoiseMismatch("the stored steps and their q do not match")
        values = [*exact, *(int(v) for v in new)]
        fresh = self.quantize(convolve_exact(self.integers, values, start, stop))
        # q as floats (q beyond 2^53 rounds: post-processing of y, which floats may round)
        y = np.array([*quantized, *fresh], dtype=np.float64) + z[:stop]
        if start and last_release is not None:
            again = float(self.releases(y[:start], start - 1)[0])
            tolerance = 2.0**-20 * self.sigma * self.norm + 2.0**-40 * abs(last_release)
            if not abs(again - last_release) <= tolerance:
                raise NoiseMismatch("its noise, drawn again, is not what it released")
        return fresh, self.releases(y, start)

    def variance(self) -> np.ndarray:
        """Var(r_t) = h^2 sigma_z^2 sum_{k<t} f(k)^2 for t = 1..T (around the bias above)."""
        return self.sigma**2 * np.cumsum(self.coefficients**2)


def laplace_tree(
    horizon: int, epsilon: float, sensitivity: int, *, honaker: bool = True
) -> BinaryTree:
    """The pure-epsilon tree: exact discrete Laplace of scale levels * sensitivity / epsilon."""
    levels = max(0, math.ceil(math.log2(horizon))) + 1
    node = DiscreteLaplace(levels * sensitivity, epsilon)
    node.prepare()  # OutOfRange now, not at the first draw
    scale = node.exact_scale
    return BinaryTree(
        horizon,
        node.variance(),
        lambda size, rng: discrete_laplace(scale, size, rng),
        honaker=honaker,
        name="binary tree, Laplace",
    )


class ContinualStream:
    """One stream of a counter under a key: feed per-step values, get noisy running totals.

    The noise for the whole horizon is drawn when the stream opens (see the
    counter), so each `step` is O(1); `resume` continues a stream whose first
    steps were released before, e.g. after a restart.
    """

    def __init__(
        self,
        counter: BinaryTree | Factorization,
        key: int,
        stream: int = 0,
        *,
        noise: np.ndarray | None = None,
    ):
        """`noise`, when given, is `counter.noise` under (key, stream), kept from before."""
        self.noise = counter.noise(keyed_generator(key, stream)) if noise is None else noise
        self.steps = 0
        self.total = 0.0

    def resume(self, steps: int, total: float) -> None:
        self.steps, self.total = steps, total

    def step(self, value: float) -> float:
        if self.steps >= len(self.noise):
            raise ValueError(f"the stream's horizon of {len(self.noise)} steps is over")
        self.total += value
        self.steps += 1
        return self.total + float(self.noise[self.steps - 1])

    def extend(self, values: np.ndarray) -> np.ndarray:
        """Releases for several new steps at once (vectorised `step`)."""
        count = len(values)
        if self.steps + count > len(self.noise):
            raise ValueError(f"the stream's horizon of {len(self.noise)} steps is over")
        totals = self.total + np.cumsum(np.asarray(values, dtype=np.float64))
        releases = totals + self.noise[self.steps : self.steps + count]
        if count:
            self.total = float(totals[-1])
        self.steps += count
        return releases


__all__ = [
    "EXACT_HORIZON",
    "MAX_DEVIATION",
    "NOISE_GRID",
    "PRECISION_BITS",
    "BinaryTree",
    "ContinualStream",
    "ExactFactorization",
    "Factorization",
    "NoiseMismatch",
    "column_norm_squared",
    "convolve_exact",
    "integer_coefficients",
    "keyed_generator",
    "laplace_tree",
    "sqrt_coefficients",
]
