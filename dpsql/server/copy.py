"""`COPY (SELECT ...) TO STDOUT`: a noisy release streamed as COPY data.

psql's `\\copy (SELECT ...) TO STDOUT`, psycopg's `cursor.copy()` and asyncpg's
`copy_from_query` read a query's result this way. The query inside is
answered exactly as the same SELECT sent alone (planned, charged once, a
repeat free), and its release is sent in PostgreSQL's text, CSV or binary
COPY format (CopyOutResponse, one CopyData per row, CopyDone, `COPY n`).
Every other COPY (FROM, of a table, to a file or program) would read raw
rows or write, and is refused 42501, as dpsql refuses any query that would
release more than the policy allows.

The formats are encoded here: they are PostgreSQL's, and no library writes
them (Python's csv module cannot tell a NULL from an empty string, which
PostgreSQL's CSV does).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import sqlglot
from pg_mimic import PgError, ResultColumn
from pg_mimic.types import encode_value, encode_value_binary
from sqlglot.tokens import Token, TokenType

from dpsql.server.sqlstate import FEATURE_NOT_SUPPORTED, INSUFFICIENT_PRIVILEGE, SYNTAX_ERROR

_POSTGRES = sqlglot.Dialect.get_or_raise("postgres")
BINARY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_INSTEAD = (
    "COPY (SELECT <aggregates> FROM ...) TO STDOUT [WITH (FORMAT text | csv | binary, "
    "HEADER)], e.g. COPY (SELECT sex, COUNT(*) FROM pums GROUP BY sex) TO STDOUT WITH "
    "(FORMAT csv, HEADER)"
)
_FORMATS = {"TEXT": "text", "CSV": "csv", "BINARY": "binary"}


@dataclass(frozen=True)
class CopyOut:
    """A `COPY (query) TO STDOUT`: the query and how to write its rows."""

    query: str
    format: str = "text"
    header: bool = False
    delimiter: str | None = None  # default: a tab in text, a comma in CSV
    null: str | None = None  # default: \\N in text, an unquoted empty field in CSV


def is_copy(sql: str) -> bool:
    """Whether `sql` is a COPY statement (of any form)."""
    return sql.lstrip()[:4].upper() == "COPY"


def parse(sql: str) -> CopyOut:
    """The COPY to answer; PgError 42501 for a form dpsql refuses, 42601 for a malformed one."""
    try:
        tokens = _POSTGRES.tokenize(sql)
    except sqlglot.errors.TokenError:
        raise _malformed("it cannot be read") from None
    tokens = [t for t in tokens if t.token_type != TokenType.SEMICOLON]
    if len(tokens) < 2 or tokens[1].token_type != TokenType.L_PAREN:
        raise _refused("a COPY of a table (or COPY FROM)", "it would read or write raw rows")
    close = _closing(tokens, 1)
    if tokens[2].text.upper() not in ("SELECT", "WITH", "VALUES", "TABLE"):
        raise _malformed("COPY (...) holds a query: SELECT, WITH, VALUES or TABLE")
    query = sql[tokens[1].end + 1 : tokens[close].start]
    rest = tokens[close + 1 :]
    words = [t.text.upper() for t in rest[:2]]
    if words[:1] != ["TO"]:
        raise _refused("COPY (...) FROM", "dpsql only reads, and releases only noisy answers")
    if words[1:] != ["STDOUT"]:
        raise _refused(
            "COPY (...) TO a file or program", "the server's files are not the analyst's to write"
        )
    return _options(query, rest[2:])


def _closing(tokens: list[Token], opening: int) -> int:
    depth = 0
    for index in range(opening, len(tokens)):
        kind = tokens[index].token_type
        depth += (kind == TokenType.L_PAREN) - (kind == TokenType.R_PAREN)
        if depth == 0:
            return index
    raise _malformed("its parenthesis is not closed")


def _options(query: str, tokens: list[Token]) -> CopyOut:
    """The options after TO STDOUT: `[WITH] (name [value], ...)` or the older keywords."""
    if tokens and tokens[0].text.upper() == "WITH":
        tokens = tokens[1:]
    listed = bool(tokens) and tokens[0].token_type == TokenType.L_PAREN
    if listed:
        if tokens[-1].token_type != TokenType.R_PAREN:
            raise _malformed("its option list is not closed")
        tokens = tokens[1:-1]
    chosen: dict[str, Any] = {}
    index = 0
    while index < len(tokens):
        name = tokens[index].text.upper()
        index += 1
        value = None
        if index < len(tokens) and tokens[index].token_type != TokenType.COMMA:
            if tokens[index].text.upper() == "AS":
                index += 1
            if index < len(tokens) and (listed or name in ("DELIMITER", "NULL")):
                value = tokens[index].text
                index += 1
        if index < len(tokens) and tokens[index].token_type == TokenType.COMMA:
            index += 1
        chosen.update(_option(name, value))
    return CopyOut(query, **chosen)


def _option(name: str, value: str | None) -> dict[str, Any]:
    if name in _FORMATS and value is None:  # the older syntax: COPY ... TO STDOUT CSV
        return {"format": _FORMATS[name]}
    if name == "FORMAT" and value is not None and value.upper() in _FORMATS:
        return {"format": _FORMATS[value.upper()]}
    if name == "HEADER":
        return {"header": value is None or value.upper() in ("TRUE", "ON", "1")}
    if name in ("DELIMITER", "NULL") and value is not None:
        if name == "DELIMITER" and len(value) != 1:
            raise _malformed("the COPY delimiter must be a single one-byte character")
        return {name.lower(): value}
    raise PgError(
        FEATURE_NOT_SUPPORTED,
        f"the COPY option {name}{' ' + value if value else ''} is not supported by dpsql; "
        "use FORMAT text, csv or binary, HEADER, DELIMITER and NULL",
    )


def _refused(what: str, why: str) -> PgError:
    return PgError(INSUFFICIENT_PRIVILEGE, f"refused {what}: {why}. Instead: {_INSTEAD}")


def _malformed(why: str) -> PgError:
    return PgError(SYNTAX_ERROR, f"malformed COPY statement: {why}. Write {_INSTEAD}")


def copy_messages(copy: CopyOut, columns: list[ResultColumn], rows: list[tuple]) -> bytes:
    """CopyOutResponse, the rows as CopyData (a header first, if asked) and CopyDone."""
    binary = copy.format == "binary"
    if binary and copy.header:
        raise PgError(FEATURE_NOT_SUPPORTED, "COPY in binary format has no HEADER; drop HEADER")
    csv = copy.format == "csv"
    delimiter = copy.delimiter or ("," if csv else "\t")
    null = copy.null if copy.null is not None else ("" if csv else "\\N")
    code = 1 if binary else 0
    body = struct.pack("!bh", code, len(columns)) + struct.pack(
        f"!{len(columns)}h", *[code] * len(columns)
    )
    parts = [_message(b"H", body)]
    if binary:
        # the header shares the first row's CopyData, as PostgreSQL sends it (psycopg
        # reads a first message of the header alone as a truncated row)
        tuples = [_binary_row(row, columns) for row in rows] or [b""]
        tuples[0] = BINARY_SIGNATURE + struct.pack("!ii", 0, 0) + tuples[0]
        parts += [_message(b"d", data) for data in tuples]
        parts.append(_message(b"d", struct.pack("!h", -1)))
    else:
        line = _csv_line if csv else _text_line
        if copy.header:
            parts.append(_message(b"d", line([c.name for c in columns], delimiter, null)))
        for row in rows:
            texts = [
                None if v is None else encode_value(c.oid, v)
                for v, c in zip(row, columns, strict=True)
            ]
            parts.append(_message(b"d", line(texts, delimiter, null)))
    parts.append(_message(b"c", b""))
    return b"".join(parts)


def _message(tag: bytes, body: bytes) -> bytes:
    return tag + struct.pack("!i", len(body) + 4) + body


def _text_line(values: list[str | None], delimiter: str, null: str) -> bytes:
    """A row in PostgreSQL's text format: NULL as its marker, backslash escapes."""
    fields = [null if v is None else _escaped(v, delimiter) for v in values]
    return (delimiter.join(fields) + "\n").encode()


def _escaped(text: str, delimiter: str) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return text.replace("\t", "\\t").replace(delimiter, "\\" + delimiter)


def _csv_line(values: list[str | None], delimiter: str, null: str) -> bytes:
    """A row in PostgreSQL's CSV: NULL unquoted, a value quoted when it needs to be (one
    that reads as the NULL marker too, so an empty string is "")."""
    fields = []
    for value in values:
        if value is None:
            fields.append(null)
        elif value == null or any(c in value for c in (delimiter, '"', "\n", "\r")):
            fields.append('"' + value.replace('"', '""') + '"')
        else:
            fields.append(value)
    return (delimiter.join(fields) + "\n").encode()


def _binary_row(row: tuple, columns: list[ResultColumn]) -> bytes:
    parts = [struct.pack("!h", len(columns))]
    for value, column in zip(row, columns, strict=True):
        if value is None:
            parts.append(struct.pack("!i", -1))
        else:
            data = encode_value_binary(column.oid, value)
            parts.append(struct.pack("!i", len(data)) + data)
    return b"".join(parts)


__all__ = ["CopyOut", "copy_messages", "is_copy", "parse"]
