"""What every local-DP frequency oracle shares: domains, randomness, the two-stage estimate.

A frequency oracle has a client half (`perturb`: one report per person, each
report epsilon-LDP on its own) and a server half split in two so that the
counting can be pushed into a database later:

    counts = m.aggregate(reports)              # a GROUP BY / SUM the proxy could run in SQL
    est    = m.estimate_from_counts(counts, n)  # de-biasing, pure numpy
    m.estimate(reports)                         # both steps at once

Each mechanism also states its closed-form variance, its message size, its
server cost, and (for small domains) its exact channel matrix, which the tests
use to check the privacy ratio exactly rather than by sampling.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

# One source of randomness for the whole project: AES-CTR keyed by the OS
# (a seeded PCG64 for tests only).
from dpsql.mechanisms.samplers import secure_generator
from dpsql.policy import require_local_epsilon


class Domain:
    """An ordered, public list of the values a person may hold, indexed 0..d-1."""

    def __init__(self, values: Iterable[Any]):
        if isinstance(values, int):
            values = range(values)
        self._range = values if isinstance(values, range) and values.step == 1 else None
        self.values: Sequence[Any] = values if self._range is not None else list(values)
        self.size = len(self.values)
        if self.size < 2:
            raise ValueError("a domain needs at least two values")
        if self._range is None:
            self._index = {v: i for i, v in enumerate(self.values)}
            if len(self._index) != self.size:
                raise ValueError("domain values must be distinct")

    def __len__(self) -> int:
        return self.size

    def index(self, values: Iterable[Any]) -> np.ndarray:
        """Indices of `values`; a value outside the domain is an error, not a silent drop."""
        arr = np.asarray(
            values
            if not isinstance(values, range)
            else np.arange(values.start, values.stop, values.step)
        )
        if self._range is not None:
            if arr.size and arr.dtype.kind not in "iu":
                raise ValueError(f"this domain holds integers, got {arr.flat[0]!r}")
            idx = arr.astype(np.int64).reshape(-1) - self._range.start
            bad = (idx < 0) | (idx >= self.size)
            if bad.any():
                raise ValueError(f"value {arr.reshape(-1)[bad][0]!r} is not in the domain")
            return idx
        # Look each distinct value up once: files repeat values millions of times.
        uniques, inverse = np.unique(arr.reshape(-1), return_inverse=True)
        try:
            mapped = np.array([self._index[_py(u)] for u in uniques], dtype=np.int64)
        except KeyError as exc:
            raise ValueError(f"value {exc.args[0]!r} is not in the domain") from None
        return mapped[inverse.reshape(-1)]


def _py(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def as_generator(rng: np.random.Generator | int | None) -> np.random.Generator:
    if rng is None:
        return secure_generator()
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(rng)


def bits_for(count: int) -> int:
    """Bits needed to name one of `count` outcomes."""
    return max(1, math.ceil(math.log2(count)))


class FrequencyOracle(ABC):
    """An epsilon-LDP randomiser with an unbiased server-side count estimator."""

    name: str = ""

    def __init__(self, epsilon: float, domain: Iterable[Any] | Domain | int):
        require_local_epsilon(epsilon)
        self.epsilon = float(epsilon)
        self.domain = domain if isinstance(domain, Domain) else Domain(domain)
        self.d = self.domain.size

    # client ----------------------------------------------------------------
    def perturb(self, values: Iterable[Any], rng: np.random.Generator | int | None = None):
        """One randomised report per value (per person)."""
        return self.perturb_indices(self.domain.index(values), as_generator(rng))

    @abstractmethod
    def perturb_indices(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Reports for domain indices `idx` (int array of length n)."""

    # server ----------------------------------------------------------------
    @abstractmethod
    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        """The sufficient statistic of the reports (what SQL would compute)."""

    @abstractmethod
    def estimate_from_counts(self, counts: np.ndarray, n: int) -> np.ndarray:
        """Unbiased count per domain value from `aggregate`'s output and the report count."""

    def valid_reports(self, reports: np.ndarray) -> np.ndarray:
        """Per parsed report, whether this oracle's randomiser could have sent it (the
        server leaves out the rest: a value a client uploaded unrandomised, an index
        beyond the domain). Every report of the right shape, unless overridden."""
        return np.ones(len(reports), dtype=bool)

    def estimate(self, reports: np.ndarray) -> np.ndarray:
        """Unbiased estimate of how many people hold each domain value."""
        return self.estimate_from_counts(self.aggregate(reports), len(reports))

    # accounting ------------------------------------------------------------
    @abstractmethod
    def variance(self, n: int, count: float = 0.0) -> float:
        """Closed-form variance of one estimated count, for n reports and true count `count`."""

    def uniform_variance(self, n: int) -> float:
        """The largest variance of one count when the n people are spread evenly over the
        domain (the planning figure `advise` compares). Overridden where the variance
        depends on more of the data than the value's own count."""
        return float(self.variance(n, n / self.d))

    @property
    @abstractmethod
    def message_bits(self) -> int:
        """Bits one report needs on the wire."""

    @abstractmethod
    def server_cost(self, n: int) -> float:
        """Elementary operations the server spends to estimate all d counts from n reports."""

    # verification ----------------------------------------------------------
    @abstractmethod
    def channel(self) -> np.ndarray:
        """Exact matrix P[output | input], shape (d, outputs); small domains only."""

    @abstractmethod
    def output_index(self, reports: np.ndarray) -> np.ndarray:
        """The channel column of each report (to compare sampled reports with `channel`)."""

    # wire format -------------------------------------------------------------
    @abstractmethod
    def format_reports(self, reports: np.ndarray) -> list[str]:
        """One CSV field per report."""

    @abstractmethod
    def parse_reports(self, fields: Sequence[str]) -> np.ndarray:
        """Inverse of `format_reports`."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(epsilon={self.epsilon:g}, d={self.d})"


class PureProtocol(FrequencyOracle):
    """A protocol where each report 'supports' a set of values (Wang et al. 2017).

    P[report supports v | person holds v] = p_star, and = q_star when they hold
    any other value; the count estimate is (C_v - n q*) / (p* - q*), where C_v
    counts the reports that support v. Subclasses set p_star and q_star.
    """

    p_star: float
    q_star: float

    def estimate_from_counts(self, counts: np.ndarray, n: int) -> np.ndarray:
        counts = np.asarray(counts, dtype=np.float64)
        return (counts - n * self.q_star) / (self.p_star - self.q_star)

    def variance(self, n: int, count: float = 0.0) -> float:
        p, q = self.p_star, self.q_star
        # Exact: C_v is Binomial(count, p) + Binomial(n - count, q).
        return (count * p * (1 - p) + (n - count) * q * (1 - q)) / (p - q) ** 2


class IntegerReports:
    """Reports that are one integer each (an output index): identity channel columns."""

    def output_index(self, reports: np.ndarray) -> np.ndarray:
        return np.asarray(reports, dtype=np.int64)

    def format_reports(self, reports: np.ndarray) -> list[str]:
        return np.asarray(reports).astype(str).tolist()

    def parse_reports(self, fields: Sequence[str]) -> np.ndarray:
        return np.asarray(fields, dtype=np.int64)

    @property
    def outputs(self) -> int:
        """How many output indices there are: a report is one of 0..outputs-1."""
        return self.d

    def valid_reports(self, reports: np.ndarray) -> np.ndarray:
        reports = np.asarray(reports, dtype=np.int64)
        return (reports >= 0) & (reports < self.outputs)


def split_fields(fields: Sequence[str], separator: str, count: int) -> list[list[str]]:
    """Each field's `count` integers: ValueError unless every field has exactly that many
    (a field of two reports, read as two, was counted as two)."""
    parts = [field.split(separator) for field in fields]
    if any(len(part) != count for part in parts):
        raise ValueError(f"a report has other than {count} parts")
    return parts


def max_privacy_ratio(channel: np.ndarray) -> float:
    """The largest P[y|x] / P[y|x'] over all outputs y and inputs x, x' (inf if 0 vs > 0)."""
    hi = channel.max(axis=0)
    lo = channel.min(axis=0)
    live = hi > 0
    if np.any(lo[live] == 0):
        return math.inf
    return float(np.max(hi[live] / lo[live]))
