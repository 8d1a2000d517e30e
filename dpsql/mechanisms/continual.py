"""Continual counting: noisy running totals over a fixed horizon of T steps (knows nothing of SQL).

Two counters, each a data-independent noise vector eta (one value per step)
drawn once from a keyed generator, so that the release at step t is
S_t + eta_t, a stream restarted from the same key continues with the same
noise, and a past release never changes:

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
  The noise L z is precomputed for the whole horizon by one FFT convolution,
  O(T log T) once, after which a step costs O(1).

The release is S_t + eta_t with eta independent of the data and snapped to a
power-of-two grid, so no floating-point arithmetic ever touches the data:
adding a grid value to an integer (or grid) total is exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from randomgen import AESCounter

from dpsql.mechanisms.base import OutOfRange
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
    "MAX_DEVIATION",
    "NOISE_GRID",
    "BinaryTree",
    "ContinualStream",
    "Factorization",
    "column_norm_squared",
    "keyed_generator",
    "laplace_tree",
    "sqrt_coefficients",
]
