"""Hierarchical histograms: noisy b-ary trees over bins that answer every range count.

The n bins are padded with zeros to b^h leaves and summed into levels 1..h
(level h holds the leaves; the root, the total, is not measured: it would
cost a whole level of sensitivity and add almost nothing, as Qardaji et al.
2013 note). Each unit adds its (at most `contributions`) rows to one node per
level, so the L1 sensitivity of the tree is levels * contributions, and every
node gets exact discrete Laplace noise of that scale over epsilon (not
log2(levels): seed 000's bug). The Gaussian variant (for (epsilon, delta)
budgets, calibrated in zCDP) uses the L2 sensitivity instead: a unit changes
each level by at most `contributions` in L2, so the whole tree by
contributions * sqrt(levels), and every node gets exact discrete Gaussian
noise with sigma^2 = contributions^2 * levels / (2 rho) (CKS 2020, Theorem 14).
For long ranges the Gaussian's sqrt(levels) beats the Laplace's levels.

A range [start, stop) of bins is answered in one of two ways:

- consistent (default): the least-squares consistent tree (Hay et al. 2010,
  generalised to branching b as in Qardaji et al. 2013), computed in two
  linear passes; a range is then a difference of prefix sums of the
  consistent leaves. It is the best linear unbiased estimator from the noisy
  nodes (Gauss-Markov), so no other linear combination of them, the flat
  leaf sum included, has a lower variance.
- raw: without consistency, the lower-variance of the b-adic decomposition
  (at most (b - 1)(2 ceil(log_b r) + 1) nodes) and the sum of the r flat
  leaves (better for very short ranges).

Variances are exact closed forms. For the consistent tree the variance of a
range q is sigma^2 q^T (A^T A)^{-1} q, evaluated in O(levels) in the b-ary
Haar eigenbasis of A^T A (A maps leaves to nodes): the functions constant on
level-j blocks with zero sum on level-(j-1) blocks form an eigenspace with
eigenvalue lambda_j = sum of b^(h - l) over the measured levels l >= j.

The 95% interval is conservative, from an exact tail bound: the estimator's
noise is sum_v w_v Z_v with independent discrete Laplace Z_v. Its moment
generating function is at most that of continuous Laplace of the same scale
(log(sinh x / x) is convex), and -log(1 - x) is convex, so with
Q = sum w_v^2 and W = max |w_v| the Chernoff bound is
P(|noise| > t) <= 2 min_u exp(-u t) (1 - s^2 W^2 u^2)^(-Q / W^2). The half-width
is the smallest t where that is <= 5%: about 1.4 standard deviations wider
than a normal approximation for long ranges, but guaranteed. Q and W come
from the same closed forms (W from the <= 2 partial nodes per level and their
children, where the estimator's weights can vary).

For the Gaussian variant the interval comes from sub-Gaussianity: a discrete
Gaussian with parameter sigma satisfies E[e^(uZ)] <= e^(u^2 sigma^2 / 2)
(Canonne, Kamath and Steinke 2020), so sum_v w_v Z_v is sub-Gaussian with
variance proxy sigma^2 Q and P(|noise| > t) <= 2 exp(-t^2 / (2 sigma^2 Q)):
t = sigma sqrt(2 Q log 40), guaranteed, about 1.39 times the normal 1.96 sd.
"""

from __future__ import annotations

import base64
import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.mechanisms.base import COVERAGE_MISS, valid_miss
from dpsql.mechanisms.gaussian import DiscreteGaussian
from dpsql.mechanisms.grid import privacy_parameter
from dpsql.mechanisms.laplace import DiscreteLaplace

_SQRT_BITS = 32  # the L2 sensitivity is rounded up to a multiple of 2^-32
_NEWTON_STEPS = 20  # a cap: K from 1e-3 to 1e12 needs at most 5
_NEWTON_TOLERANCE = 1e-12  # relative to the half-width, far below the 1e-9 margin
_CHUNK = 1 << 13  # elements in range_weights' largest array per chunk: 64 KB stays in cache


@dataclass(frozen=True)
class TreeShape:
    """The geometry of a b-ary tree over `bins` leaves (padded to a power of b)."""

    bins: int
    branching: int

    def __post_init__(self) -> None:
        if self.bins < 1 or self.branching < 2:
            raise ValueError(
                f"need bins >= 1 and branching >= 2, got {self.bins}, {self.branching}"
            )

    @functools.cached_property
    def height(self) -> int:
        height, leaves = 0, 1
        while leaves < self.bins:
            height, leaves = height + 1, leaves * self.branching
        return height

    @property
    def top(self) -> int:
        """The first measured level: 1 (below the root), or 0 for a single bin."""
        return 1 if self.height else 0

    @property
    def levels(self) -> int:
        """How many levels are measured: the sensitivity per contributed row."""
        return self.height + 1 - self.top

    def sizes(self) -> list[int]:
        """Nodes per measured level, top first."""
        return [self.branching**level for level in range(self.top, self.height + 1)]

    @property
    def leaves(self) -> int:
        return self.branching**self.height

    def block(self, level: int) -> int:
        """How many leaves one node of `level` covers."""
        return self.branching ** (self.height - level)

    @functools.cached_property
    def eigenvalues(self) -> np.ndarray:
        """lambda_j = sum of b^(h - l) over measured l >= j: A^T A on the level-j Haar subspace."""
        b, h = self.branching, self.height
        return np.array([(b ** (h - max(j, self.top) + 1) - 1) / (b - 1) for j in range(h + 1)])

    @functools.cached_property
    def blocks(self) -> np.ndarray:
        """block(level) for every level, root first."""
        return np.array([self.block(level) for level in range(self.height + 1)])

    def node_bound(self, length: int) -> int:
        """(b - 1)(2 ceil(log_b r) + 1): the most nodes a range of `length` bins needs."""
        depth, span = 0, 1
        while span < length:
            depth, span = depth + 1, span * self.branching
        return (self.branching - 1) * (2 * depth + 1)


def decompose(shape: TreeShape, start: int, stop: int) -> list[tuple[int, int]]:
    """The b-adic nodes (level, index) that cover bins [start, stop) exactly, fewest first-found."""
    _check_range(shape, start, stop)
    nodes: list[tuple[int, int]] = []
    b, low, high, level = shape.branching, start, stop, shape.height
    while low < high:
        if level == shape.top:
            nodes.extend((level, index) for index in range(low, high))
            break
        while low < high and low % b:
            nodes.append((level, low))
            low += 1
        while low < high and high % b:
            high -= 1
            nodes.append((level, high))
        low, high, level = low // b, high // b, level - 1
    return nodes


def _check_range(shape: TreeShape, start: int, stop: int) -> None:
    if not 0 <= start <= stop <= shape.bins:
        raise ValueError(f"range [{start}, {stop}) is outside the {shape.bins} bins")


def level_sums(shape: TreeShape, counts: np.ndarray) -> list[np.ndarray]:
    """Exact counts of every measured node, top level first."""
    leaves = np.zeros(shape.leaves, dtype=np.int64)
    leaves[: shape.bins] = counts
    levels = [leaves]
    while len(levels[-1]) > 1:
        levels.append(levels[-1].reshape(-1, shape.branching).sum(axis=1))
    return levels[::-1][shape.top :]


def consistent_leaves(shape: TreeShape, noisy: list[np.ndarray]) -> np.ndarray:
    """Leaves of the least-squares consistent tree (Hay et al. 2010), in two linear passes.

    Bottom-up, a node of height k (leaves have height 1) combines its own
    noisy count and its children's estimates with weights (b^k - b^(k-1)) /
    (b^k - 1) and (b^(k-1) - 1) / (b^k - 1); top-down, each child gets an
    equal share of what its parent's final value leaves over.
    """
    b, h, top = shape.branching, shape.height, shape.top
    z = [None] * (h + 1)
    z[h] = noisy[-1].astype(np.float64)
    for level in range(h - 1, top - 1, -1):
        k = h - level + 1
        own = (b**k - b ** (k - 1)) / (b**k - 1)
        children = z[level + 1].reshape(-1, b).sum(axis=1)
        z[level] = own * noisy[level - top] + (1 - own) * children
    final = z[top]  # the top level's nodes have no measured parent to agree with
    for level in range(top + 1, h + 1):
        gap = final - z[level].reshape(-1, b).sum(axis=1)
        final = z[level] + np.repeat(gap / b, b)
    return final[: shape.bins]


def range_weights(
    shape: TreeShape, starts: np.ndarray, stops: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(sum of squared weights, largest |weight|) of the consistent estimator of each range.

    The estimator is w^T (noisy nodes) with w = A (A^T A)^{-1} q. For a node v
    at level l, w_v = b^(h-l) * sum_{j <= l} (c_j - c_{j-1}) / lambda_j, where
    c_j is the fraction of v's level-j ancestor that the range covers: the
    weights change only along the two boundary paths. All levels are computed
    at once (a levels axis), so one range costs a few dozen numpy calls, not a
    few dozen per level; ranges go in chunks that bound the temporary arrays.
    """
    a = np.asarray(starts, dtype=np.int64)
    e = np.asarray(stops, dtype=np.int64)
    squares, largest = np.empty(a.shape), np.empty(a.shape)
    chunk = max(1, _CHUNK // ((shape.height + 1) * shape.branching))
    flat = (a.reshape(-1), e.reshape(-1), squares.reshape(-1), largest.reshape(-1))
    for first in range(0, flat[0].size, chunk):
        part = slice(first, first + chunk)
        flat[2][part], flat[3][part] = _weights(shape, flat[0][part], flat[1][part])
    return squares, largest


def _weights(shape: TreeShape, a: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """range_weights of 1-d `a`, `e`: arrays are (path, level[, child], range)."""
    b, lam, size = shape.branching, shape.eigenvalues[:, None], shape.blocks[:, None]
    paths = np.stack([a // size, (e - 1) // size])  # the left and the right boundary path
    left, right = (paths[0] + 1) * size - a, e - paths[1] * size
    norm = np.where(
        paths[0] == paths[1],
        (e - a) ** 2 / size,
        (left**2 + right**2) / size + (paths[1] - paths[0] - 1) * size,
    )
    # summed level by level (cumsum's order, unlike sum's, does not depend on the shape):
    # a range gets the same bits alone as in a batch
    squares = np.cumsum(np.maximum(_increments(norm), 0) / lam, axis=0)[-1]
    covered = _coverage(paths, size, a, e)
    g = np.cumsum(_increments(covered.swapaxes(0, 1)).swapaxes(0, 1) / lam, axis=1)
    largest = np.abs(size * g)[:, shape.top :].max(axis=(0, 1), initial=0.0)
    if shape.height:  # the children of each path node, one level down; ranges last, so
        # the reductions over paths, levels and children are elementwise maxima of rows
        child_size = size[1:, None]
        children = paths[:, :-1, None] * b + np.arange(b)[:, None]
        child_cover = _coverage(children, child_size, a, e)
        child_g = g[:, :-1, None] + (child_cover - covered[:, :-1, None]) / lam[1:, None]
        largest = np.maximum(largest, np.abs(child_size * child_g).max(axis=(0, 1, 2)))
    return squares, largest


def _increments(values: np.ndarray) -> np.ndarray:
    """Each level's value minus the level above's (the top's minus 0), along axis 0:
    np.diff with prepend, without its wrappers' cost (a tenth of a one-range answer)."""
    steps = values.copy()
    steps[1:] -= values[:-1]
    return steps


def _coverage(node: np.ndarray, size: np.ndarray, a: np.ndarray, e: np.ndarray) -> np.ndarray:
    low = node * size
    return np.maximum(np.minimum(e, low + size) - np.maximum(a, low), 0) / size


def chernoff_halfwidths(
    scale: float, squares: np.ndarray, largest: np.ndarray, miss: float = COVERAGE_MISS
) -> np.ndarray:
    """Half-widths t with P(|sum_v w_v Z_v| > t) <= miss for discrete Laplace Z_v of `scale`.

    `squares` = sum w_v^2 and `largest` = max |w_v|, per estimate. In units of
    s W the half-width depends only on K = squares / largest^2: it is where
    f(tau) = min over v of -v tau - K log(1 - v^2) (the log of the one-sided
    bound) crosses log(miss / 2). f is a minimum of lines in tau, so concave and
    decreasing, with slope -v at the optimum v = tau / (sqrt(K^2 + tau^2) + K).
    Newton's method therefore lands at or beyond the crossing from any start
    (a concave function lies below its tangents) and then descends to it
    without passing it: every iterate from the first on is a valid, wider
    half-width, and a few iterations reach 1e-12 of it (bisection took 40).
    K is rounded down by 1e-9 (a smaller K gives a wider bound) and the result
    up by 1e-9, so float rounding never narrows the interval.
    """
    squares, largest = np.asarray(squares, dtype=float), np.asarray(largest, dtype=float)
    valid = (squares > 0) & (largest > 0)
    ratio = np.where(valid, squares / np.where(valid, largest, 1) ** 2 * (1 - 1e-9), 1.0)
    target = math.log(valid_miss(miss) / 2)
    # about the answer: sqrt(4 K log(2/miss)) + log(2/miss)
    tau = np.sqrt(4 * ratio * -target) - target
    squared = ratio * ratio
    for _ in range(_NEWTON_STEPS):
        v = tau / (np.sqrt(squared + tau * tau) + ratio)
        step = (-v * tau - ratio * np.log1p(-v * v) - target) / v
        tau = tau + step
        if (np.abs(step) <= _NEWTON_TOLERANCE * tau).all():
            break
    return np.where(valid, scale * largest * tau * (1 + 1e-9), 0.0)


def subgaussian_halfwidths(
    sigma: float, squares: np.ndarray, miss: float = COVERAGE_MISS
) -> np.ndarray:
    """Half-widths t with P(|sum_v w_v Z_v| > t) <= miss for discrete Gaussians Z_v of `sigma`.

    `squares` = sum w_v^2 per estimate. Rounded up by 1e-9 so float rounding
    never narrows the interval.
    """
    squares = np.asarray(squares, dtype=float)
    return sigma * np.sqrt(2 * squares * math.log(2 / valid_miss(miss))) * (1 + 1e-9)


def l2_sensitivity(levels: int, contributions: int) -> Fraction:
    """contributions * sqrt(levels), rounded up to a rational (exact for square `levels`).

    A rational keeps the Gaussian's sigma^2 exact, and rounding up never adds too
    little noise (a float sqrt may round down).
    """
    scaled = levels << (2 * _SQRT_BITS)
    root = math.isqrt(scaled)
    root += root * root < scaled
    return contributions * Fraction(root, 1 << _SQRT_BITS)


def laplace_node_noise(
    shape: TreeShape, epsilon: float | Fraction, contributions: int = 1
) -> DiscreteLaplace:
    """The noise on each node of a tree that is epsilon-DP when each unit adds at most
    `contributions` to the counts in total (it reaches one node per level)."""
    return DiscreteLaplace(contributions * shape.levels, epsilon)


def gaussian_node_noise(
    shape: TreeShape, rho: float | Fraction, contributions: int = 1
) -> DiscreteGaussian:
    """The noise on each node of a rho-zCDP tree (L2 sensitivity contributions * sqrt(levels))."""
    return DiscreteGaussian(l2_sensitivity(shape.levels, contributions), rho)


@dataclass(frozen=True)
class Estimate:
    """A noisy range count with its exact variance and a guaranteed 95% half-width."""

    value: float
    variance: float
    interval95: float
    estimator: str  # "consistent tree", "tree nodes" or "flat leaves"


NodeNoise = DiscreteLaplace | DiscreteGaussian


class HierarchicalHistogram:
    """A released noisy tree over bins; every range answer is post-processing of it."""

    def __init__(self, shape: TreeShape, noisy: list[np.ndarray], noise: NodeNoise):
        self.shape = shape
        self.noisy = noisy
        self.noise = noise
        self._prefix: np.ndarray | None = None

    @classmethod
    def build(
        cls,
        counts: np.ndarray,
        branching: int,
        epsilon: float | Fraction,
        rng: np.random.Generator,
        contributions: int = 1,
    ) -> HierarchicalHistogram:
        """Noisy tree of the exact per-bin `counts`, epsilon-DP when each unit adds at most
        `contributions` to the counts in total."""
        shape = TreeShape(len(counts), branching)
        return cls.measure(counts, shape, laplace_node_noise(shape, epsilon, contributions), rng)

    @classmethod
    def build_gaussian(
        cls,
        counts: np.ndarray,
        branching: int,
        rho: float | Fraction,
        rng: np.random.Generator,
        contributions: int = 1,
    ) -> HierarchicalHistogram:
        """Noisy tree of the exact per-bin `counts`, rho-zCDP when each unit adds at most
        `contributions` to the counts in total (L2 sensitivity contributions * sqrt(levels))."""
        shape = TreeShape(len(counts), branching)
        return cls.measure(counts, shape, gaussian_node_noise(shape, rho, contributions), rng)

    @classmethod
    def measure(
        cls, counts: np.ndarray, shape: TreeShape, noise: NodeNoise, rng: np.random.Generator
    ) -> HierarchicalHistogram:
        """Every measured node of `counts`' tree, plus independent `noise`."""
        return cls(shape, [noise.sample(level, rng) for level in level_sums(shape, counts)], noise)

    @functools.cached_property
    def node_variance(self) -> float:
        """The variance of each node's noise (exact, from Fractions: worth keeping)."""
        return self.noise.variance()

    @property
    def mechanism(self) -> str:
        """The node noise: 'laplace' or 'gaussian'."""
        return self.noise.name

    def halfwidths(
        self, squares: np.ndarray, largest: np.ndarray, miss: float = COVERAGE_MISS
    ) -> np.ndarray:
        """Guaranteed half-widths (P(|error| > t) <= miss, 95% by default) of estimates with
        these sums and maxima of |weights|."""
        if isinstance(self.noise, DiscreteGaussian):
            return subgaussian_halfwidths(self.noise.scale, squares, miss)
        return chernoff_halfwidths(self.noise.scale, squares, largest, miss)

    @property
    def prefix(self) -> np.ndarray:
        """Prefix sums of the consistent leaves: range [a, b) is prefix[b] - prefix[a]."""
        if self._prefix is None:
            leaves = consistent_leaves(self.shape, self.noisy)
            self._prefix = np.concatenate([[0.0], np.cumsum(leaves)])
        return self._prefix

    def answer(self, start: int, stop: int, consistent: bool = True) -> Estimate:
        """The count over bins [start, stop), from the lowest-variance estimator available."""
        _check_range(self.shape, start, stop)
        if start == stop:
            return Estimate(0.0, 0.0, 0.0, "empty range")
        if consistent:
            squares, largest = range_weights(self.shape, np.array([start]), np.array([stop]))
            (halfwidth,) = self.halfwidths(squares, largest)
            value = self.prefix[stop] - self.prefix[start]
            return Estimate(float(value), float(squares[0]) * self.node_variance,
                            float(halfwidth), "consistent tree")  # fmt: skip
        nodes = decompose(self.shape, start, stop)
        length = stop - start
        if length <= len(nodes):
            value, count, estimator = int(self.noisy[-1][start:stop].sum()), length, "flat leaves"
        else:
            value = sum(int(self.noisy[level - self.shape.top][index]) for level, index in nodes)
            count, estimator = len(nodes), "tree nodes"
        (halfwidth,) = self.halfwidths(np.array([count]), np.ones(1))
        return Estimate(float(value), count * self.node_variance, float(halfwidth), estimator)

    def answers(
        self, starts: np.ndarray, stops: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Consistent answers, exact variances and 95% half-widths of many ranges at once."""
        starts, stops = np.asarray(starts), np.asarray(stops)
        values = self.prefix[stops] - self.prefix[starts]
        nonempty = stops > starts
        squares, largest = range_weights(
            self.shape, np.where(nonempty, starts, 0), np.where(nonempty, stops, 1)
        )
        squares, largest = np.where(nonempty, squares, 0.0), np.where(nonempty, largest, 0.0)
        return values, squares * self.node_variance, self.halfwidths(squares, largest)

    # -- persistence ----------------------------------------------------------

    def to_json(self) -> dict:
        nodes = np.concatenate(self.noisy).astype("<i8")
        data = {
            "bins": self.shape.bins,
            "branching": self.shape.branching,
            "nodes": base64.b64encode(nodes.tobytes()).decode("ascii"),
        }
        if isinstance(self.noise, DiscreteGaussian):
            # rebuilt as build_gaussian builds it, to the same exact sigma^2; the
            # sensitivity is contributions * sqrt(levels) rounded up by < 2^-32
            contributions = self.noise.sensitivity / math.sqrt(self.shape.levels)
            rho = privacy_parameter(self.noise.rho, "rho")
            return {**data, "mechanism": "gaussian", "contributions": round(contributions),
                    "rho": str(rho), "sigma2": str(self.noise.sigma2)}  # fmt: skip
        return {**data, "sensitivity": self.noise.sensitivity, "scale": str(self.noise.exact_scale)}

    @classmethod
    def from_json(cls, data: dict) -> HierarchicalHistogram:
        shape = TreeShape(int(data["bins"]), int(data["branching"]))
        nodes = np.frombuffer(base64.b64decode(data["nodes"]), dtype="<i8").astype(np.int64)
        sizes = shape.sizes()
        if len(nodes) != sum(sizes):
            raise ValueError("stored tree does not match its shape")
        noisy = np.split(nodes, np.cumsum(sizes)[:-1])
        if data.get("mechanism") == "gaussian":
            sensitivity = l2_sensitivity(shape.levels, int(data["contributions"]))
            noise = DiscreteGaussian(sensitivity, Fraction(data["rho"]))
            if noise.sigma2 != Fraction(data["sigma2"]):
                raise ValueError("stored Gaussian tree does not match its noise parameters")
            return cls(shape, noisy, noise)
        sensitivity = int(data["sensitivity"])
        # epsilon as sensitivity / scale, so the scale comes back exactly
        noise = DiscreteLaplace(sensitivity, sensitivity / Fraction(data["scale"]))
        return cls(shape, noisy, noise)
