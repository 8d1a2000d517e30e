"""The continual counters against their mathematics and closed forms."""

from __future__ import annotations

import importlib.util
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from dpsql.accounting import zcdp_epsilon, zcdp_rho
from dpsql.mechanisms.continual import (
    NOISE_GRID,
    BinaryTree,
    ContinualStream,
    Factorization,
    column_norm_squared,
    keyed_generator,
    laplace_tree,
    sqrt_coefficients,
)
from dpsql.mechanisms.laplace import DiscreteLaplace


def _normal(size: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    # float Gaussian only here, where the point is the variance, never in a release
    return rng.normal(0.0, sigma, size)


@pytest.mark.parametrize("horizon", [1, 7, 64, 300])
def test_square_root_factor_squares_to_the_all_ones_lower_triangle(horizon):
    f = sqrt_coefficients(horizon)
    index = np.arange(horizon)
    gap = index[:, None] - index[None, :]
    factor = np.where(gap >= 0, f[np.clip(gap, 0, None)], 0.0)
    assert np.abs(factor @ factor - np.tril(np.ones((horizon, horizon)))).max() < 1e-12


def test_coefficients_are_central_binomials_over_powers_of_four():
    f = sqrt_coefficients(40)
    for k in range(40):
        exact = Fraction(math.comb(2 * k, k), 4**k)
        assert abs(f[k] - float(exact)) <= 1e-15 * float(exact)


def test_column_norms_match_the_reference():
    assert round(column_norm_squared(2048), 4) == 3.4932
    assert round(column_norm_squared(2**16), 4) == 4.5964


def test_tree_sensitivity_is_its_number_of_levels():
    tree = laplace_tree(2048, 0.5, 3, honaker=False)
    assert tree.levels == 12  # 2^11 leaves: 11 levels below the root, and the root
    assert tree.node_variance == DiscreteLaplace(12 * 3, 0.5).variance()
    assert laplace_tree(2049, 1.0, 1).levels == 13  # padded to 4096 leaves
    # each step lies in exactly one node per level: the prefix [1, t] of a
    # power-of-two t is one node, and popcount(t) nodes in general
    plain = tree.variance() / tree.node_variance
    t = np.arange(1, 2049)
    assert np.array_equal(plain, [bin(v).count("1") for v in t])


def test_rho_converts_to_the_asked_epsilon():
    rho = zcdp_rho(0.5, 1e-10)
    assert float(zcdp_epsilon(Fraction(rho), Fraction(1, 10**10))) <= 0.5
    assert float(zcdp_epsilon(Fraction(rho * 1.001), Fraction(1, 10**10))) > 0.5


def _empirical_variance(counter, runs: int) -> np.ndarray:
    draws = np.stack([counter.noise(keyed_generator(run + 1)) for run in range(runs)])
    assert abs(draws.mean()) < 5 * math.sqrt(counter.variance().mean() / draws.size) * 3
    return draws.var(axis=0, ddof=1)


@pytest.mark.parametrize("honaker", [False, True])
def test_tree_variance_matches_the_closed_form(honaker):
    runs = 3000
    tree = laplace_tree(64, 1.0, 1, honaker=honaker)
    ratio = _empirical_variance(tree, runs) / tree.variance()
    # Laplace-type noise has kurtosis 6: a sample variance's relative sd is
    # sqrt(5/runs) for one node and less for sums; 5 sd per step, 64 steps
    assert np.abs(ratio - 1).max() < 5 * math.sqrt(5 / runs)
    assert abs(ratio.mean() - 1) < 5 * math.sqrt(5 / runs / 64) * 3


def test_factorization_variance_matches_the_closed_form():
    runs = 3000
    counter = Factorization(64, 0.5, 1.0, _normal)
    assert counter.sigma == pytest.approx(math.sqrt(column_norm_squared(64)))
    ratio = _empirical_variance(counter, runs) / counter.variance()
    assert np.abs(ratio - 1).max() < 5 * math.sqrt(2 / runs)


def test_honaker_never_worse_and_strictly_better_past_one_node():
    plain = laplace_tree(1024, 1.0, 1, honaker=False).variance()
    better = laplace_tree(1024, 1.0, 1).variance()
    assert np.all(better <= plain + 1e-9)
    assert better[1022] < 0.6 * plain[1022]  # t = 1023: ten nodes
    assert plain.max() == pytest.approx(2420, rel=0.001)  # mechanisms.md 3, pure epsilon = 1
    assert better.max() == pytest.approx(1404, rel=0.001)


def test_noise_lies_on_its_grid_and_is_deterministic_per_key():
    counter = laplace_tree(100, 1.0, 1)
    first = counter.noise(keyed_generator(7, 2))
    assert np.array_equal(first, counter.noise(keyed_generator(7, 2)))
    assert not np.array_equal(first, counter.noise(keyed_generator(7, 3)))
    assert np.array_equal(first / NOISE_GRID, np.rint(first / NOISE_GRID))
    plain = laplace_tree(100, 1.0, 1, honaker=False).noise(keyed_generator(7))
    assert np.array_equal(plain, np.rint(plain))  # plain sums of integer noise


def test_stream_steps_resume_and_never_rewrite_the_past():
    counter = BinaryTree(32, 4.0, lambda size, rng: rng.integers(-3, 4, size))
    values = np.arange(32) % 5
    whole = ContinualStream(counter, 11).extend(values)
    stepped = ContinualStream(counter, 11)
    assert [stepped.step(v) for v in values[:10]] == list(whole[:10])
    restarted = ContinualStream(counter, 11)
    restarted.resume(10, whole[9] - restarted.noise[9])
    assert np.array_equal(restarted.extend(values[10:]), whole[10:])
    with pytest.raises(ValueError, match="horizon"):
        restarted.step(1)


def test_seed003_example_runs_and_matches_its_closed_forms(tmp_path):
    path = Path(__file__).resolve().parent.parent / "examples" / "seed003_continual.py"
    spec = importlib.util.spec_from_file_location("seed003_continual", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rows = example.experiment([4, 6], reps=400, seed=1, streams_at=4)
    assert {r["p"] for r in rows} == set(example.PS)
    for row in rows:
        # mean over >= 16 steps of a 400-run MSE: relative sd below sqrt(5/400) / 2
        assert row["mean"] == pytest.approx(row["closed_mean"], rel=5 * math.sqrt(5 / 400) / 2)
    example.plot(rows, tmp_path / "curve.png")
    top = example.zipf_histogram(64, 5, 1, tmp_path / "zipf.png")
    assert (tmp_path / "curve.png").stat().st_size > 0 and (tmp_path / "zipf.png").exists()
    assert top["top key"] >= 1


def test_a_tree_whose_node_variance_underflows_releases_exact_totals():
    """epsilon 1e4: the discrete Laplace's variance is 0.0 at sensitivity 1 and subnormal at
    2, where Honaker's weights once overflowed to NaN (released as int64's minimum)."""
    from dpsql.mechanisms.continual import laplace_tree

    for sensitivity in (1, 2):
        tree = laplace_tree(16, 1e4, sensitivity)
        assert tree.node_variance < 1e-300
        noise = tree.noise(np.random.default_rng(1))
        assert np.all(noise == 0) and np.all(np.isfinite(tree.variance()))


# -- the factorization as released: exact integers up to the noise ---------------------


def _brute_convolution(horizon: int, values: list[int]) -> list[Fraction]:
    """(R~ x)_t 2^B with Fractions from the coefficients' definition: F(k) is f(k) 2^B
    rounded, f(k) = C(2k, k) / 4^k exactly."""
    from dpsql.mechanisms.continual import PRECISION_BITS

    scale = 1 << PRECISION_BITS
    exact = [Fraction(math.comb(2 * k, k), 4**k) * scale for k in range(horizon)]
    rounded = [math.floor(v + Fraction(1, 2)) for v in exact]
    return [
        sum(Fraction(rounded[t - i]) * values[i] for i in range(t + 1)) for t in range(len(values))
    ]


def test_integer_coefficients_are_the_rounded_square_root_coefficients():
    from dpsql.mechanisms.continual import PRECISION_BITS, integer_coefficients

    integers = integer_coefficients(3000)
    for k in [*range(60), 255, 1024, 2999]:
        exact = Fraction(math.comb(2 * k, k), 4**k) * (1 << PRECISION_BITS)
        assert abs(integers[k] - exact) <= Fraction(1, 2)
    assert integer_coefficients(40) == integers[:40]


def test_exact_convolution_direct_and_kronecker_agree_with_fractions():
    from dpsql.mechanisms.continual import (
        _convolve_direct,
        _convolve_kronecker,
        convolve_exact,
        integer_coefficients,
    )

    rng = np.random.default_rng(5)
    coefficients = integer_coefficients(64)
    for _ in range(60):
        size = int(rng.integers(1, 50))
        magnitude = 10 ** int(rng.integers(0, 19))
        values = [int(v) for v in rng.integers(-magnitude, magnitude + 1, size)]
        if rng.random() < 0.3:
            values = [abs(v) for v in values]  # no offset
        start = int(rng.integers(0, size + 1))
        brute = _brute_convolution(64, values)[start:]
        assert _convolve_direct(coefficients, values, start, size) == brute
        assert _convolve_kronecker(coefficients, values, start, size) == brute
        assert convolve_exact(coefficients, values, start, size) == brute
    # the extremes a step can take: +/- 2^62 (exact_integers' clamp), and a long prefix
    values = [(-1) ** i * (1 << 62) for i in range(3000)]
    coefficients = integer_coefficients(3000)
    assert _convolve_kronecker(coefficients, values, 2990, 3000) == _convolve_direct(
        coefficients, values, 2990, 3000
    )


def test_rounding_is_half_up_on_any_lattice():
    from dpsql.mechanisms.continual import PRECISION_BITS, ExactFactorization

    counter = ExactFactorization(8, 0.5, 1)
    for exponent in (-60, -48, -47, -10, 0, 3):
        counter.exponent = exponent
        lattice = Fraction(2) ** exponent
        convolved = [-7, -3, -1, 0, 1, 3, 2**50 + 1, -(2**50) - 5, 12345678901234567]
        for c, q in zip(convolved, counter.quantize(convolved), strict=True):
            value = Fraction(c, 1 << PRECISION_BITS) / lattice
            assert q == math.floor(value + Fraction(1, 2))


def test_the_norm_bound_is_the_largest_column_norm_of_r_tilde_rounded_up():
    from dpsql.mechanisms.continual import PRECISION_BITS, ExactFactorization

    counter = ExactFactorization(300, 0.5, 1)
    columns = [
        sum(Fraction(v, 1 << PRECISION_BITS) ** 2 for v in counter.integers[: 300 - j])
        for j in range(300)
    ]
    assert max(columns) == columns[0] <= counter.norm_bound**2
    assert counter.norm_bound**2 - columns[0] < Fraction(1, 2**40)
    assert float(counter.norm_bound) == pytest.approx(math.sqrt(column_norm_squared(300)))


@pytest.mark.parametrize("exponent", [None, -3, 0, 2])
def test_neighbours_q_differ_by_at_most_the_sensitivity_bound(exponent):
    """||q(x) - q(x')||_2 <= Delta ||R~||_{1->2} / h + sqrt(T), the bound sigma_z is made of,
    for delta with ||delta||_1 <= Delta spread over the steps, at the counter's own lattice
    and at coarse ones (where the rounding term matters)."""
    from dpsql.mechanisms.continual import ExactFactorization, convolve_exact

    horizon, sensitivity = 120, 7
    counter = ExactFactorization(horizon, 0.05, sensitivity)
    if exponent is not None:
        counter.exponent = exponent
    lattice = Fraction(2) ** counter.exponent
    bound = sensitivity * counter.norm_bound / lattice + math.isqrt(horizon - 1) + 1
    if exponent is None:
        assert bound == counter.sensitivity_bound
        assert counter.sigma2 >= bound**2 / (2 * Fraction(0.05))
    rng = np.random.default_rng(11)

    def q(values: list[int]) -> np.ndarray:
        convolved = convolve_exact(counter.integers, values, 0, horizon)
        return np.array(counter.quantize(convolved), dtype=object)

    worst = Fraction(0)
    for trial in range(80):
        values = [int(v) for v in rng.integers(-50, 1000, horizon)]
        delta = [0] * horizon
        parts = int(rng.integers(1, sensitivity + 1)) if trial % 4 else 1
        budget = sensitivity
        for _ in range(parts):  # split the L1 budget over random steps, random signs
            amount = budget if _ == parts - 1 else int(rng.integers(0, budget + 1))
            budget -= amount
            delta[int(rng.integers(0, 3 if trial % 4 == 0 else horizon))] += int(
                rng.choice([-1, 1]) * amount
            )
        assert sum(map(abs, delta)) <= sensitivity
        neighbour = [v + d for v, d in zip(values, delta, strict=True)]
        gap = q(values) - q(neighbour)
        squared = sum(int(g) ** 2 for g in gap)
        assert squared <= bound**2
        worst = max(worst, Fraction(squared))
    # the bound is nearly attained (a whole Delta on the first step): it is not loose
    if exponent is None:
        assert worst >= (bound - 2 * (math.isqrt(horizon) + 1)) ** 2


def test_partitions_share_one_bound_with_every_partitions_rounding():
    """A unit's Delta may be spread over every partition of a stream, each with its own q
    and z: by the triangle inequality the concatenated q move by at most Delta ||R~|| / h
    plus the rounding of every coordinate of every partition, sqrt(P T), which sigma_z
    must be made of (it was sqrt(T): found reviewing the exact factorization)."""
    from dpsql.mechanisms.continual import ExactFactorization, convolve_exact

    horizon, sensitivity, partitions = 64, 6, 6
    counter = ExactFactorization(horizon, 0.05, sensitivity, partitions)
    lattice = Fraction(2) ** counter.exponent
    rounding = math.isqrt(partitions * horizon - 1) + 1
    assert counter.sensitivity_bound == sensitivity * counter.norm_bound / lattice + rounding
    assert counter.sigma2 >= counter.sensitivity_bound**2 / (2 * Fraction(0.05))
    counter.exponent = 4  # a lattice of 16 units: rounding is most of what moves q
    bound = sensitivity * counter.norm_bound / 16 + rounding

    def q(values: list[int]) -> list[int]:
        return counter.quantize(convolve_exact(counter.integers, values, 0, horizon))

    rng = np.random.default_rng(5)
    for _ in range(100):
        squared = 0
        for _part in range(partitions):  # one unit's row in each partition's first step
            values = [int(v) for v in rng.integers(0, 1000, horizon)]
            neighbour = [values[0] + 1, *values[1:]]
            squared += sum((a - b) ** 2 for a, b in zip(q(values), q(neighbour), strict=True))
        assert squared <= bound**2


def test_exact_factorization_continues_identically_from_stored_steps():
    """A stream extended tick by tick (one step, a few, many: direct sums, then Kronecker)
    has the q of one tick over every step, so a restarted process that reads the stored
    exact values and q continues the same mechanism; its releases agree to float rounding."""
    from dpsql.mechanisms.continual import ExactFactorization

    counter = ExactFactorization(4000, 0.5, 2)
    z = counter.noise(keyed_generator(3, 1))
    assert np.array_equal(z, counter.noise(keyed_generator(3, 1)))
    values = [int(v) for v in np.random.default_rng(2).integers(-3, 40, 4000)]
    whole_q, whole_r = counter.extend([], [], z, values)
    exact, quantized, releases = [], [], []
    for cut in (1, 2, 40, 41, 3999, 4000):
        fresh_q, fresh_r = counter.extend(exact, quantized, z, values[len(exact) : cut])
        exact, quantized = exact + values[len(exact) : cut], quantized + fresh_q
        releases.extend(fresh_r)
    assert quantized == whole_q
    np.testing.assert_allclose(releases, whole_r, rtol=0, atol=1e-9 * np.abs(whole_r).max())
    with pytest.raises(ValueError, match="horizon"):
        counter.extend(exact, quantized, z, [1])


def test_exact_factorization_is_exact_at_a_huge_budget_and_refuses_what_it_cannot_draw():
    from dpsql.mechanisms.base import OutOfRange
    from dpsql.mechanisms.continual import EXACT_HORIZON, ExactFactorization

    counter = ExactFactorization(500, 1e12, 1)
    counter.prepare()
    values = [int(v) for v in np.random.default_rng(4).integers(0, 10**6, 500)]
    _, releases = counter.extend([], [], counter.noise(keyed_generator(9)), values)
    assert np.array_equal(np.rint(releases), np.cumsum(values))
    with pytest.raises(OutOfRange):
        ExactFactorization(1024, 1e-48, 1).prepare()  # a count's noise beyond int64
    with pytest.raises(OutOfRange):
        ExactFactorization(1024, 0.0, 1).prepare()  # no rho
    with pytest.raises(ValueError, match="horizon"):
        ExactFactorization(EXACT_HORIZON + 1, 0.5, 1)


def test_exact_factorization_refuses_past_steps_that_do_not_match():
    """Stored q of another length than the stored exact values (ticks of another format
    before), or a last release its q and z do not give again: the stream is not
    continued, since its new steps would add other noise to released q."""
    from dpsql.mechanisms.continual import ExactFactorization, NoiseMismatch, keyed_generator

    counter = ExactFactorization(64, 0.5, 1)
    z = counter.noise(keyed_generator(5))
    quantized, released = counter.extend([], [], z, [3, 1, 4])
    with pytest.raises(NoiseMismatch, match="do not match"):
        counter.extend([3, 1, 4], quantized[:2], z, [1])
    counter.extend([3, 1, 4], quantized, z, [1], float(released[-1]))  # the same noise
    with pytest.raises(NoiseMismatch, match="drawn again"):
        other = counter.noise(keyed_generator(6))  # noise drawn otherwise
        counter.extend([3, 1, 4], quantized, other, [1], float(released[-1]))
