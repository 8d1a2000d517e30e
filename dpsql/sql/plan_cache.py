"""The plan cache: a direct plan built once, handed out again with a fresh secret.

Planning a private query (normalise, check, analyse, calibrate the noise,
rewrite the SQL) is most of dpsql's own time for a query the release cache
has not seen. The Session keeps the plans it built here, under a key that
holds the statement (the release cache's key of its tokens, every constant's
value included) and everything the planning reads besides it: see
docs/plan-cache.md for the key, what invalidates it and why it is safe.

Only `DirectPlan`s are kept, and of those only plans that no stored state
(synopses) could have changed. The one input a plan may not share is the
secret that keys the contribution-bounding hash: it is drawn per release.
So a plan is kept as its SQL cut around the secret's digits (the secret and
the few offsets the rewrite adds to it), and each hit gets a copy of the plan
with the fresh secret written in; everything else a plan holds is read-only
once built, as the noise mechanisms it shares with every plan already are.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from dpsql.lru import WeightedLru
from dpsql.sql.plan import DirectPlan, Plan

# The rewrite keys its hashes by the secret and by the secret plus a small offset
# (rows by seed, groups by seed + 1); a digit run at seed + [0, OFFSETS) is the secret.
OFFSETS = 8
# A secret below this is not templated: its digits could be a constant's. The secret is
# drawn from [0, 2^62), so a plan is left uncached about once in 2^22 draws.
SMALLEST_SECRET = 2**40
PLANS = 512  # plans kept per policy (the Session and the sessions it opens for analysts)

# A secret's digit run is at least as long as SMALLEST_SECRET's: shorter runs (the
# query's constants, most of its numbers) are not even converted.
_DIGITS = re.compile(rf"\d{{{len(str(SMALLEST_SECRET))},}}")


class Inputs:
    """Everything a plan's key holds besides the statement, hashed once: a Session builds
    one when its options or the database facts it read change, not per lookup (hashing
    the budget's Fractions and the proofs again for every statement cost more than the
    lookup itself)."""

    __slots__ = ("_hash", "parts")

    def __init__(self, parts: tuple):
        self.parts = parts
        self._hash = hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Inputs):
            return NotImplemented
        return self._hash == other._hash and self.parts == other.parts


@dataclass(frozen=True)
class _Entry:
    plan: DirectPlan
    # the SQL as text between the secrets, and in their places each secret's offset
    pieces: tuple[str | int, ...]


class PlanCache:
    """Direct plans by key, each handed out with the secret of the release asking."""

    def __init__(self, size: int = PLANS):
        self._plans = WeightedLru(size) if size > 0 else None

    def get(self, key: Hashable, secret: Callable[[], int]) -> DirectPlan | None:
        """The plan kept under `key`, its SQL keyed by a secret `secret()` draws; None (and
        nothing drawn) if none is kept: a miss leaves the secrets to the planning."""
        entry = self._plans.get(key) if self._plans is not None else None
        if entry is None:
            return None
        plan = copy.copy(entry.plan)
        seed = secret()
        plan.sql = "".join(p if isinstance(p, str) else str(seed + p) for p in entry.pieces)
        return plan

    def put(self, key: Hashable, plan: Plan, seed: int) -> None:
        """Keep `plan`, built with secret `seed`, under `key` if it may be handed out again."""
        if self._plans is not None and cacheable(plan) and seed >= SMALLEST_SECRET:
            self._plans.put(key, _Entry(plan, _cut(plan.sql, seed)))


def cacheable(plan: Plan) -> bool:
    """Whether `plan` depends only on what the cache key holds: a direct plan (not a
    subclass), over a table without synopses, whose plans depend on what is stored."""
    if type(plan) is not DirectPlan or not plan.sql:
        return False
    return not any(column.synopsis for column in plan.analysis.table.columns.values())


def _cut(sql: str, seed: int) -> tuple[str | int, ...]:
    """`sql` as text between the secrets' digits, with each secret's offset from `seed`."""
    pieces: list[str | int] = []
    last = 0
    for match in _DIGITS.finditer(sql):
        offset = int(match.group()) - seed
        if 0 <= offset < OFFSETS:
            pieces += [sql[last : match.start()], offset]
            last = match.end()
    pieces.append(sql[last:])
    return tuple(pieces)


__all__ = ["OFFSETS", "PLANS", "Inputs", "PlanCache", "cacheable"]
