"""Partition selection: a lone unit's key is released with probability <= delta/k."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpsql.mechanisms.samplers import secure_generator
from dpsql.mechanisms.selection import PartitionSelection, threshold


def release_probability(epsilon: float, max_partitions: int, tau: int) -> float:
    """P(1 + Z >= tau) for discrete Laplace Z of scale max_partitions/epsilon (closed form)."""
    a = math.exp(-epsilon / max_partitions)
    return a ** (tau - 1) / (1 + a)


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-6, 1e-9])
@pytest.mark.parametrize("max_partitions", [1, 5, 10])
def test_threshold_is_the_smallest_that_bounds_delta(epsilon, delta, max_partitions):
    tau = threshold(epsilon, delta, max_partitions)
    assert release_probability(epsilon, max_partitions, tau) <= delta / max_partitions
    assert release_probability(epsilon, max_partitions, tau - 1) > delta / max_partitions


def test_threshold_matches_the_continuous_laplace_reference():
    # mechanisms.md section 7: continuous Laplace tau = 14.12 at C = 1, eps = 1, delta = 1e-6
    assert threshold(1.0, 1e-6, 1) == 15  # the discrete threshold is the next integer up


def test_a_lone_unit_is_released_at_most_delta_of_the_time():
    selection = PartitionSelection(epsilon=1.0, delta=1e-2, max_partitions=1)
    counts = np.ones(400_000, dtype=np.int64)
    released = selection.keep(counts, secure_generator(3)).mean()
    bound = release_probability(1.0, 1, selection.tau)
    # 6 standard errors of a binomial proportion above the exact probability
    assert released <= bound + 6 * math.sqrt(bound * (1 - bound) / counts.size)
    assert selection.cost.delta == Fraction("0.01")
