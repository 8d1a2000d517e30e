"""The exact bit-sliced Bernoulli sampler behind unary encodings, and the count simulations.

Fixed seeds; every tolerance is a stated number of standard errors for the
sample size, so these cannot flake and cannot pass by accident.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpsql import ldp
from dpsql.ldp.unary import bernoulli_words, exact_probability, odds_probability

LANES = 64 * (1 << 16)


def ones(words: np.ndarray) -> np.ndarray:
    return np.unpackbits(words.view(np.uint8), bitorder="little")


@pytest.mark.parametrize(
    "prob",
    [
        odds_probability(Fraction(2)),  # OUE's q at epsilon 2: 0.000111101...
        exact_probability(Fraction(1, 2**11) + Fraction(1, 2**13)),  # decided after digit 8
        exact_probability(0.75),
    ],
)
def test_bits_have_the_exact_probability_and_are_independent(prob):
    p = prob.floor_scaled(64) / 2**64
    bits = ones(bernoulli_words(prob, LANES // 64, np.random.default_rng(11)))
    se = math.sqrt(p * (1 - p) / bits.size)
    assert abs(bits.mean() - p) <= 5 * se
    # Neighbouring lanes (inside a word and across words) are independent.
    pairs = bits[:-1].astype(np.int64) * 2 + bits[1:]
    expected = np.array([(1 - p) ** 2, (1 - p) * p, p * (1 - p), p * p]) * pairs.size
    observed = np.bincount(pairs, minlength=4)
    assert np.all(np.abs(observed - expected) <= 5 * np.sqrt(expected) + 1)


def test_probabilities_zero_and_one_are_exact():
    rng = np.random.default_rng(3)
    assert not ones(bernoulli_words(exact_probability(0.0), 1000, rng)).any()
    assert ones(bernoulli_words(exact_probability(1.0), 1000, rng)).all()


def test_oue_probabilities_give_e_to_the_epsilon_exactly():
    m = ldp.mechanism("oue", 1.7, range(10))
    q = m.q_exact
    # (1 - q) / q = e^eps: compare 2^200 (1 - q) with e^eps 2^200 q through exact bounds.
    lo, hi = q.bounds(200)
    ratio_lo, ratio_hi = ((1 << 200) - hi) / hi, ((1 << 200) - lo) / lo
    assert ratio_lo <= math.exp(1.7) * (1 + 1e-15) and ratio_hi >= math.exp(1.7) * (1 - 1e-15)
    assert m.p_exact.floor_scaled(64) == 1 << 63


def test_packed_rows_keep_padding_clear_and_true_bit_at_p():
    m = ldp.mechanism("oue", 2.0, range(13))  # 13 bits: 3 padding bits in the last byte
    reports = m.perturb_indices(np.full(100_000, 12), np.random.default_rng(5))
    assert not (reports[:, -1] & 0b1110_0000).any()
    bits = np.unpackbits(reports, axis=1, count=13, bitorder="little")
    se_p = math.sqrt(0.25 / len(bits))
    assert abs(bits[:, 12].mean() - 0.5) <= 5 * se_p
    q = m.q_star
    rest = bits[:, :12]
    assert abs(rest.mean() - q) <= 5 * math.sqrt(q * (1 - q) / rest.size)


COUNTS = np.array([500, 300, 120, 50, 20, 10, 0, 0])
REPS = 1200


@pytest.mark.parametrize("name", ["oue", "she", "the"])
def test_count_simulation_matches_the_closed_form(name):
    """simulate_counts has aggregate()'s mean and variance for every cell."""
    m = ldp.mechanism(name, 1.0, range(COUNTS.size))
    sims = np.array([m.simulate_counts(COUNTS, np.random.default_rng(40 + r)) for r in range(REPS)])
    n = int(COUNTS.sum())
    if name == "she":
        mean = m.k * COUNTS
        var = np.full(COUNTS.size, n * m.noise_variance)
    else:
        p, q = m.p_star, m.q_star
        mean = COUNTS * p + (n - COUNTS) * q
        var = COUNTS * p * (1 - p) + (n - COUNTS) * q * (1 - q)
    assert np.all(np.abs(sims.mean(axis=0) - mean) <= 5 * np.sqrt(var / REPS))
    ratio = sims.var(axis=0, ddof=1) / var
    assert np.all(np.abs(ratio - 1) <= 5 * math.sqrt(2 / (REPS - 1)))


@pytest.mark.parametrize("name", ["oue", "she", "the"])
def test_count_simulation_matches_real_reports(name):
    """Simulated and really perturbed-then-counted cells agree (two-sample, 5 s.e.)."""
    m = ldp.mechanism(name, 1.0, range(COUNTS.size))
    rng = np.random.default_rng(9)
    values = np.repeat(np.arange(COUNTS.size), COUNTS)
    reps = 300
    real = np.array([m.aggregate(m.perturb_indices(values, rng)) for _ in range(reps)])
    sim = np.array([m.simulate_counts(COUNTS, rng) for _ in range(reps)])
    se = np.sqrt((real.var(axis=0, ddof=1) + sim.var(axis=0, ddof=1)) / reps)
    assert np.all(np.abs(real.mean(axis=0) - sim.mean(axis=0)) <= 5 * se)
    log_ratio = np.log(real.var(axis=0, ddof=1) / sim.var(axis=0, ddof=1))
    assert np.all(np.abs(log_ratio) <= 5 * math.sqrt(4 / (reps - 1)))


class _NoFloatDraws:
    """A generator that refuses float draws: randomised response must decide exactly."""

    def __init__(self, seed: int):
        self._rng = np.random.default_rng(seed)

    def random(self, *args, **kwargs):
        raise AssertionError("a keep decision drawn as a float")

    def __getattr__(self, name):
        return getattr(self._rng, name)


@pytest.mark.parametrize(
    ("name", "options", "others"),
    [("grr", {}, 9), ("olh", {"g": 4}, 3), ("hm", {}, 1), ("rm", {}, 1), ("hr", {}, 3)],
)
def test_randomised_response_keeps_with_the_exact_probability(name, options, others):
    """GRR, OLH, the one-bit projections and HR decided "keep" with `rng.random() < p`: p
    rounded up to a multiple of 2^-53, so the ratio of two outputs' probabilities
    exceeded e^eps (GRR by up to 2.8e-11 in epsilon; found by an audit). The keep
    probability is now e^eps / (e^eps + others) exactly, drawn bit by bit."""
    from decimal import Decimal, localcontext

    epsilon = 1.25
    mechanism = ldp.mechanism(name, epsilon, 10, **options)
    with localcontext() as context:
        context.prec = 100
        exact = 1 / (1 + others * (-Decimal(epsilon)).exp())
        drawn = Decimal(mechanism._keep.floor_scaled(300)) / Decimal(2) ** 300
        assert abs(drawn - exact) < Decimal(2) ** -299  # floor_scaled(300) is within 2^-300
    # and it is what the reports are drawn with: no float decision, the right frequency
    values = np.zeros(200_000, dtype=np.int64)
    reports = mechanism.perturb_indices(values, _NoFloatDraws(5))
    assert len(reports) == values.size
    if name == "grr":
        kept = float(np.mean(reports == 0))
        p = float(exact)
        assert abs(kept - p) <= 5 * math.sqrt(p * (1 - p) / values.size)


@pytest.mark.parametrize("epsilon", [math.log(6), math.log(12), math.log(2) + 1e-15, 1.0, 5.0])
def test_distance_sensitive_window_never_exceeds_epsilon(epsilon):
    """theta was floor((sqrt(4 e^eps + 1) - 1) / 2 + 1e-12): at eps = float(ln 6), just
    below ln 6, it gave theta = 2, whose worst ratio theta (theta + 1) = 6 is above e^eps
    (found by an audit). theta is the largest whole number whose ratio fits, exactly."""
    from decimal import Decimal, localcontext

    from dpsql.ldp.distance import _window

    theta = _window(epsilon)
    with localcontext() as context:
        context.prec = 60
        bound = Decimal(epsilon)
        assert theta < 1 or Decimal(theta * (theta + 1)).ln() <= bound
        assert Decimal((theta + 1) * (theta + 2)).ln() > bound
