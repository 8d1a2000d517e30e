"""Joins of a row-level private table (no privacy_unit: each row its own unit) with
public tables, along keys the database keeps unique (docs/relations.md).

A row-level table has no unit column to bound a unit's rows by, and a join could
repeat one of its rows (a row matching three public rows is three relation rows,
one person counted three times). So each public table must be joined on a column
the database keeps unique (its PRIMARY KEY or a UNIQUE column), equal to a column
of a table already tied to the private row: then each private row meets at most
one row of each public table, the relation has at most one row per private row,
and it is row-level as the private table is (1 row, 1 group per unit: the
sensitivities of one table, unchanged). Removing one private row removes at most
its one relation row and leaves every other row as it was.

A row-level table joined with another private table is refused: its rows have no
unit that could be equal to the other's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.policy import Table
from dpsql.sql.ranges import conjuncts


class _Base(Protocol):
    alias: str
    table: Table
    hidden: bool


def row_level(table: Table) -> bool:
    """Whether `table` is private with each row its own unit."""
    return not table.public and table.privacy_unit is None and table.via is None


def require_one_row_each(
    bases: Sequence[_Base], conditions: list[exp.Expression], unique: frozenset[str]
) -> None:
    """Refuse a relation with a row-level table unless it is the only private table and
    every public table is joined on a kept key (`unique`: "table.column" the database
    keeps unique) to a table already tied to it, so that no private row is repeated."""
    rows = [b for b in bases if row_level(b.table)]
    if not rows:
        return
    private = [b for b in bases if not b.table.public and not b.hidden]
    if len(private) > 1:
        others = ", ".join(b.table.name for b in private if b is not rows[0])
        raise QueryRefused(
            f"a join of {rows[0].table.name}, a table with row-level privacy, with {others}",
            "a row-level table's rows have no privacy unit, so no join condition can say that "
            "a row of it and a row of another private table are one person's",
            f"query {rows[0].table.name} with public tables only, or ask the data owner to "
            f"declare a privacy_unit for {rows[0].table.name}",
        )
    tied = {rows[0].alias.lower()}
    keys = []
    for condition in conditions:
        for conjunct in conjuncts(condition):
            sides = [conjunct.this, conjunct.expression] if isinstance(conjunct, exp.EQ) else []
            if len(sides) == 2 and all(isinstance(s, exp.Column) and s.table for s in sides):
                keys.append(sides)
    public = {b.alias.lower(): b.table for b in bases if b.table.public}
    grown = True
    while grown:  # each public table whose kept key equals a column of a tied table
        grown = False
        for pair in keys:
            for key, other in (pair, pair[::-1]):
                alias = key.table.lower()
                table = public.get(alias)
                if (
                    table is not None
                    and alias not in tied
                    and other.table.lower() in tied
                    and f"{table.name.lower()}.{key.name.lower()}" in unique
                ):
                    tied.add(alias)
                    grown = True
    loose = [public[alias].name for alias in public if alias not in tied]
    if loose:
        alias = next(a for a in public if a not in tied)
        kept = sorted(u.split(".")[-1] for u in unique if u.rsplit(".", 1)[0] == loose[0].lower())
        key = f"{alias}.{kept[0]}" if kept else f"{alias}.<key>"

        raise QueryRefused(
            f"the join of {rows[0].table.name}, a table with row-level privacy, with "
            f"{', '.join(loose)}",
            f"each of its rows is one person's, and a join that can match it with several "
            f"rows of {loose[0]} would count that person several times, with no unit to "
            "bound them by; a join on a key the database keeps unique (PRIMARY KEY or "
            "UNIQUE) matches at most one",
            f"join {loose[0]} on a key the database keeps unique (ON {rows[0].alias}.<column> "
            f"= {key}{'' if kept else ', declared PRIMARY KEY or UNIQUE in the database'}), "
            f"or ask the data owner to declare a privacy_unit for {rows[0].table.name}",
        )


def require_unit(table: Table, name: str) -> None:
    """Refuse a subquery `name` aggregating per unit over a row-level relation."""
    if table.privacy_unit is None:
        raise QueryRefused(
            f"the subquery {name}, which aggregates",
            "it reads a table with row-level privacy, whose unit is each row: there is no "
            "unit to aggregate per, and a group of its rows mixes many people",
            "aggregate the rows in the outer query (SELECT key, COUNT(*) ... GROUP BY key)",
        )
