"""Random-matrix projection (Bassily and Smith 2015), as seed 004 meant it.

A public matrix Phi in {-1/sqrt(m), +1/sqrt(m)}^(m x d), drawn from a public
seed so clients and server agree. A person holding v picks a row r uniformly
and reports (r, one randomised sign): the sign of Phi[r, v], kept with
probability e^eps / (e^eps + 1). r does not depend on v, and the sign's ratio
is e^eps, so a report is eps-LDP.

The server computes est[i] = c sqrt(m) sum_j s_j Phi[r_j, i] with
c = (e^eps + 1) / (e^eps - 1). Its expectation is (Phi^T Phi f)[i]: the
diagonal of Phi^T Phi is exactly 1 (every column has squared norm 1), and the
off-diagonal terms have mean 0 over the public randomness, so the estimate is
unbiased averaged over the choice of Phi, and for one fixed Phi it carries the
bias (Phi^T Phi - I) f, which `bias` reports. (Seed 004 drew entries uniformly
in [-1/sqrt(m), 1/sqrt(m)], so the columns had squared norm about 1/3 and the
estimates were about three times too small.) The one-bit Hadamard mechanism
`hm` is the same protocol with an orthogonal matrix, which removes the bias:
prefer it; this one is here to reproduce the seed's comparison correctly.
"""

from __future__ import annotations

import math

import numpy as np

from dpsql.ldp.hadamard import OneBitProjection


class RandomMatrix(OneBitProjection):
    """The one-bit projection on a public random sign matrix (`size` rows)."""

    name = "rm"

    def __init__(self, epsilon: float, domain, rows: int | None = None, matrix_seed: int = 0):
        super().__init__(epsilon, domain)
        self.size = int(rows) if rows is not None else self.d
        if self.size < 1:
            raise ValueError(f"the matrix needs at least one row, got {rows}")
        e = math.exp(self.epsilon)
        self.keep = e / (e + 1)
        self.c = (e + 1) / (e - 1)
        # Public randomness, not a secret: numpy's PCG64 from the public seed.
        signs = np.random.default_rng(matrix_seed).integers(0, 2, size=(self.size, self.d))
        self.signs = (2 * signs - 1).astype(np.float64)  # Phi * sqrt(m)

    @property
    def matrix(self) -> np.ndarray:
        return self.signs / math.sqrt(self.size)

    def _plus(self, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return self.signs[rows, values] > 0

    def estimate_from_counts(self, counts: np.ndarray, n: int) -> np.ndarray:
        counts = np.asarray(counts, dtype=np.float64).reshape(self.size, 2)
        signed = counts[:, 1] - counts[:, 0]
        # c sqrt(m) * sum_r signed_r Phi[r, i] = c * sum_r signed_r signs[r, i]
        return self.c * (self.signs.T @ signed)

    def bias(self, counts: np.ndarray) -> np.ndarray:
        """E[estimate] - truth for this matrix when the true counts are `counts`."""
        gram = self.matrix.T @ self.matrix
        return (gram - np.eye(self.d)) @ np.asarray(counts, dtype=np.float64)

    def variance(self, n: int, count: float = 0.0) -> float:
        """Variance over the reports for this matrix: at most n c^2 - count, for any data.

        Each report adds c * s * signs[r, i]; its square is c^2, so the variance is
        n c^2 - sum_j E[term_j]^2 with E[term_j] = (Phi^T Phi)[v_j, i]: 1 for the
        value's own people, and a Gram entry >= 0 squared for everyone else, which
        depends on where they are. Dropping those terms gives a bound that holds for
        every column and any data; the older figure, for column d // 2 with the others
        spread evenly, was up to 2.3% too small for other columns (d = 8, epsilon 4).
        """
        return n * self.c**2 - count

    def server_cost(self, n: int) -> float:
        return float(n + self.size * self.d)
