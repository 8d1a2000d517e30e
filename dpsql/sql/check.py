"""The allowed SQL subset: refuse every construct dpsql cannot prove safe.

This pass is structural: it looks at node types, the FROM clause and the
statement kind, and raises QueryRefused (construct, reason, what to write
instead) for anything outside the subset. It is an allow-list: a node type
that is not named here is refused, so a new sqlglot construct is refused
until someone decides it is safe. Column-level rules (private columns,
bounds, raw rows) belong to `analyze`.
"""

from __future__ import annotations

import functools
import math

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.policy import Policy, Table
from dpsql.sql.dispersion import DISPERSION

AGGREGATES: tuple[type[exp.Expression], ...] = (exp.Count, exp.Sum, exp.Avg, *DISPERSION)
# Order statistics, let through here and planned (or refused) by sql/quantiles.py.
ORDER_STATISTICS: tuple[type[exp.Expression], ...] = (
    exp.Min, exp.Max, exp.Median, exp.PercentileCont, exp.PercentileDisc, exp.WithinGroup,
)  # fmt: skip

# Scalar functions allowed in WHERE, GROUP BY, inside aggregates and in
# post-processing: deterministic, side-effect free, no access outside the row.
SCALAR_FUNCTIONS: tuple[type[exp.Expression], ...] = (
    exp.Abs, exp.Ceil, exp.Floor, exp.Round, exp.Sign, exp.Sqrt, exp.Ln, exp.Log, exp.Exp,
    exp.Pow, exp.Coalesce, exp.Nullif, exp.Greatest, exp.Least, exp.If, exp.Case, exp.Cast,
    exp.TryCast, exp.Lower, exp.Upper, exp.Length, exp.Substring, exp.Trim, exp.Concat,
    exp.DPipe, exp.DateTrunc, exp.TimestampTrunc, exp.Extract, exp.Year, exp.Month,
    exp.Day, exp.Quarter, exp.DayOfWeek, exp.DayOfYear, exp.StartsWith,
)  # fmt: skip

# Structure and operators allowed anywhere in a query.
STRUCTURE: tuple[type[exp.Expression], ...] = (
    exp.Select, exp.From, exp.Table, exp.TableAlias, exp.Identifier, exp.Column, exp.Alias,
    exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered, exp.Limit, exp.Offset,
    exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Neg, exp.Not, exp.And, exp.Or,
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
    exp.Is, exp.In, exp.Between, exp.Like, exp.ILike, exp.Escape, exp.Add, exp.Sub,
    exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.DataType, exp.DataTypeParam, exp.Var,
    exp.Interval, exp.Tuple, exp.Distinct, exp.Star,
)  # fmt: skip

# What a statement without a table may call: clients send these to check a connection.
CONNECTION_CHECKS: tuple[type[exp.Expression], ...] = (
    exp.CurrentVersion, exp.CurrentDatabase, exp.CurrentSchema, exp.CurrentUser,
)  # fmt: skip

_SELECT_ARGS = {"expressions", "from_", "where", "group", "having", "order", "limit", "offset"}

_OTHER_STATEMENTS: list[tuple[tuple[type[exp.Expression], ...], str, str]] = [
    ((exp.SetOperation,), "a set operation (UNION/INTERSECT/EXCEPT)",
     "run each SELECT separately"),
    ((exp.Insert, exp.Update, exp.Delete, exp.Merge), "a statement that changes data",
     "dpsql is read-only; change data with the database's own tools"),
    ((exp.Create, exp.Drop, exp.Alter, exp.TruncateTable), "a DDL statement",
     "dpsql is read-only; manage the schema with the database's own tools"),
    ((exp.Copy, exp.Attach, exp.Detach, exp.Pragma, exp.Install, exp.Use, exp.Describe),
     "a statement that reaches outside the query",
     "send an aggregate SELECT over a table of the policy"),
    ((exp.Set,), "SET of a setting that is not dpsql's",
     "only SET dpsql.epsilon / dpsql.mechanism are allowed"),
]  # fmt: skip


def over_the_release(window: exp.Window) -> bool:
    """A window over the release: COUNT/SUM/AVG of released aggregates with no ORDER BY
    or frame, e.g. SUM(COUNT(*)) OVER () for shares of a total, or OVER (PARTITION BY
    sex) for shares within each sex.

    It reads released values only, so it is post-processing (the analysis refuses a
    PARTITION BY on anything but the group keys); any other window is either a
    running total (sql/running.py) or refused.
    """
    function = window.this
    argument = function.this if isinstance(function, AGGREGATES) else None
    return (
        isinstance(argument, exp.Expression)
        and argument.find(*AGGREGATES) is not None
        and not any(window.args.get(key) for key in ("order", "spec", "alias"))
    )


def refuse_statement(tree: exp.Expression | None) -> QueryRefused:
    """The refusal for a statement that is not a SELECT (DDL, DML, COPY, PRAGMA, ...)."""
    for classes, construct, hint in _OTHER_STATEMENTS:
        if isinstance(tree, classes):
            return QueryRefused(construct, "dpsql only answers aggregate SELECT queries", hint)
    text = tree.sql()[:60] if tree is not None else ""
    keyword = text.split(" ", 1)[0].upper() or "this statement"
    return QueryRefused(
        f"the statement {keyword}",
        "dpsql only answers aggregate SELECT queries",
        "write SELECT <aggregates> FROM <table> [WHERE ...] [GROUP BY ...]",
    )


def check_query(select: exp.Select, policy: Policy) -> Table | None:
    """Refuse constructs outside the subset; return the queried table (None: no table)."""
    check_clauses(select)
    source = select.args.get("from_")
    if source is None:
        _check_nodes(select, CONNECTION_CHECKS)
        _check_constant_casts(select)
        return None
    _check_nodes(select, ())
    return _resolve_table(source.this, policy)


# What a statement without a table may cast to: a cast to a catalog type (regclass,
# regnamespace, ...) reads the database's catalog, beyond the policy's tables (found by
# an audit: CAST('schema.table' AS regclass) told whether a table exists, and its oid).
_CONSTANT_CAST_TYPES = (
    *exp.DataType.TEXT_TYPES, *exp.DataType.NUMERIC_TYPES, *exp.DataType.TEMPORAL_TYPES,
    exp.DataType.Type.BOOLEAN, exp.DataType.Type.INTERVAL,
)  # fmt: skip


def _check_constant_casts(select: exp.Select) -> None:
    for target in select.find_all(exp.DataType):
        if not target.is_type(*_CONSTANT_CAST_TYPES):
            raise QueryRefused(
                f"a cast to {target.sql()}",
                "it can read the database's catalog, which is not in the policy",
                "cast constants to text, numbers, truth values, dates, times or intervals",
            )


def check_clauses(select: exp.Select) -> None:
    """Refuse a clause outside SELECT, FROM, WHERE, GROUP BY, HAVING, ORDER BY, LIMIT."""
    for key, value in select.args.items():
        if value and key not in _SELECT_ARGS:
            raise _refuse_select_arg(key)


def _refuse_select_arg(key: str) -> QueryRefused:
    if key == "joins":
        return QueryRefused(
            "a join",
            "dpsql answers queries over one table for now",
            "query each table separately, or ask the data owner for a joined table in the policy",
        )
    if key == "with_":
        return QueryRefused(
            "a common table expression (WITH)",
            "dpsql does not analyse CTEs yet",
            "write the aggregate directly over the table",
        )
    if key == "distinct":
        return QueryRefused(
            "SELECT DISTINCT with an aggregate, a GROUP BY or *",
            "dpsql answers DISTINCT only as the keys of public domains (SELECT DISTINCT educ "
            "FROM t); the distinct values of anything else are raw data",
            "drop DISTINCT (the groups of a GROUP BY are distinct already), or write "
            "SELECT col, COUNT(*) FROM t GROUP BY col to get noisy counts per value",
        )
    return QueryRefused(
        f"the clause {key.rstrip('_').upper()}",
        "it is outside the SQL subset dpsql can protect",
        "use only SELECT, FROM, WHERE, GROUP BY, HAVING, ORDER BY and LIMIT",
    )


# Node kinds a rule below looks into (a subquery, a window, *, a number); every other
# kind is allowed or refused by its type alone, which _allowed_kind caches.
_INSPECTED = (exp.Select, exp.Subquery, exp.Exists, exp.Window, exp.Star, exp.Literal)


@functools.cache
def _allowed_kind(kind: type, extra: tuple[type[exp.Expression], ...]) -> bool:
    """Whether every node of this (uninspected) kind passes _check_nodes."""
    if issubclass(kind, _INSPECTED):
        return False
    if not extra and issubclass(kind, AGGREGATES + ORDER_STATISTICS):
        return True
    return issubclass(kind, SCALAR_FUNCTIONS + STRUCTURE + extra)


def _check_nodes(select: exp.Select, extra: tuple[type[exp.Expression], ...]) -> None:
    for node in select.walk():
        if _allowed_kind(type(node), extra):
            continue  # one look-up for most nodes: the checks below cost ~5% of planning
        if node is not select and isinstance(node, exp.Select | exp.Subquery | exp.Exists):
            raise QueryRefused(
                "a subquery",
                "dpsql cannot bound the sensitivity of nested queries yet",
                "write one aggregate query over one table",
            )
        if isinstance(node, exp.Array) and isinstance(
            node.parent, exp.PercentileCont | exp.PercentileDisc
        ):
            continue  # a list of quantiles at once: its elements are checked as numbers
        if isinstance(node, exp.Window) and over_the_release(node):
            continue  # its function and argument are checked as the walk goes on
        if isinstance(node, exp.Window):
            raise QueryRefused(
                "a window function",
                "window functions can expose individual rows",
                "use GROUP BY with COUNT/SUM/AVG instead",
            )
        if isinstance(node, exp.Star) and not isinstance(node.parent, exp.Count):
            raise QueryRefused(
                "SELECT *",
                "it returns raw rows",
                "select aggregates, e.g. SELECT COUNT(*) FROM t, or GROUP BY a column",
            )
        if isinstance(node, exp.Literal) and node.is_number and not _finite(node.this):
            raise _refuse_number(node.this)
        if not extra and isinstance(node, AGGREGATES + ORDER_STATISTICS):
            continue
        if isinstance(node, SCALAR_FUNCTIONS + STRUCTURE + extra):
            continue
        raise _refuse_node(node)


def _finite(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:  # e.g. hexadecimal; the database reads it, it is not huge
        return True


def _refuse_number(text: str) -> QueryRefused:
    if text.lower().lstrip("+-") in ("nan", "inf", "infinity"):  # a bound float or Decimal
        return QueryRefused(
            f"the number {text}",
            "NaN and infinity have no spelling as an SQL number (the database would read "
            "the word as a column name)",
            "pass a finite number; for a missing value write IS NULL",
        )
    return QueryRefused(
        f"the number {text[:40]}",
        "it is beyond double precision, so the database would fail on it "
        "(PostgreSQL does) or read it as infinity",
        "write a number below 1.7e308 in magnitude",
    )


def _refuse_node(node: exp.Expression) -> QueryRefused:
    name = (node.sql_name() if isinstance(node, exp.Func) else type(node).__name__).upper()
    if isinstance(node, exp.Min | exp.Max | exp.Quantile | exp.PercentileCont |
                  exp.PercentileDisc | exp.Median | exp.ApproxQuantile):  # fmt: skip
        return QueryRefused(
            f"the aggregate {name}",
            "MIN, MAX and percentiles are not supported yet",
            "use COUNT(*) with a range predicate, e.g. COUNT(*) ... WHERE age >= 90",
        )
    if isinstance(node, exp.AggFunc):
        return QueryRefused(
            f"the aggregate {name}",
            "dpsql releases COUNT, SUM, AVG, variances, standard deviations and quantiles only",
            "rewrite it with COUNT(*), COUNT(col), COUNT(DISTINCT col), SUM(col), AVG(col), "
            "VAR_POP(col), STDDEV(col), MEDIAN(col) or quantile_cont(col, p)",
        )
    if isinstance(node, exp.Func):
        if isinstance(node, exp.Anonymous):
            name = str(node.this).upper()
        return QueryRefused(
            f"the function {name}",
            "it is not on dpsql's allow-list of deterministic functions",
            "use arithmetic, CASE, COALESCE, FLOOR/CEIL/ROUND, LOWER/UPPER, DATE_TRUNC or EXTRACT",
        )
    snippet = node.sql()[:40]
    return QueryRefused(
        f"the construct {type(node).__name__} ({snippet})",
        "it is outside the SQL subset dpsql can protect",
        "use plain comparisons, arithmetic, CASE and the aggregates COUNT, SUM, AVG",
    )


def _resolve_table(source: exp.Expression, policy: Policy) -> Table:
    if not isinstance(source, exp.Table) or not isinstance(source.this, exp.Identifier):
        raise QueryRefused(
            "a table function or derived table in FROM",
            "dpsql only reads the tables declared in its policy",
            f"query one of: {table_list(policy)}",
        )
    if source.args.get("sample") or source.args.get("joins") or source.args.get("laterals"):
        raise QueryRefused(
            "TABLESAMPLE or a lateral join",
            "it is outside the subset dpsql can protect",
            "query the whole table; dpsql's noise already protects individuals",
        )
    return policy_table(".".join(part.name for part in source.parts), policy)


def policy_table(name: str, policy: Policy) -> Table:
    """The policy's table called `name`, or the refusal of a name outside the policy."""
    table = policy.table(name)
    if table is None:
        raise QueryRefused(
            f"the table {name}",
            "it is not in the privacy policy (system catalogs and files are never readable)",
            f"query one of: {table_list(policy)}",
        )
    return table


def table_list(policy: Policy) -> str:
    return ", ".join(sorted(table.name for table in policy.tables.values()))
