"""Relations in FROM: joins, subqueries and CTEs as one unit-carrying relation.

A query whose FROM joins tables, or reads a subquery or a CTE, is turned into a
query over one *virtual table*: the relation the database computes from the
FROM clause, whose every row belongs to exactly one privacy unit (DESIGN
section 3, "Relations"; docs/relations.md). The analysis, the rewrite and the
release then treat it as they treat a table: contribution bounding and clamping
happen once, on the final relation, right before the outer aggregate, so a join
that duplicates a unit's rows changes utility, never a sensitivity.

The passes, each a function over the tree:

1. `inline` merges subqueries and CTEs that only filter and project into the
   outer query (sqlglot's optimizer: qualify, eliminate_subqueries,
   merge_subqueries); what cannot be merged (a subquery that aggregates, a
   recursive CTE) is refused.
2. `_joined` reads the FROM clause and its joins into base tables, and checks
   each join: private with public on any condition the gate proves total,
   private with private only on equality of their units (INNER), outer joins
   only where every private table is preserved.
3. `_virtual` builds the virtual table (the columns the query reads, each
   renamed to one unambiguous name; the units of joined private tables are one
   column) and the SQL computing its rows; the outer query is rewritten to read
   it.

Queries over public tables alone never come here: sql/public.py answers them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sqlglot import exp
from sqlglot.optimizer.eliminate_ctes import eliminate_ctes
from sqlglot.optimizer.eliminate_subqueries import eliminate_subqueries
from sqlglot.optimizer.merge_subqueries import merge_subqueries

from dpsql.errors import QueryRefused
from dpsql.policy import Column, Policy, Table
from dpsql.sql.analysis import RESERVED_PREFIX
from dpsql.sql.check import check_clauses
from dpsql.sql.join_domains import ReadPublic, public_key_domains
from dpsql.sql.per_unit import aggregates_per_unit, per_unit_table, shown
from dpsql.sql.public import require_public_query
from dpsql.sql.qualify import qualified, tables_read
from dpsql.sql.row_level import require_one_row_each, require_unit
from dpsql.sql.total import require_total
from dpsql.sql.unions import union_branches, union_table

_UNIT = f"{RESERVED_PREFIX}_unit"  # the relation's unit column, when its own name is taken
_JOIN_SIDES = ("", "LEFT", "RIGHT")


def reads_relation(select: exp.Select) -> bool:
    """Whether the query reads more than one table: joins, a subquery anywhere, a CTE."""
    source = select.args.get("from_")
    return bool(
        select.args.get("joins")
        or select.args.get("with_")
        or (source is not None and not isinstance(source.this, exp.Table))
        or any(node is not select for node in select.find_all(exp.Select))
    )


def inline(select: exp.Select, per_unit: Callable[[exp.CTE], str] | None = None) -> exp.Select:
    """Subqueries and CTEs that only filter and project, merged into the outer query;
    each that aggregates is read as the table `per_unit` names for it (none: refused)."""
    merged = merge_subqueries(eliminate_subqueries(select))
    with_ = merged.args.get("with_")
    for cte in list(with_.expressions) if with_ is not None and per_unit is not None else []:
        derived = isinstance(cte.this, exp.Select) and aggregates_per_unit(cte.this)
        if derived or isinstance(cte.this, exp.SetOperation):
            # its own query, with the CTEs before it (the subqueries it reads, hoisted)
            inner = cte.this.copy()
            before = with_.expressions[: with_.expressions.index(cte)]
            if before:
                inner.set("with_", exp.With(expressions=[c.copy() for c in before]))
            _read_as(merged, cte.alias_or_name, per_unit(inner, cte.alias_or_name))
            cte.pop()
    merged = eliminate_ctes(merged)
    for cte in merged.find_all(exp.CTE):
        raise _unmerged(cte.this, f"the common table expression {cte.alias_or_name}")
    for subquery in merged.find_all(exp.Subquery):
        raise _unmerged(subquery.this, "a subquery")
    return merged


def _read_as(select: exp.Select, cte: str, table: str) -> None:
    """Every read of the CTE `cte` in `select` made a read of the table `table`."""
    for node in list(select.find_all(exp.Table)):
        if not node.args.get("db") and node.name.lower() == cte.lower():
            alias = node.alias or node.name
            node.replace(exp.table_(exp.to_identifier(table), alias=exp.to_identifier(alias)))


def _unmerged(inner: exp.Expression, what: str) -> QueryRefused:
    if isinstance(inner, exp.Select) and aggregates_per_unit(inner):
        return QueryRefused(
            f"{what}, which aggregates",
            "dpsql reads an aggregating subquery only as a table in FROM (grouped by the "
            "privacy unit), not as a value or a condition",
            "join it in FROM: ... FROM customer c JOIN (SELECT o_custkey, COUNT(*) AS n "
            "FROM orders GROUP BY o_custkey) t ON t.o_custkey = c.c_custkey",
        )
    return QueryRefused(
        what,
        "it cannot be merged into the outer query as a filter and projection of its tables "
        "(DISTINCT, LIMIT, a set operation or a window inside it)",
        "write its conditions in the outer query's WHERE, or join the tables directly",
    )


@dataclass(frozen=True)
class _Base:
    """One table of the FROM clause, under its alias (`hidden`: joined by dpsql to read
    a referencing table's unit)."""

    alias: str
    table: Table
    node: exp.Table
    hidden: bool = False

    @property
    def private(self) -> bool:
        return not self.table.public

    @property
    def unit(self) -> str | None:
        return self.table.privacy_unit


def _joined(
    select: exp.Select,
    tables: dict[str, Table],
    policy: Policy,
    unique: frozenset[str],
    conditions: list[exp.Expression],
) -> list[_Base]:
    """The FROM clause's tables in order, each join checked (kind and side), then one
    hidden join per table whose unit is read through a reference."""
    source = select.args["from_"].this
    bases = [_base(source, tables)]
    for join in select.args.get("joins") or []:
        right = _base(join.this, tables)
        _check_join(join, bases, right)
        bases.append(right)
    if not any(base.private for base in bases):
        private = sorted(t.name for t in tables.values() if not t.public)
        raise QueryRefused(
            f"a query over public tables that reads {', '.join(private)} in a subquery",
            "the private rows would decide which public rows come back, with no noise",
            "aggregate the private table itself, e.g. SELECT n_name, COUNT(*) FROM customer "
            "JOIN nation ON ... GROUP BY n_name",
        )
    for base in list(bases):
        if base.table.via is not None:
            _require_unique(base, policy, unique)
            if not _joined_along(base, bases, conditions):
                bases.append(_referenced(select, base, len(bases), policy))
    return bases


def _joined_along(base: _Base, bases: list[_Base], conditions: list[exp.Expression]) -> bool:
    """Whether the query itself joins `base` to the table it references, on the reference
    (then that join gives each of its rows its unit, and no hidden join is needed)."""
    ends = {(base.alias.lower(), base.table.via.column)} | {
        (b.alias.lower(), base.table.via.target)
        for b in bases
        if b.table.name.lower() == base.table.via.table
    }
    for condition in conditions:
        for conjunct in _conjuncts(condition):
            if isinstance(conjunct, exp.EQ) and all(
                isinstance(side, exp.Column) for side in (conjunct.this, conjunct.expression)
            ):
                keys = {
                    (c.table.lower(), c.name.lower()) for c in (conjunct.this, conjunct.expression)
                }
                if (
                    len(keys) == 2
                    and keys <= ends
                    and (base.alias.lower(), base.table.via.column) in keys
                ):
                    return True
    return False


def _require_unique(base: _Base, policy: Policy, unique: frozenset[str]) -> None:
    via = base.table.via
    target = policy.tables[via.table]
    if f"{via.table}.{via.target}" not in unique:
        raise QueryRefused(
            f"the table {base.table.name}, whose privacy unit is read through "
            f"{target.name}.{via.target}",
            f"the database does not keep {target.name}.{via.target} unique, so one "
            f"{base.table.name} row could reference rows of several people",
            f"ask the data owner for a PRIMARY KEY or UNIQUE constraint on "
            f"{target.name}({via.target})",
        )


def _referenced(select: exp.Select, base: _Base, index: int, policy: Policy) -> _Base:
    """The referenced table, joined to `base` on its reference (appended to the query's
    joins): each row of `base` meets at most one row of it (a kept key), whose unit is
    its unit."""
    via = base.table.via
    target = policy.tables[via.table]
    alias = f"{RESERVED_PREFIX}_via{index}"
    *path, name = target.name.lower().split(".")
    node = exp.Table(
        this=exp.to_identifier(name),
        db=exp.to_identifier(path[-1]) if path else None,
        alias=exp.TableAlias(this=exp.to_identifier(alias)),
    )
    on = exp.EQ(
        this=exp.column(via.column, table=base.alias),
        expression=exp.column(via.target, table=alias),
    )
    select.append("joins", exp.Join(this=node, on=on))
    return _Base(alias, target, node, hidden=True)


def _base(node: exp.Expression, tables: dict[str, Table]) -> _Base:
    if not isinstance(node, exp.Table):
        raise _unmerged(node.this if isinstance(node, exp.Subquery) else node, "a derived table")
    if node.args.get("sample") or node.args.get("laterals"):
        raise QueryRefused(
            "TABLESAMPLE or a lateral join",
            "it is outside the subset dpsql can protect",
            "query the whole tables; dpsql's noise already protects individuals",
        )
    name = ".".join(part.name for part in node.parts)
    table = tables[name.lower()]
    return _Base(node.alias_or_name, table, node)


def _check_join(join: exp.Join, left: list[_Base], right: _Base) -> None:
    side = (join.side or "").upper()
    kind = (join.kind or "").upper()
    text = join.sql()[:80]
    if join.args.get("using"):
        raise QueryRefused(
            f"the join {text}",
            "USING hides which table a column is read from",
            "write the condition with ON, e.g. ON a.key = b.key",
        )
    if (
        kind in ("SEMI", "ANTI", "ASOF", "POSITIONAL")
        or side == "FULL"
        or side
        not in (
            *_JOIN_SIDES,
            "FULL",
        )
    ):
        raise QueryRefused(
            f"the join {text}",
            "dpsql joins with INNER, LEFT, RIGHT and CROSS joins only",
            "write an INNER JOIN, or a LEFT JOIN that keeps the private table's rows",
        )
    # The relation's unit is the first private table's: it must be on the preserved side
    # of every outer join, or a row would carry no unit, or one invented for it.
    left_private = any(base.private for base in left)
    if (side == "LEFT" and right.private and not left_private) or (
        side == "RIGHT" and left_private
    ):
        raise QueryRefused(
            f"the outer join {text}",
            "it keeps rows for which the private table has none (its columns NULL): rows "
            "that say who is absent, which no contribution bound covers",
            "use an INNER JOIN, or put the private table on the preserved side "
            "(private LEFT JOIN public)",
        )


@dataclass
class Relation:
    """The outer query over the virtual table, and that table (its `relation` the SQL)."""

    select: exp.Select
    table: Table
    description: str


def relation(
    select: exp.Select,
    policy: Policy,
    dialect: str,
    unique: frozenset[str] = frozenset(),
    seed: int = 0,
    read_public: ReadPublic | None = None,
) -> Relation:
    """The query over one unit-carrying relation built from its FROM clause; `unique`
    names the columns ("table.column") the database keeps unique; `seed` keys the hash
    that bounds the rows of a subquery aggregating per unit; `read_public` reads the
    key domains of public tables' columns (sql/join_domains.py; None: not read)."""
    tables = tables_read(select, policy)
    outer = select.copy()
    outer.set("joins", None)
    outer.set("with_", None)
    check_clauses(outer)
    resolved = qualified(select, tables, dialect)
    return _Builder(tables, policy, unique, dialect, seed, read_public).build(resolved)


@dataclass
class _Builder:
    """Builds the relation of one query, and of each subquery in it that aggregates per
    unit (a table of its own: sql/per_unit.py)."""

    tables: dict[str, Table]
    policy: Policy
    unique: frozenset[str]
    dialect: str
    seed: int
    read_public: ReadPublic | None = None
    descriptions: dict[str, str] = field(default_factory=dict)

    def build(self, resolved: exp.Select) -> Relation:
        filters = _public_filters(resolved, self.tables)
        merged = inline(resolved, self._per_unit)
        on, moved = _join_conditions(merged)
        bases = _joined(merged, self.tables, self.policy, self.unique, [*on, *moved])
        require_one_row_each(bases, [*on, *moved], self.unique)  # a row-level table's joins
        names = _virtual_names(merged, bases)
        virtual = _virtual_table(bases, names)
        _check_conditions([*on, *moved], bases, names, virtual)
        virtual, keys = public_key_domains(
            merged, bases, names, virtual, moved, self.read_public, self.dialect
        )
        outer = _outer(merged, names, virtual)
        sql = _relation_sql(merged, bases, names, [*moved, *filters])
        for base in bases:
            if base.table.relation is not None:  # a per-unit subquery: its SQL in place
                node = next(n for n in sql.find_all(exp.Table) if n.name == base.table.name)
                node.replace(base.table.relation.copy().subquery(base.alias))
        description = "; ".join([_describe(bases, self.descriptions), *keys])
        return Relation(outer, replace(virtual, relation=sql), description)

    def _per_unit(self, query: exp.Query, name: str) -> str:
        """The name of the table standing for `query`, the subquery `name` that
        aggregates per unit or stacks relations with UNION ALL, now among the tables
        the query reads."""
        with_ = query.args.get("with_")
        branches = []
        for branch in union_branches(query, name):
            if with_ is not None and branch is not query:  # the CTEs it may read
                branch = branch.copy()
                branch.set("with_", with_.copy())
            read = [self.tables.get(t.name.lower()) for t in branch.find_all(exp.Table)]
            if isinstance(query, exp.Union) and all(t is None or t.public for t in read):
                raise QueryRefused(
                    f"a branch of the UNION ALL in {name} over public tables only",
                    "its rows belong to nobody, so no privacy unit could bound them",
                    "stack relations of private tables, each selecting its unit",
                )
            inner = self.build(branch)
            _check_inner_where(inner.select, inner.table)
            branches.append(inner)
        while name.lower() in self.tables:
            name = f"{RESERVED_PREFIX}_{name}"
        if isinstance(query, exp.Union):
            table = union_table([(b.select, b.table) for b in branches], name)
            shown = " UNION ALL ".join(f"({b.description})" for b in branches)
        else:
            (inner,) = branches
            require_unit(inner.table, name)
            table = per_unit_table(inner.select, inner.table, name, self.dialect, self.seed)
            shown = f"per unit of ({inner.description})"
        self.tables[name.lower()] = table
        self.descriptions[name.lower()] = shown
        return name


def _public_filters(select: exp.Select, tables: dict[str, Table]) -> list[exp.Expression]:
    """The WHERE conjuncts `column [NOT] IN (SELECT column FROM <public tables>)`, taken
    out of the WHERE for the relation's own: the subquery reads public data only, and
    comparing a stored column with values of its own kind cannot fail."""
    where = select.args.get("where")
    if where is None:
        return []
    kept, filters = [], []
    for conjunct in _conjuncts(where.this):
        inner = conjunct.this if isinstance(conjunct, exp.Not) else conjunct
        if isinstance(inner, exp.In) and inner.args.get("query") is not None:
            _require_public_list(inner, tables)
            filters.append(conjunct)
        else:
            kept.append(conjunct)
    if filters:  # else the WHERE stays as written, for the analysis to refuse or read
        kept = [k if isinstance(k, exp.Condition) else exp.paren(k) for k in kept]
        select.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
    return filters


def _require_public_list(condition: exp.In, tables: dict[str, Table]) -> None:
    query = condition.args["query"].unnest()
    text = condition.sql()[:80]
    read = [".".join(part.name for part in t.parts).lower() for t in query.find_all(exp.Table)]
    if not isinstance(query, exp.Select) or not all(
        name in tables and tables[name].public for name in read
    ):
        raise QueryRefused(
            f"the subquery in {text}",
            "a subquery in WHERE may read public tables only: private rows would choose "
            "which rows count, with no bound on how many",
            "join the private table on its privacy unit",
        )
    require_public_query(query)
    column = condition.this
    selected = query.expressions[0].unalias() if len(query.expressions) == 1 else None
    left = _policy_column(column, tables) if isinstance(column, exp.Column) else None
    right = _policy_column(selected, tables) if isinstance(selected, exp.Column) else None
    if left is None or right is None or left.private or _kind(left) != _kind(right):
        raise QueryRefused(
            f"the condition {text}",
            "it must compare a public column of the query's tables with one column of a "
            "public table, of the same kind (a conversion there could fail for one row)",
            "write column IN (SELECT other_column FROM public_table WHERE ...)",
        )


def _policy_column(column: exp.Column, tables: dict[str, Table]) -> Column | None:
    """The declared column a qualified column names, found through its table's alias."""
    scope = column.find_ancestor(exp.Select)
    for node in scope.find_all(exp.Table) if scope else []:
        if node.alias_or_name.lower() == column.table.lower():
            table = tables.get(".".join(p.name for p in node.parts).lower())
            return table.column(column.name) if table else None
    return None


def _join_conditions(select: exp.Select) -> tuple[list[exp.Expression], list[exp.Expression]]:
    """The conditions tying tables together: every ON, and each WHERE conjunct that reads
    columns of two tables (FROM a, b WHERE a.u = b.u), which is moved out of the WHERE
    into the relation's own."""
    on = [j.args["on"] for j in select.args.get("joins") or [] if j.args.get("on") is not None]
    where = select.args.get("where")
    if where is None:
        return on, []
    kept, moved = [], []
    for conjunct in _conjuncts(where.this):
        aliases = {c.table.lower() for c in conjunct.find_all(exp.Column)}
        (moved if len(aliases) > 1 else kept).append(conjunct)
    select.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
    return on, moved


def _conjuncts(condition: exp.Expression) -> list[exp.Expression]:
    return list(condition.flatten()) if isinstance(condition, exp.And) else [condition]


def _virtual_names(select: exp.Select, bases: list[_Base]) -> dict[tuple[str, str], str]:
    """One name per column the query reads: its own where no other table has it, else
    alias.column; the units of every private table are one column, named after the
    first one's unit where that name is free."""
    counts: dict[str, int] = {}
    for base in bases:
        for column in base.table.columns:
            counts[column] = counts.get(column, 0) + 1
    first = _unit_source(bases)
    unit = None if first is None else first.unit if counts[first.unit] == 1 else _UNIT
    read = {(c.table.lower(), c.name.lower()) for c in select.find_all(exp.Column)}
    names: dict[tuple[str, str], str] = {}
    for base in bases:
        for column in base.table.columns:
            key = (base.alias.lower(), column)
            if base.private and column == base.unit:
                names[key] = unit
            elif key in read:
                names[key] = column if counts[column] == 1 else f"{base.alias.lower()}.{column}"
    return names


def _unit_source(bases: list[_Base]) -> _Base | None:
    """The table whose unit column is the relation's: the first with a unit of its own
    (None: a row-level table's relation, one row per private row, sql/row_level.py)."""
    return next((base for base in bases if base.private and base.unit), None)


def _virtual_table(bases: list[_Base], names: dict[tuple[str, str], str]) -> Table:
    private = [base for base in bases if base.private and not base.hidden]
    first = _unit_source(bases)
    columns: dict[str, Column] = {}
    for base in bases:
        for column_name, column in base.table.columns.items():
            name = names.get((base.alias.lower(), column_name))
            if name is not None:
                columns[name.lower()] = replace(column, name=name)
    return Table(
        name=" JOIN ".join(base.table.name.split(".")[-1] for base in bases),
        columns=columns,
        privacy_unit=names[(first.alias.lower(), first.unit)] if first else None,
        max_groups_per_unit=max(base.table.max_groups_per_unit for base in private),
        max_rows_per_unit=max(base.table.max_rows_per_unit for base in private),
    )


def _renamed(node: exp.Expression, names: dict[tuple[str, str], str]) -> exp.Expression:
    """`node` with each qualified column read as its virtual column."""

    def rename(sub: exp.Expression) -> exp.Expression:
        if isinstance(sub, exp.Column) and sub.table:
            name = names.get((sub.table.lower(), sub.name.lower()))
            if name is not None:
                return exp.column(name, quoted=True)
        return sub

    return node.transform(rename, copy=True)


def _read_name(column: exp.Column, names: dict[tuple[str, str], str], bases: list[_Base]) -> str:
    return names.get((column.table.lower(), column.name.lower()), "")


def _check_conditions(
    conditions: list[exp.Expression],
    bases: list[_Base],
    names: dict[tuple[str, str], str],
    virtual: Table,
) -> None:
    """Join conditions read public columns only, through expressions the gate proves
    total, but for equalities of units, which must link every private table."""
    units = _unit_columns(bases)
    linked = _UnitLinks([b.alias.lower() for b in bases if b.private])
    for base in bases:
        hidden = next((h for h in bases if h.hidden and _references(base, h)), None)
        if hidden is not None:
            linked.join(base.alias.lower(), hidden.alias.lower())
    for condition in conditions:
        for conjunct in _conjuncts(condition):
            pair = _unit_equality(conjunct, units)
            if pair is not None:
                linked.join(*pair)
                continue
            for column in conjunct.find_all(exp.Column):
                name = _read_name(column, names, bases)
                spec = virtual.column(name)
                if spec is not None and spec.private:
                    raise QueryRefused(
                        f"the join condition {conjunct.sql()[:80]}",
                        f"it reads the private column {column.sql()}: private columns tie rows "
                        "to people and are never used to select rows, but for joining two "
                        "private tables on their units",
                        "join private tables on their privacy units (a.unit = b.unit), and "
                        "public tables on public columns",
                    )
            _require_plain_comparison(
                conjunct,
                lambda c: virtual.column(names.get((c.table.lower(), c.name.lower()), "")),
                "the join condition",
            )
            require_total(_renamed(conjunct, names), virtual, "JOIN ... ON", condition=True)
    linked.require_one()


# What a join condition may be: a comparison of columns and constants. The relation's
# SQL reads its base tables as stored, before the rewrite clamps and widens columns
# (rewrite._clamped_source), so computing with a column there could fail for one row
# (a PostgreSQL float overflow); comparing one cannot.
_JOIN_COMPARISONS = (
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
    exp.Is, exp.In, exp.Between,
)  # fmt: skip
_CONSTANTS = (exp.Literal, exp.Null, exp.Boolean)


def _require_plain_comparison(
    conjunct: exp.Expression, spec: Callable[[exp.Column], Column | None], what: str
) -> None:
    """Refuse `what` (`conjunct`) unless it compares columns of one kind (`spec` gives
    each column's declaration) with each other or with constants."""
    operands = list(conjunct.iter_expressions()) if isinstance(conjunct, _JOIN_COMPARISONS) else []
    flat = [
        o
        for operand in operands
        for o in (operand.expressions if isinstance(operand, exp.Tuple) else [operand])
    ]
    columns = [o for o in flat if isinstance(o, exp.Column)]
    plain = operands and all(
        isinstance(o, (exp.Column, *_CONSTANTS))
        or (isinstance(o, exp.Neg) and isinstance(o.this, exp.Literal))
        for o in flat
    )
    if not plain or len({_kind(spec(c)) for c in columns}) > 1:
        raise QueryRefused(
            f"{what} {shown(conjunct, 80)}",
            "it is compared on the tables as stored, so it may only compare columns of one "
            "kind with each other or with constants (a computation there, or a comparison "
            "across kinds, could fail for one row)",
            "compare columns directly (ON a.key = b.key, WHERE t.price > 10), and compute "
            "in the outer query's WHERE",
        )


def _check_inner_where(select: exp.Select, virtual: Table) -> None:
    """The WHERE of a subquery aggregating per unit (read as stored, like a join
    condition): comparisons of columns that are not private."""
    where = select.args.get("where")
    for conjunct in _conjuncts(where.this) if where is not None else []:
        for column in conjunct.find_all(exp.Column):
            spec = virtual.column(column.name)
            if spec is not None and spec.private:
                raise QueryRefused(
                    f"the condition {shown(conjunct, 80)} in a subquery",
                    f"it reads the private column {column.name}, which is never used to "
                    "select rows",
                    "filter on columns that are not private",
                )
        _require_plain_comparison(
            conjunct, lambda c: virtual.column(c.name), "the subquery condition"
        )
        require_total(conjunct, virtual, "WHERE", condition=True)


def _kind(column: Column | None) -> str:
    if column is None:
        return ""
    return "number" if column.type in ("int", "float") else column.type


def _references(base: _Base, hidden: _Base) -> bool:
    return base.table.via is not None and hidden.table.name.lower() == base.table.via.table


def _unit_columns(bases: list[_Base]) -> dict[tuple[str, str], tuple[str, str]]:
    """The columns whose equality ties two rows to one unit: each private table's unit
    (`(alias, unit)` to `(table, "unit")`), and each reference's two ends (`(alias,
    column)` to `(referenced table, referenced column)`)."""
    ends = {}
    for base in bases:
        alias = base.alias.lower()
        if base.private and base.unit:
            ends[(alias, base.unit)] = ("", "unit")
        if base.table.via is not None:
            ends[(alias, base.table.via.column)] = (base.table.via.table, base.table.via.target)
    for base in bases:
        for via in {b.table.via for b in bases if b.table.via is not None}:
            if base.table.name.lower() == via.table:
                ends[(base.alias.lower(), via.target)] = (via.table, via.target)
    return ends


def _unit_equality(
    conjunct: exp.Expression, units: dict[tuple[str, str], tuple[str, str]]
) -> tuple[str, str] | None:
    """The two aliases an equality of units (or of a reference's ends) ties together."""
    if not isinstance(conjunct, exp.EQ):
        return None
    sides = [conjunct.this, conjunct.expression]
    if not all(isinstance(side, exp.Column) for side in sides):
        return None
    keys = [(side.table.lower(), side.name.lower()) for side in sides]
    if keys[0][0] == keys[1][0] or not all(key in units for key in keys):
        return None
    if units[keys[0]] == units[keys[1]]:
        return keys[0][0], keys[1][0]
    return None


class _UnitLinks:
    """Which private tables are joined on their units (a union-find over aliases)."""

    def __init__(self, aliases: list[str]):
        self.parent = {alias: alias for alias in aliases}

    def root(self, alias: str) -> str:
        while self.parent[alias] != alias:
            alias = self.parent[alias]
        return alias

    def join(self, first: str, second: str) -> None:
        self.parent[self.root(first)] = self.root(second)

    def require_one(self) -> None:
        roots = {self.root(alias) for alias in self.parent}
        if len(roots) > 1:
            shown = sorted(a for a in self.parent if not a.startswith(RESERVED_PREFIX))
            raise QueryRefused(
                f"a join of the private tables {', '.join(shown)}",
                "rows of two private tables are one person's only when joined on their "
                "privacy units; on other columns a row would carry two people",
                "add the condition a.<unit> = b.<unit> to the join (e.g. "
                "ON o.o_custkey = c.c_custkey)",
            )


def _outer(select: exp.Select, names: dict[tuple[str, str], str], virtual: Table) -> exp.Select:
    """The outer query over the virtual table: one FROM, no joins, columns renamed."""
    outer = _renamed(select, names)
    outer.set("joins", None)
    outer.set("with_", None)
    placeholder = exp.Table(this=exp.to_identifier(virtual.name, quoted=True))
    outer.set("from_", exp.From(this=placeholder))
    return outer


def _relation_sql(
    select: exp.Select, bases: list[_Base], names: dict[tuple[str, str], str], moved: list
) -> exp.Select:
    """The rows of the virtual table: every column under its virtual name (the unit of
    the first private table as the unit), the joins with their ON conditions, and the
    join conditions the query wrote in its WHERE."""
    first = _unit_source(bases)
    unit = names[(first.alias.lower(), first.unit)] if first else None
    items = (
        [exp.alias_(exp.column(first.unit, table=first.alias), unit, quoted=True)] if first else []
    )
    for (alias, column), name in names.items():
        if name != unit:
            items.append(exp.alias_(exp.column(column, table=alias), name, quoted=True))
    if not items:  # a row-level relation the query reads no column of: COUNT(*) alone
        items.append(exp.alias_(exp.convert(1), f"{RESERVED_PREFIX}_row", quoted=True))
    relation = exp.select(*items).from_(bases[0].node.copy())
    for join in select.args.get("joins") or []:
        relation.append("joins", join.copy())
    if moved:
        relation = relation.where(*[condition.copy() for condition in moved])
    return relation


def _describe(bases: list[_Base], per_unit: dict[str, str]) -> str:
    """The relation as EXPLAIN shows it: its joins, where its unit comes from, what is
    public, and what each subquery aggregating per unit reads."""
    shown = [b for b in bases if not b.hidden]
    text = " JOIN ".join(f"{b.table.name} AS {b.alias}" for b in shown)
    units = []
    for b in shown:
        if b.private and b.unit:
            units.append(f"{b.alias}.{b.unit}")
        elif b.table.via is not None:
            via = b.table.via
            units.append(f"{b.alias}.{via.column} -> {via.table}.{via.target}")
        elif b.private:
            units.append(f"each row of {b.alias} (row-level)")
    public = [b.table.name for b in shown if not b.private]
    inner = [f"{b.table.name} {per_unit[b.table.name.lower()]}" for b in shown
             if b.table.name.lower() in per_unit]  # fmt: skip
    return (
        f"{text}; unit: {' = '.join(units)}"
        + (f"; public: {', '.join(public)}" if public else "")
        + "".join(f"; {line}" for line in inner)
    )
