"""The hierarchical histogram: decomposition, sensitivity, consistency, variance, intervals."""

from __future__ import annotations

from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest

from dpsql.accounting import zcdp_rho
from dpsql.mechanisms.gaussian import DiscreteGaussian
from dpsql.mechanisms.tree import (
    HierarchicalHistogram,
    TreeShape,
    chernoff_halfwidths,
    consistent_leaves,
    decompose,
    l2_sensitivity,
    level_sums,
    range_weights,
    subgaussian_halfwidths,
)

RHO = zcdp_rho(1.0, 1e-6)


def _laplace(counts, branching, rng, contributions=1):
    return HierarchicalHistogram.build(counts, branching, 1.0, rng, contributions)


def _gaussian(counts, branching, rng, contributions=1):
    return HierarchicalHistogram.build_gaussian(counts, branching, RHO, rng, contributions)


def _dense(shape: TreeShape) -> np.ndarray:
    """The matrix A mapping leaves to every measured node, top level first."""
    rows = []
    for level in range(shape.top, shape.height + 1):
        size = shape.block(level)
        for index in range(shape.branching**level):
            row = np.zeros(shape.leaves)
            row[index * size : (index + 1) * size] = 1
            rows.append(row)
    return np.array(rows)


def _split(shape: TreeShape, flat: np.ndarray) -> list[np.ndarray]:
    return np.split(flat, np.cumsum(shape.sizes())[:-1])


def test_decomposition_covers_each_range_exactly_within_the_bound() -> None:
    rng = np.random.default_rng(5)
    for _ in range(400):
        shape = TreeShape(int(rng.integers(1, 3000)), int(rng.integers(2, 17)))
        start = int(rng.integers(0, shape.bins))
        stop = int(rng.integers(start + 1, shape.bins + 1))
        nodes = decompose(shape, start, stop)
        covered = np.zeros(shape.leaves, dtype=int)
        for level, index in nodes:
            size = shape.block(level)
            covered[index * size : (index + 1) * size] += 1
        assert covered[start:stop].tolist() == [1] * (stop - start)
        assert covered.sum() == stop - start
        assert len(nodes) <= shape.node_bound(stop - start)


def test_decomposition_of_the_thesis_example() -> None:
    # seed 000 section 9.4: [2, 22] with B=2, D=32 is [2,3] [4,7] [8,15] [16,19] [20,21] [22,22]
    shape = TreeShape(32, 2)
    spans = sorted(
        (i * shape.block(lv), (i + 1) * shape.block(lv) - 1) for lv, i in decompose(shape, 2, 23)
    )
    assert spans == [(2, 3), (4, 7), (8, 15), (16, 19), (20, 21), (22, 22)]


_SHAPES = [(32, 2, 5), (27, 3, 3), (64, 4, 3), (101, 16, 2), (65536, 16, 4), (1, 2, 1)]


@pytest.mark.parametrize(("bins", "branching", "levels"), _SHAPES)
def test_sensitivity_is_the_number_of_levels(bins: int, branching: int, levels: int) -> None:
    shape = TreeShape(bins, branching)
    assert shape.levels == levels
    counts = np.arange(bins) % 7
    for leaf in (0, bins // 3, bins - 1):
        plus = counts.copy()
        plus[leaf] += 1
        change = sum(
            int(np.abs(a - b).sum())
            for a, b in zip(level_sums(shape, plus), level_sums(shape, counts), strict=True)
        )
        assert change == levels
    tree = HierarchicalHistogram.build(counts, branching, 0.5, np.random.default_rng(1), 3)
    assert tree.noise.sensitivity == 3 * levels  # levels x the rows one unit may add
    assert tree.noise.scale == pytest.approx(3 * levels / 0.5)


@pytest.mark.parametrize(("bins", "branching", "levels"), _SHAPES)
def test_gaussian_l2_sensitivity_is_the_root_of_the_levels(
    bins: int, branching: int, levels: int
) -> None:
    shape = TreeShape(bins, branching)
    counts = np.arange(bins) % 7
    for leaf in (0, bins // 2, bins - 1):
        plus = counts.copy()
        plus[leaf] += 3  # a unit's 3 rows, all in one bin: the worst case
        squares = sum(
            int(np.square(a - b).sum())
            for a, b in zip(level_sums(shape, plus), level_sums(shape, counts), strict=True)
        )
        assert squares == 9 * levels
    bound = l2_sensitivity(levels, 3)
    assert bound**2 >= 9 * levels and bound - 3 * np.sqrt(levels) < 1e-9
    tree = _gaussian(counts, branching, np.random.default_rng(1), 3)
    # sigma^2 = Delta_2^2 / (2 rho), never below the exact value, never far above it
    assert tree.noise.sigma2 == bound**2 / (2 * tree.noise.cost.rho)
    assert float(tree.noise.sigma2) == pytest.approx(9 * levels / (2 * RHO), rel=1e-9)
    assert tree.noise.cost.rho == pytest.approx(RHO, rel=1e-12)


@pytest.mark.parametrize(("bins", "branching"), [(27, 3), (20, 4), (7, 2), (1, 2), (101, 16)])
def test_consistency_variance_and_weights_match_dense_least_squares(
    bins: int, branching: int
) -> None:
    shape = TreeShape(bins, branching)
    dense = _dense(shape)
    rng = np.random.default_rng(bins)
    flat = dense @ np.r_[rng.integers(0, 50, bins), np.zeros(shape.leaves - bins)]
    flat = flat + rng.normal(0, 4, len(flat))
    solution = np.linalg.lstsq(dense, flat, rcond=None)[0]
    assert np.allclose(consistent_leaves(shape, _split(shape, flat)), solution[:bins])
    inverse = np.linalg.inv(dense.T @ dense)
    starts, stops = np.triu_indices(bins + 1, 1)
    pick = np.random.default_rng(0).permutation(len(starts))[:150]
    starts, stops = starts[pick], stops[pick]
    squares, largest = range_weights(shape, starts, stops)
    for a, e, q2, w in zip(starts, stops, squares, largest, strict=True):
        query = np.zeros(shape.leaves)
        query[a:e] = 1
        weights = dense @ inverse @ query
        assert q2 == pytest.approx(query @ inverse @ query, rel=1e-9)
        assert w == pytest.approx(np.abs(weights).max(), rel=1e-9)


@pytest.mark.parametrize("build", [_laplace, _gaussian])
def test_consistent_estimate_is_unbiased_with_the_closed_form_variance(build) -> None:
    counts = np.random.default_rng(2).integers(0, 40, 64)
    ranges = [(0, 64), (3, 4), (5, 37), (17, 60)]
    trials = 3000
    rng = np.random.default_rng(11)
    starts, stops = np.array(ranges).T
    answers = np.empty((trials, len(ranges)))
    for t in range(trials):
        prefix = build(counts, 4, rng).prefix
        answers[t] = prefix[stops] - prefix[starts]
    tree = build(counts, 4, rng)
    for column, (a, e) in enumerate(ranges):
        estimate = tree.answer(a, e)
        truth = counts[a:e].sum()
        # mean within 5 standard errors; sample variance within 5 of its standard
        # errors, Var(s^2) <= sigma^4 (2 + excess kurtosis) / n with excess <= 3 (Laplace;
        # 0 for the Gaussian)
        assert abs(answers[:, column].mean() - truth) < 5 * np.sqrt(estimate.variance / trials)
        ratio = answers[:, column].var(ddof=1) / estimate.variance
        assert abs(ratio - 1) < 5 * np.sqrt(5 / trials)
        outside = np.mean(np.abs(answers[:, column] - truth) > estimate.interval95)
        assert outside < 0.05  # the interval is guaranteed, hence conservative


def test_gaussian_variance_is_the_node_variance_times_the_squared_weights() -> None:
    tree = _gaussian(np.ones(4096, dtype=np.int64), 16, np.random.default_rng(3))
    assert tree.mechanism == "gaussian"
    # the discrete Gaussian's variance is just below sigma^2 at this sigma
    sigma2 = float(tree.noise.sigma2)
    assert sigma2 * (1 - 1e-6) < tree.node_variance <= sigma2
    squares, _ = range_weights(tree.shape, np.array([100]), np.array([3000]))
    estimate = tree.answer(100, 3000)
    assert estimate.variance == pytest.approx(squares[0] * tree.node_variance, rel=1e-12)
    assert estimate.interval95 == pytest.approx(
        np.sqrt(sigma2 * squares[0] * 2 * np.log(40)), rel=1e-8
    )
    raw = tree.answer(100, 102, consistent=False)
    assert raw.estimator == "flat leaves"
    assert raw.variance == pytest.approx(2 * tree.node_variance)


def test_subgaussian_halfwidth_is_a_valid_bound() -> None:
    # one discrete Gaussian: the bound must cover at least the exact 95% interval
    for sigma2 in (1, 7, 250):
        noise = DiscreteGaussian(1, Fraction(1, 2 * sigma2))
        (width,) = subgaussian_halfwidths(np.sqrt(sigma2), np.array([1.0]))
        assert width >= noise.interval95()
    # many equal weights: the normal 1.96 sd times sqrt(2 log 40) / 1.96 = 1.386
    (wide,) = subgaussian_halfwidths(2.0, np.array([10_000.0]))
    assert wide == pytest.approx(1.96 * 200 * 1.3859, rel=1e-3)


def test_raw_tree_picks_flat_leaves_for_short_ranges() -> None:
    counts = np.ones(4096, dtype=np.int64)
    tree = HierarchicalHistogram.build(counts, 16, 1.0, np.random.default_rng(3))
    short = tree.answer(100, 102, consistent=False)
    long = tree.answer(100, 3000, consistent=False)
    assert short.estimator == "flat leaves"
    assert short.variance == pytest.approx(2 * tree.node_variance)
    assert long.estimator == "tree nodes"
    assert long.variance == pytest.approx(
        len(decompose(tree.shape, 100, 3000)) * tree.node_variance
    )
    assert tree.answer(100, 3000).variance < long.variance  # consistency helps
    assert tree.answer(5, 5) == tree.answer(5, 5, consistent=False)  # empty: exactly 0


def test_chernoff_halfwidth_is_a_valid_bound() -> None:
    # one discrete Laplace of scale 1: P(|Z| > t) = 2 a^(t+1) / (1 + a), a = 1/e
    a = np.exp(-1)
    (width,) = chernoff_halfwidths(1.0, np.array([1.0]), np.array([1.0]))
    assert 2 * a ** (np.floor(width) + 1) / (1 + a) <= 0.05
    # many equal weights: close to the normal 1.96 sd, never below it
    (wide,) = chernoff_halfwidths(1.0, np.array([10_000.0]), np.array([1.0]))
    normal = 1.96 * np.sqrt(2 * a / (1 - a) ** 2 * 10_000)
    assert normal < wide < 1.5 * normal


def test_chernoff_halfwidth_is_the_crossing_of_the_bound_to_within_its_margin() -> None:
    # the bound evaluated in 50-digit decimals: the half-width is never inside the
    # crossing (valid), and less than 1e-8 beyond it (Newton's method converged)
    getcontext().prec = 50
    ratios = np.concatenate([np.geomspace(1e-3, 1e12, 400), [1.0, 2.0]])
    widths = chernoff_halfwidths(1.0, ratios, np.ones_like(ratios))
    target = Decimal("0.025").ln()

    def log_bound(ratio: float, tau: float) -> Decimal:
        k, t = Decimal(ratio), Decimal(tau)
        v = t / ((k * k + t * t).sqrt() + k)
        return -v * t - k * (1 - v * v).ln()

    for ratio, width in zip(ratios, widths, strict=True):
        assert log_bound(ratio, width) <= target
        assert log_bound(ratio, width * (1 - 1e-8)) > target


def test_range_weights_of_a_batch_over_many_chunks_match_one_range_at_a_time() -> None:
    shape = TreeShape(5000, 4)
    starts, stops = np.sort(np.random.default_rng(3).integers(0, 5001, (2, 3000)), axis=0)
    squares, largest = range_weights(shape, starts, stops)
    for a, e, q2, w in zip(starts, stops, squares, largest, strict=True):
        assert (q2, w) == tuple(float(x[0]) for x in range_weights(shape, [a], [e]))


@pytest.mark.parametrize("build", [_laplace, _gaussian])
def test_json_round_trip_answers_the_same(build) -> None:
    tree = build(np.arange(300), 8, np.random.default_rng(4), 2)
    again = HierarchicalHistogram.from_json(tree.to_json())
    assert again.answer(17, 250) == tree.answer(17, 250)
    assert again.noise.sensitivity == tree.noise.sensitivity
    assert again.mechanism == tree.mechanism
    assert again.node_variance == tree.node_variance


def test_stored_gaussian_tree_with_other_noise_is_refused() -> None:
    data = _gaussian(np.arange(300), 8, np.random.default_rng(4), 2).to_json()
    data["sigma2"] = "1"
    with pytest.raises(ValueError, match="does not match its noise"):
        HierarchicalHistogram.from_json(data)
