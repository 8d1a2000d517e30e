"""The shape every noise mechanism shares (it knows nothing of SQL).

A mechanism is built for one sensitivity and one privacy parameter, carries
its own privacy cost (like an OpenDP measurement carries its privacy map), and
adds noise to a whole numpy array of true values at once.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from dpsql.accounting import Cost


@runtime_checkable
class NoiseMechanism(Protocol):
    """Adds calibrated noise to an array of exact aggregates."""

    name: str
    sensitivity: float
    cost: Cost

    @property
    def scale(self) -> float:
        """The noise scale parameter (Delta/epsilon for Laplace)."""

    def sample(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Noisy copies of `values`, one independent draw per element."""

    def interval95(self) -> float:
        """Exact half-width h with P(|noise| <= h) >= 0.95, the smallest on the output grid."""

    def expected_abs_error(self) -> float:
        """E|noise| in closed form."""

    def variance(self) -> float:
        """Var(noise) in closed form."""
