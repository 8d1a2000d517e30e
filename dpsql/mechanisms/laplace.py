"""Laplace-type noise that cannot leak through floating point.

Counts (integer queries) get exact discrete Laplace noise, the geometric
mechanism: P(Z = k) proportional to a^|k| with a = exp(-epsilon/Delta), which
is epsilon-DP for integer sensitivity Delta.

Sums (real-valued queries) get the same integer noise on a power-of-two grid,
as in Google's secure noise generation (mechanisms.md 1.3): the true value is
rounded to the nearest multiple of g, integer noise times g is added, and the
result is a float multiple of g. Rounding moves each input by at most g/2, so
neighbouring inputs differ by at most Delta + g after rounding, and the noise
uses that inflated sensitivity. Every output lies on g*Z whatever the input,
so the set of possible outputs carries nothing about the true value (Mironov
2012). We take g = the smallest power of two >= (Delta/epsilon) / 2^19, not
Google's 2^40: the extra error is below (1 + 2/epsilon) * 2^-19 of the noise
(Google's Prop. 2), about 6e-6 at epsilon = 1, and the grid noise then has
scale <= 2^19 + 1/epsilon, which our sampler draws from two random words.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np

from dpsql.accounting import Cost
from dpsql.mechanisms.base import NoiseMechanism
from dpsql.mechanisms.samplers import ExactReal, discrete_laplace

GRANULARITY_BITS = 19
_COVERAGE = Fraction(19, 20)
_GRID_LIMIT = 1 << 62  # grid indices stay far inside int64 after the noise is added


def _positive(value: float | Fraction, name: str) -> Fraction:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    exact = Fraction(value)
    if exact <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return exact


def _tail_exceeds(scale: Fraction, m: int) -> bool:
    """Whether P(|Z| > m) = 2 a^(m+1) / (1+a) is above 1 - 0.95 (never equal: it is irrational)."""
    tail = 2 * ExactReal.exp_neg((m + 1) / scale) / (1 + ExactReal.exp_neg(1 / scale))
    return tail.exceeds(1 - _COVERAGE)


@functools.lru_cache(maxsize=256)  # exact, hence slow-ish; the same scales recur query after query
def interval95_units(scale: Fraction) -> int:
    """The smallest integer m with P(|Z| <= m) >= 0.95 for discrete Laplace of this scale."""
    a = math.exp(-1 / scale)
    m = max(0, math.ceil(math.log((1 - float(_COVERAGE)) * (1 + a) / 2) * -float(scale)) - 1)
    while _tail_exceeds(scale, m):
        m += 1
    while m > 0 and not _tail_exceeds(scale, m - 1):
        m -= 1
    return m


def _abs_error_units(scale: Fraction) -> float:
    """E|Z| = 2a / (1 - a^2), written with expm1 so large scales keep their digits."""
    rate = float(1 / scale)
    return 2 * math.exp(-rate) / -math.expm1(-2 * rate)


def _variance_units(scale: Fraction) -> float:
    """Var Z = 2a / (1 - a)^2."""
    rate = float(1 / scale)
    return 2 * math.exp(-rate) / math.expm1(-rate) ** 2


class DiscreteLaplace:
    """The geometric mechanism for integer queries: value + Z with Z ~ DLap(Delta/epsilon)."""

    name = "discrete_laplace"

    def __init__(self, sensitivity: int, epsilon: float | Fraction) -> None:
        if isinstance(sensitivity, float) and sensitivity.is_integer():
            sensitivity = int(sensitivity)
        if not isinstance(sensitivity, int | np.integer) or sensitivity < 1:
            raise ValueError(f"integer sensitivity must be an int >= 1, got {sensitivity!r}")
        self.sensitivity = int(sensitivity)
        self.epsilon = epsilon
        self.cost = Cost.of(epsilon, 0)
        self.exact_scale = Fraction(self.sensitivity) / _positive(epsilon, "epsilon")

    @property
    def scale(self) -> float:
        return float(self.exact_scale)

    def sample(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        array = np.asarray(values)
        if array.dtype.kind == "f":
            if not np.all(np.isfinite(array)) or not np.all(array == np.rint(array)):
                raise ValueError("discrete Laplace adds integer noise to integer values only")
        elif array.dtype.kind not in "iub":
            raise ValueError(f"discrete Laplace needs integer values, got dtype {array.dtype}")
        exact = array.astype(np.int64)
        if exact.size and np.abs(exact).max() > _GRID_LIMIT:
            raise ValueError("value too large for exact int64 noise addition")
        noise = discrete_laplace(self.exact_scale, exact.size, rng)
        return exact + noise.reshape(exact.shape)

    def interval95(self) -> float:
        return interval95_units(self.exact_scale)

    def expected_abs_error(self) -> float:
        return _abs_error_units(self.exact_scale)

    def variance(self) -> float:
        return _variance_units(self.exact_scale)


class GridLaplace:
    """Discrete Laplace on the grid g*Z for real-valued queries (sums).

    Output = g * (round(value / g) + Z) with Z ~ discrete Laplace of scale
    (Delta + g) / (epsilon * g) grid steps, i.e. noise scale (Delta + g)/epsilon.
    interval95, expected_abs_error and variance describe the added noise g*Z;
    the rounding of the input adds at most g/2 on top (g <= scale * 2^-18).
    """

    name = "laplace_grid"

    def __init__(self, sensitivity: float | Fraction, epsilon: float | Fraction) -> None:
        delta = _positive(sensitivity, "sensitivity")
        eps = _positive(epsilon, "epsilon")
        self.sensitivity = float(sensitivity)
        self.epsilon = epsilon
        self.cost = Cost.of(epsilon, 0)
        target = delta / eps / (1 << GRANULARITY_BITS)
        exponent = target.numerator.bit_length() - target.denominator.bit_length()
        while Fraction(2) ** exponent < target:
            exponent += 1
        while Fraction(2) ** (exponent - 1) >= target:
            exponent -= 1
        if not -1000 <= exponent <= 900:
            raise ValueError("sensitivity/epsilon is outside the range of float64 grids")
        self.exponent = exponent
        self.granularity = math.ldexp(1.0, exponent)
        self._inverse = math.ldexp(1.0, -exponent)
        grid = Fraction(2) ** exponent
        self.grid_scale = (delta + grid) / (eps * grid)
        self._exact_scale = (delta + grid) / eps

    @property
    def scale(self) -> float:
        return float(self._exact_scale)

    def round_to_grid(self, values: np.ndarray) -> np.ndarray:
        """The nearest grid index of each value (ties to even), exactly."""
        # a product with a power of two is exact unless it underflows, and what
        # underflows is below 2^-1022 grid steps, which rounds to 0 anyway
        steps = np.rint(np.asarray(values, dtype=np.float64) * self._inverse)
        # one reduction catches NaN (max is NaN), infinities and indices too large for int64
        if steps.size and not np.abs(steps).max() <= _GRID_LIMIT:
            raise ValueError("grid Laplace needs finite values within 2^62 grid steps")
        return steps.astype(np.int64)

    def sample(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        steps = self.round_to_grid(values)
        noisy = steps + discrete_laplace(self.grid_scale, steps.size, rng).reshape(steps.shape)
        # int -> float rounds only beyond 2^53 steps, onto a coarser power-of-two grid (still
        # on g*Z); the product with g is then exact, as the exponent range leaves headroom
        return noisy.astype(np.float64) * self.granularity

    def interval95(self) -> float:
        return self.granularity * interval95_units(self.grid_scale)

    def expected_abs_error(self) -> float:
        return self.granularity * _abs_error_units(self.grid_scale)

    def variance(self) -> float:
        return self.granularity**2 * _variance_units(self.grid_scale)


def laplace_for(sensitivity: float, epsilon: float, integer: bool) -> NoiseMechanism:
    """Discrete Laplace for integer-valued queries, grid Laplace for real-valued ones."""
    if integer:
        return DiscreteLaplace(sensitivity, epsilon)
    return GridLaplace(sensitivity, epsilon)
