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
