"""Local hierarchical histogram for range counts over an ordered domain.

The domain [0, d) is covered by a B-ary tree with h = ceil(log_B d) levels
below the root (level l has ceil(d / B^(h-l)) nodes). Each person picks one
level uniformly at random and reports the node holding their value through
a frequency oracle over that level's nodes, with the whole epsilon: one
report per person, so the release is epsilon-LDP. (Seed 000 perturbs with a
"keep or uniform over all g values" oracle whose uniform draw can return the
true value, which leaks ln(1 + g e^eps / (g - 1)) > eps; here every level
uses a correct oracle: randomised response when the level has fewer than
3 e^eps + 2 nodes, optimised local hashing otherwise, unless `oracle` names one.)

The server estimates each level from its own n_l reports and scales by
n / n_l; the level choice is independent of the value, so this is unbiased.
Node variances differ by level, so `consistent_tree` (least squares with
per-level variances) joins the levels, with the root fixed to the public n.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dpsql.ldp.base import FrequencyOracle, bits_for, split_fields
from dpsql.ldp.direct import DirectEncoding
from dpsql.ldp.hadamard import HadamardMechanism, HadamardResponse
from dpsql.ldp.hashing import LocalHashing
from dpsql.ldp.postprocess import consistent_tree

# Oracles whose reports fit in at most two integers, so all levels share one report array.
_LEVEL_ORACLES = {
    "grr": DirectEncoding,
    "olh": LocalHashing,
    "hr": HadamardResponse,
    "hm": HadamardMechanism,
}


class LocalHierarchy(FrequencyOracle):
    """Reports are int64 rows (level, field 1, field 2); levels are numbered 1..h."""

    name = "hh"

    def __init__(self, epsilon: float, domain, branching: int = 4, oracle: str = "auto"):
        super().__init__(epsilon, domain)
        if branching < 2:
            raise ValueError("the branching factor must be at least 2")
        self.branching = int(branching)
        self.height = max(1, math.ceil(math.log(self.d, self.branching) - 1e-12))
        self.oracles: list[FrequencyOracle] = []
        threshold = 3 * math.exp(self.epsilon) + 2
        for level in range(1, self.height + 1):
            nodes = -(-self.d // self.branching ** (self.height - level))
            name = oracle if oracle != "auto" else ("grr" if nodes < threshold else "olh")
            if name not in _LEVEL_ORACLES:
                raise ValueError(f"level oracle must be one of {sorted(_LEVEL_ORACLES)} or auto")
            self.oracles.append(_LEVEL_ORACLES[name](self.epsilon, nodes))
        self._widths = [
            len(o.aggregate(np.zeros((0, _fields(o)) if _fields(o) == 2 else 0, dtype=np.int64)))
            for o in self.oracles
        ]

    def node_of(self, idx: np.ndarray, level: int | np.ndarray) -> np.ndarray:
        return np.asarray(idx) // self.branching ** (self.height - np.asarray(level))

    def perturb_indices(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        level = rng.integers(1, self.height + 1, size=idx.size)
        out = np.zeros((idx.size, 3), dtype=np.int64)
        out[:, 0] = level
        for lvl, oracle in enumerate(self.oracles, start=1):
            mine = np.flatnonzero(level == lvl)
            inner = oracle.perturb_indices(self.node_of(idx[mine], lvl), rng)
            out[mine, 1 : 1 + _fields(oracle)] = inner.reshape(mine.size, -1)
        return out

    def _split(self, reports: np.ndarray):
        reports = np.asarray(reports, dtype=np.int64).reshape(-1, 3)
        for lvl, oracle in enumerate(self.oracles, start=1):
            rows = reports[reports[:, 0] == lvl]
            inner = rows[:, 1 : 1 + _fields(oracle)]
            yield oracle, (inner if _fields(oracle) == 2 else inner[:, 0])

    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        """Layout: [n_1 .. n_h, aggregate of level 1, ..., aggregate of level h]."""
        sizes, parts = [], []
        for oracle, inner in self._split(reports):
            sizes.append(len(inner))
            parts.append(oracle.aggregate(inner))
        return np.concatenate([np.asarray(sizes, dtype=np.int64), *parts])

    def estimate_levels(self, counts: np.ndarray, n: int) -> list[np.ndarray]:
        """Unbiased node counts per level (not yet consistent)."""
        counts = np.asarray(counts)
        sizes = counts[: self.height]
        offset = self.height
        levels = []
        for oracle, size, width in zip(self.oracles, sizes, self._widths, strict=True):
            part = counts[offset : offset + width]
            offset += width
            est = oracle.estimate_from_counts(part, int(size)) if size else np.zeros(oracle.d)
            levels.append(est * (n / size if size else 0.0))
        return levels

    def level_variances(self, n: int) -> list[float]:
        """Variance of one node estimate per level (count near 0), n / h reports a level."""
        share = n / self.height
        return [(n / share) ** 2 * oracle.variance(share) for oracle in self.oracles]

    def consistent(self, counts: np.ndarray, n: int) -> list[np.ndarray]:
        return consistent_tree(
            self.estimate_levels(counts, n), self.level_variances(n), self.branching, n
        )

    def estimate_from_counts(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Consistent leaf counts (a linear, hence still unbiased, function of the levels)."""
        return self.consistent(counts, n)[-1][: self.d]

    def decompose(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The fewest (level, node) pairs whose leaves are exactly [lo, hi)."""
        nodes: list[tuple[int, int]] = []
        level, left, right = self.height, lo, hi
        while left < right:
            if level == 1:
                nodes.extend((1, node) for node in range(left, right))
                break
            # Nodes that do not fill a whole parent are taken at this level.
            while left % self.branching and left < right:
                nodes.append((level, left))
                left += 1
            while right % self.branching and left < right:
                right -= 1
                nodes.append((level, right))
            left, right, level = left // self.branching, right // self.branching, level - 1
        return nodes

    def range_count(self, levels: Sequence[np.ndarray], lo: int, hi: int) -> float:
        """Estimated number of people with a value in [lo, hi)."""
        return float(sum(levels[lvl - 1][node] for lvl, node in self.decompose(lo, hi)))

    def variance(self, n: int, count: float = 0.0) -> float:
        """Variance of a leaf estimate from the leaf level alone (before consistency)."""
        share = n / self.height
        scale = n / share
        sampling = count * (1 - count / n) * (self.height - 1)
        return scale**2 * self.oracles[-1].variance(share, count / scale) + sampling

    @property
    def message_bits(self) -> int:
        return bits_for(self.height) + max(o.message_bits for o in self.oracles)

    def server_cost(self, n: int) -> float:
        share = n / self.height
        return sum(o.server_cost(share) + o.d for o in self.oracles)

    def channel(self) -> np.ndarray:
        blocks = []
        for lvl, oracle in enumerate(self.oracles, start=1):
            inner = oracle.channel()
            blocks.append(inner[self.node_of(np.arange(self.d), lvl)] / self.height)
        return np.concatenate(blocks, axis=1)

    def output_index(self, reports: np.ndarray) -> np.ndarray:
        reports = np.asarray(reports, dtype=np.int64)
        out = np.empty(len(reports), dtype=np.int64)
        offset = 0
        for lvl, (oracle, inner) in enumerate(self._split(reports), start=1):
            out[reports[:, 0] == lvl] = offset + oracle.output_index(inner)
            offset += oracle.channel().shape[1]
        return out

    def format_reports(self, reports: np.ndarray) -> list[str]:
        return [":".join(map(str, row)) for row in np.asarray(reports, np.int64).tolist()]

    def parse_reports(self, fields: Sequence[str]) -> np.ndarray:
        return np.asarray(split_fields(fields, ":", 3), dtype=np.int64).reshape(-1, 3)

    def valid_reports(self, reports: np.ndarray) -> np.ndarray:
        """A level 1..h and a valid report of that level's oracle (a field it leaves
        unused, 0): a report of another level was counted in n but in no level."""
        reports = np.asarray(reports, dtype=np.int64).reshape(-1, 3)
        valid = np.zeros(len(reports), dtype=bool)
        for level, oracle in enumerate(self.oracles, start=1):
            mine = np.flatnonzero(reports[:, 0] == level)
            inner = reports[mine, 1:]
            if _fields(oracle) == 2:
                valid[mine] = oracle.valid_reports(inner)
            else:
                valid[mine] = oracle.valid_reports(inner[:, 0]) & (inner[:, 1] == 0)
        return valid


def _fields(oracle: FrequencyOracle) -> int:
    """Integers per report of a level oracle."""
    return 2 if isinstance(oracle, LocalHashing) else 1
