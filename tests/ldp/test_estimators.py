"""Unbiasedness and closed-form variance of every estimator, at fixed seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsql import ldp

COUNTS = np.array([500, 300, 120, 50, 20, 10, 0, 0])  # n = 1000, d = 8
REPS = 1200


def repeated_estimates(m, rng):
    values = np.repeat(np.arange(COUNTS.size), COUNTS)
    return np.array([m.estimate(m.perturb_indices(values, rng)) for _ in range(REPS)])


def check(estimates, variances):
    n_reps = len(estimates)
    mean = estimates.mean(axis=0)
    sd = np.sqrt(variances)
    # Means: 5 standard errors. Variances: the sample variance of REPS near-Gaussian
    # draws has relative sd sqrt(2 / (REPS - 1)); allow 5 of those.
    assert np.all(np.abs(mean - COUNTS) <= 5 * sd / math.sqrt(n_reps)), (mean, COUNTS)
    ratio = estimates.var(axis=0, ddof=1) / variances
    assert np.all(np.abs(ratio - 1) <= 5 * math.sqrt(2 / (n_reps - 1))), ratio


@pytest.mark.parametrize("name", ["grr", "sue", "oue", "olh", "hm", "rappor", "she", "the"])
@pytest.mark.parametrize("epsilon", [0.7, 2.5])
def test_unbiased_with_closed_form_variance(name, epsilon):
    m = ldp.mechanism(name, epsilon, range(COUNTS.size))
    est = repeated_estimates(m, np.random.default_rng(11))
    n = int(COUNTS.sum())
    check(est, np.array([m.variance(n, c) for c in COUNTS]))


@pytest.mark.parametrize("epsilon", [0.7, 2.5, 4.0])
def test_hadamard_response_unbiased_with_block_aware_variance(epsilon):
    m = ldp.mechanism("hr", epsilon, range(COUNTS.size))
    est = repeated_estimates(m, np.random.default_rng(12))
    block = np.arange(COUNTS.size) // (m.block_size - 1)
    in_block = np.bincount(block, weights=COUNTS)[block]
    n = int(COUNTS.sum())
    check(est, np.array([m.variance(n, c, b) for c, b in zip(COUNTS, in_block, strict=True)]))


def test_hierarchy_levels_unbiased_and_leaf_variance_matches():
    m = ldp.mechanism("hh", 1.5, range(COUNTS.size), branching=2)
    rng = np.random.default_rng(13)
    values = np.repeat(np.arange(COUNTS.size), COUNTS)
    n = int(COUNTS.sum())
    leaves, consistent, ranges = [], [], []
    for _ in range(REPS):
        agg = m.aggregate(m.perturb_indices(values, rng))
        leaves.append(m.estimate_levels(agg, n)[-1])
        tree = m.consistent(agg, n)
        consistent.append(tree[-1])
        ranges.append(m.range_count(tree, 1, 6))
    check(np.array(leaves), np.array([m.variance(n, c) for c in COUNTS]))
    consistent = np.array(consistent)
    sd = consistent.std(axis=0)
    assert np.all(np.abs(consistent.mean(axis=0) - COUNTS) <= 5 * sd / math.sqrt(REPS))
    # Consistency can only help: never a larger variance than the raw leaf level.
    assert np.all(consistent.var(axis=0) <= 1.1 * np.array(leaves).var(axis=0))
    ranges = np.array(ranges)
    assert abs(ranges.mean() - COUNTS[1:6].sum()) <= 5 * ranges.std() / math.sqrt(REPS)


def test_variances_match_the_reference_table():
    # n Var* at f = 0 from the reference notes (section 5): eps = 2, d = 128.
    n = 1
    assert ldp.mechanism("grr", 2, 128).variance(n) == pytest.approx(3.268, rel=1e-3)
    assert ldp.mechanism("sue", 2, 128).variance(n) == pytest.approx(0.9207, rel=1e-3)
    assert ldp.mechanism("oue", 2, 128).variance(n) == pytest.approx(0.7241, rel=1e-3)
    hm = ldp.mechanism("hm", 2, 128)
    assert hm.variance(n) == pytest.approx((math.e**2 + 1) ** 2 / (math.e**2 - 1) ** 2)


def test_estimate_from_counts_matches_estimate():
    rng = np.random.default_rng(3)
    values = rng.integers(0, 20, 5000)
    for name in ldp.MECHANISMS:
        m = ldp.mechanism(name, 1.0, range(20))
        reports = m.perturb_indices(values, rng)
        halves = m.aggregate(reports[:2000]) + m.aggregate(reports[2000:])
        np.testing.assert_allclose(m.estimate_from_counts(halves, 5000), m.estimate(reports))


def test_olh_counting_paths_agree():
    from dpsql.ldp.hashing import _mod_inverse

    rng = np.random.default_rng(8)
    for epsilon in (0.5, 3.0):
        m = ldp.mechanism("olh", epsilon, range(50))
        reports = m.perturb_indices(rng.integers(0, 50, 3000), rng)
        seeds, y = reports.T
        a_inv = _mod_inverse(seeds // m.prime + 1, m.prime)
        first = a_inv * ((y - seeds % m.prime) % m.prime) % m.prime
        length = (m.prime - 1 - y) // m.g + 1
        direct = m._count_directly(first, a_inv * m.g % m.prime, length)
        convolved = m._count_by_convolution(first, seeds // m.prime, length)
        np.testing.assert_array_equal(direct, convolved)
        # And both equal hashing every value for every report.
        brute = [(m._hash(seeds, np.int64(v)) == y).sum() for v in range(50)]
        np.testing.assert_array_equal(direct[:50], brute)
