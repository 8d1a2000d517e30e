"""Auditing a noise mechanism on its own: neighbouring inputs x and x + sensitivity.

The catalog holds the honest mechanisms of dpsql.mechanisms and two that are
broken on purpose, so that a run shows the auditor can tell them apart:
discrete Laplace with half the noise its claim needs, and x plus numpy's
float Laplace, whose low-order bits give the input away (Mironov 2012).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.accounting import Cost, zcdp_epsilon
from dpsql.audit.events import Finding, audit_outputs, with_low_bits
from dpsql.mechanisms.base import NoiseMechanism
from dpsql.mechanisms.laplace import DiscreteLaplace, GridLaplace


class HalfNoiseLaplace:
    """Broken on purpose: discrete Laplace of scale Delta/(2 epsilon) that claims epsilon."""

    name = "broken: half-noise Laplace"

    def __init__(self, sensitivity: int, epsilon: float) -> None:
        self.sensitivity = sensitivity
        self.cost = Cost.of(epsilon)
        self._noise = DiscreteLaplace(sensitivity, 2 * Fraction(epsilon))

    def sample(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self._noise.sample(values, rng)


class NumpyLaplace:
    """Broken on purpose: x + numpy's float Laplace(Delta/epsilon), the textbook sampler."""

    name = "broken: numpy float Laplace"

    def __init__(self, sensitivity: float, epsilon: float) -> None:
        self.sensitivity = sensitivity
        self.cost = Cost.of(epsilon)
        self._scale = sensitivity / epsilon

    def sample(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        array = np.asarray(values, dtype=np.float64)
        return array + rng.laplace(0.0, self._scale, array.shape)


def gaussian_rho(epsilon: float, delta: float) -> float:
    """The largest rho whose conversion (the ledger's) gives at most epsilon at delta."""
    low, high = 1e-12, 1e6
    for _ in range(100):  # bisection on a log scale: the conversion increases with rho
        middle = math.sqrt(low * high)
        if zcdp_epsilon(Fraction(middle), Fraction(delta)) <= epsilon:
            low = middle
        else:
            high = middle
    return low


def claim(cost: Cost, delta: float) -> tuple[float, float]:
    """The (epsilon, delta) a cost claims; zCDP rho is converted at `delta` as the ledger does."""
    if not cost.rho:
        return float(cost.epsilon), float(cost.delta)
    total = Fraction(delta) + cost.delta
    return float(cost.epsilon + zcdp_epsilon(cost.rho, Fraction(delta))), float(total)


@dataclass(frozen=True)
class MechanismTarget:
    """One catalog entry: how to build the mechanism for a claimed epsilon."""

    name: str
    sensitivity: float
    build: Callable[[float, float, float], NoiseMechanism]  # (sensitivity, epsilon, delta)
    honest: bool = True


def _optional(module: str, cls: str, zcdp: bool = False) -> Callable | None:
    """A mechanism class another part of dpsql provides, or None while it is not there."""
    try:
        found = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError):
        return None
    if zcdp:
        return lambda s, e, d: found(s, Fraction(gaussian_rho(e, d)))
    return lambda s, e, d: found(s, e)


def catalog() -> list[MechanismTarget]:
    """Every mechanism the auditor knows, honest ones first; absent modules are left out."""
    targets = [
        MechanismTarget("discrete_laplace", 1, lambda s, e, d: DiscreteLaplace(s, e)),
        MechanismTarget("laplace_grid", 1.0, lambda s, e, d: GridLaplace(s, e)),
    ]
    staircase = _optional("dpsql.mechanisms.staircase", "Staircase")
    if staircase is not None:
        targets.append(MechanismTarget("staircase", 10, staircase))
    gaussian = _optional("dpsql.mechanisms.gaussian", "DiscreteGaussian", zcdp=True)
    if gaussian is not None:
        targets.append(MechanismTarget("gaussian", 1, gaussian))
    targets += [
        MechanismTarget("broken_half_noise", 1, lambda s, e, d: HalfNoiseLaplace(s, e), False),
        MechanismTarget("broken_numpy_laplace", 1.0, lambda s, e, d: NumpyLaplace(s, e), False),
    ]
    return targets


def audit_mechanism(
    mechanism: NoiseMechanism,
    runs: int,
    rng: np.random.Generator,
    *,
    delta: float = 0.0,
    confidence: float = 0.999,
) -> Finding:
    """Lower-bound the epsilon of `mechanism` from `runs` outputs on 0 and on its sensitivity.

    `delta` is where a zCDP mechanism is audited; pure ones audit at their own delta.
    """
    sensitivity = mechanism.sensitivity
    dtype = np.int64 if float(sensitivity).is_integer() else np.float64
    first = mechanism.sample(np.zeros(runs, dtype=dtype), rng)
    second = mechanism.sample(np.full(runs, sensitivity, dtype=dtype), rng)
    _, claimed_delta = claim(mechanism.cost, delta)
    return audit_outputs(
        with_low_bits({"value": first}), with_low_bits({"value": second}),
        claimed_delta, confidence,
    )  # fmt: skip
