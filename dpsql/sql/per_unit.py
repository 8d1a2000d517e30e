"""Subqueries that aggregate per unit, as tables of at most a few rows per unit.

`SELECT AVG(n) FROM (SELECT o_custkey, COUNT(*) AS n FROM orders GROUP BY
o_custkey) t` asks for one value per customer first. Grouped by its privacy
unit, the inner query gives rows that each belong to one unit and are a
function of that unit's rows alone; once each unit's rows are bounded (at most
`max_rows_per_unit` of them, chosen by a keyed hash, the NULL unit left out)
and each aggregate's argument is clamped to its declared bounds, every value of
such a row has bounds that follow from the policy: COUNT(*) lies in [1, R],
SUM(x) in [min(l, R*l), max(u, R*u)], AVG, MIN and MAX of x in [l, u]. So the
subquery is a private table like any other (sql/relations.py joins it and the
outer query aggregates it), whose declared columns are those bounds: the outer
aggregate's sensitivity comes from the inner bounding, and neighbouring
databases differ in one unit's rows of it.

The inner query reads its relation as stored (before the rewrite's clamped
source), so its WHERE may only compare columns (sql/relations.py checks it as it
checks join conditions), and the aggregates read only bare columns.
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.policy import Column, Table
from dpsql.sql.analysis import RESERVED_PREFIX
from dpsql.sql.clamps import clamp
from dpsql.sql.intervals import column_interval
from dpsql.sql.rewrite import keyed_hash, read_double

_RANK = f"{RESERVED_PREFIX}_inner_rank"
_SOURCE = f"{RESERVED_PREFIX}_inner_source"
_BOUNDED = f"{RESERVED_PREFIX}_inner_bounded"
_BIGINT = exp.DataType.build("BIGINT")
_DOUBLE = exp.DataType.build("DOUBLE")
# A per-unit SUM adds at most max_rows_per_unit clamped values: refused where that
# could leave what BIGINT or DOUBLE hold (an overflow would fail for one unit's rows).
_LARGEST_SUM = {"int": 2.0**62, "float": 1e300}
_AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)


def aggregates_per_unit(select: exp.Select) -> bool:
    """Whether a subquery aggregates (a GROUP BY or an aggregate in its select list)."""
    return bool(select.args.get("group")) or any(
        isinstance(item.unalias(), exp.AggFunc) for item in select.expressions
    )


def per_unit_table(select: exp.Select, inner: Table, name: str, dialect: str, seed: int) -> Table:
    """The table of `select`'s rows: `select` groups `inner` (a relation, its columns
    under their virtual names) by its unit, and perhaps more columns. Its `relation` is
    the SQL computing the rows, each unit's rows bounded and each argument clamped
    first; `seed` keys the hash choosing which rows a unit keeps."""
    _require_clauses(select, name)
    unit = inner.privacy_unit
    grouped = _grouped_columns(select, inner, unit, name)
    limit = inner.max_rows_per_unit
    items, columns, unit_name = [], {}, None
    for item in select.expressions:
        alias = item.alias_or_name
        value = item.unalias()
        if isinstance(value, exp.Column) and value.name.lower() in grouped:
            spec = inner.column(value.name)
            items.append(exp.alias_(exp.column(spec.name, quoted=True), alias, quoted=True))
            if spec.name.lower() == unit.lower():
                unit_name = alias
            columns[alias.lower()] = replace(spec, name=alias)
            continue
        sql, column = _aggregate(value, alias, inner, limit, name, dialect)
        items.append(exp.alias_(sql, alias, quoted=True))
        columns[alias.lower()] = column
    if unit_name is None:
        raise QueryRefused(
            f"the subquery {name}",
            f"it does not select its privacy unit {unit}, which its rows belong to",
            f"add {unit} to its select list: SELECT {unit}, ... GROUP BY {unit}",
        )
    one_per_unit = grouped == {unit.lower()}
    bounded = _bounded_rows(select, inner, dialect, seed)
    keys = [exp.column(inner.column(c).name, quoted=True) for c in sorted(grouped)]
    relation = (
        exp.select(*items)
        .from_(bounded)
        .where(exp.LTE(this=exp.column(_RANK), expression=exp.convert(limit)))
        .group_by(*keys)
    )
    rows = 1 if one_per_unit else limit
    return Table(
        name=name,
        columns=columns,
        privacy_unit=unit_name,
        max_rows_per_unit=rows,
        max_groups_per_unit=1 if one_per_unit else min(rows, inner.max_groups_per_unit),
        relation=relation,
    )


def _require_clauses(select: exp.Select, name: str) -> None:
    allowed = {"expressions", "from_", "where", "group"}
    for key, value in select.args.items():
        if value and key not in allowed:
            raise QueryRefused(
                f"the clause {key.rstrip('_').upper()} in the subquery {name}",
                "a subquery that aggregates per unit may only select, filter and group",
                "filter the per-unit values in the outer query's WHERE "
                "(... FROM (SELECT unit, COUNT(*) AS n ...) t WHERE t.n > 2)",
            )


def _grouped_columns(select: exp.Select, inner: Table, unit: str, name: str) -> set[str]:
    """The lower-case names of the columns `select` groups by, which include the unit."""
    group = select.args.get("group")
    keys = group.expressions if group is not None else []
    if not all(isinstance(key, exp.Column) and inner.column(key.name) for key in keys):
        raise QueryRefused(
            f"the GROUP BY of the subquery {name}",
            "a subquery that aggregates per unit groups by columns only",
            f"write GROUP BY {unit}[, other columns], and compute in the outer query",
        )
    grouped = {key.name.lower() for key in keys}
    if unit.lower() not in grouped:
        raise QueryRefused(
            f"the subquery {name}, which aggregates over several people",
            f"it does not group by the privacy unit {unit}: a row of it would mix the rows "
            "of many people, and the outer query could not bound anyone's share",
            f"group by the unit (GROUP BY {unit}, ...), or aggregate once in the outer query",
        )
    return grouped


def _aggregate(
    value: exp.Expression, alias: str, inner: Table, limit: int, name: str, dialect: str
) -> tuple[exp.Expression, Column]:
    """The SQL of one per-unit aggregate and the column it declares (its bounds)."""
    if not isinstance(value, _AGGREGATES):
        raise QueryRefused(
            f"{shown(value)} in the subquery {name}",
            "a subquery that aggregates per unit selects its group columns and "
            "COUNT, SUM, AVG, MIN or MAX of columns",
            "compute with the per-unit values in the outer query",
        )
    argument = value.this
    distinct = isinstance(argument, exp.Distinct)
    if distinct:
        argument = argument.expressions[0] if len(argument.expressions) == 1 else None
    if isinstance(value, exp.Count):
        if isinstance(argument, exp.Star):
            return _cast(exp.Count(this=exp.Star()), "int"), Column(
                alias, "int", lower=1, upper=limit, public=True
            )
        spec = _argument(argument, inner, value, name, numeric=False)
        counted = exp.column(spec.name, quoted=True)
        counted = exp.Distinct(expressions=[counted]) if distinct else counted
        return _cast(exp.Count(this=counted), "int"), Column(
            alias, "int", lower=0, upper=limit, public=True
        )
    if distinct:
        raise QueryRefused(
            f"{shown(value)} in the subquery {name}",
            "DISTINCT is only bounded per unit inside COUNT",
            "drop DISTINCT, or count the distinct values with COUNT(DISTINCT column)",
        )
    spec = _argument(argument, inner, value, name, numeric=True)
    interval = column_interval(spec)
    read: exp.Expression = exp.column(spec.name, quoted=True)
    if spec.read_as_double:
        read = read_double(read, dialect)
    clamped = clamp(read, interval)
    lower, upper = interval.lower, interval.upper
    if isinstance(value, exp.Sum):
        lower, upper = min(lower, limit * lower), max(upper, limit * upper)
        if max(abs(lower), abs(upper)) > _LARGEST_SUM[spec.type]:
            raise QueryRefused(
                f"{shown(value)} in the subquery {name}",
                f"a unit's sum of up to {limit} values of {spec.name} could overflow",
                f"declare tighter bounds for {spec.name}",
            )
        kind, sql = spec.type, exp.Sum(this=clamped)
    elif isinstance(value, exp.Avg):
        kind, sql = "float", exp.Avg(this=clamped)
    else:
        kind, sql = spec.type, type(value)(this=clamped)
    bounds = {"lower": _typed(lower, kind), "upper": _typed(upper, kind)}
    return _cast(sql, kind), Column(alias, kind, **bounds)


def _argument(
    argument: exp.Expression | None, inner: Table, value: exp.Expression, name: str, numeric: bool
) -> Column:
    spec = inner.column(argument.name) if isinstance(argument, exp.Column) else None
    wanted = "a bounded number column" if numeric else "a column"
    if (
        spec is None
        or spec.private
        or (numeric and (spec.type not in ("int", "float") or column_interval(spec) is None))
    ):
        raise QueryRefused(
            f"{shown(value)} in the subquery {name}",
            f"a per-unit aggregate reads {wanted} of the policy as it is, never a private "
            "column or a computed value (the subquery reads the tables as stored)",
            "aggregate a declared column, and compute with the result in the outer query",
        )
    return spec


def shown(node: exp.Expression, length: int = 60) -> str:
    """`node` as the analyst wrote it: names unquoted (the subquery's are quoted by now)."""
    plain = node.copy()
    for identifier in plain.find_all(exp.Identifier):
        identifier.set("quoted", False)
    return plain.sql()[:length]


def _cast(value: exp.Expression, kind: str) -> exp.Expression:
    """One type per column on every backend (PostgreSQL sums BIGINT as NUMERIC)."""
    return exp.Cast(this=value, to=(_BIGINT if kind == "int" else _DOUBLE).copy())


def _typed(bound: float, kind: str) -> float | int:
    return int(bound) if kind == "int" else float(bound)


def _bounded_rows(select: exp.Select, inner: Table, dialect: str, seed: int) -> exp.Expression:
    """The relation's rows with a unit, passing the subquery's WHERE, each ranked within
    its unit by a keyed hash of the columns it reads."""
    unit = exp.column(inner.column(inner.privacy_unit).name, quoted=True)
    read = sorted({c.name.lower() for c in select.find_all(exp.Column)} - {unit.name.lower()})
    values = [unit, *[exp.column(inner.column(c).name, quoted=True) for c in read]]
    rank = exp.Window(
        this=exp.RowNumber(),
        partition_by=[unit.copy()],
        order=exp.Order(expressions=[exp.Ordered(this=keyed_hash(dialect, seed, values))]),
    )
    owned = exp.Not(this=exp.Is(this=unit.copy(), expression=exp.Null()))
    source = inner.relation.copy().subquery(_SOURCE)
    rows = exp.select(exp.Star(), exp.alias_(rank, _RANK)).from_(source).where(owned)
    where = select.args.get("where")
    if where is not None:
        rows = rows.where(where.this.copy())
    return rows.subquery(_BOUNDED)
