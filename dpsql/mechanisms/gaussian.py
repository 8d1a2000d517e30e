"""The discrete Gaussian mechanism (Canonne, Kamath and Steinke 2020), exact and vectorised.

Noise Z on the integers with P(Z = k) proportional to exp(-k^2 / (2 sigma^2)).
For a query of L2 sensitivity Delta, sigma^2 = Delta^2 / (2 rho) gives
rho-zCDP (CKS Theorem 14), the same as the continuous Gaussian; the ledger
converts zCDP to (epsilon, delta) with CKS Proposition 12 (accounting.py).
rho is taken exactly as the ledger counts it, so sigma^2 is an exact rational.

Sampling follows CKS Algorithm 3 on whole arrays: a candidate Y is exact
discrete Laplace of scale t (samplers.py), accepted with probability
exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)); accepted candidates are exactly
N_Z(0, sigma^2) for any t > 0, since e^(-|y|/t) times that probability is
proportional to e^(-y^2 / (2 sigma^2)). CKS take t = floor(sigma) + 1; we take
sigma rounded down to a multiple of 1/64, which accepts 70-76% of candidates
where theirs accepts 54% at sigma = 1. The acceptance is decided by comparing a uniform
64-bit word with that probability computed in floating point with a rigorous
error margin (relative 2^-36, while the float evaluation is good to 2^-43, see
`_accept`): outside the margin the float comparison is provably the exact
answer; inside it (probability < 2^-34) the decision is made exactly with
ExactReal. So every decision is exact and costs the same numpy operations.

Time does not reveal the noise: a batch draws about n / acceptance candidates
at once (oversampled, so one pass almost always suffices) and keeps the first n
accepted in order. In rejection sampling the number of candidates used is
independent of the values accepted, so neither the passes nor the time carry
information about the output. Each candidate costs the same fixed work.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from statistics import NormalDist

import numpy as np

from dpsql.accounting import Cost
from dpsql.mechanisms.base import (
    COVERAGE_MISS,
    OutOfRange,
    drawable,
    miss_probability,
    smallest_covering,
)
from dpsql.mechanisms.grid import (
    GridMechanism,
    as_float,
    as_integers,
    positive,
    power_of_two_exponent,
    privacy_parameter,
)
from dpsql.mechanisms.pool import Draw
from dpsql.mechanisms.samplers import CHUNK, ExactReal, Sampler, below, constant, exact_laplace

GRANULARITY_BITS = 19  # the grid version runs at sigma ~ 2^19 grid steps, as grid Laplace does
_MAX_SIGMA2 = Fraction(1 << 80)  # t <= 2^40: candidates and their squares stay exact in float64
_MARGIN = constant(2.0**-36, np.float64)  # relative slack around the float acceptance probability
_FLOOR = constant(
    2.0**-62, np.float64
)  # absolute slack, for probabilities too small to have a relative error
_WORD = constant(2.0**-64, np.float64)
_NONE = np.empty(0, dtype=np.int64)
_DIRECT_SIGMA = 1 << 16  # above this the closed forms use Euler-Maclaurin, exact to ~sigma^-4
_CERTAIN = 2.0**-40  # coverage is decided in floating point only this far from 1 - miss
_SMALLEST_MISS = Fraction(1, 1 << 32)


def _floor_sqrt(value: Fraction) -> int:
    """floor(sqrt(p/q)) = isqrt(p*q) // q, exactly."""
    return math.isqrt(value.numerator * value.denominator) // value.denominator


class _Plan(Sampler):
    """The rejection sampler for one sigma^2."""

    def __init__(self, sigma2: Fraction) -> None:
        super().__init__()
        self.sigma2 = sigma2
        self.t = Fraction(max(1, _floor_sqrt(4096 * sigma2)), 64)  # floor(64 sigma) / 64
        self.shift = sigma2 / self.t  # the candidate |Y| most likely to be accepted
        self._shift = constant(float(self.shift), np.float64)
        self._negative_half_inverse = constant(-float(1 / (2 * sigma2)), np.float64)
        self.acceptance = self._acceptance()
        self._laplace = exact_laplace(self.t)
        # outputs per chunk such that one pass of candidates usually fits in CHUNK
        self.chunk_size = max(1, math.floor((CHUNK - 16) * self.acceptance / 1.05))

    def _acceptance(self) -> float:
        """P(a candidate is accepted), in floating point: it only sizes the batches."""
        sigma = math.sqrt(self.sigma2)
        if self.t > 1 << 12:
            # the sum is then an integral to many digits: (sigma/t) sqrt(pi/2) e^(-s^2/(2 sigma^2))
            return (
                sigma
                / self.t
                * math.sqrt(math.pi / 2)
                * math.exp(-(float(self.shift) ** 2) / 2 / sigma**2)
            )
        reach = math.ceil(60 * self.t)
        y = np.arange(-reach, reach + 1, dtype=np.float64)
        a = math.exp(-1 / self.t)
        laplace = (1 - a) / (1 + a) * a ** np.abs(y)
        return float((laplace * self._probability(y)).sum())

    def _probability(self, candidates: np.ndarray) -> np.ndarray:
        """exp(-(|y| - s)^2 / (2 sigma^2)) of float candidates y."""
        gap = np.abs(candidates) - self._shift
        return np.exp(gap * gap * self._negative_half_inverse)

    def chunk(self, size: int, rng: np.random.Generator) -> np.ndarray:
        passes = [_NONE]
        filled = 0
        while filled < size:
            need = size - filled
            # 5% and 16 candidates to spare: a second pass is rare even for a single value
            count = min(CHUNK, math.ceil(need / self.acceptance * 1.05) + 16)
            candidates = self._laplace.draw(count, rng)
            passes.append(candidates[self._accept(candidates, rng)][:need])
            filled += passes[-1].size
        # one pass (nearly always): its accepted candidates are the values, uncopied
        return passes[1] if len(passes) == 2 else np.concatenate(passes)

    def _accept(self, candidates: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Exact Bernoulli(exp(-(|y| - s)^2 / (2 sigma^2))) for each candidate y.

        Float error: |y| <= 2^47 and s are exact or within half an ulp, and where the
        probability exceeds 2^-64 the gap |y| - s is below 10 sigma, so the exponent
        x is off by less than 2^-44 absolutely and np.exp adds a few ulps: the float
        probability is within a relative 2^-43 of the exact one, far inside _MARGIN.
        Converting the word to float moves it by a relative 2^-53, also inside.
        """
        words = rng.bit_generator.random_raw(candidates.size)
        probability = self._probability(candidates.astype(np.float64))
        uniform = words.astype(np.float64) * _WORD
        accept = uniform < probability
        # farther apart than the margin, the float comparison is the exact one (the
        # difference of two floats is within a relative 2^-53 of the exact difference)
        undecided = np.abs(uniform - probability) <= probability * _MARGIN + _FLOOR
        for at in undecided.nonzero()[0]:
            accept[at] = below(self.exact_probability(int(candidates[at])), int(words[at]), rng)
        return accept

    def exact_probability(self, candidate: int) -> ExactReal:
        return ExactReal.exp_neg((abs(candidate) - self.shift) ** 2 / (2 * self.sigma2))


@functools.lru_cache(maxsize=64)
def _plan(sigma2: Fraction) -> _Plan:
    return _Plan(sigma2)


def discrete_gaussian(sigma2: Fraction, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` exact draws of N_Z(0, sigma^2) for an exact rational sigma^2."""
    if not 0 < sigma2 <= _MAX_SIGMA2:
        raise ValueError(f"discrete Gaussian sigma^2 must be in (0, 2^80], got {float(sigma2)}")
    if size < 0:
        raise ValueError("size must be >= 0")
    return _plan(Fraction(sigma2)).sample(size, rng)


class _Sums:
    """Closed forms of N_Z(0, sigma^2) in floating point: sums over the support, or
    Euler-Maclaurin expansions once sigma is large enough that they are exact to float."""

    def __init__(self, sigma2: Fraction) -> None:
        self.sigma2 = float(sigma2)
        self.sigma = math.sqrt(self.sigma2)
        self.direct = self.sigma <= _DIRECT_SIGMA
        if self.direct:
            self._k = np.arange(0, math.ceil(40 * self.sigma) + 2, dtype=np.float64)
            self._weights = np.exp(-(self._k * self._k) / (2 * self.sigma2))
            # the total weight over Z: 0 once, the rest twice
            self.total = 2 * math.fsum(self._weights) - 1
        else:
            # Poisson summation: the total is sigma sqrt(2 pi) up to e^(-2 pi^2 sigma^2)
            self.total = self.sigma * math.sqrt(2 * math.pi)

    def abs_mean(self) -> float:
        if self.direct:
            return 2 * math.fsum(self._k * self._weights) / self.total
        # sum_{k>=1} k e^(-k^2/2s^2) = s^2 - 1/12 + O(s^-2) by Euler-Maclaurin
        return 2 * (self.sigma2 - 1 / 12) / self.total

    def variance(self) -> float:
        if self.direct:
            return 2 * math.fsum(self._k * self._k * self._weights) / self.total
        return self.sigma2  # Poisson summation: the difference is below e^(-2 pi^2 sigma^2)

    def coverage(self, m: int) -> float:
        """P(|Z| <= m), to a relative 2^-44."""
        if self.direct:
            return (2 * math.fsum(self._weights[: m + 1]) - 1) / self.total
        # midpoint rule with its first Euler-Maclaurin correction; the remainder is O(sigma^-4)
        edge = (m + 0.5) / self.sigma
        correction = edge * math.exp(-edge * edge / 2) / (12 * self.sigma2)
        return math.erf(edge / math.sqrt(2)) + correction * self.sigma / self.total


@functools.lru_cache(maxsize=256)
def _sums(sigma2: Fraction) -> _Sums:
    return _Sums(sigma2)


@functools.lru_cache(maxsize=256)
def _half_width(sigma2: Fraction, miss: Fraction) -> int:
    """The smallest m whose coverage is certainly >= 1 - miss (the true smallest unless
    the coverage of m - 1 is within a relative 2^-40 of it, when this may be one more).
    The continuous closed form sigma * z_(1 - miss/2) is only the first guess."""
    if miss < _SMALLEST_MISS:  # the float coverage cannot tell such tails apart from 0
        raise ValueError(f"a Gaussian half-width needs a miss probability >= 2^-32, got {miss}")
    sums = _sums(sigma2)
    guess = math.ceil(sums.sigma * NormalDist().inv_cdf(1 - float(miss) / 2)) - 1

    def tail_exceeds(m: int) -> bool:
        return sums.coverage(m) * (1 - _CERTAIN) < 1 - miss

    return smallest_covering(tail_exceeds, guess)


class DiscreteGaussian:
    """The discrete Gaussian mechanism for integer queries: value + N_Z(0, Delta^2/(2 rho)).

    `sensitivity` is the L2 sensitivity (an integer query's can be sqrt of an
    integer, so any positive real is accepted); the cost is Cost(rho=rho).
    """

    name = "gaussian"

    def __init__(self, sensitivity: float | Fraction, rho: float | Fraction) -> None:
        delta = positive(sensitivity, "sensitivity")
        self.sensitivity = float(sensitivity)
        self.rho = rho
        self.cost = Cost.of(rho=rho)
        self.sigma2 = delta**2 / (2 * privacy_parameter(rho, "rho"))
        if self.sigma2 > _MAX_SIGMA2:
            raise OutOfRange(
                "discrete Gaussian sigma is above 2^40; use GridGaussian for large sensitivities"
            )

    @property
    def scale(self) -> float:
        return math.sqrt(self.sigma2)

    @functools.cached_property
    def noise(self) -> Draw:
        """noise(size, rng): the pooled sampler, bound at the first sample (its tables take ms to
        build)."""
        return _plan(self.sigma2).sample

    def prepare(self) -> None:
        with drawable(f"discrete Gaussian noise of sigma {self.scale:.4g}"):
            self.noise  # noqa: B018 -- builds (and caches) the sampler
            self.interval95()

    def sample(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        exact = as_integers(values, "the discrete Gaussian")
        return exact + self.noise(exact.size, rng).reshape(exact.shape)

    def half_width(self, miss: float) -> float:
        return _half_width(self.sigma2, miss_probability(miss))

    def interval95(self) -> float:
        return self.half_width(COVERAGE_MISS)

    def expected_abs_error(self) -> float:
        return _sums(self.sigma2).abs_mean()

    def variance(self) -> float:
        return _sums(self.sigma2).variance()


class GridGaussian(GridMechanism):
    """The discrete Gaussian on the grid g*Z for real-valued queries (sums).

    g is the smallest power of two >= sigma / 2^19. Rounding moves each changed
    coordinate by at most one grid step, so for a release in which a neighbour
    changes at most `coordinates` values the L2 sensitivity in grid steps is
    Delta/g + sqrt(coordinates) (rounded up to Delta/g + ceil(sqrt(coordinates))).
    """

    name = "gaussian"

    def __init__(
        self, sensitivity: float | Fraction, rho: float | Fraction, coordinates: int = 1
    ) -> None:
        delta = positive(sensitivity, "sensitivity")
        exact_rho = privacy_parameter(rho, "rho")
        if not isinstance(coordinates, int) or coordinates < 1:
            raise ValueError(f"coordinates must be an int >= 1, got {coordinates!r}")
        self.sensitivity = float(sensitivity)
        self.rho = rho
        self.cost = Cost.of(rho=rho)
        # sigma/2^19 <= target: sigma^2 = Delta^2/(2 rho), and a rational bound is enough
        sigma_bound = Fraction(_floor_sqrt(delta**2 / (2 * exact_rho)) + 1)
        with drawable(f"Gaussian noise of sigma {as_float(sigma_bound):.4g}"):
            exponent = power_of_two_exponent(sigma_bound / (1 << GRANULARITY_BITS))
        steps = delta / Fraction(2) ** exponent + (math.isqrt(coordinates - 1) + 1)
        self._set_grid(exponent, DiscreteGaussian(steps, rho))
