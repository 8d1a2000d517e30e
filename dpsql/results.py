"""What a release hands the front ends: named columns, rows, the accuracy of each noisy
column and notes (this module's one job), how many groups a release may hold, and how
a released value reads at the precision its 95% interval supports.

The plans (dpsql/sql/) build a `Release`, the Session returns it (and keeps it
in the release cache), and the front ends read it: DB-API cursors, the wire
server and the shell. It imports nothing of dpsql but the policy's limit, so
every layer can read it. Programs get the full values (the DB-API cursor, the
wire rows, JSON); what a person reads (the shell, `dpsql query`, CSV, the
wire notice's hint) goes through `noisy_text`, so a value never shows more
digits than its interval supports: 97,723 with a half-width of 95,000 reads
98,000 ± 95,000, not seven exact-looking digits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_EVEN, Decimal, localcontext
from typing import Any

import numpy as np

from dpsql.policy import MAX_PUBLIC_KEYS

# Released groups per query unless the session says otherwise: as many as the
# largest public domain, so a query the planner accepts before the charge is
# not refused after it by default.
MAX_GROUPS = MAX_PUBLIC_KEYS


# How many significant digits of a 95% half-width are shown; a value is shown to the
# same decimal place (the digits past it are noise).
SIGNIFICANT_DIGITS = 2


@dataclass(frozen=True)
class Accuracy:
    """How noisy one released column is: a 95% half-width for the whole column, or, when
    it differs per row (AVG, a ratio of two measurements), one (low, high) 95% interval
    per released row, in the order of `Release.rows`."""

    mechanism: str
    scale: float  # noise scale in the column's units
    interval95: float | None  # half-width of a 95% interval; None when it varies per row
    sensitivity: float
    note: str = ""
    intervals: tuple[tuple[float, float], ...] | None = None
    # a quantile's 95% rank interval: the released value's rank lies within this many
    # ranks of q n, beyond the best candidate's (the value interval needs the data)
    rank_interval95: float | None = None

    def __post_init__(self) -> None:
        # the release cache and the wire notice carry intervals as JSON lists of pairs
        if self.intervals is not None:
            pairs = tuple((float(low), float(high)) for low, high in self.intervals)
            object.__setattr__(self, "intervals", pairs)

    def interval(self, row: int, value: Any) -> tuple[float, float] | None:
        """The 95% interval of `value`, released in row `row`; None when none is stated."""
        if value is None:
            return None
        if self.intervals is not None:
            return self.intervals[row] if 0 <= row < len(self.intervals) else None
        if self.interval95 is None:
            return None
        return float(value) - self.interval95, float(value) + self.interval95


@dataclass
class Release:
    """What a plan hands back: named columns, rows, and the accuracy of noisy columns."""

    columns: list[str]
    rows: list[tuple]
    accuracy: dict[str, Accuracy] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    # payloads for the Session to persist in the ledger under these keys (first
    # writer wins): the state a stateful plan built, e.g. a range synopsis
    state: dict[str, str] = field(default_factory=dict)


def format_value(value: Any) -> str:
    """A value without a stated interval (a key, an exact answer): NULL, or 6 significant
    digits for reals, which also hides float artefacts (0.1 + 0.2 reads 0.3)."""
    if isinstance(value, float | Decimal | np.floating):
        number = float(value)
        if not math.isfinite(number) or abs(number) < 1e6:
            return f"{number:,.6g}"
        return f"{number:,.0f}"
    return "NULL" if value is None else str(value)


def decimal_place(half_width: float, integer: bool = False) -> int | None:
    """The power of ten a value with this 95% half-width is shown to: the half-width's
    SIGNIFICANT_DIGITS-th significant digit, never finer than units for an integer value;
    None when the half-width is 0 or not finite (nothing to round to)."""
    if not (math.isfinite(half_width) and half_width > 0):
        return None
    # Decimal of a float is exact, so its leading digit's place is too (log10 is not)
    place = Decimal(half_width).adjusted() - (SIGNIFICANT_DIGITS - 1)
    return max(place, 0) if integer else place


def format_number(
    number: float, place: int, rounding: str = ROUND_HALF_EVEN, separators: bool = True
) -> str:
    """`number` rounded to a multiple of 10^place, written out in full (no exponent)."""
    exact = Decimal(float(number))
    with localcontext() as context:  # enough digits for 1e30 to the units, say
        context.prec = max(context.prec, exact.adjusted() - place + 2)
        rounded = exact.quantize(Decimal(1).scaleb(place), rounding=rounding)
    if rounded == 0:
        rounded = abs(rounded)  # -0 reads 0
    return f"{rounded:,f}" if separators else f"{rounded:f}"


def _is_integer(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _rounded_parts(value: Any, accuracy: Accuracy, row: int, separators: bool) -> list[str] | None:
    """[value, half-width] (a column-wide interval) or [value, low, high] (the row's own),
    rounded to the place the interval supports: the value to nearest, the interval
    outwards so that what is shown still covers it. None without such a place."""
    interval = accuracy.interval(row, value)
    if interval is None or not math.isfinite(float(value)):
        return None
    low, high = interval
    half_width = accuracy.interval95 if accuracy.intervals is None else (high - low) / 2
    place = decimal_place(float(half_width), _is_integer(value))
    if place is None:
        return None
    shown = format_number(value, place, separators=separators)
    if accuracy.intervals is None:
        return [shown, format_number(half_width, place, ROUND_CEILING, separators)]
    return [
        shown,
        format_number(low, place, ROUND_FLOOR, separators),
        format_number(high, place, ROUND_CEILING, separators),
    ]


def _stated(accuracy: Accuracy | None) -> Accuracy | None:
    """`accuracy` when it states an interval (column-wide or per row), else None."""
    if accuracy is None or (accuracy.interval95 is None and accuracy.intervals is None):
        return None
    return accuracy


def noisy_text(value: Any, accuracy: Accuracy | None, row: int) -> str:
    """How a person reads a released value: at the precision its 95% interval supports,
    with that interval: `98,000 ± 95,000` for a column-wide half-width, `2,500 (2,300 to
    2,700)` for the row's own interval; a value without a stated interval (or with one
    of width 0) as `format_value` writes it."""
    stated = _stated(accuracy)
    if value is None or stated is None:
        return format_value(value)
    parts = _rounded_parts(value, stated, row, separators=True)
    if parts is None:
        if stated.intervals is None:
            return f"{format_value(value)} ± {format_value(stated.interval95)}"
        return format_value(value)
    if len(parts) == 2:
        return f"{parts[0]} ± {parts[1]}"
    return f"{parts[0]} ({parts[1]} to {parts[2]})"


def half_width_text(half_width: float) -> str:
    """`± h` for a half-width stated for a whole column, to SIGNIFICANT_DIGITS digits
    (rounded up; an integral one to units at least)."""
    place = decimal_place(half_width, float(half_width).is_integer())
    if place is None:
        return f"± {format_value(half_width)}"
    return f"± {format_number(half_width, place, ROUND_CEILING)}"


def csv_header(name: str, accuracy: Accuracy | None) -> list[str]:
    """The CSV header cells of column `name`, matching `csv_cells`: `<name>_interval95` (a
    half-width) after a column-wide interval, `<name>_low95` and `<name>_high95` after
    per-row intervals."""
    stated = _stated(accuracy)
    if stated is None:
        return [name]
    if stated.intervals is None:
        return [name, f"{name}_interval95"]
    return [name, f"{name}_low95", f"{name}_high95"]


def csv_cells(value: Any, accuracy: Accuracy | None, row: int) -> list[str]:
    """A released value and its interval as CSV cells (see `csv_header`), at the precision
    the interval supports; full values where it states none, empty cells for NULL."""
    stated = _stated(accuracy)
    width = len(csv_header("", stated))
    if value is None or stated is None:
        return ["" if value is None else str(value)] + [""] * (width - 1)
    parts = _rounded_parts(value, stated, row, separators=False)
    if parts is not None:
        return parts
    if stated.intervals is None:
        return [str(value), str(stated.interval95)]
    interval = stated.interval(row, value)
    return [str(value)] + (["", ""] if interval is None else [str(interval[0]), str(interval[1])])


__all__ = [
    "MAX_GROUPS",
    "SIGNIFICANT_DIGITS",
    "Accuracy",
    "Release",
    "csv_cells",
    "csv_header",
    "decimal_place",
    "format_number",
    "format_value",
    "half_width_text",
    "noisy_text",
]
