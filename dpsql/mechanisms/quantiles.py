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
2 in the exponent the release is epsilon-DP (McSherry & Talwar 2007; a base
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
log-weights would only approximate it. The number of proposals depends on the
data (at most the grid's size on average); this mechanism serves `dpsql policy
init`, run by the data's owner, not answers to analysts over a network.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from dpsql.accounting import Cost
from dpsql.mechanisms.samplers import ExactReal, bernoulli, uniform_below


def quantile_cost(epsilon: Fraction) -> Cost:
    """What one release of `exponential_quantile` costs: pure epsilon."""
    return Cost(epsilon=Fraction(epsilon))


def quantile_weights(
    counts: Sequence[int], q: Fraction, epsilon: Fraction, prior: Sequence[Fraction] = ()
) -> list[Fraction]:
    """Each candidate's exponent x(i) >= 0: it is released with probability proportional to
    e^-x(i), and the likeliest candidates have x = 0 (the closed form the tests check).
    `prior` (one non-negative Fraction per candidate, or none: uniform) is -log mu."""
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
        exponents.append(Fraction(epsilon) * abs(rank - target) / 2 + Fraction(base))
    least = min(exponents)
    return [x - least for x in exponents]


def exponential_quantile(
    counts: Sequence[int],
    q: Fraction,
    epsilon: Fraction,
    rng: np.random.Generator,
    prior: Sequence[Fraction] = (),
) -> int:
    """The index of the released candidate (see the module docstring): epsilon-DP."""
    exponents = quantile_weights(counts, Fraction(q), Fraction(epsilon), prior)
    size = np.array(len(exponents), dtype=np.uint64)
    accept: dict[int, ExactReal] = {}
    while True:
        index = int(uniform_below(size, rng.bit_generator.random_raw(1), rng)[0])
        x = exponents[index]
        if x == 0:
            return index
        if index not in accept:
            accept[index] = ExactReal.exp_neg(x)
        if bernoulli(accept[index], 1, rng)[0]:
            return index
