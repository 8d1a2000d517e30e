"""The mechanism choice: it picks the family whose closed-form expected error is least."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpsql.accounting import zcdp_epsilon, zcdp_rho
from dpsql.mechanisms.choice import choose
from dpsql.mechanisms.gaussian import GridGaussian
from dpsql.mechanisms.laplace import DiscreteLaplace, GridLaplace
from dpsql.mechanisms.samplers import secure_generator
from dpsql.mechanisms.staircase import GridStaircase, Staircase

MECHANISMS = {"laplace": GridLaplace, "staircase": GridStaircase}


def test_count_gets_laplace_whatever_epsilon() -> None:
    # Delta = 1 on integers: the staircase is the geometric mechanism, so no gain
    for epsilon in (0.1, 1.0, 10.0):
        name, reason = choose(1, 1, epsilon, 0.0, 1)
        assert name == "laplace" and "least expected error" in reason


@pytest.mark.parametrize("epsilon", [2.0, 5.0, 10.0])
def test_large_epsilon_and_sensitivity_get_the_staircase(epsilon: float) -> None:
    name, reason = choose(100, 100, epsilon, 0.0, 1)
    assert name == "staircase"
    ratio = (
        Staircase(100, epsilon).expected_abs_error()
        / DiscreteLaplace(100, epsilon).expected_abs_error()
    )
    assert f"{ratio:.3g}x" in reason


def test_many_cells_with_delta_get_the_gaussian() -> None:
    # a unit in 100 cells, at most 1 in each: L1 = 100, L2 = 10
    name, reason = choose(100, 10, 1.0, 1e-6, 100)
    assert name == "gaussian" and "100 cells" in reason
    # without delta the Gaussian is not available; with one cell it loses
    assert choose(100, 10, 1.0, 0.0, 100)[0] != "gaussian"
    assert choose(1, 1, 1.0, 1e-6, 1)[0] == "laplace"


@pytest.mark.parametrize(
    ("l1", "l2", "epsilon", "delta", "cells"),
    [
        (1, 1, 0.5, 1e-6, 1),
        (10, 10, 3.0, 0.0, 1),
        (64, 8, 0.7, 1e-8, 64),
        (2.5, 2.5, 6.0, 1e-5, 1),
        (400, 20, 4.0, 1e-6, 400),
    ],
)
def test_choice_is_the_least_closed_form_error(
    l1: float, l2: float, epsilon: float, delta: float, cells: int
) -> None:
    name, _ = choose(l1, l2, epsilon, delta, cells)
    # integer sensitivities are compared on the integers, as the choice does
    laplace, staircase = (
        (DiscreteLaplace, Staircase) if float(l1).is_integer() else (GridLaplace, GridStaircase)
    )
    exact_l1 = int(l1) if float(l1).is_integer() else l1
    errors = {
        "laplace": laplace(exact_l1, epsilon).expected_abs_error(),
        "staircase": staircase(exact_l1, epsilon).expected_abs_error(),
    }
    if delta:
        errors["gaussian"] = GridGaussian(l2, zcdp_rho(epsilon, delta)).expected_abs_error()
    # the grid versions agree with the closed forms the choice uses to within 1e-4
    assert errors[name] <= min(errors.values()) * (1 + 1e-4)


def test_zcdp_rho_is_valid_and_nearly_largest() -> None:
    for epsilon, delta in ((1.0, 1e-6), (0.1, 1e-10), (8.0, 1e-3)):
        rho = zcdp_rho(epsilon, delta)
        assert zcdp_epsilon(Fraction(rho), Fraction(delta)) <= Fraction(epsilon)
        assert zcdp_epsilon(Fraction(rho * (1 + 1e-8)), Fraction(delta)) > Fraction(repr(epsilon))


def test_staircase_choice_pays_off_in_samples() -> None:
    """The chosen staircase's empirical error is below Laplace's on the same values."""
    values = np.zeros(200_000)

    rng = secure_generator(21)
    name, _ = choose(10.0, 10.0, 5.0, 0.0, 1)
    chosen = np.abs(MECHANISMS[name](10.0, 5.0).sample(values, rng)).mean()
    laplace = np.abs(GridLaplace(10.0, 5.0).sample(values, rng)).mean()
    assert chosen < 0.5 * laplace
    assert math.isclose(chosen / laplace, 0.41, abs_tol=0.03)


def test_refusals_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="positive sensitivities"):
        choose(0, 1, 1.0, 0.0, 1)
    with pytest.raises(ValueError, match="delta"):
        choose(1, 1, 1.0, 1.0, 1)
