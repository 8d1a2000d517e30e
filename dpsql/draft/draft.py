"""The whole path of a draft: schema, guesses, domains if asked, estimates if asked, text."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from dpsql.accounting import Cost
from dpsql.adapters import is_url, open_adapter
from dpsql.draft import bounds
from dpsql.draft.domains import read_domains
from dpsql.draft.guess import TableDraft, guess_tables, identifier_name
from dpsql.draft.render import DEFAULT_ANALYST, policy_document, render
from dpsql.draft.schema import read_schema
from dpsql.errors import InterfaceError, InternalError, ProgrammingError
from dpsql.policy import NUMERIC_TYPES, load_policy
from dpsql.session import ledger_in_memory, open_session


@dataclass(frozen=True)
class Suggestion:
    """`--suggest-bounds`: spend `epsilon` of `analyst`'s budget (`budget` in total, written
    into the draft; by default `epsilon`, so that one run spends it) on DP estimates,
    charged to `ledger` (by default where the draft's queries will be charged: beside a
    DuckDB file)."""

    epsilon: float
    analyst: str = "owner"
    budget: float | None = None
    ledger: str | None = None
    seed: int | None = None  # tests only: reproducible noise


@dataclass(frozen=True)
class Draft:
    text: str  # the policy YAML, with comments
    document: dict[str, Any]  # what the text loads as
    tables: list[TableDraft]
    spent: Cost | None  # what the estimates cost, if any were made
    ledger: str | None  # where that was charged (a password in a URL masked)
    left_open: list[str]  # what the owner still has to decide


def draft_policy(
    database: Any,
    *,
    tables: Sequence[str] = (),
    public: Sequence[str] = (),
    domains: bool = False,
    suggestion: Suggestion | None = None,
) -> Draft:
    """A draft policy for `database` (what `open_adapter` takes), for the tables named (all
    if none), `public` ones drafted public; `domains` reads text columns' values as public
    domains; `suggestion` makes the charged DP estimates."""
    ledger = None if suggestion is None else _ledger(suggestion.ledger, database)
    adapter = open_adapter(database)
    dialect = adapter.dialect
    try:
        drafts = guess_tables(read_schema(adapter, tables), adapter.dialect, public)
        if domains:
            read_domains(adapter, drafts)
    finally:
        adapter.close()
    # A table none of whose columns a policy type fits cannot be declared at all.
    unreadable = [d.name for d in drafts if not d.columns]
    drafts = [d for d in drafts if d.columns]
    if not drafts:
        raise ProgrammingError(
            f"no column of {', '.join(unreadable)} has a type a policy declares (int, float, "
            "string, bool, date, timestamp); declare views that cast them, and draft those"
        )
    spent, charged_at, analysts, notes = None, None, {}, {}
    if suggestion is not None:
        analysts = {
            suggestion.analyst: {
                **DEFAULT_ANALYST,
                "epsilon": suggestion.budget or suggestion.epsilon,
            }
        }
        with open_session(
            database,
            policy_document(drafts, analysts, ledger),
            suggestion.analyst,
            ledger=ledger,
        ) as session:
            spent = bounds.suggest(session, drafts, suggestion.epsilon, suggestion.seed)
            charged_at = session.ledger.location  # a password in a URL masked
        notes[suggestion.analyst] = (
            f"the owner's: epsilon {float(spent.epsilon):g} of it paid for the suggested "
            f"bounds below (ledger {charged_at})"
        )
    document = policy_document(drafts, analysts, ledger)
    header = _header(dialect, suggestion) + [
        f"Left out: {name}: no column of a type a policy declares; declare a view that casts "
        "them, and draft it"
        for name in unreadable
    ]
    text = render(document, drafts, header, notes)
    _check_loads(text, document)
    left_open = [f"{name}: left out (no column a policy type fits)" for name in unreadable]
    return Draft(text, document, drafts, spent, charged_at, left_open + _left_open(drafts))


def _ledger(ledger: str | None, database: Any) -> str | None:
    """The ledger the estimates are charged to, as the draft will name it: a file or URL
    given, absolute (the policy reads a relative one beside itself); none for a DuckDB
    file, whose ledger beside it is the default of every later connection too."""
    if ledger is not None and ledger_in_memory(ledger):
        raise InterfaceError(
            f"--suggest-bounds charges the owner's budget, and the ledger {ledger!r} forgets "
            "its charges when the draft is written; give a file (budget.sqlite) or a "
            "postgresql:// ledger"
        )
    if ledger is not None:
        return ledger if is_url(ledger) else os.path.abspath(ledger)
    if is_url(database) or not isinstance(database, str | os.PathLike) or database == ":memory:":
        raise InterfaceError(
            "--suggest-bounds charges the owner's budget, and this database has no ledger "
            "of its own beside it (only a DuckDB file has): give --ledger budget.sqlite (or "
            "a postgresql:// ledger); the draft names it"
        )
    return None


_ENGINES = {"duckdb": "DuckDB", "postgres": "PostgreSQL", "sqlite": "SQLite", "spark": "Spark"}


def _header(dialect: str, suggestion: Suggestion | None) -> list[str]:
    kind = _ENGINES.get(dialect, dialect)
    lines = [
        f"Draft privacy policy, written by `dpsql policy init` on {dt.date.today()} from the "
        f"schema of a {kind} database.",
        "A draft is a guess from names and keys: read every comment, then decide. Nothing "
        "in it was read from the data, except what a comment says was.",
    ]
    if suggestion is not None:
        lines.append(
            f"Bounds marked 'DP estimate' were suggested with epsilon {suggestion.epsilon:g} "
            f"of analyst {suggestion.analyst}'s budget, charged to the ledger."
        )
    return lines


def _check_loads(text: str, document: dict[str, Any]) -> None:
    """The text must load as the document, and the document as a policy."""
    if yaml.safe_load(text) != document:
        raise InternalError("dpsql policy init wrote text that does not read back as its draft")
    load_policy(document)


def _left_open(tables: list[TableDraft]) -> list[str]:
    left = []
    for table in tables:
        if table.public:
            continue
        if table.unit is None and table.via is None:
            left.append(f"{table.name}: no privacy unit (row-level)")
        elif not table.unique_unit and not table.bound_notes:
            left.append(f"{table.name}: max_rows_per_unit and max_groups_per_unit (now 1)")
        unbounded = [
            c.name
            for c in table.columns.values()
            if c.kind in NUMERIC_TYPES
            and not c.private
            and not identifier_name(c.name)
            and "lower" not in c.spec
        ]
        if unbounded:
            left.append(f"{table.name}: bounds of {', '.join(unbounded)}")
    return left
