"""Seed 004's distance-sensitive encoding and random-matrix protocol, corrected."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsql import ldp


# the float nearest ln 2 lies below it, where no window fits: the next one up
@pytest.mark.parametrize(
    "epsilon", [math.nextafter(math.log(2), 1), 1.0, math.log(6), math.log(12), math.log(20)]
)
@pytest.mark.parametrize("d", [3, 7, 50])
def test_dse_rows_sum_to_one_and_the_ratio_is_exactly_theta_theta_plus_one(epsilon, d):
    m = ldp.mechanism("dse", epsilon, range(d))
    channel = m.channel()
    np.testing.assert_allclose(channel.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.diag(channel), m.a, rtol=1e-12)  # the edges too
    ratio = ldp.max_privacy_ratio(channel)
    assert ratio <= m.theta * (m.theta + 1) * (1 + 1e-12) <= math.exp(epsilon) * (1 + 1e-9)
    if d > 4 * m.theta:  # far values exist whose rows carry no edge mass: the bound is reached
        assert ratio == pytest.approx(m.theta * (m.theta + 1), rel=1e-9)
    assert m.effective_epsilon <= epsilon + 1e-12


def test_dse_refuses_epsilon_below_ln2():
    with pytest.raises(ValueError, match="ln 2"):
        ldp.mechanism("dse", 0.5, range(10))


def test_dse_is_unbiased_with_its_exact_covariance():
    d, n, reps = 12, 3_000, 400
    m = ldp.mechanism("dse", math.log(12), range(d))
    rng = np.random.default_rng(4)
    truth = np.bincount(np.minimum(rng.geometric(0.25, size=n) - 1, d - 1), minlength=d)
    values = np.repeat(np.arange(d), truth)
    estimates = np.array([m.estimate(m.perturb_indices(values, rng)) for _ in range(reps)])
    variance = np.diag(m.covariance(truth))
    # mean within 4.5 standard errors, variance within 5 standard errors of a chi-square
    assert np.all(np.abs(estimates.mean(axis=0) - truth) < 4.5 * np.sqrt(variance / reps))
    np.testing.assert_allclose(
        estimates.var(axis=0, ddof=1), variance, rtol=5 * math.sqrt(2 / reps)
    )


@pytest.mark.parametrize("epsilon, d", [(math.log(12), 12), (1.0, 200), (math.log(90), 60)])
def test_dse_reports_come_from_the_exact_channel(epsilon, d, monkeypatch):
    """Reports were drawn from the float CDF alone, up to about 1e-13 off the channel.
    The float CDF must lie well within the margin of the exact one, and draws decided by
    the exact CDF (every draw, with the margin widened) must follow the channel."""
    from dpsql.ldp import distance

    m = ldp.mechanism("dse", epsilon, range(d))
    for value in (0, d // 2, d - 1):
        exact = np.array([float(step) for step in m._exact_cdf(value)])
        assert np.abs(exact - m._cdf[value][:-1]).max() < distance._MARGIN / 2**10
    monkeypatch.setattr(distance, "_MARGIN", 0.5)  # every draw near a step: all exact
    n, value = 4_000, d // 3
    reports = m.perturb_indices(np.full(n, value), np.random.default_rng(8))
    frequencies = np.bincount(reports, minlength=d) / n
    expected = m.channel()[value]
    # within 5 standard errors of each report's probability (a fixed seed)
    assert np.all(np.abs(frequencies - expected) <= 5 * np.sqrt(expected * (1 - expected) / n))


def test_random_matrix_columns_have_unit_norm_and_the_ratio_is_e_eps():
    m = ldp.mechanism("rm", 1.5, range(10), rows=6)
    np.testing.assert_allclose((m.matrix**2).sum(axis=0), 1.0, rtol=1e-12)
    assert ldp.max_privacy_ratio(m.channel()) == pytest.approx(math.exp(1.5), rel=1e-12)


def test_random_matrix_mean_is_gram_times_truth_and_variance_matches():
    d, n, reps = 8, 2_000, 400
    m = ldp.mechanism("rm", 2.0, range(d), rows=16, matrix_seed=3)
    rng = np.random.default_rng(5)
    truth = np.full(d, (n - 600) // (d - 1))
    truth[d // 2] = 600
    values = np.repeat(np.arange(d), truth)
    estimates = np.array([m.estimate(m.perturb_indices(values, rng)) for _ in range(reps)])
    expected = truth + m.bias(truth)
    column = estimates[:, d // 2]
    variance = m.variance(int(truth.sum()), 600)
    assert abs(column.mean() - expected[d // 2]) < 4.5 * math.sqrt(variance / reps)
    assert column.var(ddof=1) == pytest.approx(variance, rel=5 * math.sqrt(2 / reps))


def test_random_matrix_is_unbiased_over_the_public_matrix():
    d, n = 6, 1_000
    truth = np.array([500, 200, 100, 100, 50, 50])
    biases = np.array(
        [ldp.mechanism("rm", 1.0, range(d), rows=4, matrix_seed=s).bias(truth) for s in range(2000)]
    )
    # each bias term is a sum of +-1/m products: mean 0, standard deviation below n / 2
    assert np.all(np.abs(biases.mean(axis=0)) < 4.5 * (n / 2) / math.sqrt(2000))
