"""What a release hands the front ends: named columns, rows, the accuracy of each noisy
column and notes (this module's one job), and how many groups a release may hold.

The plans (dpsql/sql/) build a `Release`, the Session returns it (and keeps it
in the release cache), and the front ends read it: DB-API cursors, the wire
server and the shell. It imports nothing of dpsql but the policy's limit, so
every layer can read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dpsql.policy import MAX_PUBLIC_KEYS

# Released groups per query unless the session says otherwise: as many as the
# largest public domain, so a query the planner accepts before the charge is
# not refused after it by default.
MAX_GROUPS = MAX_PUBLIC_KEYS


@dataclass(frozen=True)
class Accuracy:
    """How noisy one released column is."""

    mechanism: str
    scale: float  # noise scale in the column's units
    interval95: float | None  # half-width of a 95% interval; None when it varies per row
    sensitivity: float
    note: str = ""


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


__all__ = ["MAX_GROUPS", "Accuracy", "Release"]
