"""The shape every noise mechanism shares (it knows nothing of SQL).

A mechanism is built for one sensitivity and one privacy parameter, carries
its own privacy cost (like an OpenDP measurement carries its privacy map), and
adds noise to a whole numpy array of true values at once. Also here: the one
search every mechanism's exact central interval uses, at any miss probability.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Protocol, runtime_checkable

import numpy as np

from dpsql.accounting import Cost
from dpsql.errors import InternalError

COVERAGE_MISS = 0.05  # interval95 leaves at most this probability outside


def valid_miss(miss: float) -> float:
    """`miss`, the probability an interval may leave outside, or a ValueError unless it
    lies strictly between 0 and 1."""
    if not 0 < miss < 1:
        raise ValueError(f"a miss probability must lie strictly between 0 and 1, got {miss!r}")
    return float(miss)


@functools.lru_cache(maxsize=64)  # a few constants (COVERAGE_MISS): 8 us each release
def miss_probability(miss: float) -> Fraction:
    """`miss` as an exact rational no larger than it, for exact tail comparisons: the short
    fraction it prints as (0.05 is 1/20, below the float 0.05) unless that is larger than
    the float, then the float's own value. A ValueError unless 0 < miss < 1."""
    exact = Fraction(valid_miss(miss))
    short = exact.limit_denominator(1 << 32)
    return short if short <= exact else exact


class OutOfRange(ValueError):
    """A mechanism's parameters lie beyond what its exact sampler can draw: a noise scale
    too large for its integer arithmetic, or probabilities too close together for its
    tables. Raised when the mechanism is built or prepared, before any draw."""


@contextmanager
def drawable(what: str) -> Iterator[None]:
    """Turn the refusal of a sampler (or of its closed forms) to take these parameters
    into OutOfRange, naming `what` could not be drawn."""
    try:
        yield
    except OutOfRange:
        raise
    except (ValueError, ArithmeticError, InternalError) as exc:
        raise OutOfRange(f"{what} cannot be drawn exactly ({exc})") from exc


@runtime_checkable
class NoiseMechanism(Protocol):
    """Adds calibrated noise to an array of exact aggregates.

    `name` is the family ("laplace", "staircase" or "gaussian"); `cost` is the
    privacy cost in the family's natural unit: pure epsilon for Laplace and
    staircase, zCDP rho (Cost(rho=...)) for Gaussian.
    """

    name: str
    sensitivity: float
    cost: Cost

    @property
    def scale(self) -> float:
        """The noise scale: Delta/epsilon for Laplace and staircase, sigma for Gaussian."""

    def prepare(self) -> None:
        """Build the sampler and the exact 95% interval now (both are cached); raise
        OutOfRange if these parameters are beyond them. Callers that charge for a draw
        prepare first, so that no draw fails after the charge."""

    def half_width(self, miss: float) -> float:
        """Exact half-width w with P(|noise| > w) <= miss, the smallest on the output grid."""

    def sample(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Noisy copies of `values`, one independent draw per element."""

    def interval95(self) -> float:
        """half_width(COVERAGE_MISS): the central 95% interval's half-width."""

    def expected_abs_error(self) -> float:
        """E|noise| in closed form."""

    def variance(self) -> float:
        """Var(noise) in closed form."""


def smallest_covering(tail_exceeds: Callable[[int], bool], guess: int) -> int:
    """The smallest m >= 0 with not tail_exceeds(m), for a tail that decreases in m.

    `guess` comes from floating point and is only a starting point: the answer
    is decided by `tail_exceeds`, which the caller computes exactly.
    """
    # gallop from the guess to a bracket low < answer <= high, then bisect; the guess is
    # usually off by 0 or 1, so this costs two or three exact evaluations
    high, step = max(0, guess), 1
    if tail_exceeds(high):
        low = high
        while tail_exceeds(high := low + step):
            low, step = high, step * 2
    else:
        low = high - 1
        while low >= 0 and not tail_exceeds(low):
            high, low, step = low, low - step, step * 2
    while high - low > 1:  # low < 0 stands for a tail taken as exceeding
        middle = (low + high) // 2
        if tail_exceeds(middle):
            low = middle
        else:
            high = middle
    return high
