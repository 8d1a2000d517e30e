"""Post-processing invariants and the tree projection against a direct least-squares solve."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpsql.ldp import consistent_tree, postprocess
from dpsql.ldp.postprocess import METHODS


def noisy(seed=0, d=50, n=1000.0):
    rng = np.random.default_rng(seed)
    truth = rng.multinomial(int(n), rng.dirichlet(np.ones(d) * 0.3)).astype(float)
    return truth, truth + rng.normal(0, 40, d)


def test_base_pos_and_cut():
    _, est = noisy()
    pos = postprocess(est, "base-pos", 1000)
    assert pos.min() >= 0
    cut = postprocess(est, "base-cut", 1000)
    kept = np.flatnonzero(cut)
    # The kept cells are the top of the order and their sum first reaches n.
    order = np.argsort(-pos, kind="stable")
    assert set(kept) == set(order[: kept.size])
    assert cut.sum() >= 1000 > cut.sum() - cut[kept].min()
    np.testing.assert_array_equal(cut[kept], pos[kept])


def test_norm_sub_is_the_simplex_projection():
    _, est = noisy(1)
    out = postprocess(est, "norm-sub", 1000)
    assert out.min() >= 0
    assert out.sum() == pytest.approx(1000)
    # KKT: out = max(est - t, 0) for one common t.
    t = (est - out)[out > 0]
    assert np.ptp(t) < 1e-9
    assert np.all(est[out == 0] <= t[0] + 1e-9)


def test_norm_sub_beats_base_on_sparse_data():
    errors = {m: 0.0 for m in METHODS}
    for seed in range(20):
        truth, est = noisy(seed)
        for m in METHODS:
            errors[m] += float(np.sum((postprocess(est, m, truth.sum()) - truth) ** 2))
    assert errors["norm-sub"] < errors["base-pos"] < errors["none"]


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="norm-sub"):
        postprocess(np.zeros(3), "norm", 1)


def gls_reference(levels, variances, branching, total):
    """Dense weighted least squares with the leaves as unknowns and the root fixed to total."""
    leaves = len(levels[-1])
    rows, obs, weights = [], [], []
    for lvl, values in enumerate(levels):
        width = branching ** (len(levels) - 1 - lvl)
        for i, v in enumerate(values):
            row = np.zeros(leaves)
            row[i * width : (i + 1) * width] = 1
            rows.append(row)
            obs.append(v)
            weights.append(1 / variances[lvl])
    a, y, w = np.array(rows), np.array(obs), np.sqrt(np.array(weights))
    # Eliminate the constraint sum(leaves) = total with a Lagrange system.
    k = a.T @ (a * w[:, None] ** 2)
    rhs = a.T @ (y * w**2)
    system = np.block([[k, np.ones((leaves, 1))], [np.ones((1, leaves)), np.zeros((1, 1))]])
    sol = np.linalg.solve(system, np.append(rhs, total))
    return sol[:leaves]


@pytest.mark.parametrize("branching", [2, 3])
def test_consistent_tree_is_generalised_least_squares(branching):
    rng = np.random.default_rng(7)
    depth = 3
    levels = [rng.normal(50, 20, branching ** (lvl + 1)) for lvl in range(depth)]
    variances = [5.0, 9.0, 30.0]
    out = consistent_tree(levels, variances, branching, 400.0)
    np.testing.assert_allclose(
        out[-1], gls_reference(levels, variances, branching, 400.0), rtol=1e-9, atol=1e-9
    )
    for parent, child in itertools.pairwise(out):
        np.testing.assert_allclose(child.reshape(-1, branching).sum(axis=1), parent)
    assert out[0].sum() == pytest.approx(400.0)
