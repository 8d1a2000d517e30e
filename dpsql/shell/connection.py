"""What the shell is connected to: a Session in this process, or a running `dpsql serve`.

Both sides of the one small interface the rest of the shell uses
(`ShellConnection`): run a statement and get a `Release` (columns, rows,
accuracy, notes), read the budget, describe the schema. Failures come back
as `StatementFailed` with the message to show, whichever side produced them.

Over the wire, accuracy arrives in a NoticeResponse whose message is
`dpsql accuracy` and whose detail is JSON {column: {"mechanism", "scale",
"interval95", "sensitivity", "note", "intervals"}} (intervals: one [low, high]
per row, where they differ per row); the budget comes from `SHOW dpsql.budget`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dpsql.errors import BudgetExhausted, Error, OperationalError
from dpsql.results import Accuracy, Release
from dpsql.session import Budget, Session

if TYPE_CHECKING:  # the Session's policy, described to the analyst
    from dpsql.policy import Column, Policy
    from dpsql.policy import Table as PolicyTable

ACCURACY_NOTICE = "dpsql accuracy"


class StatementFailed(Exception):
    """A statement was refused or failed; the message says what, why and what to write."""


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    type: str
    bounds: str = ""
    keys: str = ""
    note: str = ""


@dataclass(frozen=True)
class TableInfo:
    name: str
    summary: str
    columns: tuple[ColumnInfo, ...]


class ShellConnection(Protocol):
    """The shell's view of a connection, in process or over the wire."""

    where: str  # what the prompt and the banner call it

    def execute(self, sql: str) -> Release: ...

    def budget(self) -> Budget: ...

    def schema(self) -> list[TableInfo]: ...

    def close(self) -> None: ...


class LocalConnection:
    """A Session in this process (`connection`: the Session, or a DB-API connection over
    one), closed with the shell."""

    def __init__(self, connection: Any, where: str, *, reset: str | None = None):
        self._connection = connection
        self._session = connection if isinstance(connection, Session) else connection.session
        self.where = where
        self._reset = reset  # how to start the budget afresh, where the analyst may

    def execute(self, sql: str) -> Release:
        try:
            release = self._session.execute(sql)
        except BudgetExhausted as exc:  # said in the shell's words
            message = exc.advice("\\set epsilon <smaller value>", self._reset)
            raise StatementFailed(f"{type(exc).__name__}: {message}") from None
        except Error as exc:
            raise StatementFailed(f"{type(exc).__name__}: {exc}") from None
        rows = list(release.rows) if release.columns else []
        return Release(list(release.columns), rows, dict(release.accuracy), list(release.notes))

    def budget(self) -> Budget:
        return self._session.budget()

    def schema(self) -> list[TableInfo]:
        return policy_schema(self._session.policy)

    def close(self) -> None:
        self._connection.close()


class WireConnection:
    """A psycopg 3 connection to a `dpsql serve` (or any PostgreSQL-speaking dpsql)."""

    def __init__(self, url: str, ask_password: Callable[[], str] | None = None):
        """Connect to `url`; when the server wants a password that neither the URL nor
        PGPASSWORD gives, `ask_password()` is asked for one (once)."""
        import psycopg

        self._psycopg = psycopg
        try:
            try:
                self._connection = psycopg.connect(url, autocommit=True)
            except psycopg.OperationalError as exc:
                if ask_password is None or "no password supplied" not in str(exc):
                    raise
                self._connection = psycopg.connect(url, autocommit=True, password=ask_password())
        except psycopg.Error as exc:
            raise OperationalError(
                f"cannot connect to the dpsql server: {_first_line(str(exc))}. Check that "
                "`dpsql serve` runs there and that user and password are right"
            ) from None
        info = self._connection.info
        self.where = f"{info.user}@{info.host}:{info.port}/{info.dbname}"
        # (message, detail) of each notice; a Diagnostic must be read inside the handler,
        # as its result is freed when the handler returns
        self._notices: list[tuple[str, str]] = []
        self._connection.add_notice_handler(
            lambda d: self._notices.append((d.message_primary or "", d.message_detail or ""))
        )

    def execute(self, sql: str) -> Release:
        self._notices.clear()
        try:
            with self._connection.cursor() as cursor:
                cursor.execute(sql)
                columns = [column.name for column in cursor.description or []]
                rows = [tuple(row) for row in cursor.fetchall()] if columns else []
        except self._psycopg.Error as exc:
            raise StatementFailed(_wire_message(exc)) from None
        accuracy: dict[str, Accuracy] = {}
        notes = []
        for message, detail in self._notices:
            if message == ACCURACY_NOTICE:
                accuracy.update(parse_accuracy(detail))
            else:
                notes.append(message)
        return Release(columns, rows, accuracy, notes)

    def budget(self) -> Budget:
        result = self.execute("SHOW dpsql.budget")
        values = dict(zip(result.columns, result.rows[0], strict=True))
        return Budget(
            str(values.pop("analyst")), **{key: float(value) for key, value in values.items()}
        )

    def schema(self) -> list[TableInfo]:
        """Table and column names from information_schema; the bounds stay with the server."""
        try:
            result = self.execute(
                "SELECT table_schema, table_name, column_name, data_type "
                "FROM information_schema.columns "
                "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') "
                "ORDER BY table_schema, table_name, ordinal_position"
            )
        except StatementFailed:
            return []
        tables: dict[str, list[ColumnInfo]] = {}
        for schema, table, column, kind in result.rows:
            name = table if schema in ("public", "main", None) else f"{schema}.{table}"
            tables.setdefault(name, []).append(ColumnInfo(column, kind))
        summary = "bounds and key domains are kept by the server's policy"
        return [TableInfo(name, summary, tuple(columns)) for name, columns in tables.items()]

    def close(self) -> None:
        self._connection.close()


def parse_accuracy(detail: str) -> dict[str, Accuracy]:
    """The accuracy JSON of a `dpsql accuracy` notice, as Accuracy per column."""
    try:
        data = json.loads(detail)
        return {
            str(column): Accuracy(
                str(item["mechanism"]),
                float(item["scale"]),
                None if item.get("interval95") is None else float(item["interval95"]),
                float(item["sensitivity"]),
                str(item.get("note") or ""),
                None if item.get("intervals") is None else item["intervals"],
            )
            for column, item in data.items()
        }
    except (ValueError, TypeError, KeyError, AttributeError):
        # The answer itself is still right; only its accuracy cannot be shown.
        return {}


def _wire_message(exc: Any) -> str:
    diagnostic = exc.diag
    message = diagnostic.message_primary or _first_line(str(exc))
    parts = [message]
    if diagnostic.message_detail:
        parts.append(diagnostic.message_detail)
    if diagnostic.message_hint:
        parts.append(f"Hint: {diagnostic.message_hint}")
    state = f" (SQLSTATE {diagnostic.sqlstate})" if diagnostic.sqlstate else ""
    return " ".join(parts) + state


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown error"


def policy_schema(policy: Policy) -> list[TableInfo]:
    """The policy's tables and columns with their bounds and key domains, in words."""
    return [
        TableInfo(name, _table_summary(table), tuple(_column_info(table, c) for c in
                                                     table.columns.values()))
        for name, table in policy.tables.items()
    ]  # fmt: skip


def _table_summary(table: PolicyTable) -> str:
    if table.public:
        return "public: no person's data, answered exactly and free (joins too)"
    if table.via is not None:
        via = table.via
        unit = f"privacy unit through {via.column} -> {via.table}.{via.target}"
    elif table.privacy_unit:
        unit = f"privacy unit {table.privacy_unit}"
    else:
        return "row-level privacy: each row is its own unit"
    return (
        f"{unit}: at most {table.max_groups_per_unit} group(s) "
        f"and {table.max_rows_per_unit} row(s) per group for each unit"
    )


def _column_info(table: PolicyTable, column: Column) -> ColumnInfo:
    if table.public:
        return ColumnInfo(column.name, column.type, note="public table: read freely")
    if column.private:
        note = (
            f"privacy unit: only in COUNT(DISTINCT {column.name})"
            if column.name == table.privacy_unit
            else "private: never selected, grouped or filtered on"
        )
        return ColumnInfo(column.name, column.type, note=note)
    bounds = f"[{column.lower}, {column.upper}]" if column.bounded else ""
    domain = column.public_domain
    if domain is None:
        keys = "from the data (partition selection)"
    elif column.values is None:
        keys = f"public: {column.lower} .. {column.upper}"
    else:
        keys = "public: " + ", ".join(map(str, domain[:12])) + (" ..." if len(domain) > 12 else "")
    note = "" if column.bounded or column.type not in ("int", "float") else "no bounds: no SUM/AVG"
    return ColumnInfo(column.name, column.type, bounds, keys, note)
