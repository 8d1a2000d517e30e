"""Laplace noise that cannot leak through floating point.

Counts (integer queries) get exact discrete Laplace noise, the geometric
mechanism: P(Z = k) proportional to a^|k| with a = exp(-epsilon/Delta), which
is epsilon-DP for integer sensitivity Delta.

Sums (real-valued queries) get the same integer noise on a power-of-two grid
(see grid.py). Neighbouring inputs differ by at most Delta + g after
rounding, and the noise uses that inflated sensitivity. We take g = the
smallest power of two >= (Delta/epsilon) / 2^19, not Google's 2^40: the extra
error is below (1 + 2/epsilon) * 2^-19 of the noise (Google's Prop. 2), about
6e-6 at epsilon = 1, and the grid noise then has scale <= 2^19 + 1/epsilon,
which our sampler draws from two random words.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np

from dpsql.accounting import Cost
from dpsql.mechanisms.base import (
    COVERAGE_MISS,
    NoiseMechanism,
    drawable,
    miss_probability,
    smallest_covering,
)
from dpsql.mechanisms.grid import (
    GridMechanism,
    as_float,
    as_integers,
    integer_sensitivity,
    positive,
    power_of_two_exponent,
    privacy_parameter,
)
from dpsql.mechanisms.pool import Draw
from dpsql.mechanisms.samplers import ExactReal, laplace_sampler

GRANULARITY_BITS = 19


def _tail_exceeds(scale: Fraction, miss: Fraction, m: int) -> bool:
    """Whether P(|Z| > m) = 2 a^(m+1) / (1+a) is above `miss` (never equal: it is irrational)."""
    tail = 2 * ExactReal.exp_neg((m + 1) / scale) / (1 + ExactReal.exp_neg(1 / scale))
    return tail.exceeds(miss)


@functools.lru_cache(maxsize=1024)  # exact, hence slow-ish; every release reports its interval
def half_width_units(scale: Fraction, miss: Fraction) -> int:
    """The smallest integer m with P(|Z| > m) <= miss for discrete Laplace of this scale.

    The closed form: P(|Z| > m) = 2 a^(m+1) / (1 + a) with a = e^(-1/scale), so m is
    ceil(scale * ln(2 / (miss (1 + a)))) - 1; evaluated in floating point it is only
    the first guess, and the exact comparison decides.
    """
    a = math.exp(-1 / scale)
    guess = math.ceil(math.log(float(miss) * (1 + a) / 2) * -float(scale)) - 1
    return smallest_covering(functools.partial(_tail_exceeds, scale, miss), guess)


# Below this rate 1/scale, 2a/(1 - a^2) is 1/rate and 2a/(1 - a)^2 is 2/rate^2 to far
# below a double's precision, and the expm1 forms would underflow (division by zero).
_TINY_RATE = 1e-100


def _abs_error_units(scale: Fraction) -> float:
    """E|Z| = 2a / (1 - a^2), written with expm1 so large scales keep their digits."""
    rate = float(1 / scale)
    if rate < _TINY_RATE:
        return as_float(scale)
    return 2 * math.exp(-rate) / -math.expm1(-2 * rate)


def _variance_units(scale: Fraction) -> float:
    """Var Z = 2a / (1 - a)^2."""
    rate = float(1 / scale)
    if rate < _TINY_RATE:
        return 2.0 * as_float(scale) * as_float(scale)  # inf beyond double range, not an error
    return 2 * math.exp(-rate) / math.expm1(-rate) ** 2


class DiscreteLaplace:
    """The geometric mechanism for integer queries: value + Z with Z ~ DLap(Delta/epsilon)."""

    name = "laplace"

    def __init__(self, sensitivity: int, epsilon: float | Fraction) -> None:
        self.sensitivity = integer_sensitivity(sensitivity)
        self.epsilon = epsilon
        self.cost = Cost.of(epsilon, 0)
        self.exact_scale = Fraction(self.sensitivity) / privacy_parameter(epsilon, "epsilon")

    @classmethod
    def with_scale(cls, scale: Fraction, epsilon: float | Fraction) -> DiscreteLaplace:
        """Noise of an exact rational scale (grid units); its cost is still `epsilon`."""
        mechanism = cls(1, epsilon)
        mechanism.exact_scale = scale
        return mechanism

    @property
    def scale(self) -> float:
        return as_float(self.exact_scale)

    @functools.cached_property
    def noise(self) -> Draw:
        """noise(size, rng): the pooled sampler, bound at the first sample (its tables take ms to
        build)."""
        return laplace_sampler(self.exact_scale)

    def prepare(self) -> None:
        with drawable(f"discrete Laplace noise of scale {self.scale:.4g}"):
            self.noise  # noqa: B018 -- builds (and caches) the sampler
            self.interval95()

    def sample(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        exact = as_integers(values, "discrete Laplace")
        return exact + self.noise(exact.size, rng).reshape(exact.shape)

    def half_width(self, miss: float) -> float:
        return half_width_units(self.exact_scale, miss_probability(miss))

    def interval95(self) -> float:
        return self.half_width(COVERAGE_MISS)

    def expected_abs_error(self) -> float:
        return _abs_error_units(self.exact_scale)

    def variance(self) -> float:
        return _variance_units(self.exact_scale)


class GridLaplace(GridMechanism):
    """Discrete Laplace on the grid g*Z for real-valued queries (sums).

    Output = g * (round(value / g) + Z) with Z ~ discrete Laplace of scale
    (Delta + g) / (epsilon * g) grid steps, i.e. noise scale (Delta + g)/epsilon
    (g <= scale * 2^-18).
    """

    name = "laplace"

    def __init__(self, sensitivity: float | Fraction, epsilon: float | Fraction) -> None:
        delta = positive(sensitivity, "sensitivity")
        eps = privacy_parameter(epsilon, "epsilon")
        self.sensitivity = float(sensitivity)
        self.epsilon = epsilon
        self.cost = Cost.of(epsilon, 0)
        with drawable(f"Laplace noise of scale {as_float(delta / eps):.4g}"):
            exponent = power_of_two_exponent(delta / eps / (1 << GRANULARITY_BITS))
        grid = Fraction(2) ** exponent
        self.grid_scale = (delta + grid) / (eps * grid)
        self._set_grid(exponent, DiscreteLaplace.with_scale(self.grid_scale, epsilon))


def laplace_for(sensitivity: float, epsilon: float, integer: bool) -> NoiseMechanism:
    """Discrete Laplace for integer-valued queries, grid Laplace for real-valued ones."""
    if integer:
        return DiscreteLaplace(sensitivity, epsilon)
    return GridLaplace(sensitivity, epsilon)
