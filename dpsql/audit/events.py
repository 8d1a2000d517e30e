"""The best distinguishing event between two samples of outputs, and the bound it proves.

Outputs are described by named features (the released value, its low-order
bits, a key's value or -inf when the key was not released). One half of each
sample picks the event: the interval or threshold on one feature whose
Clopper-Pearson epsilon bound is largest, in either direction. The other half,
unseen by the search, evaluates that single event, so the final bound is a
valid lower bound at the stated confidence however hard the search tried.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpsql.audit.bounds import epsilon_lower_bound

MAX_CUTS = 128  # cut points per feature: 129^2 / 2 candidate intervals each
ZERO_BITS = 2048.0  # the low-bit feature of 0.0: above every finite double's lowest bit


@dataclass(frozen=True)
class Event:
    """The outputs whose `feature` lies in [low, high]; `reverse`: likelier under x' than x."""

    feature: str
    low: float
    high: float
    reverse: bool

    def holds(self, values: np.ndarray) -> np.ndarray:
        return (values >= self.low) & (values <= self.high)

    def __str__(self) -> str:
        if self.low == self.high:
            text = f"{self.feature} = {_number(self.low)}"
        elif self.low == -math.inf:
            text = f"{self.feature} <= {_number(self.high)}"
        elif self.high == math.inf:
            text = f"{self.feature} >= {_number(self.low)}"
        else:
            text = f"{_number(self.low)} <= {self.feature} <= {_number(self.high)}"
        return text + (" (likelier under x')" if self.reverse else "")


def _number(value: float) -> str:
    if value == -math.inf:
        return "not released"
    return "0.0 (no low bit)" if value == ZERO_BITS else f"{value:.6g}"


@dataclass(frozen=True)
class Finding:
    """An epsilon lower bound, the event that proves it, and the evidence."""

    epsilon_bound: float
    confidence: float
    event: Event
    hits: int  # evaluation outputs in the event under the input it favours
    other_hits: int  # ... and under the other input
    trials: int  # evaluation outputs per input


def low_bits(values: np.ndarray) -> np.ndarray:
    """The exponent of the lowest set bit of each double (its 2-adic valuation).

    A value computed as x + float noise carries bits below any fixed grid, and
    which bits it can carry depends on x (Mironov 2012); an exact mechanism's
    outputs all lie on one grid whatever the input. 0.0 maps to ZERO_BITS and
    non-finite values (a key not released) stay as they are.
    """
    y = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(y) & (y != 0)
    mantissa, exponent = np.frexp(np.where(finite, y, 1.0))
    integer = np.abs(np.ldexp(mantissa, 53)).astype(np.int64)  # exact: 53 significant bits
    _, lowest = np.frexp((integer & -integer).astype(np.float64))
    bits = (exponent - 54 + lowest).astype(np.float64)
    return np.where(finite, bits, np.where(y == 0, ZERO_BITS, y))


def with_low_bits(features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The features plus the low-bit feature of each real-valued one."""
    result = dict(features)
    for name, values in features.items():
        if np.asarray(values).dtype.kind == "f":
            result[f"low bits of {name}"] = low_bits(values)
    return result


def audit_outputs(
    first: dict[str, np.ndarray],
    second: dict[str, np.ndarray],
    delta: float = 0.0,
    confidence: float = 0.999,
) -> Finding:
    """The epsilon lower bound from outputs under x (`first`) and x' (`second`).

    Both map the same feature names to equally long arrays, one entry per
    independent run. It holds with probability >= `confidence`.
    """
    trials = min(len(v) for v in (*first.values(), *second.values()))
    half = trials // 2
    if half < 10:
        raise ValueError(f"an audit needs at least 20 runs per input, got {trials}")
    alpha = 1 - confidence
    event = _best_event(
        {k: v[:half] for k, v in first.items()}, {k: v[:half] for k, v in second.items()},
        delta, alpha,
    )  # fmt: skip
    favoured, other = (second, first) if event.reverse else (first, second)
    hits = int(event.holds(np.asarray(favoured[event.feature][half : 2 * half])).sum())
    other_hits = int(event.holds(np.asarray(other[event.feature][half : 2 * half])).sum())
    bound = float(epsilon_lower_bound(hits, other_hits, half, delta, alpha))
    return Finding(bound, confidence, event, hits, other_hits, half)


def _best_event(
    first: dict[str, np.ndarray], second: dict[str, np.ndarray], delta: float, alpha: float
) -> Event:
    best, best_score = None, -1.0
    for name in first:
        a = np.sort(np.asarray(first[name], dtype=np.float64))
        b = np.sort(np.asarray(second[name], dtype=np.float64))
        cuts = _cuts(np.concatenate([a, b]))
        low, high, count_a, count_b = _intervals(a, b, cuts)
        for reverse, hits, other in ((False, count_a, count_b), (True, count_b, count_a)):
            scores = epsilon_lower_bound(hits, other, len(a), delta, alpha)
            top = int(np.argmax(scores))
            if scores[top] > best_score:
                best_score = float(scores[top])
                best = Event(name, float(low[top]), float(high[top]), reverse)
    assert best is not None  # at least one feature with at least one cut
    return best


def _cuts(pooled: np.ndarray) -> np.ndarray:
    cuts = np.unique(pooled)
    if len(cuts) <= MAX_CUTS:
        return cuts
    levels = np.linspace(0, 1, MAX_CUTS)
    return np.unique(np.quantile(pooled, levels, method="inverted_cdf"))


def _intervals(
    a: np.ndarray, b: np.ndarray, cuts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every interval [low, high] with edges at cuts or +-inf, and its count in sorted a and b."""
    lows = np.concatenate([[-math.inf], cuts])
    highs = np.concatenate([cuts, [math.inf]])
    i, j = np.nonzero(lows[:, None] <= highs[None, :])

    def counts(sample: np.ndarray) -> np.ndarray:
        below = np.searchsorted(sample, lows, side="left")
        upto = np.searchsorted(sample, highs, side="right")
        return upto[j] - below[i]

    return lows[i], highs[j], counts(a), counts(b)
