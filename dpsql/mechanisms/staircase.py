"""The staircase mechanism (Geng and Viswanath 2016), exact on the integer grid.

For integer sensitivity Delta and b = e^-epsilon, the noise has pmf
P(Z = i) proportional to b^k * w(j) where |i| = k*Delta + j (0 <= j < Delta),
w(j) = 1 on the first `r` points of each block (the high step) and b on the
rest, and i = 0 counted once. The pmf is symmetric, non-increasing in |i| and
P(i + Delta) = b * P(i) for i >= 0, so P(Z = i) / P(Z = i + d) <= e^epsilon
for every |d| <= Delta: epsilon-DP, with the bound attained. Drawing a sign and
a magnitude with the magnitude 0 possible under both signs would give 0 twice
its weight, P(0) / P(Delta) = 2 e^epsilon; here 0 is its own outcome.

r is the discrete gamma * Delta: gamma = 1/(1 + e^(epsilon/2)) minimises the
continuous E|X| ("abs"), and the reference's cube-root formula its variance
("var"); we take the integer r near gamma * Delta whose exact discrete E|X|
(or variance) is smallest. For Delta = 1 the staircase is the geometric
mechanism (r = 1, w = 1), so Staircase(1, epsilon) is discrete Laplace and
uses its sampler.

Sampling (time independent of the value): |Z| = 0 with probability p0, else
1 + G*Delta + j' with G geometric(b) and j' in 0..Delta-1 of weight w(j'+1)
(w(Delta) = b), sign fair. One word picks zero/high/low step by comparing
with exact thresholds (its low bit is the sign), one word picks j' uniformly
within the step, and G is exact geometric(b) (samplers.GeometricSampler).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np

from dpsql.accounting import Cost
from dpsql.mechanisms.base import COVERAGE_MISS, drawable, miss_probability, smallest_covering
from dpsql.mechanisms.grid import (
    GridMechanism,
    as_integers,
    integer_sensitivity,
    positive,
    power_of_two_exponent,
    privacy_parameter,
    steps_apart,
)
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.mechanisms.pool import Draw
from dpsql.mechanisms.samplers import (
    ExactReal,
    Sampler,
    SortedCuts,
    cut_table,
    exact_geometric,
    ratio_cuts,
    signed,
    uniform_below,
)

GRID_STEPS_BITS = 20  # a block of the grid staircase spans about 2^20 grid steps
_MAX_SENSITIVITY = (1 << 31) - 1  # uniform_below draws offsets below 2^32
_TABLE_OFFSETS = 4096  # up to here one table holds every offset of a block


def continuous_gamma(epsilon: float, objective: str) -> float:
    """The optimal gamma of the continuous staircase, for E|X| ("abs") or variance ("var")."""
    if objective == "abs":
        return 1 / (1 + math.exp(epsilon / 2))
    if objective == "var":
        b = math.exp(-epsilon)
        root = (b - 2 * b**2 + 2 * b**4 - b**5) ** (1 / 3)
        return -b / (1 - b) + root / (2 ** (1 / 3) * (1 - b) ** 2)
    raise ValueError(
        f"staircase gamma must be 'abs', 'var' or a number in [0, 1], got {objective!r}"
    )


class _Shape:
    """Closed forms of the discrete staircase (Delta, r, b), in floating point."""

    def __init__(self, delta: int, r: int, epsilon: float) -> None:
        self.delta, self.r = delta, r
        self.b = math.exp(-epsilon)
        self.one_minus_b = -math.expm1(-epsilon)
        self.block = r + self.b * (delta - r)  # W: weight of one block

    def _sums(self) -> tuple[float, float]:
        """S1 = sum j w(j) and S2 = sum j^2 w(j) over one block."""
        r, d, b = self.r, self.delta, self.b
        s1 = r * (r - 1) / 2 + b * (d * (d - 1) - r * (r - 1)) / 2
        s2 = _squares(r) + b * (_squares(d) - _squares(r))
        return s1, s2

    def _normaliser(self) -> float:
        """Total weight over Z divided by 2: W/(1-b) - 1/2 (0 counted once)."""
        return self.block / self.one_minus_b - 0.5

    def expected_abs(self) -> float:
        s1, _ = self._sums()
        om, b = self.one_minus_b, self.b
        return (self.delta * self.block * b / om**2 + s1 / om) / self._normaliser()

    def variance(self) -> float:
        s1, s2 = self._sums()
        om, b, d = self.one_minus_b, self.b, self.delta
        second = d * d * self.block * b * (1 + b) / om**3 + 2 * d * s1 * b / om**2 + s2 / om
        return second / self._normaliser()

    def tail(self, m: int) -> float:
        """P(|X| > m) in floating point, for the interval search's first guess."""
        k, j = divmod(m, self.delta)
        b, om, w = self.b, self.one_minus_b, self.block
        covered = min(j + 1, self.r) + b * max(0, j + 1 - self.r)
        return 2 * b**k * (om * (w - covered) + b * w) / (2 * w - om)


def _squares(n: int) -> float:
    """0^2 + 1^2 + ... + (n-1)^2."""
    return (n - 1) * n * (2 * n - 1) / 6


def _best_steps(delta: int, epsilon: float, gamma: float | str) -> int:
    """r: the number of grid points in each block's high step."""
    if not isinstance(gamma, str):
        if not 0 <= gamma <= 1:
            raise ValueError(f"staircase gamma must be in [0, 1], got {gamma}")
        return min(delta, max(1, round(gamma * delta)))
    centre = math.floor(continuous_gamma(epsilon, gamma) * delta)
    candidates = {min(delta, max(1, centre + offset)) for offset in range(-2, 4)}

    def objective(r: int) -> float:
        shape = _Shape(delta, r, epsilon)
        return shape.expected_abs() if gamma == "abs" else shape.variance()

    return min(sorted(candidates), key=objective)


class _Plan(Sampler):
    """The exact sampler of one discrete staircase (Delta >= 2, r, epsilon).

    Every probability is (A + B b) / (C + D b) with integers A..D, the
    denominator being the total weight (1 - b) + 2 (r - 1) + 2 b (Delta - r + 1).
    For Delta up to _TABLE_OFFSETS one word picks zero or the offset j' from a
    table of all of them; above, one word picks zero / high step / low step
    and a second the offset within the step.
    """

    def __init__(self, delta: int, r: int, epsilon: Fraction) -> None:
        super().__init__()
        b = ExactReal.exp_neg(epsilon)
        total = (2 * r - 1, 2 * delta - 2 * r + 1)
        if delta <= _TABLE_OFFSETS:
            # cut k >= 1: P(0) plus both signs of the first k offsets (weight 1 below r - 1)
            cuts = [(1 + 2 * min(k, r - 1), -1 + 2 * max(0, k - r + 1)) for k in range(delta)]
            self._table = cut_table(*ratio_cuts(b, cuts, total))
            self._words = 1
            outcomes = delta  # outcome k >= 1 is the offset j' = k - 1
        else:
            cuts = [(1, -1)] + ([(2 * r - 1, -1)] if r > 1 else [])  # P(0), P(0) + P(high step)
            self._steps = SortedCuts(*ratio_cuts(b, cuts, total))
            # (1 + first j', how many j') of the high step (if any) and the low step
            kinds = ([(1, r - 1)] if r > 1 else []) + [(r, delta - r + 1)]
            self._start = np.array([0] + [start for start, _ in kinds], dtype=np.int64)
            self._count = np.array([1] + [count for _, count in kinds], dtype=np.uint64)
            self._words = 2
            self.chunk_size //= 2  # the words of a chunk: one pass's size
            outcomes = len(kinds)
        # by outcome of the first word: what one block adds to |Z| (nothing when Z = 0)
        self._block_step = np.array([0] + [delta] * outcomes, dtype=np.int64)
        self._blocks = exact_geometric(epsilon)

    def chunk(self, size: int, rng: np.random.Generator) -> np.ndarray:
        words = rng.bit_generator.random_raw((self._words, size))
        index, steps = self._offsets(words, rng)  # steps: 0 for Z = 0, else 1 + j'
        magnitude = steps + self._blocks.chunk(size, rng) * self._block_step.take(index)
        return signed(magnitude, words[0])

    def _offsets(
        self, words: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """The first word's outcome index, and 1 + j' (0 for Z = 0)."""
        table = self._table if self._words == 1 else self._steps
        index, tie = table.index(words[0])
        for at in tie.nonzero()[0]:
            index[at] = table.exact_index(int(words[0, at]), rng)
        if self._words == 1:
            return index, index
        # Z = 0 has count 1, so its uniform offset is 0, and start 0
        within = uniform_below(self._count.take(index), words[1], rng)
        return index, self._start.take(index) + within


@functools.lru_cache(maxsize=64)
def _plan(delta: int, r: int, epsilon: Fraction) -> _Plan:
    return _Plan(delta, r, epsilon)


class Staircase:
    """The staircase mechanism for integer queries: value + Z, Z a discrete staircase.

    gamma: "abs" (least E|X|), "var" (least variance) or a number in [0, 1];
    `steps` is the resulting r, the number of grid points in each high step.
    """

    name = "staircase"

    def __init__(
        self, sensitivity: int, epsilon: float | Fraction, gamma: float | str = "abs"
    ) -> None:
        self.sensitivity = integer_sensitivity(sensitivity)
        if self.sensitivity > _MAX_SENSITIVITY:
            raise ValueError("staircase sensitivity must be below 2^31; use GridStaircase")
        self.exact_epsilon = privacy_parameter(epsilon, "epsilon")
        self.epsilon = epsilon
        self.cost = Cost.of(epsilon, 0)
        self.gamma = gamma
        # the closed forms overflow float64 once e^epsilon does (epsilon above about 709)
        with drawable(f"staircase noise for sensitivity {self.sensitivity} at epsilon {epsilon}"):
            self.steps = _best_steps(self.sensitivity, float(epsilon), gamma)
            self._shape = _Shape(self.sensitivity, self.steps, float(epsilon))
        # Delta = 1: the staircase is the geometric mechanism, whose sampler is cheaper
        self._geometric = DiscreteLaplace(1, epsilon) if self.sensitivity == 1 else None

    @property
    def scale(self) -> float:
        return self.sensitivity / float(self.exact_epsilon)

    @functools.cached_property
    def noise(self) -> Draw:
        """noise(size, rng): the pooled sampler, bound at the first sample (its tables take ms to
        build)."""
        if self._geometric is not None:
            return self._geometric.noise
        return _plan(self.sensitivity, self.steps, self.exact_epsilon).sample

    def prepare(self) -> None:
        with drawable(f"staircase noise for sensitivity {self.sensitivity} at epsilon "
                      f"{self.epsilon}"):  # fmt: skip
            self.noise  # noqa: B018 -- builds (and caches) the sampler
            self.interval95()

    def sample(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        exact = as_integers(values, "the staircase mechanism")
        return exact + self.noise(exact.size, rng).reshape(exact.shape)

    def weight_exponent(self, i: int) -> int:
        """e with P(Z = i) = P(Z = 0) * e^(-epsilon * e): the exact pmf, up to its constant."""
        k, j = divmod(abs(i), self.sensitivity)
        return k + (j >= self.steps)

    def half_width(self, miss: float) -> float:
        if self._geometric is not None:
            return self._geometric.half_width(miss)
        return _half_width(self.sensitivity, self.steps, self.exact_epsilon, miss_probability(miss))

    def interval95(self) -> float:
        return self.half_width(COVERAGE_MISS)

    def expected_abs_error(self) -> float:
        if self._geometric is not None:  # the same number, to the last bit, as Laplace's
            return self._geometric.expected_abs_error()
        return self._shape.expected_abs()

    def variance(self) -> float:
        if self._geometric is not None:
            return self._geometric.variance()
        return self._shape.variance()


@functools.lru_cache(maxsize=256)  # exact, hence slow-ish; the same mechanisms recur
def _half_width(delta: int, r: int, epsilon: Fraction, miss: Fraction) -> int:
    """The smallest m with P(|Z| > m) <= miss, decided with exact arithmetic on the
    staircase's own tail (below): a float search brackets it, the exact tail decides."""
    b = ExactReal.exp_neg(epsilon)
    block = r + b * (delta - r)

    def tail_exceeds(m: int) -> bool:
        # P(|Z| > m) = 2 b^k ((1-b)(W - C(j)) + b W) / (2W - (1-b)), m = k Delta + j,
        # C(j) the weight of offsets 0..j of a block
        k, j = divmod(m, delta)
        covered = min(j + 1, r) + b * max(0, j + 1 - r)
        tail = 2 * ExactReal.exp_neg(k * epsilon) * ((1 - b) * (block - covered) + b * block)
        return (tail / (2 * block - (1 - b))).exceeds(miss)

    shape = _Shape(delta, r, float(epsilon))
    low, high = 0, 1
    rough = float(miss)
    while shape.tail(high) > rough:  # a floating-point bracket for the first guess
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if shape.tail(middle) > rough else (low, middle)
    return smallest_covering(tail_exceeds, high)


class GridStaircase(GridMechanism):
    """The staircase on the grid g*Z for real-valued queries (sums).

    g is the smallest power of two >= Delta / 2^20, so a block spans about 2^20
    grid steps and the discrete staircase is the continuous one to within one
    part in a million; inputs Delta apart round at most floor(Delta/g) + 1 steps
    apart, and the integer staircase is calibrated to that.
    """

    name = "staircase"

    def __init__(
        self, sensitivity: float | Fraction, epsilon: float | Fraction, gamma: float | str = "abs"
    ) -> None:
        delta = positive(sensitivity, "sensitivity")
        self.sensitivity = float(sensitivity)
        self.epsilon = epsilon
        self.cost = Cost.of(epsilon, 0)
        with drawable(f"staircase noise for sensitivity {self.sensitivity}"):
            exponent = power_of_two_exponent(delta / (1 << GRID_STEPS_BITS))
        steps = Staircase(steps_apart(delta, Fraction(2) ** exponent), epsilon, gamma)
        self._set_grid(exponent, steps)
