"""Group keys read from public tables: the key domain of a GROUP BY on a column of a
public table joined into a relation (docs/relations.md, "Keys from public tables").

`SELECT n.n_name, SUM(...) FROM customer c JOIN nation n ON ... GROUP BY n.n_name`
groups by a column whose every value is public: the nations are in the nation
table, whoever the customers are. So the keys need no partition selection: they
are read from the public tables alone, by a query that names only the public
tables the relation is inner-joined with and only the query's conditions on their
columns (never a private table or column), and every key is released, empty
groups included, under pure epsilon, as a policy `values:` domain is. The key set
is then a function of public data alone: identical on neighbouring databases.

Each non-NULL key of a relation row lies in the domain read: that row holds one row
of each inner-joined public table, and those rows pass every condition read (each
is an ON of an inner join or a WHERE conjunct, true of every relation row). The
rewrite also keeps only rows whose key is in the domain (rewrite._where), so
privacy never rests on that argument, only the completeness of the answer does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.policy import Table
from dpsql.sql.check import AGGREGATES, ORDER_STATISTICS
from dpsql.sql.keys import canonical_sql, canonical_value
from dpsql.sql.public import require_public_query
from dpsql.sql.ranges import conjuncts
from dpsql.sql.rewrite import in_dialect

# The most keys one public column's domain may have; above it the keys come from the
# data (partition selection), as for a column without a public domain.
MAX_JOIN_DOMAIN = 10_000
_KINDS = ("int", "string")  # key types whose values read back in one spelling each
ReadPublic = Callable[[str], list[tuple]]  # runs SQL over public tables, returns its rows


class _Base(Protocol):
    alias: str
    table: Table
    node: exp.Table
    hidden: bool


def public_key_domains(
    select: exp.Select,
    bases: Sequence[_Base],
    names: dict[tuple[str, str], str],
    virtual: Table,
    conditions: list[exp.Expression],
    read: ReadPublic | None,
    dialect: str,
) -> tuple[Table, list[str]]:
    """`virtual` with a public domain (`values`) on each GROUP BY key that is a column
    of a public table, read by `read`; and a line per such key saying where its keys
    come from. `conditions` are the join conditions not in `select`'s WHERE."""
    group = select.args.get("group")
    if read is None or group is None or select.find(*AGGREGATES, *ORDER_STATISTICS) is None:
        return virtual, []
    columns = dict(virtual.columns)
    lines = []
    for key in _group_columns(select, group):
        base = next((b for b in bases if b.alias.lower() == key.table.lower()), None)
        name = names.get((key.table.lower(), key.name.lower()))
        spec = columns.get(name.lower()) if name else None
        if base is None or not base.table.public or spec is None or spec.public_domain:
            continue
        if spec.type not in _KINDS:
            lines.append(f"keys of {key.sql()} by partition selection (a {spec.type} column)")
            continue
        sql = _domain_sql(select, bases, key, spec.type, conditions, dialect)
        values = {canonical_value(row[0], spec.type) for row in read(sql)}
        if len(values) > MAX_JOIN_DOMAIN:
            lines.append(
                f"keys of {key.sql()} by partition selection: {base.table.name} has more than "
                f"{MAX_JOIN_DOMAIN:,} of them"
            )
            continue
        # SQLite may store a text in an integer column: sorted by type, then value
        ordered = sorted(values, key=lambda v: (type(v).__name__, v))
        columns[name.lower()] = replace(spec, values=tuple(ordered))
        lines.append(
            f"keys of {key.sql()}: the {len(values)} values of {base.table.name} under the "
            "query's conditions on public tables (public, every one released)"
        )
    return replace(virtual, columns=columns), lines


def _group_columns(select: exp.Select, group: exp.Group) -> list[exp.Column]:
    """The GROUP BY keys that are bare qualified columns (a position read as its item)."""
    items = [item.unalias() for item in select.expressions]
    found = []
    for node in group.expressions:
        if isinstance(node, exp.Literal) and node.is_int and 0 < int(node.this) <= len(items):
            node = items[int(node.this) - 1]
        if isinstance(node, exp.Column) and node.table:
            found.append(node)
    return found


def _domain_sql(
    select: exp.Select,
    bases: Sequence[_Base],
    key: exp.Column,
    kind: str,
    conditions: list[exp.Expression],
    dialect: str,
) -> str:
    """The query reading `key`'s domain: its public table, the public tables linked to
    it by conditions over public tables alone, and those conditions."""
    joins = select.args.get("joins") or []
    kept = [True] * len(bases)  # whether every relation row has a row of the table
    for index, join in enumerate(joins, start=1):
        side = (join.side or "").upper()
        if side == "LEFT":
            kept[index] = False
        elif side == "RIGHT":
            kept[:index] = [False] * index
    inner = {
        base.alias.lower(): base
        for base, whole in zip(bases, kept, strict=True)
        if base.table.public
        and not base.hidden
        and (whole or base.alias.lower() == key.table.lower())
    }
    where = select.args.get("where")
    candidates = [where.this] if where is not None else []
    candidates += [j.args["on"] for j in joins if not j.side and j.args.get("on") is not None]
    candidates += conditions
    usable = []
    for condition in candidates:
        for conjunct in conjuncts(condition):
            aliases = {c.table.lower() for c in conjunct.find_all(exp.Column)}
            if aliases and aliases <= inner.keys() and _public_sql(conjunct):
                usable.append((aliases, conjunct))
    linked = {key.table.lower()}
    grown = True
    while grown:  # the tables linked to the key's by usable conditions
        grown = False
        for aliases, _ in usable:
            if aliases & linked and not aliases <= linked:
                linked |= aliases
                grown = True
    # Every part is a copy made here, so the builders take them as they are (copy=False):
    # copying the query so far at each step cost most of reading a domain.
    read = [inner[alias].node.copy() for alias in inner if alias in linked]
    value = canonical_sql(key.copy(), kind, dialect)
    query = exp.select(exp.alias_(value, "v", copy=False), copy=False)
    query = query.distinct(copy=False).from_(read[0], copy=False)
    for table in read[1:]:
        query = query.join(table, copy=False)
    chosen = [c.copy() for aliases, c in usable if aliases <= linked]
    not_null = exp.Not(this=exp.Is(this=key.copy(), expression=exp.Null()))
    query = query.where(exp.and_(*chosen, not_null, copy=False), copy=False)
    return in_dialect(query.limit(MAX_JOIN_DOMAIN + 1, copy=False), dialect)


def _public_sql(conjunct: exp.Expression) -> bool:
    """Whether a condition is one dpsql runs over public tables (no subquery in it)."""
    if conjunct.find(exp.Select) is not None:
        return False
    try:
        require_public_query(exp.select("1").where(conjunct.copy(), copy=False))
    except QueryRefused:
        return False
    return True
