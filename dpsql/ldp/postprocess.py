"""Post-processing of local-DP estimates (free: it only reads released estimates).

Methods (Wang et al., NDSS 2020), for a vector of estimated counts over the
domain and the public number of reports n:
- none: the unbiased estimates as they are (may be negative or sum != n);
- base-pos: negatives set to 0;
- base-cut: base-pos, then only the largest estimates are kept, in
  decreasing order until their sum first reaches n; the rest become 0;
- norm-sub: the Euclidean projection onto {x >= 0, sum x = n} (the fixed point
  of "clip at 0, subtract a common amount, repeat").
`consistent_tree` makes a hierarchical histogram consistent (every parent
equals the sum of its children, the root equals n) by generalised least
squares with per-level variances.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

METHODS = ("none", "base-pos", "base-cut", "norm-sub")


def base_pos(estimate: np.ndarray) -> np.ndarray:
    return np.maximum(np.asarray(estimate, dtype=np.float64), 0.0)


def base_cut(estimate: np.ndarray, n: float) -> np.ndarray:
    out = base_pos(estimate)
    order = np.argsort(-out, kind="stable")
    running = np.cumsum(out[order])
    # Keep the shortest prefix whose sum reaches n (the crossing value stays).
    keep = int(np.searchsorted(running, n, side="left")) + 1
    out[order[keep:]] = 0.0
    return out


def norm_sub(estimate: np.ndarray, n: float) -> np.ndarray:
    est = np.asarray(estimate, dtype=np.float64)
    ordered = np.sort(est)[::-1]
    excess = np.cumsum(ordered) - n
    ranks = np.arange(1, est.size + 1)
    last = np.flatnonzero(ordered - excess / ranks > 0)[-1]
    shift = excess[last] / (last + 1)
    return np.maximum(est - shift, 0.0)


def postprocess(estimate: np.ndarray, method: str, n: float) -> np.ndarray:
    """Apply one of METHODS to estimated counts (n = number of reports)."""
    if method == "none":
        return np.array(estimate, dtype=np.float64)
    if method == "base-pos":
        return base_pos(estimate)
    if method == "base-cut":
        return base_cut(estimate, n)
    if method == "norm-sub":
        return norm_sub(estimate, n)
    raise ValueError(f"unknown post-processing {method!r}; choose one of {', '.join(METHODS)}")


def _children(values: np.ndarray, parents: int, branching: int) -> np.ndarray:
    """Values of one level as a (parents, branching) matrix, zero-padded at the end."""
    padded = np.zeros(parents * branching)
    padded[: values.size] = values
    return padded.reshape(parents, branching)


def consistent_tree(
    levels: Sequence[np.ndarray], variances: Sequence[float], branching: int, total: float
) -> list[np.ndarray]:
    """Least-squares consistent node counts for a tree of noisy level estimates.

    levels[0] holds the root's children, levels[-1] the leaves; node i of one
    level has children branching*i .. branching*i + branching - 1 of the next.
    variances[l] is the noise variance of every node of levels[l]. Upward,
    each node combines its own estimate with its children's sum by inverse
    variance; downward, each parent's final value is split over its children
    in proportion to their variances. On a tree with independent noise this
    two-pass scheme is exactly the GLS solution (Hay et al.'s for equal variances).
    """
    depth = len(levels)
    z = [np.asarray(levels[-1], dtype=np.float64)]
    vz = [np.full(len(levels[-1]), float(variances[-1]))]
    for lvl in range(depth - 2, -1, -1):
        parents = len(levels[lvl])
        child_sum = _children(z[0], parents, branching).sum(axis=1)
        child_var = _children(vz[0], parents, branching).sum(axis=1)
        own_w = 1.0 / variances[lvl]
        kid_w = 1.0 / child_var
        z.insert(0, (np.asarray(levels[lvl]) * own_w + child_sum * kid_w) / (own_w + kid_w))
        vz.insert(0, 1.0 / (own_w + kid_w))
    out: list[np.ndarray] = []
    parent = np.array([float(total)])
    for lvl in range(depth):
        parents = parent.size
        zc = _children(z[lvl], parents, branching) if lvl else z[0].reshape(1, -1)
        vc = _children(vz[lvl], parents, branching) if lvl else vz[0].reshape(1, -1)
        gap = parent - zc.sum(axis=1)
        fixed = zc + vc / vc.sum(axis=1, keepdims=True) * gap[:, None]
        parent = fixed.reshape(-1)[: len(levels[lvl])]
        out.append(parent)
    return out
