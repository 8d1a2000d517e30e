"""The interactive prompt of `dpsql shell`, on prompt_toolkit.

History in ~/.dpsql/history, statements over several lines until a ';',
syntax highlighting with pygments' PostgreSQL lexer, completion of tables,
columns and keywords, and a toolbar with the remaining budget. Running
what was typed is the engine's job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.history import FileHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.lexers import PygmentsLexer
from pygments.lexers.sql import PostgresLexer

from dpsql.shell.connection import TableInfo
from dpsql.shell.engine import (
    META_COMMANDS,
    SETTINGS,
    Piece,
    Quit,
    Shell,
    split_script,
    statement_complete,
)

KEYWORDS = (
    "SELECT", "FROM", "WHERE", "GROUP BY", "ORDER BY", "HAVING", "LIMIT", "AS", "AND", "OR",
    "NOT", "IN", "BETWEEN", "IS NULL", "IS NOT NULL", "DISTINCT", "CASE", "WHEN", "THEN", "ELSE",
    "END", "ASC", "DESC", "LIKE", "EXPLAIN", "SET", "SHOW",
)  # fmt: skip
FUNCTIONS = ("COUNT", "SUM", "AVG")
OPTIONS = (*(f"dpsql.{name}" for name in SETTINGS), "dpsql.budget")
_TOKEN = re.compile(r"[\\\w.]*$")
_META_TOKEN = re.compile(r"[\\\w.-]*$")  # a value of \set may hold a '-' (norm-sub)
_TABLE_CONTEXT = re.compile(r"\b(from|join)\s+[\w.]*$", re.IGNORECASE)
# where a private column is accepted: COUNT(DISTINCT unit), a join condition
_PRIVATE_CONTEXT = re.compile(
    r"(count\s*\(\s*distinct\s+|\bon\b(?:(?!\b(?:where|group|select)\b).)*?)[\w.]*$",
    re.IGNORECASE | re.DOTALL,
)
_PRIVATE_NOTES = ("private", "privacy unit")


def history_path() -> Path:
    path = Path.home() / ".dpsql" / "history"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


class ShellCompleter(Completer):
    """Completes meta-commands, settings, tables, columns, functions and keywords."""

    def __init__(self, schema: list[TableInfo]):
        self.tables = {info.name: [column.name for column in info.columns] for info in schema}
        # private columns are refused everywhere but COUNT(DISTINCT unit) and join
        # conditions on units and references: offered only there
        self.private = {
            (info.name, column.name) for info in schema for column in info.columns
            if column.note.startswith(_PRIVATE_NOTES)
        }  # fmt: skip

    def get_completions(self, document: Document, event: CompleteEvent) -> Iterable[Completion]:
        before = document.text_before_cursor
        in_meta = document.current_line_before_cursor.lstrip().startswith("\\")
        token = _META_TOKEN if in_meta else _TOKEN
        word = token.search(before).group()  # type: ignore[union-attr]  # always matches
        if not word and not event.completion_requested:
            return  # not on every space; Tab asks for all
        for text, meta in self._candidates(document.current_line_before_cursor, before, word):
            if text.lower().startswith(word.lower()) and text != word:
                yield Completion(_case_like(text, word), -len(word), display_meta=meta)

    def _candidates(self, line: str, before: str, word: str) -> Iterable[tuple[str, str]]:
        stripped = line.lstrip()
        if stripped.startswith("\\"):
            yield from self._meta_candidates(stripped)
            return
        if "." in word:
            prefix = word.rsplit(".", 1)[0]
            if prefix.lower() == "dpsql":
                yield from ((option, "setting") for option in OPTIONS)
            for table, columns in self.tables.items():
                if table.lower() == prefix.lower():
                    yield from ((f"{prefix}.{column}", f"column of {table}")
                                for column in self._offered(table, columns, before))  # fmt: skip
            return
        tables = [(table, "table") for table in self.tables]
        if _TABLE_CONTEXT.search(before):
            yield from tables
            return
        for table, columns in self.tables.items():
            yield from ((column, f"column of {table}")
                        for column in self._offered(table, columns, before))  # fmt: skip
        yield from tables
        yield from ((name, "aggregate") for name in FUNCTIONS)
        yield from ((keyword, "keyword") for keyword in KEYWORDS)

    def _offered(self, table: str, columns: list[str], before: str) -> Iterable[str]:
        """The columns worth offering at the cursor: private ones only where accepted."""
        where_private = _PRIVATE_CONTEXT.search(before) is not None
        return (c for c in columns if where_private or (table, c) not in self.private)

    def _meta_candidates(self, line: str) -> Iterable[tuple[str, str]]:
        parts = line.split()
        if len(parts) <= 1 and not line.endswith(" "):
            yield from ((command.split()[0], text) for command, text in META_COMMANDS.items()
                        if command.count(" ") <= 1)  # fmt: skip
        elif parts[0] == "\\set" and (len(parts) == 1 or (len(parts) == 2 and not
                                                            line.endswith(" "))):  # fmt: skip
            yield from ((name, "setting") for name in SETTINGS)
        elif parts[0] == "\\set" and parts[1].lower() in SETTINGS:
            yield from ((value, parts[1].lower()) for value in SETTINGS[parts[1].lower()].choices)


def _case_like(text: str, typed: str) -> str:
    """Keywords follow the case the analyst typed; names keep theirs."""
    if text.isupper() and typed and typed == typed.lower():
        return text.lower()
    return text


def repl(shell: Shell) -> int:
    """Read, run and print until \\q or Ctrl-D; always exits 0."""
    session: PromptSession[str] = PromptSession(
        history=FileHistory(str(history_path())),
        lexer=PygmentsLexer(PostgresLexer),
        completer=ShellCompleter(shell.connection.schema()),
        complete_while_typing=True,
        multiline=True,
        key_bindings=_bindings(),
        prompt_continuation=lambda width, line, wrap: "...> ".rjust(width),
        bottom_toolbar=lambda: _toolbar(shell),
    )
    shell.out.print(
        f"[bold]dpsql shell[/] on {shell.connection.where}. Statements end with ';'. "
        "\\help for help, \\q to quit.",
        highlight=False,
    )
    while True:
        try:
            text = session.prompt("dpsql> ")
        except KeyboardInterrupt:
            continue  # Ctrl-C drops what was typed, as in psql
        except EOFError:
            return 0
        try:
            for piece in _pieces(text):
                shell.run(piece)
        except Quit:
            return 0
        except KeyboardInterrupt:
            shell.err.print("cancelled (a query already charged stays charged)")


def _pieces(text: str) -> Iterable[Piece]:
    # A meta-command typed at the prompt takes all of the input, even over several lines.
    stripped = text.strip()
    if stripped.startswith("\\"):
        return [Piece("meta", stripped, 1)]
    return split_script(text)


def _bindings() -> KeyBindings:
    bindings = KeyBindings()

    @bindings.add("enter")
    def _enter(event: KeyPressEvent) -> None:
        buffer = event.current_buffer
        if statement_complete(buffer.text) and buffer.document.is_cursor_at_the_end:
            buffer.validate_and_handle()
        else:
            buffer.insert_text("\n")

    @bindings.add("escape", "enter")
    def _run_now(event: KeyPressEvent) -> None:
        event.current_buffer.validate_and_handle()

    return bindings


def _toolbar(shell: Shell) -> str:
    parts = [shell.connection.where]
    if "epsilon" in shell.settings:
        parts.append(f"epsilon per query {shell.settings['epsilon']}")
    if shell.budget is not None:
        budget = shell.budget
        parts.append(
            f"{budget.analyst}: epsilon {budget.epsilon_remaining:.4g} of "
            f"{budget.epsilon_total:.4g} left"
        )
    return " " + " · ".join(parts) + " "
