"""Basic RAPPOR (one-hot, no Bloom filter): permanent then instantaneous randomisation.

The permanent randomised response (PRR) is drawn once per person and value
and memoised on the client: a set bit stays 1 with probability 1 - f/2, a
clear bit becomes 1 with probability f/2. Each report then re-randomises
the permanent bits (IRR): 1 -> 1 with probability p, 0 -> 1 with
probability q. `epsilon` is the longitudinal bound epsilon_inf = 2 ln((1 - f/2)/(f/2))
that holds however many reports a person sends, so f = 2 / (1 + e^(eps/2)).

The estimator must account for both stages: a report's bit for the true
value is 1 with probability q1 = (1 - f/2) p + (f/2) q and any other bit with
q0 = (f/2) p + (1 - f/2) q, so the count is (C - n q0) / (q1 - q0). (Seed
004's estimator ignores the IRR step and is biased.) One report on its own
is epsilon_one-LDP with epsilon_one = ln(q1 (1 - q0) / (q0 (1 - q1))) < epsilon.
With a fresh permanent response per person, the bits of one report are
independent with probabilities (q1, q0), so the unary encoding's estimator,
variance and count simulation apply unchanged with p* = q1, q* = q0.
"""

from __future__ import annotations

import math

import numpy as np

from dpsql.ldp.unary import (
    UnaryEncoding,
    exact_probability,
    randomize_onehot,
    randomize_packed,
    unary_channel,
)


class Rappor(UnaryEncoding):
    """Basic RAPPOR with permanent (f) and instantaneous (p, q) randomisation."""

    name = "rappor"

    def __init__(self, epsilon: float, domain, p: float = 0.75, q: float = 0.25):
        super().__init__(epsilon, domain, kind="sue")
        if not 0 <= q < p <= 1:
            raise ValueError("RAPPOR needs 0 <= q < p <= 1")
        self.name = "rappor"
        # SUE's exact (p, q) are RAPPOR's permanent (1 - f/2, f/2): f/2 = 1 / (1 + e^(eps/2)).
        self.keep_exact, self.half_f_exact = self.p_exact, self.q_exact
        self.f = 2 * self.q_star
        self.irr_p, self.irr_q = p, q
        irr_p, irr_q = exact_probability(p), exact_probability(q)
        self.irr_exact = (irr_p, irr_q)
        self.set_probabilities(
            self.keep_exact * irr_p + self.half_f_exact * irr_q,
            self.half_f_exact * irr_p + self.keep_exact * irr_q,
        )
        q1, q0 = self.p_star, self.q_star
        self.epsilon_one = math.log(q1 * (1 - q0) / (q0 * (1 - q1))) if q1 < 1 else math.inf

    def permanent(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Permanent responses (packed rows) for values `idx`; the client stores these."""
        return randomize_onehot(idx, self.d, self.keep_exact, self.half_f_exact, rng)

    def instantaneous(self, permanent: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A fresh report from stored permanent responses."""
        return randomize_packed(permanent, self.d, *self.irr_exact, rng)

    def perturb_indices(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """First reports of people with no stored permanent response.

        Drawn in one pass from the composite bit probabilities (q1, q0): the
        same distribution as instantaneous(permanent(idx)), at unary speed.
        People who report again must keep `permanent` and call `instantaneous`.
        """
        return randomize_onehot(idx, self.d, self.p_exact, self.q_exact, rng)

    def permanent_channel(self) -> np.ndarray:
        """P[permanent bits | x]: its worst-case ratio is exactly e^epsilon."""
        half = self.f / 2
        return unary_channel(self.d, 1 - half, half)
