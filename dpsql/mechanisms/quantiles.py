"""A DP quantile: the exponential mechanism over a fixed grid of candidates, sampled exactly.

The data arrive as a histogram over the grid: `counts[i]` values fell at or
below candidate `i` and above candidate `i - 1` (values past either end are
counted in the end buckets). Candidate `i` has utility

    u(i) = -| rank(i) - q n |,   rank(i) = counts[0] + ... + counts[i],  n = sum(counts)

and is released with probability proportional to mu(i) exp(epsilon u(i) / (2 Delta)),
Delta = max(q, 1 - q) s (below), where the base measure mu(i) = e^-prior(i) is fixed by
the caller before the data are read. A grid of round numbers reaching far past any
data has a long flat run of candidates above the largest value, all of utility about
-(1 - q) n: with a uniform mu, small epsilons land anywhere in it (an upper bound of
1e12 for prices below 1000). A mu that shrinks with the candidate's size makes the
first of them likelier than the rest, so a weak estimate errs by a few grid steps, not
decades.

Privacy map: a privacy unit that adds up to `sensitivity` = s values
(max_rows_per_unit, times max_groups_per_unit when the same epsilon covers every group
it reaches) adds m <= s values: each rank grows by some r in [0, m] and q n by q m, so
rank(i) - q n moves by r - q m, within [-q m, (1 - q) m], and each utility by at most
Delta = max(q, 1 - q) s (for the median s / 2, not s). With the exponent
epsilon u(i) / (2 Delta) the release is epsilon-DP per unit (McSherry & Talwar 2007: the
numerator and the normaliser each move by at most e^(epsilon / 2); a base measure
independent of the data cancels from the ratio of any two databases' probabilities),
under the neighbouring relation of whoever built the histogram (one value per privacy
unit gives user-level DP); tests/test_quantiles.py checks the ratio on every neighbour
of small histograms. The output is one of the grid's candidates, fixed before the data
are read, so no floating-point value of the data can show through it.

Sampling is exact: a candidate is proposed uniformly (`uniform_below`) and
accepted with probability e^-x(i), x(i) = epsilon d(i) / (2 Delta) + prior(i) - min_j(...),
d(i) = |rank(i) - q n|. The exponents are computed in integers on a lattice, x(i) =
m(i) step with step rational and m(i) a non-negative integer (`exponent_lattice`), and
e^-(m step) is the product over the bits j of m of e^-(2^j step): a proposal is
accepted iff it passes an independent exact Bernoulli of e^-(2^j step) at each bit of
its m (`samplers.bernoulli`, x rational), one vectorised draw per bit level for all
proposals at once. Rejection from a uniform proposal yields exactly the exponential
mechanism's distribution. Gumbel-max over floating-point log-weights would only
approximate it.

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
data dependent is how many proposals reach each bit level (those with that bit of m
set that passed the levels above): the candidates proposed are data independent
(uniform), and each level's work, its draw and its bookkeeping, costs the same per
proposal that reaches it. This is an argument
about counts of operations, not a constant-time implementation.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.accounting import Cost
from dpsql.mechanisms.samplers import ExactReal, bernoulli, uniform_below


def quantile_cost(epsilon: Fraction) -> Cost:
    """What one release of `exponential_quantile` costs: pure epsilon."""
    return Cost(epsilon=Fraction(epsilon))


# Proposals per candidate in one block of the sampler (see Timing above): e^-28 < 2^-40.
ROUNDS_PER_CANDIDATE = 28


def exponent_rate(q: Fraction, epsilon: Fraction, sensitivity: int) -> Fraction:
    """The exponent's step per unit of the integer distance |D rank - a n| (q = a / D):
    epsilon / (2 Delta) per rank, Delta = max(q, 1 - q) s the utility's sensitivity."""
    q = Fraction(q)
    return Fraction(epsilon) / (2 * sensitivity * max(q.numerator, q.denominator - q.numerator))


def rank_error_bound(
    epsilon: Fraction, sensitivity: int, candidates: int, beta: float, q: Fraction
) -> float:
    """With probability >= 1 - beta, the released candidate's |rank - q n| exceeds the
    best candidate's by at most this (McSherry & Talwar's bound for a uniform prior):
    2 Delta ln(candidates / beta) / epsilon, Delta = max(q, 1 - q) s."""
    spread = max(Fraction(q), 1 - Fraction(q)) * sensitivity
    return 2 * float(spread) * math.log(candidates / beta) / float(epsilon)


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
    step, multiples = exponent_lattice(counts, q, epsilon, prior, sensitivity)
    return [step * int(m) for m in multiples]


@dataclass(frozen=True)
class RatePrior:
    """A prior on the exponents' own lattice: -log mu(i) = multiples[i] times the rate
    (`exponent_rate`), whole multiples of the step the uniform prior's exponents take, so the
    sampler's integers stay as small as without it (`lattice_prior` makes one)."""

    multiples: np.ndarray  # int64, >= 0
    rate: Fraction  # exponent_rate's: a sampler at any other rate refuses it

    def __len__(self) -> int:
        return len(self.multiples)


def exponent_lattice(
    counts: Sequence[int],
    q: Fraction,
    epsilon: Fraction,
    prior: Sequence[Fraction] | RatePrior = (),
    sensitivity: int = 1,
) -> tuple[Fraction, np.ndarray]:
    """The exponents of `quantile_weights` as x(i) = m(i) step: a rational `step` and
    integers m(i) >= 0 (int64 when they fit, else Python ints in an object array),
    computed in integers: with q = a / D, |rank(i) - q n| = |D rank(i) - a n| / D."""
    if sensitivity < 1:
        raise ValueError(f"the sensitivity must be a positive integer, got {sensitivity}")
    if not 0 < q < 1:
        raise ValueError(f"the quantile must lie strictly between 0 and 1, got {q}")
    if epsilon <= 0:
        raise ValueError(f"epsilon must be positive, got {epsilon}")
    counts = np.asarray(counts, dtype=np.int64)
    if counts.size == 0 or bool((counts < 0).any()):
        raise ValueError("counts must be a non-empty histogram of non-negative counts")
    given = prior.multiples if isinstance(prior, RatePrior) else prior
    if len(given) and (len(given) != len(counts) or min(given) < 0):
        raise ValueError("the prior needs one non-negative exponent per candidate")
    q, rate = Fraction(q), exponent_rate(q, epsilon, sensitivity)
    if isinstance(prior, RatePrior) and prior.rate != rate:
        raise ValueError(f"a prior on the lattice of rate {prior.rate} sampled at rate {rate}")
    cumulative = np.cumsum(counts)
    total = int(cumulative[-1])
    if (isinstance(prior, RatePrior) or not len(given)) and q.denominator * total < 2**61:
        # all in int64: |D rank - a n| < 2^61, and a prior's multiples are small
        d = np.abs(q.denominator * cumulative - q.numerator * total)
        values = d + prior.multiples if isinstance(prior, RatePrior) else d
        return rate, values - values.min()
    ranks = cumulative.tolist()
    target = q.numerator * total
    distances = [abs(q.denominator * rank - target) for rank in ranks]
    if isinstance(prior, RatePrior):
        values, step = [d + int(m) for d, m in zip(distances, prior.multiples, strict=True)], rate
    elif prior:  # on one denominator with the prior's exponents
        denominator = math.lcm(rate.denominator, *(Fraction(p).denominator for p in prior))
        scale = rate.numerator * (denominator // rate.denominator)
        values = [
            d * scale + Fraction(p).numerator * (denominator // Fraction(p).denominator)
            for d, p in zip(distances, prior, strict=True)
        ]
        step = Fraction(1, denominator)
    else:
        values, step = distances, rate
    least = min(values)
    multiples = [value - least for value in values]
    if max(multiples) < 2**62:
        return step, np.array(multiples, dtype=np.int64)
    wide = np.empty(len(multiples), dtype=object)
    wide[:] = multiples
    return step, wide


def lattice_prior(
    log_measure: np.ndarray, q: Fraction, epsilon: Fraction, sensitivity: int = 1
) -> RatePrior:
    """The prior (-log mu) of a base measure given by each candidate's log mu(i) <= 0,
    rounded to the nearest whole multiple of the exponents' step for this q, epsilon and
    sensitivity: the measure moves by a factor of at most e^(step / 2), and a base
    measure fixed before the data are read leaves the privacy map as it is (the
    rounding, in floats, reads only those data-independent numbers)."""
    rate = exponent_rate(q, epsilon, sensitivity)
    steps = np.rint(-np.asarray(log_measure, dtype=float) / float(rate)).astype(np.int64)
    return RatePrior(steps, rate)


def exponential_quantile(
    counts: Sequence[int],
    q: Fraction,
    epsilon: Fraction,
    rng: np.random.Generator,
    prior: Sequence[Fraction] | RatePrior = (),
    sensitivity: int = 1,
) -> int:
    """The index of the released candidate (see the module docstring): epsilon-DP."""
    step, multiples = exponent_lattice(counts, Fraction(q), Fraction(epsilon), prior, sensitivity)
    size = np.array(len(multiples), dtype=np.uint64)
    block = ROUNDS_PER_CANDIDATE * len(multiples)
    while True:
        proposals = uniform_below(size, rng.bit_generator.random_raw(block), rng)
        # every proposal is decided, accepted or not, so the work does not stop early
        accepted = _accepted(multiples[proposals.astype(np.int64)], step, rng)
        if accepted.any():
            return int(proposals[int(accepted.argmax())])


def _accepted(multiples: np.ndarray, step: Fraction, rng: np.random.Generator) -> np.ndarray:
    """One exact Bernoulli(e^-(m step)) decision per proposal, all at once: e^-(m step) is
    the product over the bits j of m of e^-(2^j step), so a proposal is accepted iff it
    passes an independent exact Bernoulli of e^-(2^j step) at each of its bits. Levels
    go from the highest bit down, where candidates far from the quantile fail first;
    each level is one vectorised draw (`_decisions`) for every proposal still alive
    with that bit set. The proposals still alive are kept as indexes, so a level costs
    what reaches it: most proposals fail at their highest bits."""
    alive = np.arange(len(multiples))
    top = int(multiples.max()).bit_length() if len(multiples) else 0
    for bit in reversed(range(top)):
        chosen = (multiples[alive] >> bit) & 1 == 1
        count = int(np.count_nonzero(chosen))
        if count:
            kept = ~chosen
            kept[chosen] = _decisions(step * 2**bit, count, rng)
            alive = alive[kept]
    accepted = np.zeros(len(multiples), dtype=bool)
    accepted[alive] = True
    return accepted


def _decisions(x: Fraction, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` exact Bernoulli(e^-x) decisions: e^-x = e^-r (e^-CHUNK)^k, x = k CHUNK + r with
    0 <= r < CHUNK, so each is the AND of independent exact Bernoullis of e^-r and k times
    e^-CHUNK (a single e^-x far below 2^-64 would take a slow high-precision exponential
    to threshold; e^-CHUNK's threshold is a 64-bit word's, and almost every decision of a
    large x ends at the first e^-CHUNK)."""
    alive = np.ones(size, dtype=bool)
    chunks = math.floor(x / CHUNK)
    rest = x - chunks * CHUNK
    if rest:
        alive &= bernoulli(_exp_neg(rest), size, rng)
    for _ in range(chunks):
        if not alive.any():
            break
        alive[alive] = bernoulli(_exp_neg(Fraction(CHUNK)), int(alive.sum()), rng)
    return alive


# e^-CHUNK is about 1.3e-14: above 2^-64, so an exact Bernoulli of it reads one word but
# for ties, and small enough that a far candidate fails it at once.
CHUNK = 32


# A query's groups share their bit levels' exponents: their thresholds are computed once.
@functools.lru_cache(maxsize=4096)
def _exp_neg(x: Fraction) -> ExactReal:
    return ExactReal.exp_neg(x)
