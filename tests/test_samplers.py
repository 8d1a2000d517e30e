"""The exact samplers: threshold bits, tie and tail paths, and the law of the output.

Statistical checks use fixed seeds and tolerances derived from the sample
size: 6 standard errors from closed-form moments, or a chi-square test at
alpha = 1e-6, so a correct sampler fails them with probability < 1e-6 for a
random seed and never for the fixed one.
"""

from __future__ import annotations

import decimal
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpsql.mechanisms import samplers
from dpsql.mechanisms.samplers import ExactReal, bernoulli, discrete_laplace, secure_generator

SCALES = [0.5, 1, 3.7, 100, 1e4]
N = 2_000_000
SIGMAS = 6
_MAX = (1 << 64) - 1


class ScriptedWords:
    """A stand-in generator whose bit generator returns the given 64-bit words in order."""

    def __init__(self, words: list[int]) -> None:
        self.words = list(words)
        self.bit_generator = self

    def random_raw(self, shape: int | tuple[int, ...]) -> np.ndarray:
        count = math.prod(shape) if isinstance(shape, tuple) else shape
        taken, self.words = self.words[:count], self.words[count:]
        assert len(taken) == count, "the sampler read more words than the test scripted"
        return np.array(taken, dtype=np.uint64).reshape(shape)


# --- an independent computation of the thresholds: plain decimal at 90 digits ------------------


def _dec(value: Fraction) -> Decimal:
    return Decimal(value.numerator) / Decimal(value.denominator)


def _floor_bits(value: Decimal, bits: int) -> int:
    return int((value * (1 << bits)).to_integral_value(rounding=decimal.ROUND_FLOOR))


@pytest.fixture
def digits90():
    with decimal.localcontext() as ctx:
        ctx.prec = 90
        yield


def _table(level) -> list[int]:
    thr = level._thr
    return [int(v) for v in thr[thr != samplers._PAD]]


def _truncated_cdfs(beta: Decimal, length: int) -> list[Decimal]:
    powers, value = [], Decimal(1)
    for _ in range(length + 1):
        powers.append(value)
        value *= beta
    return [(1 - p) / (1 - powers[length]) for p in powers]


def _top_cut(scale: Fraction, k: int) -> Decimal:
    """The k-th cut of the plan's last (tail) table: C * beta^k."""
    plan = samplers._plan(scale)
    a = (-_dec(1 / scale)).exp()
    if plan._first is None:
        return 2 / (1 + a) * a**k
    return (-_dec(plan._top_multiplier / scale)).exp() ** k


def _expected_cuts(scale: Fraction) -> list[tuple[object, list[Decimal]]]:
    """Every table of the plan for `scale` and the cut points it should hold, ascending."""
    plan = samplers._plan(scale)
    a = (-_dec(1 / scale)).exp()
    out = []
    if plan._first is not None:
        length = plan._first_length
        f = _truncated_cdfs(a, length)
        p0, half, second = (1 - a) / (1 + a), a / (1 + a), 1 / (1 + a)
        first = [p0] + [p0 + half * f[j] for j in range(1, length + 1)]
        first += [second + half * f[j] for j in range(1, length)]
        out.append((plan._first, first))
        for level, multiplier in plan._digits:
            beta = (-_dec(multiplier / scale)).exp()
            out.append((level, _truncated_cdfs(beta, length)[1:length]))
    out.append((plan._top, [_top_cut(scale, k) for k in range(plan._top.cuts, 0, -1)]))
    return out


@pytest.mark.parametrize("scale", [0.5, 3.7, 100, 1e4, 1e6, 1e9])
def test_threshold_tables_are_the_exact_floors(scale: float, digits90: None) -> None:
    for level, cuts in _expected_cuts(Fraction(scale)):
        assert _table(level) == [_floor_bits(cut, 63) for cut in cuts]


@pytest.mark.parametrize("scale", [0.5, 1, 3.7, 100, 1e4, 1e6])
def test_tail_table_holds_every_cut_above_the_tail(scale: float, digits90: None) -> None:
    exact = Fraction(scale)
    top = samplers._plan(exact)._top
    table = _table(top)
    # the first cut left out is below 2^tail_bits, the last one kept is above
    assert _floor_bits(_top_cut(exact, top.cuts + 1), 63) < 1 << top.tail_bits
    assert not table or table[0] >= 1 << top.tail_bits
    assert samplers.slow_path_probability(exact) < 2**-48


# --- ExactReal and the Bernoulli -----------------------------------------------------------------


def test_exact_real_bits_match_high_precision_decimal(digits90: None) -> None:
    scale = Fraction(3.7)
    for i in range(6):
        b = ExactReal.exp_neg(Fraction(2**i) / scale)
        p = b / (1 + b)
        exact = (-_dec(Fraction(2**i) / scale)).exp()
        assert p.floor_scaled(64) == _floor_bits(exact / (1 + exact), 64)
        assert p.floor_scaled(192) == _floor_bits(exact / (1 + exact), 192)


def test_exp_neg_bounds_are_rigorous_and_tight(digits90: None) -> None:
    for x in (Fraction(1, 3), Fraction(7), Fraction(1, 10**6), Fraction(123456, 7)):
        low, high = ExactReal.exp_neg(x).bounds(200)
        exact = (-_dec(x)).exp() * (1 << 200)
        assert Decimal(low) <= exact <= Decimal(high)
        assert high - low < 16


@pytest.mark.parametrize("level", [0, 2, 5])
def test_bernoulli_matches_p(level: int) -> None:
    a = ExactReal.exp_neg(Fraction(2**level) / Fraction(3.7))
    p = a / (1 + a)
    value = p.floor_scaled(64) / 2**64
    draws = bernoulli(p, N, secure_generator(11 + level))
    sd = math.sqrt(N * value * (1 - value))
    assert abs(int(draws.sum()) - N * value) <= SIGMAS * sd


def test_bernoulli_tie_reads_the_next_bits() -> None:
    a = ExactReal.exp_neg(Fraction(1, 2))
    p = a / (1 + a)
    first, second = p.floor_scaled(64), p.floor_scaled(128) & samplers._MASK64
    third = p.floor_scaled(192) & samplers._MASK64
    assert bernoulli(p, 1, ScriptedWords([first, second - 1]))[0]
    assert not bernoulli(p, 1, ScriptedWords([first, second + 1]))[0]
    assert bernoulli(p, 1, ScriptedWords([first, second, third - 1]))[0]
    assert not bernoulli(p, 1, ScriptedWords([first, second, third + 1]))[0]
    assert list(bernoulli(p, 2, ScriptedWords([first - 1, first + 1]))) == [True, False]


def test_bernoulli_refuses_p_outside_unit_interval() -> None:
    with pytest.raises(ValueError):
        bernoulli(ExactReal.exp_neg(1) + 1, 3, secure_generator(1))


# --- slow paths agree with the fast path -------------------------------------------------------


@pytest.mark.parametrize("scale", [0.5, 3.7, 100, 1e4, 1e6, 1e9])
def test_exact_path_agrees_with_vectorised_path(scale: float) -> None:
    plan = samplers._plan(Fraction(scale))
    words = secure_generator(5).bit_generator.random_raw((plan.words_per_sample, 3000))
    fast, slow = plan._fast(words)
    assert not slow.any()
    exact = [plan._exact([int(w) for w in words[:, i]], None) for i in range(words.shape[1])]
    assert fast.tolist() == exact


@pytest.mark.parametrize("rate", [Fraction(5), Fraction(1), Fraction(1, 100), Fraction(1, 1000)])
def test_geometric_sampler_law_from_a_table_or_a_folded_laplace(rate: Fraction) -> None:
    sampler = samplers.exact_geometric(rate)
    assert (sampler._tail is None) == (rate < Fraction(1, 128))  # else a folded Laplace
    g = sampler.draw(N // 4, secure_generator(int(1 / rate)))
    b = math.exp(-float(rate))
    # bins: each k with >= 50 expected draws, and the tail beyond them (P(G >= k) = b^k)
    last = max(1, int(math.log(50 / g.size) / math.log(b)))
    probs = np.append([(1 - b) * b**k for k in range(last)], b**last)
    observed = np.bincount(np.minimum(g, last), minlength=last + 1)
    statistic = float(((observed - probs * g.size) ** 2 / (probs * g.size)).sum())
    assert g.min() >= 0 and stats.chi2.sf(statistic, last) > 1e-6


def test_tie_with_a_threshold_reads_the_next_bits(digits90: None) -> None:
    scale = Fraction(3.7)
    plan = samplers._plan(scale)
    a = (-_dec(1 / scale)).exp()
    for k in (1, 4):
        cut = 2 * a**k / (1 + a)  # P(|Z| >= k)
        word = _floor_bits(cut, 63) << 1
        digit = _floor_bits(cut, 127) & samplers._MASK64
        # V just below the cut: |Z| >= k; just above: |Z| = k - 1; the low bit is the sign
        assert discrete_laplace(scale, 1, ScriptedWords([word, digit - 1]))[0] == k
        assert discrete_laplace(scale, 1, ScriptedWords([word | 1, digit + 1]))[0] == -(k - 1)
    assert plan._top.tail_bits >= 1


def test_first_level_tie_in_the_two_word_plan(digits90: None) -> None:
    scale = Fraction(10**4)
    a = (-_dec(1 / scale)).exp()
    p0 = (1 - a) / (1 + a)
    word = _floor_bits(p0, 63) << 1
    digit = _floor_bits(p0, 127) & samplers._MASK64
    top_word = 1 << 62  # any word that lands in the bulk of the top table
    assert discrete_laplace(scale, 1, ScriptedWords([word, top_word, digit - 1]))[0] == 0
    assert discrete_laplace(scale, 1, ScriptedWords([word, top_word, digit + 1]))[0] != 0


@pytest.mark.parametrize("u", [0, 1, 37, 200])
def test_far_tail_is_exact(u: int, digits90: None) -> None:
    scale = Fraction(100)
    plan = samplers._plan(scale)
    assert u < 1 << plan._top.tail_bits
    rest = [0x9E3779B97F4A7C15, 0x6A09E667F3BCC908, 0xBB67AE8584CAA73B]
    value = discrete_laplace(scale, 1, ScriptedWords([u << 1, *rest]))[0]
    v = Decimal(u)
    for word in rest:
        v = v * (1 << 64) + word
    v = v / Decimal(2) ** (63 + 64 * len(rest))
    a = (-_dec(1 / scale)).exp()
    # |Z| = #{k >= 1 : 2 a^k / (1+a) > V}
    bound = (v * (1 + a) / 2).ln() / a.ln()
    assert value == math.ceil(bound) - 1
    assert value >= plan._top.cuts  # beyond anything the table holds


# --- the law of the output -----------------------------------------------------------------------


def _moments(scale: float) -> tuple[float, float, float, float]:
    """E|Z|, E Z^2, E Z^4 and a, from the closed forms (Z symmetric, so E Z = 0)."""
    a = math.exp(-1 / scale)
    one_minus = -math.expm1(-1 / scale)
    abs_mean = 2 * a / (one_minus * (1 + a))
    second = 2 * a / one_minus**2
    fourth = 2 * a * (1 + 11 * a + 11 * a**2 + a**3) / ((1 + a) * one_minus**4)
    return abs_mean, second, fourth, a


@pytest.mark.parametrize("scale", [*SCALES, 1e6, 1e9])
def test_moments_match_closed_forms(scale: float) -> None:
    z = discrete_laplace(Fraction(scale), N, secure_generator(int(scale * 10) + 1))
    assert z.dtype == np.int64
    abs_mean, second, fourth, _ = _moments(scale)
    zf = z.astype(np.float64)
    assert abs(zf.mean()) <= SIGMAS * math.sqrt(second / N)
    assert abs((zf**2).mean() - second) <= SIGMAS * math.sqrt((fourth - second**2) / N)
    assert abs(np.abs(zf).mean() - abs_mean) <= SIGMAS * math.sqrt((second - abs_mean**2) / N)


def _cdf(k: np.ndarray, a: float) -> np.ndarray:
    """P(Z <= k): a^-k/(1+a) for k < 0, 1 - a^(k+1)/(1+a) for k >= 0."""
    k = k.astype(np.float64)
    return np.where(k < 0, a ** (-k) / (1 + a), 1 - a ** (k + 1) / (1 + a))


@pytest.mark.parametrize("scale", SCALES)
def test_pmf_chi_square(scale: float) -> None:
    z = discrete_laplace(Fraction(scale), N, secure_generator(int(scale * 7) + 3))
    a = math.exp(-1 / scale)
    # bins: single values where each expects >= 50 draws, wider bins for large scales
    width = max(1, int(scale / 8))
    reach = int(8 * scale) + 2
    edges = np.arange(-reach, reach + width, width)  # bin i = (edges[i], edges[i+1]]
    probs = np.diff(np.concatenate([[0.0], _cdf(edges, a), [1.0]]))
    observed = np.bincount(np.searchsorted(edges, z, side="left"), minlength=probs.size)
    expected = probs * N
    keep = expected >= 50
    obs, exp = observed[keep], expected[keep]
    if not keep.all():  # pool the sparse bins into one, so every draw is counted
        obs, exp = np.append(obs, observed[~keep].sum()), np.append(exp, expected[~keep].sum())
    statistic = float(((obs - exp) ** 2 / exp).sum())
    assert stats.chi2.sf(statistic, obs.size - 1) > 1e-6


def test_timing_relevant_shape_every_sample_reads_the_same_words() -> None:
    for scale, words in ((1, 1), (128, 1), (129, 2), (10**6, 2), (10**9, 3)):
        assert samplers._plan(Fraction(scale)).words_per_sample == words


@pytest.mark.parametrize("mantissa_bits", [1, 4, 8])
def test_log_buckets_are_the_octave_and_top_bits_on_both_sides_of_2_53(mantissa_bits: int) -> None:
    """Each u >= 2^(m+1) lands in bucket (octave << m) + its next m bits, exactly, also where
    float64 cannot hold u (above 2^53) and at the edges; below, u is bucketed as u | 1."""
    edges = [1 << 53, 1 << 62, (1 << 63) - 1, 1 << mantissa_bits]
    around = {max(0, e + d) for e in edges for d in range(-2050, 2050)}
    spread = secure_generator(9).bit_generator.random_raw(20_000) >> np.uint64(1)
    shifts = secure_generator(10).integers(0, 63, spread.size, dtype=np.uint64)
    u = np.array(sorted(around | set((spread >> shifts).tolist()) | {0, 1}), dtype=np.uint64)
    buckets = samplers._LogBuckets(mantissa_bits).of(u)
    assert np.all(np.diff(buckets) >= 0)  # monotone in u
    m = mantissa_bits
    for value, bucket in zip(u.tolist(), buckets.tolist(), strict=True):
        bits = value if value >> (m + 1) else value | 1
        octave = bits.bit_length() - 1
        assert bucket == (octave << m) + (bits << m >> octave) - (1 << m)


def test_secure_generator_is_aes_keyed_from_the_os() -> None:
    one, two = secure_generator(), secure_generator()
    assert type(one.bit_generator).__name__ == "AESCounter"
    assert not np.array_equal(one.bit_generator.random_raw(4), two.bit_generator.random_raw(4))
    seeded = secure_generator(3).bit_generator.random_raw(4)
    assert np.array_equal(seeded, secure_generator(3).bit_generator.random_raw(4))


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        discrete_laplace(Fraction(0), 3, secure_generator(1))
    with pytest.raises(ValueError):
        discrete_laplace(Fraction(2**60), 3, secure_generator(1))
    assert discrete_laplace(Fraction(2), 0, secure_generator(1)).shape == (0,)


# --- few cuts and uniform offsets ---------------------------------------------------------------


def test_few_cuts_index_and_tie(digits90: None) -> None:
    a = ExactReal.exp_neg(Fraction(1, 3))
    cuts = [a / 4, a / 2, a]
    level = samplers.few_cuts(cuts)
    exact = [(-_dec(Fraction(1, 3))).exp() * k for k in (Decimal("0.25"), Decimal("0.5"), 1)]
    floors = [_floor_bits(c, 63) for c in exact]
    assert [int(t) for t in level._thr] == floors
    words = np.array([(f << 1) + s for f in floors for s in (-2, 2)], dtype=np.uint64)
    index, tie = level.index(words)
    assert index.tolist() == [0, 1, 1, 2, 2, 3] and not tie.any()
    # a tie reads the next word, compared with the next 64 bits of the cut
    digit = _floor_bits(exact[1], 127) & samplers._MASK64
    tied = np.array([floors[1] << 1], dtype=np.uint64)
    assert level.index(tied)[1].all()
    assert level.exact_index(floors[1] << 1, ScriptedWords([digit - 1])) == 1
    assert level.exact_index(floors[1] << 1, ScriptedWords([digit + 1])) == 2
    with pytest.raises(samplers.InternalError):
        samplers.few_cuts([a, a / 2])


def test_ratio_cuts_and_both_tables(digits90: None) -> None:
    b = ExactReal.exp_neg(Fraction(2, 3))
    bd = (-_dec(Fraction(2, 3))).exp()
    numerators = [(1, -1), (3, -1), (3, 1), (3, 5)]
    floors, cut = samplers.ratio_cuts(b, numerators, (7, 9))
    assert floors == [_floor_bits((a + s * bd) / (7 + 9 * bd), 63) for a, s in numerators]
    assert cut(2).floor_scaled(63) == floors[2]
    guided = samplers.cut_table(floors, cut)
    bisected = samplers.cut_table(floors, cut, max_buckets=4)
    assert isinstance(guided, samplers._FiniteLevel)
    assert isinstance(bisected, samplers.SortedCuts)
    words = secure_generator(8).bit_generator.random_raw(50_000)
    words = np.concatenate([words, np.array([f << 1 for f in floors], dtype=np.uint64)])
    for table in (guided, bisected):
        index, tie = table.index(words)
        assert index.tolist() == [sum(int(w) >> 1 >= f for f in floors) for w in words]
        assert tie.sum() == len(floors)


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 2**31 - 1, 2**32 - 1])
def test_uniform_below_is_the_exact_floor(n: int) -> None:
    words = secure_generator(n % 97).bit_generator.random_raw(20_000)
    index = samplers.uniform_below(np.full(words.size, n, dtype=np.uint64), words, None)
    assert index.tolist() == [(int(w) * n) >> 64 for w in words]


def test_uniform_below_resolves_a_carry_from_later_words() -> None:
    n = 3
    word = (2 * (1 << 64)) // 3  # word * 3 / 2^64 is just below 2: later words decide
    assert (word * n) % (1 << 64) > (1 << 64) - n
    below = samplers.uniform_below(
        np.array([n], np.uint64), np.array([word], np.uint64), ScriptedWords([0])
    )
    above = samplers.uniform_below(
        np.array([n], np.uint64), np.array([word], np.uint64), ScriptedWords([_MAX])
    )
    assert below.tolist() == [1] and above.tolist() == [2]


def test_uniform_below_is_uniform() -> None:
    counts = np.bincount(
        samplers.uniform_below(np.uint64(7), secure_generator(3).bit_generator.random_raw(N), None)
    )
    expected = N / 7
    statistic = float(((counts - expected) ** 2 / expected).sum())
    assert stats.chi2.sf(statistic, 6) > 1e-6
