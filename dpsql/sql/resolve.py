"""Name resolution: column references to the policy's columns (refusing unknown and
private ones), select aliases and positions in GROUP BY, HAVING and ORDER BY, and
the names of the output columns.
"""

from __future__ import annotations

import difflib

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.policy import Column, Table
from dpsql.sql.check import AGGREGATES


def expand_aliases(
    node: exp.Expression, items: list[tuple[str, exp.Expression]], resolver: Resolver
) -> exp.Expression:
    """`node` with each select alias that names no column of the table replaced by the
    aliased expression, as DuckDB reads HAVING n > 10 for COUNT(*) AS n (PostgreSQL
    would refuse the name): HAVING filters released values, so this adds nothing new."""
    expressions = {name.lower(): item for name, item in items if name.lower() in resolver.aliases}

    def expand(sub: exp.Expression) -> exp.Expression:
        if (
            isinstance(sub, exp.Column)
            and not sub.table
            and sub.name.lower() in expressions
            and resolver.table.column(sub.name) is None
        ):
            return expressions[sub.name.lower()].copy()
        return sub

    return node.transform(expand, copy=False)


def undeclared(name: str, table: Table) -> QueryRefused:
    """The refusal of a name that is not a column the policy declares for `table`, with
    the nearest readable name the policy declares (a typo's fix; nothing from the data)."""
    public = [c.name for c in table.columns.values() if not c.private]
    near = difflib.get_close_matches(name.lower(), public, n=1, cutoff=0.6)
    guess = f"did you mean {near[0]}? " if near else ""
    return QueryRefused(
        f"the column {name}",
        f"it is not declared in the policy for table {table.name}",
        f"{guess}use one of: {', '.join(public)}",
    )


def unalias(node: exp.Expression) -> exp.Expression:
    return node.this if isinstance(node, exp.Alias) else node


def output_name(item: exp.Expression) -> str:
    if isinstance(item, exp.Alias):
        return item.alias
    inner = item
    if isinstance(inner, exp.Column):
        return inner.name
    if isinstance(inner, AGGREGATES):
        return inner.key.lower()
    return inner.sql()


class Resolver:
    """Maps column references to policy columns and enforces the private-column rule."""

    def __init__(self, select: exp.Select, table: Table):
        self.table = table
        self.aliases = {
            item.alias.lower() for item in select.expressions if isinstance(item, exp.Alias)
        }
        source = select.args["from_"].this
        alias = source.alias_or_name
        self.qualifiers = {alias.lower(), source.name.lower()}

    def column(self, node: exp.Column) -> Column:
        if node.table and node.table.lower() not in self.qualifiers:
            raise QueryRefused(
                f"the column {node.sql()}",
                f"'{node.table}' is not the queried table",
                f"write {node.name} or {self.table.name}.{node.name}",
            )
        column = self.table.column(node.name)
        if column is None:
            raise undeclared(node.name, self.table)
        return column

    def canonical(self, select: exp.Select) -> exp.Select:
        """The query with every known column unqualified and spelled as in the policy.

        Names that are not columns are left alone: they may be select aliases
        used in GROUP BY, HAVING or ORDER BY, resolved later.
        """
        aliases = self.aliases

        def fix(node: exp.Column) -> exp.Expression:
            if isinstance(node.this, exp.Star):
                return node
            if node.table or self.table.column(node.name) is not None:
                return exp.column(self.column(node).name, quoted=True)
            if node.name.lower() in aliases:
                return node
            self.column(node)  # raises: unknown column
            return node

        # Only columns change: visiting them alone (in transform's depth-first order, so the
        # first unknown column refused is the same) skips a Python call for every other node.
        canonical = select.copy()
        for node in list(canonical.find_all(exp.Column, bfs=False)):
            fixed = fix(node)
            if fixed is not node:
                node.replace(fixed)
        return canonical

    def require_public(self, node: exp.Expression, where: str) -> None:
        """Every name in `node`, an expression the database computes (WHERE, a GROUP BY
        key, an aggregate's argument), is a declared, non-private column of the table.

        A select alias is not one: the rewritten SQL would send its name to the
        database, where it reads a column of that name that the policy does not
        declare (or fails to bind)."""
        for column in node.find_all(exp.Column):
            if isinstance(column.this, exp.Star):
                continue
            spec = self.table.column(column.name)
            if spec is None and column.name.lower() in self.aliases:
                raise QueryRefused(
                    f"the alias {column.name} in {where}",
                    "a select alias names a released value, not a column: sent to the "
                    "database, the name would read an undeclared column of that name",
                    "write the aliased expression itself",
                )
            if spec is None:
                raise undeclared(column.name, self.table)
            if spec.private:
                raise QueryRefused(
                    f"{where} on the private column {spec.name}",
                    "private columns identify people and are never released or used to select rows",
                    f"use only non-private columns; count people with COUNT(DISTINCT {spec.name})"
                    if spec.name.lower() == self.table.privacy_unit
                    else "use only non-private columns",
                )

    @staticmethod
    def refuse_aggregates(node: exp.Expression, where: str, hint: str) -> None:
        if any(True for _ in node.find_all(*AGGREGATES)):
            raise QueryRefused(f"an aggregate in {where}", "it is not allowed there", hint)


def select_position(node: exp.Expression, count: int, clause: str) -> int | None:
    """The select-list position (from 1) a number in `clause` names, of `count` items;
    None for anything but a number."""
    if not isinstance(node, exp.Literal) or node.is_string:
        return None
    if not node.this.isdigit():
        raise QueryRefused(
            f"{clause} {node.this}",
            "a number there is a position in the select list, and positions are whole",
            f"write {clause} 1 for the first item of the select list",
        )
    position = int(node.this)
    if not 1 <= position <= count:
        raise QueryRefused(
            f"{clause} {position}",
            f"the select list has {count} items",
            f"use a position between 1 and {count}",
        )
    return position


def resolve_reference(
    node: exp.Expression,
    items: list[tuple[str, exp.Expression]],
    aliases: dict[str, exp.Expression],
    resolver: Resolver,
    clause: str,
) -> exp.Expression:
    """A GROUP BY/ORDER BY item: a select-list position, an alias, or an expression."""
    position = select_position(node, len(items), clause)
    if position is not None:
        return items[position - 1][1]
    if (
        isinstance(node, exp.Column)
        and not node.table
        and resolver.table.column(node.name) is None
        and node.name.lower() in aliases
    ):
        return aliases[node.name.lower()]
    return node
