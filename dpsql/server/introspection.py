"""What clients ask a PostgreSQL server about itself, answered without reading data.

pg-mimic's middleware answers `current_setting()`, `current_user`, asyncpg's type
introspection and BEGIN/COMMIT/ROLLBACK; the links here add `version()`
(SQLAlchemy reads it on connect), multi-word SHOW (`SHOW transaction isolation
level`), savepoints, ordinary client SETs accepted and ignored, and send every
other query that names a catalog or a server function and reads no policy table
(pg_catalog, information_schema, `current_schemas(true)`, `format_type`, ...) to
the catalog (catalog.py: a PostgreSQL of dpsql's own holding empty copies of the
policy's tables). `SET dpsql.*` and `SHOW dpsql.*` pass through to the Session.
The schema is public; the data is not, and nothing here touches the database.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Any

from pg_mimic import PgError, ResultColumn, StaticStatement
from pg_mimic.middleware import (
    MiddlewareContext,
    asyncpg_typeinfo,
    session_functions,
    set_show,
    static_select,
    transaction_control,
)
from pg_mimic.results import format_code_for
from pg_mimic.session import Portal, Statement
from pg_mimic.types import TEXT
from sqlglot import exp

from dpsql import __version__
from dpsql.server.batches import advisory_unlocks
from dpsql.server.catalog import Catalog, mixed_formats
from dpsql.server.sqlstate import FEATURE_NOT_SUPPORTED, INVALID_PARAMETER_VALUE
from dpsql.server.values import parameter_count
from dpsql.session import sets_options

if TYPE_CHECKING:
    from dpsql.policy import Policy  # the Session's policy, whose tables the catalog shows

SERVER_VERSION = "15.0"
VERSION = f"PostgreSQL {SERVER_VERSION} (dpsql {__version__}, differentially private)"

# Settings a client may read with SHOW or current_setting(); dpsql is read-only.
SETTINGS = {
    "server_version": SERVER_VERSION,
    "server_version_num": "150000",
    "server_encoding": "UTF8",
    "client_encoding": "UTF8",
    "datestyle": "ISO, MDY",
    "intervalstyle": "postgres",
    "timezone": "UTC",
    "integer_datetimes": "on",
    "standard_conforming_strings": "on",
    "search_path": '"$user", public',
    "transaction_isolation": "read committed",
    "default_transaction_isolation": "read committed",
    "transaction_read_only": "on",
    "default_transaction_read_only": "on",
    "max_identifier_length": "63",
    "is_superuser": "off",
    "statement_timeout": "0",  # --query-timeout is the server's, not a session setting
    "lock_timeout": "0",
    "client_min_messages": "notice",
    "bytea_output": "hex",
    "lc_collate": "C",
    "lc_ctype": "C",
}
_SHOW_ALIASES = {"transaction_isolation_level": "transaction_isolation", "time_zone": "timezone"}

# sqlglot reads `version()` as an anonymous function, so pg-mimic's session
# functions miss it; it is replaced by its literal before evaluation.
_VERSION_CALL = re.compile(r"(?:\bpg_catalog\s*\.\s*)?\bversion\s*\(\s*\)(\s+AS\b)?", re.I)
_SAVEPOINT = re.compile(r"^\s*(SAVEPOINT|RELEASE|ROLLBACK\s+(?:WORK\s+|TRANSACTION\s+)?TO)\b", re.I)
_NO_OP = re.compile(r"^\s*(DISCARD|DEALLOCATE|RESET|UNLISTEN|LISTEN|CLOSE)\b", re.IGNORECASE)
_SET = re.compile(r"^\s*SET\b", re.IGNORECASE)
_SHOW = re.compile(r"^\s*SHOW\s+(.+?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)


async def savepoints(ctx: MiddlewareContext) -> Statement | None:
    """SAVEPOINT, RELEASE and ROLLBACK TO are no-ops: dpsql never writes. Rolling back
    to a savepoint leaves a failed transaction usable again, as in PostgreSQL."""
    match = _SAVEPOINT.match(ctx.sql)
    if match is None:
        return None
    connection = ctx.connection

    def on_execute() -> None:
        if connection.tx_status == b"E" and match.group(1).upper().startswith("ROLLBACK"):
            connection.tx_status = b"T"

    return StaticStatement(ctx.sql, None, [], on_execute)


async def no_ops(ctx: MiddlewareContext) -> Statement | None:
    """Session housekeeping that pools and drivers send (DISCARD, DEALLOCATE, RESET), but
    what resets dpsql's options (RESET ALL, RESET dpsql.*, DISCARD ALL): the Session's."""
    if _NO_OP.match(ctx.sql) and not sets_options(ctx.sql):
        return StaticStatement(ctx.sql, None, [])
    return None


def startup_settings(parameters: dict[str, str]) -> dict[str, str]:
    """The dpsql.* settings a client asked for when it connected: as startup parameters
    (asyncpg's server_settings, JDBC) or in `options` as a PostgreSQL backend reads
    them (libpq's PGOPTIONS or `options=-c dpsql.epsilon=0.1`: `-c name=value`,
    `-cname=value` or `--name=value`, a backslash escaping the next character, dashes
    in a name read as underscores). Other settings are accepted and ignored, as SET
    of them is. Ignored, a client's `options=-c dpsql.epsilon=0.01` left its queries
    charged the policy's default epsilon."""
    settings = {}
    words = _option_words(parameters.get("options", ""))
    for index, word in enumerate(words):
        if word == "-c" and index + 1 < len(words):
            setting = words[index + 1]
        elif word.startswith(("-c", "--")) and word != "-c":
            setting = word[2:]
        else:
            continue
        name, equals, value = setting.partition("=")
        name = name.replace("-", "_")
        if _is_dpsql(name):
            if not equals:
                raise PgError(
                    INVALID_PARAMETER_VALUE,
                    f"the connection option {name} has no value; write -c {name}=<value>",
                )
            settings[name] = value
    # a startup parameter wins over the same setting in `options`, as in PostgreSQL
    settings.update((name, value) for name, value in parameters.items() if _is_dpsql(name))
    return settings


def _is_dpsql(name: str) -> bool:
    return name.lower().startswith("dpsql.")


def _option_words(options: str) -> list[str]:
    """`options` split at unescaped whitespace, backslashes dropped (PostgreSQL's rule,
    hand-written: shlex would also read quotes, which PostgreSQL keeps as they are)."""
    words, word, escaped, started = [], [], False, False
    for char in options:
        if escaped:
            word.append(char)
            escaped = False
        elif char == "\\":
            escaped = started = True
        elif char.isspace():
            if started:
                words.append("".join(word))
            word, started = [], False
        else:
            word.append(char)
            started = True
    if started:
        words.append("".join(word))
    return words


_DPSQL_FUNCTION = re.compile(r"\b(set_config|current_setting)\s*\(\s*'dpsql\.", re.I)


async def dpsql_functions(ctx: MiddlewareContext) -> Statement | None:
    """set_config and current_setting of dpsql.* are refused: pg-mimic answers them from
    the connection's variables, which the Session's options are not, so a client saw
    epsilon 0.01 while its queries were charged 7."""
    if _DPSQL_FUNCTION.search(ctx.sql):
        raise PgError(
            FEATURE_NOT_SUPPORTED,
            "set_config and current_setting do not reach dpsql's options; write SET "
            "dpsql.epsilon = 0.5, SHOW dpsql.epsilon or RESET dpsql.epsilon",
        )
    return None


async def settings(ctx: MiddlewareContext) -> Statement | None:
    """SHOW <setting> (also multi-word) and SET of ordinary settings (accepted, ignored);
    `dpsql.*` options go on to the Session."""
    if sets_options(ctx.sql):
        return None
    show = _SHOW.match(ctx.sql)
    if show is not None:
        name = re.sub(r"\s+", "_", show.group(1).strip('"').lower())
        name = _SHOW_ALIASES.get(name, name)
        value = ctx.connection.session_vars.get(name, "")
        return StaticStatement(ctx.sql, [ResultColumn(name, TEXT)], [(value,)])
    if _SET.match(ctx.sql):
        return await set_show(ctx) or StaticStatement(ctx.sql, None, [])
    return None


async def server_functions(ctx: MiddlewareContext) -> Statement | None:
    """Table-less SELECTs of version() (plain or pg_catalog-qualified)."""
    if ctx.select_without_tables() is None or not _VERSION_CALL.search(ctx.sql):
        return None
    literal = "'" + VERSION.replace("'", "''") + "'"
    sql = _VERSION_CALL.sub(lambda m: literal + (m.group(1) or " AS version"), ctx.sql)
    return await static_select(MiddlewareContext(ctx.connection, sql, ctx.param_oids))


async def named_session_functions(ctx: MiddlewareContext) -> Statement | None:
    """pg-mimic's session functions (current_user, current_setting('x'), ...) with the
    column names PostgreSQL gives them: an unaliased call is named after its function
    (`current_setting`, `current_user`), where pg-mimic named it `_col_0` or after its
    value."""
    tree = ctx.select_without_tables()
    if tree is None:
        return None
    named = tree.copy()
    for item in named.expressions:
        if isinstance(item, exp.Anonymous):
            item.replace(exp.alias_(item.copy(), item.name.lower(), quoted=True))
        elif isinstance(item, exp.Func):
            item.replace(exp.alias_(item.copy(), item.sql_name().lower(), quoted=True))
        elif isinstance(item, exp.Column) and not item.table:
            item.replace(exp.alias_(item.copy(), item.name, quoted=True))
    sql = named.sql(dialect="postgres")
    return await session_functions(MiddlewareContext(ctx.connection, sql, ctx.param_oids))


_QUERY = re.compile(r"^\s*(\(\s*)*(SELECT|WITH|VALUES|TABLE)\b", re.I)
_CATALOG_SCHEMAS = {"pg_catalog", "information_schema"}
_STRING = re.compile(r"'(?:[^']|'')*'")


def reads_only_the_catalog(ctx: MiddlewareContext, policy: Policy) -> bool:
    """A query that names a catalog or a server function and reads no policy table (a
    table of pg_catalog or information_schema, or a pg_* name, or none at all). A
    statement sqlglot cannot parse (psql's `OPERATOR(pg_catalog.~)`) goes to the
    catalog when no policy table's name appears in it outside string literals: the
    catalog holds no row, so a private table read there would answer an empty copy
    (not the data, but a wrong answer); the Session refuses it instead."""
    if not _QUERY.match(ctx.sql):
        return False
    tree = ctx.expression
    if tree is None:
        words = set(re.findall(r"\w+", _STRING.sub("''", ctx.sql).lower()))
        return not any(key.rpartition(".")[2] in words for key in policy.tables)
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        schema, name = table.db.lower(), table.name.lower()
        if schema in _CATALOG_SCHEMAS or (not schema and name in ctes):
            continue
        if schema or not name.startswith("pg_") or policy.table(name) is not None:
            return False
    return True


async def catalog_queries(ctx: MiddlewareContext) -> Statement | None:
    """Catalog and server-function queries: answered by the catalog's PostgreSQL."""
    backend = ctx.connection.session.backend
    if not reads_only_the_catalog(ctx, backend.policy):
        return None
    return CatalogStatement(ctx.connection, backend.catalog, ctx.sql, ctx.param_oids)


class CatalogStatement(Statement):
    """A catalog query, run in the catalog once its parameters are bound."""

    def __init__(self, connection: Any, catalog: Catalog, sql: str, declared: list[int | None]):
        self.connection = connection
        self.catalog = catalog
        self.sql = sql
        count = parameter_count(sql) if "$" in sql else 0
        self.param_oids = [oid or TEXT for oid in declared] + [TEXT] * (count - len(declared))

    async def describe(self) -> list[ResultColumn] | None:
        return await CatalogPortal(self, [None] * len(self.param_oids)).run()

    def bind(self, params: list[Any]) -> CatalogPortal:
        return CatalogPortal(self, params)


class CatalogPortal(Portal):
    """A bound catalog query; its rows hold each value as PostgreSQL encoded it, in the
    formats the client asked for (`formats`, set from Bind before `run`)."""

    def __init__(self, statement: CatalogStatement, params: list[Any]):
        self.statement = statement
        self.params = params
        self.formats: list[int] = []
        self.rows: list[tuple] | None = None

    async def run(self) -> list[ResultColumn] | None:
        """Run the query in the catalog (free: the answer does not depend on the data)."""
        statement, connection = self.statement, self.statement.connection
        binary = bool(self.formats) and all(self.formats)
        columns, rows = await asyncio.to_thread(
            statement.catalog.query, statement.sql, self.params, connection.username,
            connection.database, binary,
        )  # fmt: skip
        if not binary and any(self.formats):
            wanted = [bool(format_code_for(self.formats, i)) for i in range(len(columns))]
            rows = mixed_formats(rows, [c.oid for c in columns], wanted)
        self.rows = rows
        return columns or None

    async def execute(self, max_rows: int) -> tuple[list[tuple], bool]:
        if self.rows is None:
            await self.run()
        rows = self.rows or []
        if max_rows and len(rows) > max_rows:
            self.rows = rows[max_rows:]
            return rows[:max_rows], True
        self.rows = []
        return rows, False


# Every link below that parses the statement answers only statements that name a
# catalog (pg_*, information_schema) or a session function (version(), current_*,
# session_user, set_config, pg_backend_pid); sqlglot reads `user` as a column.
# A statement naming none of them, as private queries do, skips those links and
# the parse they share (about 0.1 ms a statement).
_ABOUT_THE_SERVER = re.compile(
    r"information_schema|pg_|version|current_|session_user|set_config", re.I
)


def _if_named(*links: Any) -> Any:
    """The links, run in order, only for statements that `_ABOUT_THE_SERVER` matches."""

    async def about_the_server(ctx: MiddlewareContext) -> Statement | None:
        if not _ABOUT_THE_SERVER.search(ctx.sql):
            return None
        for link in links:
            statement = await link(ctx)
            if statement is not None:
                return statement
        return None

    return about_the_server


MIDDLEWARE: tuple[Any, ...] = (
    advisory_unlocks,
    savepoints,
    transaction_control,
    no_ops,
    dpsql_functions,
    settings,
    asyncpg_typeinfo,
    _if_named(server_functions, named_session_functions, catalog_queries),
)
