"""Which noise to use for one measurement: the family with the least expected absolute error.

A pure function of the measurement's sensitivities and its share of the
budget. Each family's E|noise| per cell comes from its closed form:

- Laplace: Delta1/epsilon (the exact discrete form when Delta1 is an integer);
- staircase: the discrete staircase's exact E|X| for an integer Delta1 (equal
  to Laplace's for Delta1 = 1, where it is the geometric mechanism), else the
  continuous Delta1 e^(eps/2) / (e^eps - 1);
- Gaussian (only when delta > 0): sigma sqrt(2/pi) with sigma = Delta2 /
  sqrt(2 rho), rho the largest zCDP parameter whose CKS conversion fits in
  (epsilon, delta). It wins when a release has many cells, so that its L2
  sensitivity is far below the L1 sensitivity the other two pay for.

Ties go to Laplace, the simplest and most familiar.
"""

from __future__ import annotations

import math

from dpsql.accounting import zcdp_rho
from dpsql.mechanisms.base import OutOfRange
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.mechanisms.staircase import Staircase

_STAIRCASE_INTEGER_LIMIT = (1 << 31) - 1  # Staircase's largest integer sensitivity


# the inverse conversion lives in accounting; plans and synopses import it from here too


def _laplace_error(l1: float, epsilon: float) -> float:
    if float(l1).is_integer():
        return DiscreteLaplace(int(l1), epsilon).expected_abs_error()
    return l1 / epsilon


def _staircase_error(l1: float, epsilon: float) -> float:
    """E|noise| of the staircase; infinity where its sampler cannot draw it (from an
    epsilon of about 100 up, by sensitivity), which makes it no candidate."""
    if float(l1).is_integer() and l1 <= _STAIRCASE_INTEGER_LIMIT:
        try:
            staircase = Staircase(int(l1), epsilon)
            staircase.prepare()
        except OutOfRange:
            return math.inf
        return staircase.expected_abs_error()
    # e^(eps/2) / (e^eps - 1), written so that no term overflows at large epsilon
    return l1 * math.exp(-epsilon / 2) / -math.expm1(-epsilon)


def _gaussian_error(l2: float, epsilon: float, delta: float) -> float:
    sigma = l2 / math.sqrt(2 * zcdp_rho(epsilon, delta))
    return sigma * math.sqrt(2 / math.pi)


def _times(error: float, laplace: float) -> str:
    """`error` as a multiple of Laplace's, which underflows to 0 at a large epsilon."""
    return f"{error / laplace:.3g}" if laplace else "-"


def choose(
    sensitivity_l1: float, sensitivity_l2: float, epsilon: float, delta: float, cells: int
) -> tuple[str, str]:
    """The mechanism name ("laplace", "staircase" or "gaussian") with the least expected
    absolute error per cell for this measurement, and a one-line reason."""
    if not (sensitivity_l1 > 0 and sensitivity_l2 > 0 and epsilon > 0 and cells >= 1):
        raise ValueError(
            "choosing a mechanism needs positive sensitivities and epsilon and cells >= 1, "
            f"got l1={sensitivity_l1}, l2={sensitivity_l2}, epsilon={epsilon}, cells={cells}"
        )
    if not 0 <= delta < 1:
        raise ValueError(f"choosing a mechanism needs 0 <= delta < 1, got {delta}")
    errors = {
        "laplace": _laplace_error(sensitivity_l1, epsilon),
        "staircase": _staircase_error(sensitivity_l1, epsilon),
    }
    if delta > 0:
        errors["gaussian"] = _gaussian_error(sensitivity_l2, epsilon, delta)
    # Within a relative 1e-9 counts as a tie (the staircase with sensitivity 1 is the
    # geometric mechanism, computed along another path), and ties go to Laplace.
    least = min(errors.values())
    best = min(
        (name for name in errors if errors[name] <= least * (1 + 1e-9)),
        key=lambda name: name != "laplace",
    )
    laplace = errors["laplace"]
    if best == "laplace":
        others = ", ".join(
            f"{name} {_times(errors[name], laplace)}x" for name in errors if name != best
        )
        return best, (
            f"laplace: least expected error (E|noise| {laplace:.4g}; {others}) "
            f"at epsilon {epsilon:g}, sensitivity {sensitivity_l1:g}"
        )
    if best == "staircase":
        return best, (
            f"staircase: E|noise| {errors[best]:.4g}, {_times(errors[best], laplace)}x Laplace's, "
            f"at epsilon {epsilon:g} with sensitivity {sensitivity_l1:g} > 1"
        )
    return best, (
        f"gaussian: E|noise| {errors[best]:.4g}, {_times(errors[best], laplace)}x Laplace's: "
        f"{cells} cells, L2 sensitivity {sensitivity_l2:g} against L1 {sensitivity_l1:g}, "
        f"delta {delta:g}"
    )
