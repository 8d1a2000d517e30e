"""Where noise lives: exact integer inputs, and the power-of-two grid for real-valued queries.

Integer mechanisms add integer noise to int64 values. A real-valued query
(a SUM of floats) is released on the grid g*Z, as in Google's secure noise
generation (mechanisms.md 1.3): the true value is rounded to the nearest
multiple of g, integer noise times g is added, and the result is a float
multiple of g. Rounding moves each input by at most g/2, so neighbouring
inputs, Delta apart, land at most floor(Delta/g) + 1 grid steps apart, and the
integer noise is calibrated to that. Every output lies on g*Z whatever the
input, so the set of possible outputs carries nothing about the true value
(Mironov 2012).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Protocol

import numpy as np

from dpsql.accounting import Cost
from dpsql.mechanisms.pool import Draw
from dpsql.mechanisms.samplers import constant

GRID_LIMIT = 1 << 62  # grid indices stay far inside int64 after the noise is added


def positive(value: float | Fraction, name: str) -> Fraction:
    """`value` as an exact positive rational, or a ValueError that says what was wrong."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    exact = Fraction(value)
    if exact <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return exact


def as_float(value: Fraction) -> float:
    """`value` as a float; infinity beyond the largest (float() raises there)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def privacy_parameter(value: float | Fraction, name: str) -> Fraction:
    """A positive epsilon or rho exactly as the ledger counts it (a float is the decimal it
    prints as), so that the noise spends precisely the cost that is charged."""
    positive(value, name)
    return Cost.of(value).epsilon


def integer_sensitivity(sensitivity: int | float) -> int:
    """An integer sensitivity >= 1 (an integral float is accepted), or a ValueError."""
    if isinstance(sensitivity, float) and sensitivity.is_integer():
        sensitivity = int(sensitivity)
    if not isinstance(sensitivity, int | np.integer) or sensitivity < 1:
        raise ValueError(
            f"integer sensitivity must be an int >= 1, got {sensitivity!r}; "
            "use the grid mechanism for real-valued sensitivities"
        )
    return int(sensitivity)


def as_integers(values: np.ndarray, mechanism: str) -> np.ndarray:
    """`values` as int64, refusing anything that is not an exact integer within 2^62."""
    array = np.asarray(values)
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or not np.all(array == np.rint(array)):
            raise ValueError(
                f"{mechanism} adds integer noise to integer values only; "
                "use its grid version for real values"
            )
        # just beyond the limit: the cast stays inside int64 and the check below refuses it
        array = np.clip(array, -(2.0**62 + 1024), 2.0**62 + 1024)
    elif array.dtype.kind not in "iub":
        raise ValueError(f"{mechanism} needs integer values, got dtype {array.dtype}")
    exact = array if array.dtype == np.int64 else array.astype(np.int64)
    # INT64_MIN, the only value abs leaves negative, is far beyond the limit too
    if exact.size and not 0 <= np.abs(exact).max() <= GRID_LIMIT:
        raise ValueError("value too large for exact int64 noise addition (limit 2^62)")
    return exact


def power_of_two_exponent(target: Fraction) -> int:
    """The k with 2^(k-1) < target <= 2^k, for a grid no coarser than needed."""
    exponent = target.numerator.bit_length() - target.denominator.bit_length()
    while Fraction(2) ** exponent < target:
        exponent += 1
    while Fraction(2) ** (exponent - 1) >= target:
        exponent -= 1
    if not -1000 <= exponent <= 900:
        raise ValueError("the noise scale is outside the range of float64 grids")
    return exponent


def steps_apart(sensitivity: Fraction, granularity: Fraction) -> int:
    """How many grid steps apart inputs `sensitivity` apart can round: floor(Delta/g) + 1."""
    return math.floor(sensitivity / granularity) + 1


class IntegerNoise(Protocol):
    """The integer mechanism a grid mechanism runs in grid units."""

    scale: float

    def sample(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...

    @property
    def noise(self) -> Draw:
        """noise(size, rng): `size` values of the noise alone, what sample adds to the
        integers it has checked."""

    def half_width(self, miss: float) -> float: ...

    def interval95(self) -> float: ...

    def expected_abs_error(self) -> float: ...

    def variance(self) -> float: ...

    def prepare(self) -> None: ...


class GridMechanism:
    """An integer mechanism run on the grid g*Z = 2^exponent * Z for real-valued queries.

    Subclasses set name, sensitivity, cost, and call `_set_grid` with the
    exponent and the integer mechanism to run in grid steps. half_width,
    interval95, expected_abs_error and variance describe the added noise g*Z; the rounding
    of the input adds at most g/2 on top.
    """

    name: str
    sensitivity: float
    cost: Cost

    def _set_grid(self, exponent: int, steps: IntegerNoise) -> None:
        self.exponent = exponent
        self.granularity = math.ldexp(1.0, exponent)
        # 0-d arrays: a scalar operand costs ~0.2 us more a call (samplers.constant)
        self._granularity = constant(self.granularity, np.float64)
        self._inverse = constant(math.ldexp(1.0, -exponent), np.float64)
        self.steps = steps

    @property
    def scale(self) -> float:
        return self.granularity * float(self.steps.scale)

    def prepare(self) -> None:
        self.steps.prepare()

    def round_to_grid(self, values: np.ndarray) -> np.ndarray:
        """The nearest grid index of each value (ties to even), exactly."""
        # a product with a power of two is exact unless it underflows, and what
        # underflows is below 2^-1022 grid steps, which rounds to 0 anyway
        steps = np.rint(np.asarray(values, dtype=np.float64) * self._inverse)
        # one reduction catches NaN (max is NaN), infinities and indices too large for int64
        if steps.size and not np.abs(steps).max() <= GRID_LIMIT:
            raise ValueError(f"{self.name} needs finite values within 2^62 grid steps")
        return steps.astype(np.int64)

    def sample(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        # grid indices are int64 within 2^62 already: the integer mechanism's own check of
        # its input would be a second one (1.4 us of a single value's 20)
        steps = self.round_to_grid(values)
        noisy = steps + self.steps.noise(steps.size, rng).reshape(steps.shape)
        # int -> float rounds only beyond 2^53 steps, onto a coarser power-of-two grid (still
        # on g*Z); the product with g is then exact, as the exponent range leaves headroom
        return noisy.astype(np.float64) * self._granularity

    def half_width(self, miss: float) -> float:
        return self.granularity * self.steps.half_width(miss)

    def interval95(self) -> float:
        return self.granularity * self.steps.interval95()

    def expected_abs_error(self) -> float:
        return self.granularity * self.steps.expected_abs_error()

    def variance(self) -> float:
        return self.granularity**2 * self.steps.variance()
