"""Which frequency oracle to use: expected error, message size and server cost side by side.

For a domain of d values, n people and epsilon, every mechanism's closed-form
variance gives its expected RMSE per count (with the n people spread evenly over
the d values; `FrequencyOracle.uniform_variance`); the
recommendation is the lowest RMSE, and among mechanisms within 5% of it the
one that is cheapest for the server, then on the wire; `fastest_close` names
the cheapest within 1.5x of the best RMSE, for when server time matters. Randomised response
can only win when d < 3 e^eps + 2 (its variance grows with d, the others' do not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpsql.ldp import mechanism

CANDIDATES = ("grr", "oue", "sue", "olh", "hr", "hm", "rappor", "she", "the")
_CLOSE = 1.05


@dataclass(frozen=True)
class Advice:
    name: str
    rmse: float  # expected RMSE of one estimated count
    message_bits: int
    server_cost: float  # elementary operations to decode all counts

    def relative(self, best: float) -> float:
        return self.rmse / best


def compare(domain_size: int, epsilon: float, users: int) -> list[Advice]:
    """Every candidate's expected figures, best RMSE first."""
    rows = []
    for name in CANDIDATES:
        m = mechanism(name, epsilon, domain_size)
        rmse = math.sqrt(m.uniform_variance(users))
        rows.append(Advice(name, rmse, m.message_bits, m.server_cost(users)))
    return sorted(rows, key=lambda a: a.rmse)


def recommend(rows: list[Advice]) -> Advice:
    best = min(r.rmse for r in rows)
    close = [r for r in rows if r.rmse <= _CLOSE * best]
    return min(close, key=lambda r: (r.server_cost, r.message_bits, r.rmse))


def fastest_close(rows: list[Advice], within: float = 1.5) -> Advice:
    """The cheapest mechanism for the server whose RMSE is within `within` x the best."""
    best = min(r.rmse for r in rows)
    return min((r for r in rows if r.rmse <= within * best), key=lambda r: r.server_cost)


def grr_threshold(epsilon: float) -> float:
    """Randomised response beats OUE exactly when d < 3 e^eps + 2."""
    return 3 * math.exp(epsilon) + 2
