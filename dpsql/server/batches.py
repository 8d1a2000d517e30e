"""Simple-query batches: several statements in one Query message, answered in order.

Pools and drivers send housekeeping in one message: asyncpg's Pool sends
`SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL;` when a
connection is released. `split` cuts such a string at its semicolons as
written, using sqlglot's PostgreSQL tokenizer, so semicolons in strings,
quoted names, dollar quotes and comments are left alone and each statement
keeps its text (pg-mimic's splitter parsed the whole batch, so one statement
sqlglot cannot parse, `UNLISTEN *`, made the batch one unparseable statement).
Each statement is then answered on its own, as PostgreSQL answers it, with
PostgreSQL's command tag (`command_tag`), and the first error ends the batch.

A batch that mixes charged queries with other statements is answered in
order: each query is charged when it runs, as if sent alone, and a charge
stands when a later statement of the batch fails (PostgreSQL would roll the
batch's implicit transaction back, but a release already sent cannot be
taken back).

`advisory_unlocks` answers `pg_advisory_unlock_all()`: dpsql takes no
advisory locks, so there is none to release, and PostgreSQL's answer (one
row holding a void) is exact.
"""

from __future__ import annotations

import re

import sqlglot
from pg_mimic import ResultColumn, StaticStatement
from pg_mimic.connection import command_tag as mimic_command_tag
from pg_mimic.middleware import MiddlewareContext
from pg_mimic.session import Statement
from sqlglot.tokens import TokenType

VOID = 2278  # PostgreSQL's type oid of void, what pg_advisory_unlock_all() returns

_POSTGRES = sqlglot.Dialect.get_or_raise("postgres")
_UNLOCK_ALL = re.compile(
    r"\s*SELECT\s+(?:pg_catalog\s*\.\s*)?pg_advisory_unlock_all\s*\(\s*\)\s*;?\s*", re.I
)
_WORDS = re.compile(r"[A-Za-z_]+|\*")
# PostgreSQL's tags where they are not the statement's first word.
_TAGS = {
    ("DISCARD", "ALL"): "DISCARD ALL",
    ("DISCARD", "PLANS"): "DISCARD PLANS",
    ("DISCARD", "SEQUENCES"): "DISCARD SEQUENCES",
    ("DISCARD", "TEMP"): "DISCARD TEMP",
    ("DISCARD", "TEMPORARY"): "DISCARD TEMP",
    ("CLOSE", "ALL"): "CLOSE CURSOR ALL",
    ("DEALLOCATE", "ALL"): "DEALLOCATE ALL",
    ("DEALLOCATE", "PREPARE", "ALL"): "DEALLOCATE ALL",
    ("START", "TRANSACTION"): "START TRANSACTION",
    ("ABORT",): "ROLLBACK",
    ("END",): "COMMIT",
}
_FIRST_WORD_TAGS = {"CLOSE": "CLOSE CURSOR"}
_SPECIAL = {words[0] for words in _TAGS} | set(_FIRST_WORD_TAGS)
_LEADING_COMMENTS = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*", re.S)
_FIRST_WORD = re.compile(r"[A-Za-z_]+")


def split(sql: str) -> list[str]:
    """The statements of a simple-query string, as written, without empty ones; the whole
    string when it cannot be tokenized (an unterminated quote: the Session says why)."""
    try:
        tokens = _POSTGRES.tokenize(sql)
    except sqlglot.errors.TokenError:
        return [sql]
    statements, start = [], 0
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            statements.append(sql[start : token.start])
            start = token.end + 1
    statements.append(sql[start:])
    return [statement for statement in statements if statement.strip()]


def command_tag(sql: str, rows: int) -> str:
    """PostgreSQL's CommandComplete tag for a statement that returned `rows` rows."""
    text = _LEADING_COMMENTS.sub("", sql)
    first = _FIRST_WORD.match(text)
    if first is None or first.group(0).upper() not in _SPECIAL:
        return mimic_command_tag(text, rows)
    words = tuple(word.upper() for word in _WORDS.findall(text, first.start())[:3])
    for length in (3, 2, 1):
        tag = _TAGS.get(words[:length])
        if tag is not None:
            return tag
    return _FIRST_WORD_TAGS.get(words[0], words[0])


async def advisory_unlocks(ctx: MiddlewareContext) -> Statement | None:
    """`SELECT pg_advisory_unlock_all()`: one row, one void column, as PostgreSQL."""
    if _UNLOCK_ALL.fullmatch(ctx.sql) is None:
        return None
    return StaticStatement(ctx.sql, [ResultColumn("pg_advisory_unlock_all", VOID)], [("",)])


__all__ = ["advisory_unlocks", "command_tag", "split"]
