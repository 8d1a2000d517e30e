"""`UNION ALL` of relations of one unit, as one table.

`SELECT COUNT(*) FROM (SELECT o_custkey AS u, o_totalprice AS v FROM orders WHERE
o_orderstatus = 'F' UNION ALL SELECT o_custkey, o_totalprice FROM orders WHERE
o_totalprice > 90000) t` stacks the rows of two relations. Each branch's rows
belong to one unit each (sql/relations.py builds each branch's relation), and
every branch selects its unit in the same position, so every row of the union
has that unit: the union is a private table like any other, and the outer
query's bounding (at most the sum of the branches' `max_rows_per_unit` rows per
unit, by default) bounds what one unit adds, however many branches hold it.

A branch may only project bare columns and filter with comparisons: it reads
its relation as stored, before the rewrite's clamped source (the checks are
sql/relations.py's, as for a join condition).
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.policy import Column, Table
from dpsql.sql.analysis import RESERVED_PREFIX
from dpsql.sql.per_unit import shown


def union_branches(union: exp.Union, name: str) -> list[exp.Select]:
    """The SELECTs a chain of UNION ALL stacks, in order; any other set operation is
    refused."""
    if isinstance(union, exp.Select):
        return [union]
    if not isinstance(union, exp.Union) or union.args.get("distinct"):
        raise QueryRefused(
            f"the set operation in {name}",
            "dpsql stacks relations with UNION ALL only: UNION, INTERSECT and EXCEPT "
            "compare rows of different people (a row kept or dropped because someone "
            "else has it)",
            "write UNION ALL, and count distinct people with COUNT(DISTINCT unit)",
        )
    if any(union.args.get(key) for key in ("order", "limit", "offset")):
        raise QueryRefused(
            f"ORDER BY or LIMIT on the UNION ALL in {name}",
            "it would keep some rows of the union and drop others, by their values",
            "leave the union whole; order and limit the outer query's groups",
        )
    return [*union_branches(union.this, name), *union_branches(union.expression, name)]


def union_table(branches: list[tuple[exp.Select, Table]], name: str) -> Table:
    """The table of the union of `branches` (each its outer query over its relation, a
    table with its `relation` SQL): its columns named as the first branch names them,
    each declared to hold what any branch's column holds."""
    first = branches[0][0]
    names = [item.alias_or_name for item in first.expressions]
    units, specs, selects = set(), [], []
    for index, (select, table) in enumerate(branches):
        columns = _projected(select, table, name)
        if len(columns) != len(names):
            raise QueryRefused(
                f"the UNION ALL in {name}",
                f"its branches select {len(names)} and {len(columns)} columns",
                "select the same columns, in the same order, in every branch",
            )
        units.add(next((i for i, c in enumerate(columns) if c.name == table.privacy_unit), -1))
        specs.append(columns)
        source = table.relation.copy().subquery(f"{RESERVED_PREFIX}_branch{index}")
        items = [
            exp.alias_(exp.column(column.name, quoted=True), alias, quoted=True)
            for column, alias in zip(columns, names, strict=True)
        ]
        branch = exp.select(*items).from_(source)
        if select.args.get("where") is not None:
            branch = branch.where(select.args["where"].this.copy())
        selects.append(branch)
    if len(units) != 1 or -1 in units:
        raise QueryRefused(
            f"the UNION ALL in {name}",
            "every branch must select its privacy unit, in the same position: a row of "
            "the union must say whose it is",
            "select the unit first in every branch (SELECT o_custkey, ... UNION ALL "
            "SELECT o_custkey, ...)",
        )
    position = units.pop()
    columns = {
        alias.lower(): _merged([spec[i] for spec in specs], alias, name)
        for i, alias in enumerate(names)
    }
    relation = selects[0]
    for branch in selects[1:]:
        relation = exp.union(relation, branch, distinct=False)
    tables = [table for _, table in branches]
    return Table(
        name=name,
        columns=columns,
        privacy_unit=names[position],
        max_rows_per_unit=sum(table.max_rows_per_unit for table in tables),
        max_groups_per_unit=max(table.max_groups_per_unit for table in tables),
        relation=relation,
    )


def _projected(select: exp.Select, table: Table, name: str) -> list[Column]:
    """The declared columns a branch selects, each bare."""
    for key, value in select.args.items():
        if value and key not in ("expressions", "from_", "where"):
            raise QueryRefused(
                f"the clause {key.rstrip('_').upper()} in a branch of {name}",
                "a branch of UNION ALL may only select columns and filter rows",
                "aggregate in the outer query, over the union",
            )
    columns = []
    for item in select.expressions:
        value = item.unalias()
        spec = table.column(value.name) if isinstance(value, exp.Column) else None
        if spec is None:
            raise QueryRefused(
                f"{shown(item.unalias())} in a branch of {name}",
                "a branch of UNION ALL reads its tables as stored, so it selects columns "
                "as they are",
                "select the column, and compute with it in the outer query",
            )
        columns.append(spec)
    return columns


_KINDS = {"int": "number", "float": "number"}


def _merged(columns: list[Column], alias: str, name: str) -> Column:
    """One column of the union: what each branch's column may hold."""
    kinds = {_KINDS.get(c.type, c.type) for c in columns}
    if len(kinds) > 1:
        raise QueryRefused(
            f"the column {alias} of the UNION ALL in {name}",
            f"its branches give it values of different kinds ({', '.join(sorted(kinds))})",
            "select columns of one kind in each position",
        )
    types = {c.type for c in columns}
    bounded = all(c.bounded for c in columns)
    domains = [c.public_domain for c in columns]
    values = (
        tuple(sorted({v for domain in domains for v in domain}))
        if all(d is not None for d in domains)
        else None
    )
    return replace(
        columns[0],
        name=alias,
        type="float" if types == {"int", "float"} else columns[0].type,
        private=any(c.private for c in columns),
        lower=min(c.lower for c in columns) if bounded else None,
        upper=max(c.upper for c in columns) if bounded else None,
        values=values,
        public=values is not None,
        read_as_double=any(c.read_as_double for c in columns),
        synopsis=None,
        continual=None,
    )
