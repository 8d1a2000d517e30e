"""Names in a query resolved against the policy: which tables it reads, and every column
qualified by its table (sqlglot's qualify over the policy's declared columns)."""

from __future__ import annotations

from sqlglot import exp
from sqlglot.errors import OptimizeError, SqlglotError
from sqlglot.optimizer.qualify import qualify
from sqlglot.schema import MappingSchema

from dpsql.errors import QueryRefused
from dpsql.lru import WeightedLru
from dpsql.policy import Policy, Table
from dpsql.sql.check import policy_table, table_list
from dpsql.sql.resolve import output_name

# sqlglot's type names for the policy's types: the schema qualify() resolves columns by
SCHEMA_TYPES = {
    "int": "BIGINT", "float": "DOUBLE", "string": "TEXT", "bool": "BOOLEAN",
    "date": "DATE", "timestamp": "TIMESTAMP",
}  # fmt: skip


def tables_read(select: exp.Select, policy: Policy) -> dict[str, Table]:
    """The policy tables a query reads (by their policy key), refusing any other source:
    a table outside the policy, a table function, a file."""
    ctes = {cte.alias_or_name.lower() for cte in select.find_all(exp.CTE)}
    found: dict[str, Table] = {}
    for node in select.find_all(exp.Table):
        if not isinstance(node.this, exp.Identifier):
            raise QueryRefused(
                "a table function in FROM",
                "dpsql only reads the tables declared in its policy",
                f"query one of: {table_list(policy)}",
            )
        name = ".".join(part.name for part in node.parts)
        if not node.args.get("db") and name.lower() in ctes:
            continue
        table = policy_table(name, policy)
        found[table.name.lower()] = table
    return found


def by_policy_names(select: exp.Select, policy: Policy) -> exp.Select:
    """`select` with each table it reads named by its policy key (`customer` written for
    the entry `main.customer`, or `main.nation` for `nation`), each keeping the name
    the query refers to it by: one name per table, so qualify() resolves it one way."""
    renamed = select.copy()
    ctes = {cte.alias_or_name.lower() for cte in renamed.find_all(exp.CTE)}
    for node in list(renamed.find_all(exp.Table)):
        written = ".".join(part.name for part in node.parts)
        table = policy.table(written) if isinstance(node.this, exp.Identifier) else None
        if table is None or (not node.args.get("db") and written.lower() in ctes):
            continue
        *path, name = table.name.split(".")
        if not node.alias and node.name.lower() != name.lower():
            node.set("alias", exp.TableAlias(this=exp.to_identifier(node.name)))
        # in place: a sample or hint the table carries stays for the checks to see
        parts = [name, *reversed(path), None, None][:3]
        for part, value in zip(("this", "db", "catalog"), parts, strict=True):
            node.set(part, exp.to_identifier(value) if value else None)
    return renamed


def schema_of(tables: dict[str, Table]) -> dict:
    """The tables' declared columns as the nested mapping sqlglot's qualify() takes."""
    schema: dict = {}
    depth = max((key.count(".") for key in tables), default=0)
    for key, table in tables.items():
        # one nesting depth for all (sqlglot's rule): a shorter name is padded with a
        # prefix no query writes, and qualify() finds it by its last parts (the query
        # names each table by its policy key: by_policy_names)
        *path, name = ["__dpsql"] * (depth - key.count(".")) + key.split(".")
        level = schema
        for part in path:
            level = level.setdefault(part, {})
        level[name] = {c.name.lower(): SCHEMA_TYPES[c.type] for c in table.columns.values()}
    return schema


# sqlglot's schema of each set of tables queries read, by its mapping's text: building
# one normalises every name in it, a tenth of a relational query's planning, repeated
# for every query over the same tables. qualify() only reads it.
_SCHEMAS = WeightedLru(256)


def _schema(tables: dict[str, Table], dialect: str) -> MappingSchema:
    mapping = schema_of(tables)
    key = (dialect, repr(mapping))
    schema = _SCHEMAS.get(key)
    if schema is None:
        schema = MappingSchema(mapping, dialect=dialect)
        _SCHEMAS.put(key, schema)
    return schema


def qualified(select: exp.Select, tables: dict[str, Table], dialect: str) -> exp.Select:
    """`select` with every column qualified by its table's alias and stars expanded to
    the declared columns (sqlglot's qualify), each select item keeping its name."""
    named = select.copy()
    for item in named.expressions:
        if not isinstance(item, exp.Alias | exp.Star) and not (
            isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
        ):
            item.replace(exp.alias_(item.copy(), output_name(item), quoted=True))
    try:
        return qualify(
            named,
            schema=_schema(tables, dialect),
            dialect=dialect,
            validate_qualify_columns=True,
            quote_identifiers=False,
            identify=False,
        )
    except (OptimizeError, SqlglotError) as exc:
        raise QueryRefused(
            "a column of the joined tables",
            f"it could not be resolved: {exc}",
            "name each column as a declared column of one of the tables, qualified by its "
            "table or alias where two tables have it",
        ) from None
