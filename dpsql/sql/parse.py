"""Parse one statement with sqlglot and classify it; bind DB-API parameters as literals.

The result is a `Statement`: a query to protect, an EXPLAIN of one, a dpsql
option (`SET dpsql.x = v`, `SHOW dpsql.x`), or anything else (left for the
checker to refuse). Parameters are bound by replacing placeholder nodes with
sqlglot literal nodes, so a value can never change the statement's structure.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import json
import logging
import math
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from dpsql.errors import InterfaceError, QueryRefused

# sqlglot logs a warning for every statement it falls back to parsing as a
# Command (EXPLAIN, SHOW, LOAD, ...); those are classified here, not errors.
logging.getLogger("sqlglot").setLevel(logging.ERROR)

MAX_SQL_LENGTH = 1_000_000


@dataclass(frozen=True)
class Statement:
    """One classified statement: kind is 'query', 'explain', 'set', 'show' or 'other'."""

    kind: str
    tree: exp.Expression | None = None
    name: str = ""
    value: Any = None
    # The statement as the release cache knows it: its tokens with the case of
    # keywords and unquoted names folded (whitespace and comments dropped) and
    # the values bound to its placeholders, in order.
    key: str = ""


@functools.cache  # the adapters' few dialect names; an instance is only read
def sqlglot_dialect(name: str) -> sqlglot.Dialect:
    """sqlglot's dialect of this name, built once (get_or_raise builds a new one each call)."""
    return sqlglot.Dialect.get_or_raise(name)


# Each thread's tokenizer and parser per dialect: building them cost 8 and 3 us a
# statement (tokenizing itself 10 us), and each resets its state when it starts, but
# holds it while it runs, so threads (the server's workers) do not share them.
_THREAD = threading.local()


def _tools(dialect: str) -> tuple[Any, Any]:
    tools = getattr(_THREAD, "tools", None)
    if tools is None:
        tools = _THREAD.tools = {}
    pair = tools.get(dialect)
    if pair is None:
        backend = sqlglot_dialect(dialect)
        pair = tools[dialect] = (backend.tokenizer(), backend.parser())
    return pair


def tokenize(sql: str, dialect: str) -> list:
    """The tokens of `sql`, refusing a text that is not a string, too long, or unreadable."""
    if not isinstance(sql, str):
        raise InterfaceError(f"the statement must be a string, got {type(sql).__name__}")
    if len(sql) > MAX_SQL_LENGTH:
        raise QueryRefused(
            "an oversized statement",
            f"it is {len(sql):,} characters long, over the limit of {MAX_SQL_LENGTH:,}",
            "send a shorter query; pass long value lists as parameters",
        )
    _require_storable(sql, "the statement")
    try:
        return _tools(dialect)[0].tokenize(sql)
    except TokenError as exc:
        raise QueryRefused(
            "malformed SQL", f"it could not be read: {exc}", "check the quoting"
        ) from None


def _require_storable(text: str, what: str) -> None:
    """Refuse text that a database cannot hold: PostgreSQL refuses a NUL character in any
    text, and a lone surrogate has no UTF-8 encoding. Either would fail only once sent,
    after the charge (as a raw UnicodeEncodeError from psycopg)."""
    if "\x00" in text:
        raise QueryRefused(
            f"{what} with a NUL character",
            "databases cannot hold NUL (0x00) in text, so it would fail after the charge",
            "remove the NUL characters",
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise QueryRefused(
                f"{what} with the lone surrogate {text[exc.start]!r}",
                "it is not a character: the text has no UTF-8 encoding to send",
                "decode the text correctly (a surrogate pair belongs together)",
            ) from None


def repeat_key(tokens: list) -> str:
    """The key a query of these tokens, bound to no parameters, has in the release cache.

    It is read off the tokens alone, so a repeat can be found in the cache
    before (and instead of) parsing: only a statement that parsed as one query
    without placeholders was ever stored under it, and the same tokens parse
    the same way. Any other statement gets a key nothing was stored under.
    """
    while tokens and tokens[-1].token_type == TokenType.SEMICOLON:
        tokens = tokens[:-1]  # a statement's terminator, which the parser ignores too
    parts = [
        (token.token_type.name,
         token.text if token.token_type in _EXACT_TOKENS else token.text.lower())
        for token in tokens
    ]  # fmt: skip
    return "tokens:" + json.dumps(parts)


def parse_statement(
    sql: str,
    dialect: str,
    parameters: Sequence[Any] | Mapping[str, Any] | None = None,
    *,
    tokens: list | None = None,
    key: str | None = None,
) -> Statement:
    """Parse `sql` (exactly one statement) and bind `parameters` into it.

    `tokens` are `tokenize(sql, dialect)` and `key` their `repeat_key` when the caller
    has them already.
    """
    if tokens is None:
        tokens = tokenize(sql, dialect)
    keyword = tokens[0].text.upper() if tokens else ""
    if keyword == "EXPLAIN":
        inner = parse_statement(sql[tokens[0].end + 1 :], dialect, parameters)
        if inner.kind != "query":
            raise QueryRefused(
                "EXPLAIN of a statement that is not a SELECT",
                "dpsql only explains the aggregate queries it would answer",
                "write EXPLAIN SELECT ... FROM <table> ...",
            )
        return Statement("explain", inner.tree)
    if keyword == "SHOW":
        _, name, rest = setting_name(sql)
        return Statement("show", name=f"{name} {rest}".strip())
    if keyword in ("RESET", "DISCARD"):
        # RESET dpsql.<option>, RESET ALL, or DISCARD ALL (as connection pools send)
        _, name, rest = setting_name(sql)
        if not rest and (keyword == "RESET" or name == "all"):
            return Statement("reset", name=name)
    try:
        tree = _parse_one(sql, tokens, dialect)
        if len(tokens) > sys.getrecursionlimit() and _depth(tree) > sys.getrecursionlimit():
            raise RecursionError  # found now, not seconds later inside a recursive pass
        bound = _bind(tree, parameters)
    except RecursionError:
        raise nested_too_deeply() from None
    if isinstance(tree, exp.Set):
        return _set_statement(tree, setting_name(sql)[1])
    if isinstance(tree, exp.Select):
        return Statement("query", tree, key=_key(tree, tokens, bound, dialect, key))
    return Statement("other", tree)


def _depth(tree: exp.Expression) -> int:
    """How many levels `tree` nests, found without recursion. A walk that recurses (the
    analysis's, sqlglot's) needs a frame per level at least, so a tree deeper than the
    recursion limit would fail in one; and a chain of 50,000 ANDs took 10 s to fail
    there. Only a statement of more tokens than that limit can be so deep."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in node.iter_expressions())
    return deepest


def nested_too_deeply() -> QueryRefused:
    """The refusal of a statement whose expressions nest beyond what the parser and the
    analysis (recursive, like sqlglot) can walk: a few hundred levels."""
    return QueryRefused(
        "a statement nested too deeply",
        "dpsql reads and checks expressions recursively, and this one nests beyond "
        "Python's recursion limit (a few hundred levels)",
        "flatten it: fewer parentheses, IN (...) or BETWEEN instead of chains, or several queries",
    )


def _key(
    tree: exp.Expression, tokens: list, bound: list[Any], dialect: str, repeat: str | None
) -> str:
    """The release cache's name for a statement.

    Without parameters it is read off the tokens (`repeat_key`), which costs
    far less than generating SQL from the tree: only differences the parser
    ignores are folded (whitespace, comments, a final semicolon, the case of
    keywords and unquoted names; quoted names and strings are kept as
    written), so two texts with one key parse to the same query. Texts that
    sqlglot would print alike but are spelled differently (`x::INT` and
    `CAST(x AS INT)`) get different keys: the second is charged and answered
    afresh, which costs budget, never privacy. With parameters it is the bound
    tree printed normalised, so `?`, `$1` and `:name` binding the same values
    share one release.
    """
    if bound:
        return "bound:" + tree.sql(dialect=dialect, normalize=True)
    return repeat if repeat is not None else repeat_key(tokens)


# Tokens whose case is part of their meaning.
_EXACT_TOKENS = frozenset(
    {TokenType.IDENTIFIER, TokenType.STRING, TokenType.NATIONAL_STRING, TokenType.RAW_STRING,
     TokenType.NATIONAL_RAW_STRING,
     TokenType.BIT_STRING, TokenType.HEX_STRING, TokenType.BYTE_STRING, TokenType.HEREDOC_STRING,
     TokenType.UNICODE_STRING}
)  # fmt: skip


def _parse_one(sql: str, tokens: list, dialect: str) -> exp.Expression:
    try:
        parser = _tools(dialect)[1]
        trees = [tree for tree in parser.parse(tokens, sql) if tree is not None]
    except (ParseError, TokenError) as exc:
        message = str(exc).splitlines()[0]
        raise QueryRefused(
            "malformed SQL",
            f"it could not be parsed ({message})",
            "check the statement's syntax; dpsql accepts DuckDB/PostgreSQL SELECT syntax",
        ) from None
    if not trees:
        raise QueryRefused("an empty statement", "there is nothing to run", "write a SELECT query")
    if len(trees) > 1:
        raise QueryRefused(
            "several statements in one string",
            f"it holds {len(trees)} statements and dpsql runs exactly one at a time",
            "send each statement in its own execute() call",
        )
    return _without_positions(trees[0])


_POSITIONS = frozenset(("line", "col", "start", "end"))


def _without_positions(tree: exp.Expression) -> exp.Expression:
    """`tree` without the token positions sqlglot's parser notes on many nodes, and
    without empty comment lists: nothing here reads them, and every copy of the tree
    (each plan makes several) copied each such dict and list through copy.deepcopy."""
    for node in tree.walk():
        # `_meta` is sqlglot's own slot (the `meta` property would create an empty dict,
        # which copies cost as much); sqlglot is pinned below 31 in pyproject.toml
        meta = node._meta
        if meta is not None and meta.keys() <= _POSITIONS:
            node._meta = None
        if node.comments is not None and not node.comments:
            node.comments = None
    return tree


def _set_statement(tree: exp.Set, name: str) -> Statement:
    items = tree.expressions
    item = items[0].this if len(items) == 1 and isinstance(items[0], exp.SetItem) else None
    if not isinstance(item, exp.EQ):
        return Statement("other", tree)
    if items[0].args.get("kind") == "LOCAL":
        raise QueryRefused(
            f"SET LOCAL {item.this.sql()}",
            "dpsql settings last for the connection, so a SET LOCAL would outlive its transaction",
            f"write SET {item.this.sql()} = ..., then RESET {item.this.sql()} when done",
        )
    value = item.expression
    if isinstance(value, exp.Literal):
        parsed: Any = value.this if value.is_string else float(value.this)
    elif isinstance(value, exp.Column | exp.Identifier | exp.Var):
        parsed = value.name
    elif isinstance(value, exp.Neg) and isinstance(value.this, exp.Literal):
        parsed = -float(value.this.this)
    else:
        parsed = value.sql()
    return Statement("set", tree, name=name, value=parsed)


# SET/SHOW/RESET/DISCARD, then a setting's name (words, quoted or not, joined by dots)
_SETTING = re.compile(
    r'\s*(SET|SHOW|RESET|DISCARD)(?:\s+|(?="))(?:(?:SESSION|LOCAL)\s+)?'
    r'((?:"[^"]*"|[\w$]+)(?:\s*\.\s*(?:"[^"]*"|[\w$]+))*)(.*)',
    re.IGNORECASE | re.DOTALL,
)
# PostgreSQL's block comments nest: the innermost first, until none is left
_INNERMOST_COMMENT = re.compile(r"/\*(?:(?!/\*|\*/).)*\*/", re.DOTALL)
_LINE_COMMENT = re.compile(r"--[^\n]*")


def _without_comments(sql: str) -> str:
    text, previous = _LINE_COMMENT.sub(" ", sql), None
    while text != previous:
        text, previous = _INNERMOST_COMMENT.sub(" ", text), text
    return text


def setting_name(sql: str) -> tuple[str, str, str]:
    """(keyword, name, rest) of a SET, SHOW, RESET or DISCARD statement, the name as
    PostgreSQL reads it: without comments or quotes, in lower case, `a . b` as a.b
    (`SET /* x */ "dpsql"."epsilon" = 1` sets dpsql.epsilon). ("", "", "") for
    another statement; `rest` is what follows the name, without a closing semicolon.

    The one reading of these names, for the Session and for the server (which must
    pass on every statement of a dpsql option, however written: one it took for an
    ordinary setting and ignored left the client charged what it had not asked for)."""
    match = _SETTING.fullmatch(_without_comments(sql).strip().removesuffix(";"))
    if match is None:
        return "", "", ""
    keyword, name, rest = match.groups()
    name = re.sub(r"\s+", "", name.replace('"', "")).lower()
    return keyword.upper(), name, rest.strip()


def _plain(value: Any) -> Any:
    """A number parameter as the plain int, float or Decimal it stands for.

    Its text becomes the literal's: a subclass's own __str__ could have written SQL
    into the statement, and a non-finite Decimal ('sNaN') read as a column name.
    """
    if isinstance(value, bool):
        return value  # not an int here, and bool cannot be subclassed
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, decimal.Decimal):
        value = decimal.Decimal(value)
        if not value.is_finite():  # NaN and sNaN, or an infinity: refused as a number
            return math.nan if value.is_nan() else float(value)
    return value


def literal(value: Any) -> exp.Expression:
    """A sqlglot literal for a Python value (the only way parameters enter a query)."""
    value = _plain(value)
    if isinstance(value, float) and not math.isfinite(value):
        # sqlglot converts NaN to NULL; as a number the gate refuses it, saying why
        return exp.Literal.number(repr(value))
    if isinstance(value, str):
        _require_storable(value, "a text parameter")
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        # dpsql's time zone is UTC (the wire server reports TimeZone UTC, and Spark's
        # results are read as UTC wall clock): an aware time becomes that wall clock
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    if value is None or isinstance(value, bool | int | float | str):
        return exp.convert(value)
    if isinstance(value, decimal.Decimal):
        return exp.Literal.number(str(value))
    if isinstance(value, dt.datetime):
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), "TIMESTAMP")
    if isinstance(value, dt.date):
        return exp.cast(exp.Literal.string(value.isoformat()), "DATE")
    raise InterfaceError(
        f"cannot bind a parameter of type {type(value).__name__}; pass None, bool, int, "
        "float, Decimal, str, date or datetime"
    )


def bind_parameters(
    tree: exp.Expression, parameters: Sequence[Any] | Mapping[str, Any] | None
) -> exp.Expression:
    """Replace `?`, `$1` and `:name` placeholders by literals; refuse leftovers."""
    _bind(tree, parameters)
    return tree


def _bind(tree: exp.Expression, parameters: Sequence[Any] | Mapping[str, Any] | None) -> list[Any]:
    """Bind `parameters` into `tree` in place; return the values bound, in placeholder order."""
    # `$1` is a Placeholder in DuckDB's dialect and a Parameter in PostgreSQL's
    # find_all filters by type in sqlglot's compiled code; the walk's order (breadth first)
    placeholders = [
        node for node in tree.find_all(exp.Parameter, exp.Placeholder) if _is_placeholder(node)
    ]
    if not placeholders:
        if parameters:
            raise InterfaceError(
                f"{len(parameters)} parameters were given but the statement has no placeholders"
            )
        return []
    if parameters is None:
        raise InterfaceError(
            f"the statement has {len(placeholders)} placeholders but no parameters were given"
        )
    positional, used, bound = 0, 0, []
    for node in placeholders:
        key = node.this.name if isinstance(node, exp.Parameter) else node.this
        if key is None:
            value, positional = _positional(parameters, positional), positional + 1
            used = max(used, positional)
        elif str(key).isdigit():
            value = _positional(parameters, int(key) - 1)
            used = max(used, int(key))
        else:
            if not isinstance(parameters, Mapping) or key not in parameters:
                raise InterfaceError(f"no value for the named parameter :{key}")
            value = parameters[key]
        node.replace(literal(value))
        bound.append(value)
    if not isinstance(parameters, Mapping) and len(parameters) > used:
        # as psycopg does: a value no placeholder takes is a mistake, not ignored
        raise InterfaceError(
            f"{len(parameters)} parameters were given but the statement takes {used}; "
            "pass one value per placeholder"
        )
    return bound


def _is_placeholder(node: exp.Expression) -> bool:
    if isinstance(node, exp.Parameter):
        return isinstance(node.this, exp.Literal) and node.this.name.isdigit()
    return isinstance(node, exp.Placeholder)


def _positional(parameters: Sequence[Any] | Mapping[str, Any], index: int) -> Any:
    if isinstance(parameters, Mapping | str | bytes):
        raise InterfaceError("positional placeholders need a sequence of parameters")
    if not 0 <= index < len(parameters):
        raise InterfaceError(
            f"the statement needs parameter {index + 1} but only {len(parameters)} were given"
        )
    return parameters[index]


__all__ = [
    "Statement",
    "bind_parameters",
    "literal",
    "nested_too_deeply",
    "parse_statement",
    "repeat_key",
    "tokenize",
]
