"""Runs what the analyst types: SQL statements and backslash meta-commands.

One engine serves the interactive prompt, `-c` and scripts. Text is cut into
statements at semicolons outside quotes and comments (as sqlglot's tokenizer
sees them); a line that starts with a backslash, between statements, is a
meta-command. Each statement's answer is printed as a table with the 95%
interval beside every noisy value, then what it cost and what remains.

`\\set NAME VALUE` is `SET dpsql.NAME = VALUE` for every option in SETTINGS
(the options a Session sets); the Session (or the server) checks the value.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import sqlglot
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlglot.errors import TokenError
from sqlglot.tokens import Token, TokenType

from dpsql.results import Release
from dpsql.session import CHOICES, Budget
from dpsql.shell import render
from dpsql.shell.connection import ShellConnection, StatementFailed, TableInfo


@dataclass(frozen=True)
class Setting:
    """An option `\\set` changes (as SET dpsql.<name>): a number, or a name among `choices`."""

    example: str  # the value \help shows
    help: str
    choices: tuple[str, ...] = ()  # the names it takes (completion, messages); none: a number
    noun: str = ""  # what a name value is, in messages


SETTINGS = {
    "epsilon": Setting("0.5", "privacy cost of each next query (smaller: cheaper and noisier)"),
    "delta": Setting("1e-6", "delta of each next query (used when group keys come from the data)"),
    "mechanism": Setting(
        "laplace", "noise mechanism of the next queries", CHOICES["mechanism"], noun="a mechanism"
    ),
    "continual": Setting(
        "factorization",
        "mechanism of the next running totals (policy: each column's own)",
        CHOICES["continual"],
        noun="a continual mechanism",
    ),
    "ldp_postprocess": Setting(
        "norm-sub",
        "post-processing of the estimates from local-DP report tables",
        CHOICES["ldp_postprocess"],
        noun="a post-processing method",
    ),
}
META_COMMANDS = {
    r"\budget": "total, spent and remaining privacy budget",
    r"\policy": "tables and columns you may query: bounds, key domains, privacy unit",
    r"\explain QUERY": "the plan and the cost of QUERY, without running or charging it",
    r"\set": f"show the settings of the next queries ({', '.join(SETTINGS)})",
    **{f"\\set {name} {setting.example}": setting.help for name, setting in SETTINGS.items()},
    r"\help": "this help",
    r"\q": "quit (also Ctrl-D)",
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")  # quoted as it is: no quote, no space


class Quit(Exception):
    """The analyst asked to leave (\\q)."""


@dataclass(frozen=True)
class Piece:
    """A statement or a meta-command, and the line of the input it starts on."""

    kind: str  # "sql" or "meta"
    text: str
    line: int


def _tokens(text: str) -> list[Token] | None:
    """The SQL tokens of `text` (comments dropped); None while a quote or comment is open."""
    try:
        return sqlglot.tokenize(text, dialect="postgres")
    except TokenError:
        return None


def _ends(tokens: list[Token]) -> list[int]:
    """Offsets of the semicolons that end statements."""
    return [token.start for token in tokens if token.token_type == TokenType.SEMICOLON]


def statement_complete(text: str) -> bool:
    """Whether Enter should run `text`: a meta-command, or SQL ending with a semicolon."""
    stripped = text.strip()
    if not stripped or stripped.startswith("\\") or stripped.lower() in ("exit", "quit"):
        return True
    return stripped.endswith(";") and _tokens(stripped) is not None


def split_script(text: str) -> Iterator[Piece]:
    """The statements and meta-commands of a script, in order."""
    pending: list[str] = []
    start = 1
    for number, line in enumerate(text.splitlines(), start=1):
        if not _has_sql(pending):
            if line.lstrip().startswith("\\"):
                pending = []
                yield Piece("meta", line.strip(), number)
                continue
            pending, start = [], number
        pending.append(line)
        joined = "\n".join(pending)
        tokens = _tokens(joined)
        ends = _ends(tokens) if tokens else []
        if not ends:
            continue
        offset = 0
        for end in ends:
            yield from _statement(joined[offset:end], start + joined.count("\n", 0, offset))
            offset = end + 1
        start += joined.count("\n", 0, offset)
        rest = joined[offset:]
        pending = [rest] if rest.strip() else []
    if pending:
        yield from _statement("\n".join(pending), start)


def _has_sql(lines: list[str]) -> bool:
    """Whether `lines` hold the start of a statement (not only blanks and comments)."""
    return bool(lines) and _tokens("\n".join(lines)) != []


def _statement(text: str, line: int) -> Iterator[Piece]:
    if _tokens(text) == []:
        return  # only comments or blanks
    skipped = len(text) - len(text.lstrip())
    yield Piece("sql", text.strip(), line + text.count("\n", 0, skipped))


class Shell:
    """Runs pieces against one connection and prints their answers."""

    def __init__(
        self, connection: ShellConnection, out: Console, err: Console, csv: IO[str] | None = None
    ):
        self.connection = connection
        self.out = out
        self.err = err
        self.csv = csv  # CSV goes here; tables, notes and costs then go to `err`
        self.budget: Budget | None = None
        self.settings: dict[str, str] = {}

    def start(self) -> None:
        """Read the budget and the settings, for the first cost line and the toolbar."""
        self.budget = self._fresh_budget()
        self.refresh_settings()

    # -- running --------------------------------------------------------------

    def run(self, piece: Piece, where: str = "") -> bool:
        """Run one piece, print its answer or its error; False when it failed."""
        try:
            if piece.kind == "meta":
                self.meta(piece.text)
            else:
                self.statement(piece.text)
            return True
        except StatementFailed as exc:
            self._error(where, str(exc))
        except Quit:
            raise
        except Exception as exc:  # a shell shows every failure as a message, never a traceback
            self._error(where, f"internal error ({type(exc).__name__}: {exc}); this is a bug in "
                        "dpsql, please report it with the statement that caused it")  # fmt: skip
        return False

    def run_text(self, text: str, keep_going: bool = False, source: str = "") -> bool:
        """Run a script; stop at the first failure unless `keep_going`. True if all ran.

        `source` names where the text came from in error messages ("command 2, ").
        """
        ok = True
        for piece in split_script(text):
            if not self.run(piece, f"{source}line {piece.line}"):
                ok = False
                if not keep_going:
                    break
        return ok

    def statement(self, sql: str) -> None:
        if sql.strip().lower().rstrip(";") in ("exit", "quit"):
            raise Quit
        result = self.connection.execute(sql)
        self.show(result)
        if not result.columns:
            self.refresh_settings()  # a SET may have changed them
        before, self.budget = self.budget, self._fresh_budget()
        if self.budget is not None and (result.accuracy or _charged(before, self.budget)):
            self._info(render.cost_line(before, self.budget))

    def show(self, result: Release) -> None:
        if result.columns:
            if self.csv is not None:
                render.write_csv(self.csv, result.columns, result.rows, result.accuracy)
            else:
                self.out.print(render.result_table(result.columns, result.rows, result.accuracy))
        for note in [*result.notes, *render.accuracy_notes(result.accuracy)]:
            self._info(f"note: {note}")

    # -- meta-commands --------------------------------------------------------

    def meta(self, line: str) -> None:
        command, _, argument = line.strip().partition(" ")
        argument = argument.strip()
        handlers = {
            "\\q": self._quit, "\\quit": self._quit, "\\help": self._help, "\\?": self._help,
            "\\budget": self._budget, "\\policy": self._policy, "\\explain": self._explain,
            "\\set": self._set,
        }  # fmt: skip
        handler = handlers.get(command.lower())
        if handler is None:
            raise StatementFailed(f"unknown command {command}; \\help lists the commands")
        handler(argument)

    def _quit(self, argument: str) -> None:
        raise Quit

    def _help(self, argument: str) -> None:
        table = Table(title="dpsql shell", show_header=False, box=None)
        table.add_column(style="bold")
        table.add_column()
        for command, text in META_COMMANDS.items():
            table.add_row(command, text)
        self._print(table)
        self._info(
            "SQL: end each statement with ';' (Enter inside a statement starts a new line). "
            "Aggregates only: COUNT, SUM, AVG with WHERE and GROUP BY; each noisy value "
            "shows '± half-width' of its 95% interval. Tab completes tables, columns and "
            "keywords. SET dpsql.epsilon = 0.5, SHOW dpsql.budget and EXPLAIN work as SQL too."
        )

    def _budget(self, argument: str) -> None:
        self.budget = self.connection.budget()
        self._print(render.budget_table(self.budget))

    def _policy(self, argument: str) -> None:
        for info in self.connection.schema():
            self._print(_schema_table(info))
        self._info(self._settings_line())

    def _explain(self, argument: str) -> None:
        query = argument.rstrip().rstrip(";")
        if not query:
            raise StatementFailed(r"\explain needs a query, e.g. \explain SELECT COUNT(*) FROM t")
        self.show(self.connection.execute(f"EXPLAIN {query}"))

    def _set(self, argument: str) -> None:
        name, _, value = argument.replace("=", " ").partition(" ")
        name, value = name.lower(), value.strip()
        if not name:
            self._info(self._settings_line())
            return
        setting = SETTINGS.get(name)
        if setting is None:
            raise StatementFailed(
                f"\\set {argument}: give one of {', '.join(SETTINGS)} and a value, e.g. "
                "\\set epsilon 0.5 or \\set mechanism laplace"
            )
        if not value:
            raise StatementFailed(
                f"\\set {name} needs a value, e.g. \\set {name} {setting.example}"
            )
        self.connection.execute(f"SET dpsql.{name} = {_literal(name, setting, value)}")
        self.refresh_settings()
        self._info(self._settings_line())

    # -- state ----------------------------------------------------------------

    def refresh_settings(self) -> None:
        for name in SETTINGS:
            try:
                result = self.connection.execute(f"SHOW dpsql.{name}")
                self.settings[name] = render.format_value(result.rows[0][0])
            except (StatementFailed, IndexError):
                self.settings.pop(name, None)

    def _settings_line(self) -> str:
        shown = ", ".join(f"{name} {self.settings[name]}" for name in SETTINGS if name in
                          self.settings)  # fmt: skip
        return f"next queries: {shown or 'settings unavailable'} (change with \\set NAME VALUE)"

    def _fresh_budget(self) -> Budget | None:
        try:
            return self.connection.budget()
        except (StatementFailed, IndexError, ValueError, TypeError):
            return None  # a server without SHOW dpsql.budget: answers still show

    # -- output ---------------------------------------------------------------

    def _print(self, renderable: object) -> None:
        (self.err if self.csv is not None else self.out).print(renderable)

    def _info(self, text: str) -> None:
        console = self.err if self.csv is not None else self.out
        console.print(f"[dim]{escape(text)}[/]", highlight=False, soft_wrap=_unwrapped(console))

    def _error(self, where: str, message: str) -> None:
        prefix = f"error ({where})" if where else "error"
        self.err.print(
            f"[bold red]{prefix}:[/] {escape(message)}",
            highlight=False,
            soft_wrap=_unwrapped(self.err),
        )


def _unwrapped(console: Console) -> bool:
    """Long messages wrap at word boundaries on a terminal (rich wraps to its width);
    into a pipe or a file they stay one line each, for grep and for logs."""
    return not console.is_terminal


def _charged(before: Budget | None, after: Budget) -> bool:
    return before is not None and (
        after.epsilon_spent > before.epsilon_spent or after.delta_spent > before.delta_spent
    )


def _literal(name: str, setting: Setting, value: str) -> str:
    """The SQL literal for a \\set value, refusing anything that is not a plain value.

    Only the form is checked here; whether the name or number is allowed is the
    Session's (or the server's) to say, as for SET dpsql.<name>."""
    example = f"e.g. \\set {name} {setting.example}"
    if setting.choices:
        if not _NAME.fullmatch(value):
            raise StatementFailed(
                f"\\set {name} {value}: {setting.noun} is a name "
                f"({', '.join(setting.choices)}), {example}"
            )
        return f"'{value}'"
    try:
        return repr(float(value))
    except ValueError:
        raise StatementFailed(f"\\set {name} {value}: {name} is a number, {example}") from None


def _schema_table(info: TableInfo) -> Table:
    table = Table(title=info.name, caption=info.summary, header_style="bold", title_justify="left")
    for column in ("column", "type", "bounds", "group keys", "note"):
        table.add_column(column)
    for column in info.columns:
        table.add_row(column.name, column.type, column.bounds, column.keys, column.note)
    return table
