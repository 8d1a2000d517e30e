"""Confidence bounds on event probabilities and the epsilon lower bound they imply.

For an (epsilon, delta)-DP mechanism M and neighbouring inputs x, x', every
event E satisfies P(M(x) in E) <= e^epsilon P(M(x') in E) + delta. So if
p_low <= P(M(x) in E) and P(M(x') in E) <= p_up both hold, then
epsilon >= log((p_low - delta) / p_up). The probabilities are bounded with
exact Clopper-Pearson intervals (beta quantiles from scipy, which computes
them accurately far into the tails, where a normal approximation would make
the bound invalid for rare events).
"""

from __future__ import annotations

import numpy as np

try:
    from scipy.special import betaincinv
except ImportError as exc:  # scipy comes with the test extra, not the server install
    raise ImportError(
        "the privacy auditor needs scipy for exact Clopper-Pearson bounds: "
        "pip install scipy (or install dpsql with its test extra)"
    ) from exc


def lower_probability(successes: np.ndarray, trials: int, alpha: float) -> np.ndarray:
    """One-sided Clopper-Pearson lower bounds: P(true p < bound) <= alpha for each count."""
    k = np.asarray(successes, dtype=np.float64)
    # the alpha quantile of Beta(k, n - k + 1); it is 0 when there are no successes
    safe = np.maximum(k, 1.0)
    return np.where(k > 0, betaincinv(safe, trials - safe + 1, alpha), 0.0)


def upper_probability(successes: np.ndarray, trials: int, alpha: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper bounds: P(true p > bound) <= alpha for each count."""
    k = np.asarray(successes, dtype=np.float64)
    safe = np.minimum(k, trials - 1.0)
    return np.where(k < trials, betaincinv(safe + 1, trials - safe, 1 - alpha), 1.0)


def epsilon_lower_bound(
    hits: np.ndarray, other_hits: np.ndarray, trials: int, delta: float, alpha: float
) -> np.ndarray:
    """log((p_low - delta) / p_up) for events seen `hits` times under x and `other_hits` under x'.

    Holds with probability >= 1 - alpha (alpha/2 for each one-sided bound).
    Events that show no evidence get 0: epsilon is never negative.
    """
    low = lower_probability(hits, trials, alpha / 2) - delta
    high = upper_probability(other_hits, trials, alpha / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = np.log(np.where(low > 0, low, np.nan) / high)
    return np.nan_to_num(np.maximum(bound, 0.0), nan=0.0)
