"""The analysis record: what one query measures and releases (group keys,
measurements, aggregates, outputs), and the reserved column names by which the
rewrite and the release refer to them. Data only: analyze.py fills it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from dpsql.policy import Table
from dpsql.sql.intervals import Interval

KEY_PREFIX = "__dpsql_k"
VALUE_PREFIX = "__dpsql_a"
RESERVED_PREFIX = "__dpsql"


@dataclass(frozen=True)
class Measurement:
    """One exact aggregate to measure with noise: a COUNT or a clamped SUM."""

    kind: str  # "count", "count_units", "count_distinct" (of a value, not the unit) or "sum"
    argument: exp.Expression | None = None  # row expression as written; None for COUNT(*)
    bounds: Interval | None = None  # clamp interval of a SUM's argument
    clamped: exp.Expression | None = None  # a SUM's argument with its columns clamped
    note: str = ""  # how the bounds were obtained, for EXPLAIN
    # `clamped` provably lies within `bounds` as the rewrite reads its columns (clamped
    # and filtered by WHERE already), so the rewrite need not clamp it again
    within: bool = False

    @property
    def key(self) -> str:
        argument = self.argument.sql() if self.argument is not None else "*"
        return f"{self.kind}({argument})"


@dataclass(frozen=True)
class Aggregate:
    """An aggregate the query releases: COUNT/SUM straight from a measurement, AVG from two."""

    function: str  # "count", "sum", "avg", ..., or "quantile" (sql/quantiles.py)
    measurements: tuple[int, ...]  # indexes into Analysis.measurements (avg: sum, count)
    bounds: Interval | None = None  # AVG is clamped to these after division
    # AVG: its SUM measures the values less this centre (AVG = centre + SUM / COUNT)
    centre: float = 0.0
    node: exp.Expression | None = None  # a quantile's aggregate as written: none measured


@dataclass(frozen=True)
class GroupKey:
    expression: exp.Expression
    domain: tuple[Any, ...] | None  # every key, when the policy makes them public


@dataclass(frozen=True)
class Output:
    name: str
    expression: exp.Expression  # over __dpsql_k<i> / __dpsql_a<j> columns and literals


@dataclass
class Analysis:
    """Everything the rewrite and the release need to know about one query."""

    table: Table
    where: exp.Expression | None
    keys: list[GroupKey]
    outputs: list[Output]
    measurements: list[Measurement] = field(default_factory=list)
    aggregates: list[Aggregate] = field(default_factory=list)
    having: exp.Expression | None = None
    order: list[exp.Ordered] = field(default_factory=list)
    limit: int | None = None
    offset: int | None = None

    @property
    def grouped(self) -> bool:
        return bool(self.keys)

    @property
    def public_keys(self) -> bool:
        """Whether the released keys come from the policy rather than the data."""
        return all(key.domain is not None for key in self.keys)

    @property
    def is_plain_projection(self) -> bool:
        """Outputs are bare released columns, with nothing to evaluate afterwards."""
        return (
            all(isinstance(out.expression, exp.Column) for out in self.outputs)
            and self.having is None
            and not self.order
            and self.limit is None
            and self.offset is None
        )
