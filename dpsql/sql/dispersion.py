"""VAR and STDDEV (population and sample) from three noisy measurements (this module's one job).

`VAR_POP(x)` over values clamped to [l, u] is released from a noisy COUNT(x) N, a
noisy SUM(x - m) S1 and a noisy SUM((x - m)^2) S2, centred on a midpoint m of the
bounds (an integer for an integer column, so the database computes in integers):
each row moves the centred sums by at most h = max(u - m, m - l) and h^2, instead
of max(|l|, |u|) and its square. The estimate is post-processing of the three:

    var_pop = S2 / N - (S1 / N)^2      var_samp = (S2 - S1^2 / N) / (N - 1)

with N taken as at least 1 (pop) or 2 (samp), the result clipped to
[0, h^2] (pop; h^2 N / (N - 1) for samp: no values in [l, u] vary more), and
STDDEV the square root of the clipped variance.

The 95% interval is conservative, post-processing of the released values and
the mechanisms' exact central intervals, as sql/avg_interval.py does for AVG:
with the miss split in three (Bonferroni), the true N, S1, S2 lie in boxes
around the noisy ones (widened by the grid's rounding of each summed value),
and the interval bounds the variance over the whole box.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.mechanisms.base import COVERAGE_MISS, NoiseMechanism
from dpsql.sql.analysis import Aggregate, Measurement
from dpsql.sql.intervals import Interval

# sqlglot's nodes for the aggregates, and what each releases. STDDEV and VARIANCE are the
# sample forms in DuckDB and PostgreSQL; VAR (no node in sqlglot) is read as VARIANCE.
FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.Variance: "var_samp",
    exp.VariancePop: "var_pop",
    exp.Stddev: "stddev_samp",
    exp.StddevSamp: "stddev_samp",
    exp.StddevPop: "stddev_pop",
}
DISPERSION: tuple[type[exp.Expression], ...] = tuple(FUNCTIONS)
NAMES = frozenset(FUNCTIONS.values())
# Each of the three measurements may leave out this share of the interval's miss.
SPLIT = 3


def is_var_spelling(node: exp.Expression) -> bool:
    """`VAR(x)`, which sqlglot reads as an unknown function."""
    return (
        isinstance(node, exp.Anonymous)
        and node.name.upper() == "VAR"
        and len(node.expressions) == 1
    )


def var_spellings(select: exp.Select) -> exp.Select:
    """`VAR(x)` as `VARIANCE(x)` (the sample variance), for the checker and analysis."""

    def rewrite(node: exp.Expression) -> exp.Expression:
        return exp.Variance(this=node.expressions[0]) if is_var_spelling(node) else node

    return select.transform(rewrite)


def written(node: exp.Expression) -> str:
    """The aggregate's name as DuckDB and PostgreSQL spell it (VAR_POP, not VARIANCE_POP)."""
    return node.sql(dialect="duckdb").split("(", 1)[0]


def centre(bounds: Interval) -> float:
    """The midpoint the sums are centred on: an integer for integer bounds (the database
    then subtracts in integers, and h grows by at most 1/2)."""
    middle = (bounds.lower + bounds.upper) / 2
    # any centre is sound (the analysis bounds the centred values whatever it is): a
    # short one reads better in EXPLAIN than 29.999999999999996
    return float(math.floor(middle)) if bounds.integer else float(f"{middle:.6g}")


def half_range(bounds: Interval) -> float:
    """h: how far a clamped value lies from the centre at most."""
    m = centre(bounds)
    return max(bounds.upper - m, m - bounds.lower)


def centred_sums(
    argument: exp.Expression,
    bounds: Interval,
    note: str,
    clamped: Callable[[exp.Expression], exp.Expression],
    interval: Callable[[exp.Expression], Interval | None],
    total: Callable[[exp.Expression], None],
    squares: bool,
) -> list[Measurement]:
    """The SUM of `argument` - m (and with `squares`, of its square too), m the bounds'
    centre: each a measurement whose per-row bounds the interval arithmetic finds.
    `clamped` and `interval` are the analysis's clamp of columns and interval arithmetic,
    `total` its refusal of a row expression that could fail for some row (a square of
    a large value overflows BIGINT or a double, of a tiny one underflows in PostgreSQL):
    the centred values and squares are row expressions the database computes too.
    Raises QueryRefused with the reason when one cannot be computed or bounded."""
    m = centre(bounds)
    literal = exp.convert(int(m) if bounds.integer else m)
    centred = exp.Sub(this=exp.paren(argument.copy(), copy=False), expression=literal)
    values = [(centred, "centred on")]
    if squares:
        squared = exp.Mul(
            this=exp.paren(centred.copy(), copy=False),
            expression=exp.paren(centred.copy(), copy=False),
        )
        values.append((squared, "squared about"))
    # A bare column reaches the aggregate clamped to its declared bounds and filtered by
    # the WHERE that tightened them (rewrite._clamped_source), so its centred values lie
    # within the bounds the interval arithmetic finds for them: no clamp is needed.
    bare = isinstance(argument, exp.Column)
    measurements = []
    for value, what in values:
        total(value)
        value_bounds = interval(value)
        if value_bounds is None:
            raise QueryRefused(what, "its squares are beyond what dpsql can bound", "")
        detail = f"{note}; {what} {m:g}, each row within +/-{value_bounds.magnitude:g}"
        computed = value.copy() if bare else clamped(value)
        measurements.append(Measurement("sum", value, value_bounds, computed, detail, within=bare))
    return measurements


def decompose(
    node: exp.Expression,
    argument: exp.Expression,
    bounds: Interval,
    note: str,
    measure: Callable[[Measurement], int],
    counted: Callable[[exp.Expression], Measurement],
    clamped: Callable[[exp.Expression], exp.Expression],
    interval: Callable[[exp.Expression], Interval | None],
    total: Callable[[exp.Expression], None],
) -> Aggregate:
    """The aggregate of a VAR/STDDEV `node` over `argument`, clamped to `bounds`: its three
    measurements (COUNT, centred SUM, centred SUM of squares), found or added by `measure`
    (`counted` gives the COUNT's measurement: COUNT(*) where `argument` cannot be NULL);
    the rest as `centred_sums` takes them."""
    try:
        sums = centred_sums(argument, bounds, note, clamped, interval, total, squares=True)
    except QueryRefused as refused:
        raise _out_of_reach(node, argument, refused.reason) from None
    indexes = [measure(counted(argument))] + [measure(m) for m in sums]
    return Aggregate(FUNCTIONS[type(node)], tuple(indexes), bounds)


def _out_of_reach(node: exp.Expression, argument: exp.Expression, reason: str) -> QueryRefused:
    """The refusal of a VAR/STDDEV whose centred squares the database could not compute
    for every row."""
    name, text = written(node), argument.sql()[:60]
    tiny = "underflow" in reason  # too near zero, rather than too large
    scaled = f"{text} * 1000" if tiny else f"{text} / 1000"
    back = "divide" if tiny else "multiply"
    return QueryRefused(
        f"{name}({text})",
        f"its values' squares about the bounds' midpoint cannot be computed safely: {reason}",
        f"take {name} of a scaled value, e.g. {name}({scaled}), and {back} the result by 1000 "
        "(1e6 for a variance); or ask the data owner for tighter bounds",
    )


def refuse_text(node: exp.Expression, argument: exp.Expression) -> QueryRefused:
    """The refusal of VAR/STDDEV of a column that holds no numbers."""
    name = written(node)
    return QueryRefused(
        f"{name}({argument.sql()[:60]})",
        "it is not a number column, so it has no variance",
        f"take {name} of a bounded number column, or count its values: "
        f"COUNT(DISTINCT {argument.sql()[:60]}), or GROUP BY it with COUNT(*)",
    )


def _post_processed(
    function: str, count: np.ndarray, total: np.ndarray, squares: np.ndarray, h: float
) -> np.ndarray:
    sample = function.endswith("samp")
    n = np.maximum(np.asarray(count, dtype=np.float64), 2.0 if sample else 1.0)
    spread = squares - total * total / n
    variance = spread / (n - 1) if sample else spread / n
    most = h * h * (n / (n - 1) if sample else 1.0)
    return np.clip(variance, 0.0, most)


def unbounded(node: exp.Expression, argument: exp.Expression) -> QueryRefused:
    """The refusal of VAR/STDDEV of a value the policy gives no bounds."""
    name = written(node)
    return QueryRefused(
        f"{name}({argument.sql()[:60]})",
        "its sensitivity needs bounds on the value, and the policy gives none (the column "
        "needs 'lower' and 'upper'; arithmetic with constants, CASE and COALESCE keep them)",
        f"take {name} of a bounded column, or ask the data owner to declare lower/upper for "
        f"{argument.sql()[:60]}",
    )


def estimate(
    function: str, count: np.ndarray, total: np.ndarray, squares: np.ndarray, bounds: Interval
) -> np.ndarray:
    """The released VAR/STDDEV per group from the noisy COUNT, centred SUM and centred SUM
    of squares (in the column's units): post-processing only."""
    variance = _post_processed(function, count, total, squares, half_range(bounds))
    return np.sqrt(variance) if function.startswith("stddev") else variance


@dataclass(frozen=True)
class Widths:
    """What the intervals need of the three mechanisms, in the column's units."""

    count: float  # the COUNT's half-width at miss / SPLIT
    total: float  # the centred SUM's, widened by its grid's rounding per counted row
    total_step: float
    squares: float
    squares_step: float


def widths(
    count: NoiseMechanism,
    total: tuple[NoiseMechanism, float],
    squares: tuple[NoiseMechanism, float],
    miss: float = COVERAGE_MISS,
) -> Widths:
    """The half-widths for intervals that miss with probability at most `miss`; each sum's
    mechanism draws in grid steps of the step beside it. Exact searches that can fail on
    extreme parameters: planning computes them, before anything is charged."""
    part = miss / SPLIT
    return Widths(
        count.half_width(part),
        total[0].half_width(part) * total[1],
        total[1],
        squares[0].half_width(part) * squares[1],
        squares[1],
    )


def intervals(
    function: str,
    count: np.ndarray,
    total: np.ndarray,
    squares: np.ndarray,
    widths: Widths,
    bounds: Interval,
) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) per group, covering the group's true VAR/STDDEV of its clamped values
    with probability at least 1 - miss.

    On the event that each noise is within its half-width, the true count n lies in
    [N~ - b, N~ + b] (and is at least 1, or 2 for samp: a group with fewer has no
    value to cover), the true centred sums within a + n g / 2 of the noisy ones (each
    summed value was rounded to the grid step g). With n in [lo, hi]:
    S2 / n - (S1 / n)^2 <= max(S2) / lo (or / hi if negative) - min|S1|^2 / hi^2, and
    >= min(S2) / hi (or / lo if negative) - max|S1|^2 / lo^2; the sample variance is
    the population one times n / (n - 1), largest at lo, smallest at hi.
    """
    sample = function.endswith("samp")
    least = 2.0 if sample else 1.0
    h = half_range(bounds)
    count = np.asarray(count, dtype=np.float64)
    lo = np.maximum(np.ceil(count - widths.count), least)
    hi = np.floor(count + widths.count)
    possible = hi >= least
    hi = np.maximum(hi, least)  # only where impossible, then replaced by the range
    s1_width = widths.total + hi * widths.total_step / 2
    s2_width = widths.squares + hi * widths.squares_step / 2
    s1_low, s1_high = total - s1_width, total + s1_width
    s2_low, s2_high = squares - s2_width, squares + s2_width
    nearest = np.where((s1_low <= 0) & (s1_high >= 0), 0.0, np.minimum(abs(s1_low), abs(s1_high)))
    farthest = np.maximum(abs(s1_low), abs(s1_high))
    high = np.where(s2_high >= 0, s2_high / lo, s2_high / hi) - (nearest / hi) ** 2
    low = np.where(s2_low >= 0, s2_low / hi, s2_low / lo) - (farthest / lo) ** 2
    if sample:
        high = np.where(high >= 0, high * lo / (lo - 1), high * hi / (hi - 1))
        low = np.where(low >= 0, low * hi / (hi - 1), low * lo / (lo - 1))
    # h^2 is rounded: a hair more, so the true spread is never cut off
    most = h * h * (1 + 1e-9) * (lo / (lo - 1) if sample else 1.0)
    low = np.where(possible, np.clip(low, 0.0, most), 0.0)
    high = np.where(possible, np.clip(high, 0.0, most), most)
    if function.startswith("stddev"):
        return np.sqrt(low), np.sqrt(high)
    return low, high


NOTE = (
    "from a noisy COUNT and noisy sums and sums of squares centred on the bounds' midpoint: "
    "a 95% interval per row, conservative (each measurement's 98.3% interval, combined, "
    "within what the column's bounds allow); the noise scale is the sum of squares'"
)


def explanation(widths: Widths) -> str:
    """EXPLAIN's line on a VAR/STDDEV's intervals."""
    return (
        f"per row, conservative: the COUNT's 98.3% half-width {widths.count:g}, the centred "
        f"SUM's {widths.total:.6g} and the centred SUM of squares' {widths.squares:.6g} "
        "combined; the epsilon is split equally over the three measurements (a COUNT or SUM "
        "the query also releases is measured once)"
    )
