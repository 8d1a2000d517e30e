"""Partition selection: which group keys taken from the data may be released.

A key is released only when a noisy count of the distinct units in its group
reaches a threshold tau. Each unit appears in at most `max_partitions` groups,
so the unit counts have L1 sensitivity `max_partitions`; they get discrete
Laplace noise of scale max_partitions/epsilon. A group that holds one unit
alone (the only groups whose existence depends on that unit) passes with
probability at most delta/max_partitions, so the whole selection is
(epsilon, delta)-DP (Wilson et al. 2020, with discrete noise).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.accounting import Cost
from dpsql.mechanisms.base import drawable
from dpsql.mechanisms.laplace import DiscreteLaplace


def threshold(epsilon: float, delta: float, max_partitions: int) -> int:
    """The smallest integer tau with P(1 + Z >= tau) <= delta / max_partitions.

    Z is discrete Laplace with a = exp(-epsilon/max_partitions), for which
    P(Z >= j) = a^j / (1 + a) when j >= 1.
    """
    if not 0 < delta < 1:
        raise ValueError("partition selection needs 0 < delta < 1")
    per_partition = delta / max_partitions
    rate = epsilon / max_partitions  # -ln(a)
    a = math.exp(-rate)
    steps = max(1, math.ceil((-math.log(per_partition) - math.log1p(a)) / rate))
    # guard against rounding in the logarithms: the bound must hold, never just nearly
    while math.exp(-rate * steps) / (1 + a) > per_partition:
        steps += 1
    while steps > 1 and math.exp(-rate * (steps - 1)) / (1 + a) <= per_partition:
        steps -= 1
    return 1 + steps


@dataclass(frozen=True)
class PartitionSelection:
    """Noisy thresholding of distinct-unit counts; carries its own cost."""

    epsilon: float
    delta: float
    max_partitions: int

    @property
    def cost(self) -> Cost:
        return Cost.of(self.epsilon, self.delta)

    # Both are found once per selection (a plan's, shared by its every release): they
    # depend on the parameters alone, and a race builds the same value twice, harmlessly.
    @functools.cached_property
    def tau(self) -> int:
        return threshold(self.epsilon, self.delta, self.max_partitions)

    @functools.cached_property
    def noise(self) -> DiscreteLaplace:
        """The unit counts' noise mechanism (it holds no draw: each `keep` draws afresh)."""
        return DiscreteLaplace(self.max_partitions, Fraction(self.epsilon))

    def prepare(self) -> None:
        """Compute tau and build the noise's sampler now; OutOfRange if either cannot be."""
        # the noise first: within its scales, tau's search takes a few steps (far beyond
        # them, its guard loops would step one by one through some 1e300 values)
        self.noise.prepare()
        with drawable(f"partition selection at epsilon {self.epsilon:g}"):
            self.tau  # noqa: B018 -- the threshold's own arithmetic can overflow

    def keep(self, unit_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A boolean mask of the groups whose noisy unit count reaches tau."""
        return self.noise.sample(np.asarray(unit_counts, dtype=np.int64), rng) >= self.tau
