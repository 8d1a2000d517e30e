"""A DP quantile: the exponential mechanism over a fixed grid of candidates, sampled exactly.

The data arrive as a histogram over the grid: `counts[i]` values fell at or
below candidate `i` and above candidate `i - 1` (values past either end are
counted in the end buckets). Candidate `i` has utility

    u(i) = -| rank(i) - q n |,   rank(i) = counts[0] + ... + counts[i],  n = sum(counts)

and is released with probability proportional to mu(i) exp(epsilon u(i) / 2), where the
base measure mu(i) = e^-prior(i) is fixed by the caller before the data are read. A
grid of round numbers reaching far past any data has a long flat run of candidates
above the largest value, all of utility about -(1 - q) n: with a uniform mu, small
epsilons land anywhere in it (an upper bound of 1e12 for prices below 1000). A mu
that shrinks with the candidate's size makes the first of them likelier than the
rest, so a weak estimate errs by a few grid steps, not decades.

Privacy map: adding or removing one value moves every rank by 0 or 1 and q n
by q, so each utility moves by at most max(q, 1 - q) < 1; with the usual factor
2 in the exponent the release is epsilon-DP. A privacy unit that adds up to
`sensitivity` = s values (max_rows_per_unit, times max_groups_per_unit when the
same epsilon covers every group it reaches) moves each rank by between 0 and
m <= s and q n by q m, so each utility by at most max(q, 1 - q) s < s: the
exponent epsilon d(i) / (2 s) keeps the release epsilon-DP per unit (McSherry & Talwar 2007; a base
measure independent of the data cancels from the ratio of any two databases'
probabilities), under the neighbouring relation of whoever built the histogram
(one value per privacy unit gives user-level DP). The output is one of the grid's candidates, fixed
before the data are read, so no floating-point value of the data can show
through it.

Sampling is exact: a candidate is proposed uniformly (`uniform_below`) and
accepted with probability e^-x(i), x(i) = epsilon d(i) / 2 + prior(i) - min_j(...),
d(i) = |rank(i) - q n|, decided by an exact Bernoulli of e^-x with x rational
(`samplers.bernoulli`); rejection from a uniform proposal yields exactly the
exponential mechanism's distribution. Gumbel-max over floating-point
log-weights would only approximate it.

Timing. It serves `dpsql policy init` and analysts' quantiles (sql/quantiles.py).
The number of proposals is geometric with success probability sum_i e^-x(i) / B,
which depends on the data: left alone, the sampler's running time would be a
side channel to an analyst timing answers over a network. So the sampler always
draws ROUNDS_PER_CANDIDATE * B proposals, deciding every one of them (each decision's exact
Bernoulli is made, and its cost depends only on x, not on whether an earlier
proposal was accepted), and returns the first accepted. Since the likeliest
candidate has x = 0, the success probability is at least 1 / B, so all rounds
fail with probability at most (1 - 1/B)^(ROUNDS_PER_CANDIDATE B) <= e^-ROUNDS_PER_CANDIDATE,
below 2^-40; only then does it draw a further block. The count of blocks (and so
of proposals) is then data dependent only with that probability. What remains
data dependent is the cost of each candidate's decisions, which grows with x
(the AND of floor(x) exact Bernoullis of e^-1, stopped once every one of that
candidate's proposals is rejected); the candidates proposed are data
independent (uniform), so the set whose x is evaluated is too. This is an
argument about counts of operations, not a constant-time implementation:
Python's Fraction arithmetic still takes time that varies with the size of
x's numerator and denominator.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from dpsql.accounting import Cost
from dpsql.mechanisms.samplers import ExactReal, bernoulli, uniform_below


def quantile_cost(epsilon: Fraction) -> Cost:
    """What one release of `exponential_quantile` costs: pure epsilon."""
    return Cost(epsilon=Fraction(epsilon))


# Proposals per candidate in one block of the sampler (see Timing above): e^-28 < 2^-40.
ROUNDS_PER_CANDIDATE = 28


def rank_error_bound(epsilon: Fraction, sensitivity: int, candidates: int, beta: float) -> float:
    """With probability >= 1 - beta, the released candidate's |rank - q n| exceeds the
    best candidate's by at most this (McSherry & Talwar's bound for a uniform prior):
    2 s ln(candidates / beta) / epsilon."""
    return 2 * sensitivity * math.log(candidates / beta) / float(epsilon)


def quantile_weights(
    counts: Sequence[int],
    q: Fraction,
    epsilon: Fraction,
    prior: Sequence[Fraction] = (),
    sensitivity: int = 1,
) -> list[Fraction]:
    """Each candidate's exponent x(i) >= 0: it is released with probability proportional to
    e^-x(i), and the likeliest candidates have x = 0 (the closed form the tests check).
    `prior` (one non-negative Fraction per candidate, or none: uniform) is -log mu;
    `sensitivity` is how many values one privacy unit may add (see the privacy map)."""
    if sensitivity < 1:
        raise ValueError(f"the sensitivity must be a positive integer, got {sensitivity}")
    if not 0 < q < 1:
        raise ValueError(f"the quantile must lie strictly between 0 and 1, got {q}")
    if epsilon <= 0:
        raise ValueError(f"epsilon must be positive, got {epsilon}")
    if not counts or any(c < 0 for c in counts):
        raise ValueError("counts must be a non-empty histogram of non-negative counts")
    prior = list(prior) or [Fraction(0)] * len(counts)
    if len(prior) != len(counts) or any(p < 0 for p in prior):
        raise ValueError("the prior needs one non-negative exponent per candidate")
    target = Fraction(q) * sum(counts)
    rank, exponents = 0, []
    for count, base in zip(counts, prior, strict=True):
        rank += int(count)
        exponents.append(
            Fraction(epsilon) * abs(rank - target) / (2 * sensitivity) + Fraction(base)
        )
    least = min(exponents)
    return [x - least for x in exponents]


def exponential_quantile(
    counts: Sequence[int],
    q: Fraction,
    epsilon: Fraction,
    rng: np.random.Generator,
    prior: Sequence[Fraction] = (),
    sensitivity: int = 1,
) -> int:
    """The index of the released candidate (see the module docstring): epsilon-DP."""
    exponents = quantile_weights(counts, Fraction(q), Fraction(epsilon), prior, sensitivity)
    size = np.array(len(exponents), dtype=np.uint64)
    block = ROUNDS_PER_CANDIDATE * len(exponents)
    while True:
        proposals = uniform_below(size, rng.bit_generator.random_raw(block), rng)
        # every proposal is decided, accepted or not, so the work does not stop early;
        # each proposed candidate's decisions are drawn at once (one exact threshold each)
        accepted = np.zeros(block, dtype=bool)
        for index in np.unique(proposals):
            at = proposals == index
            accepted[at] = _decisions(exponents[int(index)], int(at.sum()), rng)
        if accepted.any():
            return int(proposals[int(accepted.argmax())])


def _decisions(x: Fraction, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` exact Bernoulli(e^-x) decisions: e^-x = (e^-1)^floor(x) e^-frac(x), so each is
    the AND of independent exact Bernoullis of e^-frac(x) and floor(x) times e^-1 (an
    e^-x far below 2^-64 would take a slow high-precision exponential to threshold)."""
    alive = np.ones(size, dtype=bool)
    whole = math.floor(x)
    if x != whole:
        alive &= bernoulli(ExactReal.exp_neg(x - whole), size, rng)
    for _ in range(whole):
        if not alive.any():
            break
        alive[alive] = bernoulli(_exp_minus_one(), int(alive.sum()), rng)
    return alive


@functools.cache
def _exp_minus_one() -> ExactReal:
    return ExactReal.exp_neg(Fraction(1))
