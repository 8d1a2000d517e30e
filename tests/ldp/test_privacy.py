"""Exact privacy ratios from each mechanism's channel, and sampled reports against the channel."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpsql import ldp
from dpsql.ldp import max_privacy_ratio

SMALL = {
    "grr": {},
    "sue": {},
    "oue": {},
    "olh": {},
    "hr": {},
    "hm": {},
    "she": {"resolution": 2},
    "the": {"resolution": 2},
    "hh": {"branching": 2},
}


def domain_for(name: str) -> list[int]:
    return [2, 3] if name in ("she", "the") else [2, 3, 5, 8]


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.3])
def test_worst_case_ratio_is_exactly_e_to_the_epsilon(name, epsilon):
    for d in domain_for(name):
        m = ldp.mechanism(name, epsilon, range(d), **SMALL[name])
        channel = m.channel()
        assert max_privacy_ratio(channel) == pytest.approx(math.exp(epsilon), rel=1e-9)
        if name not in ("she", "the"):  # histogram encoding's alphabet is truncated
            np.testing.assert_allclose(channel.sum(axis=1), 1.0, rtol=1e-12)


def test_hierarchy_with_every_level_oracle_is_exactly_epsilon():
    for oracle in ("grr", "olh", "hr", "hm"):
        m = ldp.mechanism("hh", 1.2, range(9), branching=3, oracle=oracle)
        assert max_privacy_ratio(m.channel()) == pytest.approx(math.exp(1.2), rel=1e-9)


def test_seed_000_frequency_oracle_would_fail_the_check():
    # Keep x with probability p, else uniform over all g values (x included):
    # the checker must see ratio 1 + g e^eps / (g - 1) > e^eps.
    g, eps = 8, 1.0
    p = math.exp(eps) / (math.exp(eps) + g - 1)
    channel = np.full((g, g), (1 - p) / g) + np.eye(g) * p
    assert max_privacy_ratio(channel) == pytest.approx(1 + g * math.exp(eps) / (g - 1))
    assert max_privacy_ratio(channel) > math.exp(eps)


def test_rappor_permanent_is_epsilon_and_one_report_is_epsilon_one():
    m = ldp.mechanism("rappor", 2.0, range(4))
    assert max_privacy_ratio(m.permanent_channel()) == pytest.approx(math.exp(2.0), rel=1e-9)
    assert max_privacy_ratio(m.channel()) == pytest.approx(math.exp(m.epsilon_one), rel=1e-9)
    assert m.epsilon_one < 2.0


@pytest.mark.parametrize("name", ["grr", "sue", "oue", "olh", "hr", "hm", "rappor", "hh"])
def test_sampled_reports_follow_the_channel(name):
    """A chi-square test per input at a fixed seed: perturb() really draws from channel()."""
    rng = np.random.default_rng(20240607)
    m = ldp.mechanism(name, 1.3, range(5), **({"branching": 2} if name == "hh" else {}))
    channel = m.channel()
    draws = 60_000
    for x in range(m.d):
        reports = m.perturb_indices(np.full(draws, x), rng)
        observed = np.bincount(m.output_index(reports), minlength=channel.shape[1])
        expected = channel[x] * draws
        live = expected > 0
        assert observed[~live].sum() == 0
        chi2 = float(np.sum((observed[live] - expected[live]) ** 2 / expected[live]))
        assert chi2 < stats.chi2.ppf(1 - 1e-6, live.sum() - 1), (x, chi2)


def test_histogram_encoding_noise_is_discrete_laplace():
    rng = np.random.default_rng(5)
    m = ldp.mechanism("she", 1.0, range(3), resolution=2)
    reports = m.perturb_indices(np.zeros(200_000, dtype=np.int64), rng)
    noise = reports[:, 1].astype(np.int64)
    channel_marginal = m.channel()[0].reshape(*(len(m._window()),) * 3).sum(axis=(0, 2))
    w = m._window()
    inside = (noise >= w[0]) & (noise <= w[-1])
    observed = np.bincount(noise[inside] - w[0], minlength=w.size)
    # The marginal of a coordinate is exact up to the truncation of the other two.
    expected = channel_marginal / channel_marginal.sum() * inside.sum()
    chi2 = float(np.sum((observed - expected) ** 2 / expected))
    assert chi2 < stats.chi2.ppf(1 - 1e-6, w.size - 1)
    assert noise.var() == pytest.approx(m.noise_variance, rel=0.03)
