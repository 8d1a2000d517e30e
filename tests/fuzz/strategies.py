"""Hypothesis strategies that write SQL text over the DuckDB and PostgreSQL surface.

Statements are built from a small grammar: nested expressions over the PUMS
policy's columns (private `pid` included, plus unknown, qualified, quoted and
Unicode names), literals at the edges (huge, tiny, negative, NaN and infinity
spelled as strings), every function name sqlglot knows (enumerated from the
`sqlglot.exp.Func` subclasses), casts to every type sqlglot names, CASE,
subqueries in every position, window clauses, placeholders, comments; and
statements around them (joins, CTEs, set operations, DDL/DML, several
statements in one string). Most statements are near the accepted subset so
that the rewrite is exercised too; the rest are hostile or malformed.
"""

from __future__ import annotations

from hypothesis import strategies as st
from sqlglot import exp

TABLES = ["pums", "pums_pid", "pums_dup", "pums_null"]
PUBLIC_COLUMNS = ["age", "sex", "educ", "race", "income", "married"]
# "n" and "x" are also select aliases the generator writes: a name that is both
OTHER_NAMES = ["pid", "nonexistent", '"AGE"', '"Income"', '"ünï"', "pums.age", "t.income", "x.sex",
               "n", "x"]  # fmt: skip


def _func_names() -> list[str]:
    found: set[str] = set()
    stack = [exp.Func]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        try:
            names = cls.sql_names()
        except NotImplementedError:  # abstract classes (Func itself, AggFunc, ...)
            continue
        found.update(name for name in names if name.isidentifier())
    return sorted(found)


FUNCTIONS = _func_names()
ALLOWED_FUNCTIONS = [
    "ABS", "CEIL", "FLOOR", "ROUND", "SIGN", "SQRT", "LN", "LOG", "EXP", "POWER",
    "COALESCE", "NULLIF", "GREATEST", "LEAST", "LOWER", "UPPER", "LENGTH",
]  # fmt: skip
TYPES = sorted(t.value for t in exp.DataType.Type if t.value.replace("_", "").isalnum())
AGGREGATES = ["COUNT", "SUM", "AVG", "MIN", "MAX", "MEDIAN", "STDDEV", "STRING_AGG", "LIST"]

literals = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["0", "1", "40", "100", "500000", "123456", "1e9", "1e308", "1e400",
                     "1e-320", "0.5", "-1", "9223372036854775807", "-9223372036854775808"]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["'NaN'", "'Infinity'", "'-inf'", "'abc'", "''", "'o''brien'", "NULL",
                     "TRUE", "FALSE", "DATE '2020-01-01'", "INTERVAL '1 day'", "'\\x00'",
                     "CAST('nan' AS DOUBLE)"]),
)  # fmt: skip

columns = st.one_of(
    st.sampled_from(PUBLIC_COLUMNS),
    st.sampled_from(PUBLIC_COLUMNS).map(lambda c: f'"{c}"'),
    st.sampled_from(OTHER_NAMES),
)


def _binary(parts: tuple[str, str, str]) -> str:
    left, op, right = parts
    return f"({left} {op} {right})"


OPERATORS = ["+", "-", "*", "/", "%", "//", "=", "<>", "<", ">=", "AND", "OR", "||", "LIKE",
             "IS DISTINCT FROM", "^", "&", "<<"]  # fmt: skip


def expressions(depth_leaves: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[str]:
    """Row expressions: nested arithmetic, functions, casts, CASE, subqueries, windows."""
    leaves = depth_leaves or st.one_of(
        columns, columns, literals, literals, st.sampled_from(["?", "$1", ":name"])
    )

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        args = st.lists(inner, min_size=0, max_size=3).map(", ".join)
        return st.one_of(
            st.tuples(inner, st.sampled_from(OPERATORS), inner).map(_binary),
            inner.map(lambda e: f"-{e}"),
            inner.map(lambda e: f"NOT {e}"),
            st.tuples(st.sampled_from(ALLOWED_FUNCTIONS), args).map(lambda p: f"{p[0]}({p[1]})"),
            st.tuples(st.sampled_from(FUNCTIONS), args).map(lambda p: f"{p[0]}({p[1]})"),
            st.tuples(inner, st.sampled_from(TYPES)).map(lambda p: f"CAST({p[0]} AS {p[1]})"),
            st.tuples(
                inner,
                st.sampled_from(
                    [
                        "TEXT",
                        "BIGINT",
                        "DOUBLE",
                        "TINYINT",
                        "INTEGER",
                        "DECIMAL(3, 1)",
                        "UTINYINT",
                        "DATE",
                        "BOOLEAN",
                    ]
                ),
            ).map(lambda p: f"{p[0]}::{p[1]}"),
            st.tuples(inner, inner, inner).map(
                lambda p: f"CASE WHEN {p[0]} THEN {p[1]} ELSE {p[2]} END"
            ),
            st.tuples(inner, inner, inner).map(lambda p: f"{p[0]} BETWEEN {p[1]} AND {p[2]}"),
            st.tuples(inner, st.lists(literals, min_size=1, max_size=3).map(", ".join)).map(
                lambda p: f"{p[0]} IN ({p[1]})"
            ),
            st.tuples(inner, st.sampled_from(TABLES)).map(
                lambda p: f"(SELECT {p[0]} FROM {p[1]} LIMIT 1)"
            ),
            st.tuples(inner, st.sampled_from(TABLES)).map(
                lambda p: f"EXISTS (SELECT {p[0]} FROM {p[1]})"
            ),
            inner.map(lambda e: f"{e} /* comment; DROP TABLE pums */"),
            inner.map(lambda e: f"{e} IS NULL"),
        )

    return st.recursive(leaves, extend, max_leaves=6)


row_expressions = expressions()
windows = st.sampled_from(
    ["OVER ()", "OVER (ORDER BY age)", "OVER (PARTITION BY sex ORDER BY income)",
     "OVER (ORDER BY age ROWS UNBOUNDED PRECEDING)", "OVER w",
     "OVER (ORDER BY age ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING)"]
)  # fmt: skip


@st.composite
def aggregates(draw: st.DrawFn) -> str:
    """An aggregate call, mostly of the accepted kinds, sometimes windowed or filtered."""
    argument = draw(st.one_of(st.sampled_from(PUBLIC_COLUMNS), columns, row_expressions))
    call = draw(
        st.one_of(
            st.just("COUNT(*)"),
            st.just("COUNT(DISTINCT pid)"),
            st.sampled_from(["COUNT", "SUM", "AVG"]).map(lambda f: f"{f}({argument})"),
            st.sampled_from(AGGREGATES).map(lambda f: f"{f}({argument})"),
            st.sampled_from(["COUNT", "SUM"]).map(lambda f: f"{f}(DISTINCT {argument})"),
            st.just(f"SUM(CASE WHEN {argument} THEN income ELSE 0 END)"),
        )
    )
    suffix = draw(
        st.one_of(
            st.just(""),
            st.just(""),
            st.just(""),
            windows.map(lambda w: f" {w}"),
            st.just(f" FILTER (WHERE {argument})"),
        )
    )
    return call + suffix


@st.composite
def select_items(draw: st.DrawFn, keys: list[str]) -> str:
    items = draw(
        st.lists(
            st.one_of(
                aggregates(),
                aggregates(),
                aggregates(),
                aggregates().map(lambda a: f"{a} / 2 + 1"),
                st.tuples(aggregates(), aggregates()).map(lambda p: f"{p[0]} / {p[1]}"),
                st.sampled_from(keys) if keys else aggregates(),
                columns,
                literals,
                st.just("*"),
            ),
            min_size=1,
            max_size=4,
        )
    )
    aliases = st.sampled_from(["", "", " AS n", ' AS "ünï"', " AS __dpsql_a0", " x", ' "a b"'])
    return ", ".join(item + draw(aliases) for item in items)


@st.composite
def selects(draw: st.DrawFn) -> str:
    """One SELECT near the accepted subset: FROM, WHERE, GROUP BY, HAVING, ORDER BY, LIMIT."""
    table = draw(st.one_of(st.sampled_from(TABLES), st.sampled_from([
        '"PUMS"', "main.pums", "pums AS t", "pums t", "read_csv('/etc/passwd')",
        "information_schema.tables", "(SELECT * FROM pums) AS s", "pums, pums_pid",
        "pums JOIN pums_pid USING (age)", "ONLY pums", 'pums AS "ünï"'])))  # fmt: skip
    keys = draw(
        st.lists(st.one_of(columns, row_expressions, st.sampled_from(["1", "2"])), max_size=2)
    )
    text = f"SELECT {draw(select_items(keys))} FROM {table}"
    if draw(st.booleans()):
        text += f" WHERE {draw(row_expressions)}"
    if keys:
        text += f" GROUP BY {', '.join(keys)}"
    if draw(st.integers(0, 4)) == 0:
        text += f" HAVING {draw(st.one_of(aggregates(), row_expressions))} > 0"
    if draw(st.integers(0, 3)) == 0:
        target = draw(st.one_of(st.sampled_from(["1", "n", "2"]), aggregates(), columns))
        text += f" ORDER BY {target} {draw(st.sampled_from(['', 'DESC', 'ASC NULLS FIRST']))}"
    if draw(st.integers(0, 3)) == 0:
        text += f" LIMIT {draw(st.sampled_from(['0', '1', '10', '-1', 'ALL', '1e3', '?']))}"
        if draw(st.booleans()):
            text += f" OFFSET {draw(st.sampled_from(['0', '1', '99999999999999999999']))}"
    return text


SAFE_OPERATORS = ["+", "-", "*", "/", "<", ">=", "=", "AND", "OR"]
_modest = st.one_of(st.integers(-1000, 1000).map(str), st.sampled_from(["0.5", "1e3", "40"]))


def _safe_expressions() -> st.SearchStrategy[str]:
    """Expressions from the accepted subset: public columns, modest constants, arithmetic."""
    leaves = st.one_of(st.sampled_from(PUBLIC_COLUMNS), _modest)

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, st.sampled_from(SAFE_OPERATORS), inner).map(_binary),
            st.tuples(inner, inner, inner).map(
                lambda p: f"CASE WHEN {p[0]} > {p[1]} THEN {p[2]} ELSE 0 END"
            ),
            st.tuples(st.sampled_from(["ABS", "FLOOR", "ROUND", "SIGN"]), inner).map(
                lambda p: f"{p[0]}({p[1]})"
            ),
        )

    return st.recursive(leaves, extend, max_leaves=4)


@st.composite
def accepted_selects(draw: st.DrawFn) -> str:
    """A SELECT built only from the accepted subset (so the rewrite is exercised often)."""
    safe = _safe_expressions()
    keys = draw(st.lists(st.one_of(st.sampled_from(PUBLIC_COLUMNS), safe), max_size=2))
    measures = draw(
        st.lists(
            st.one_of(
                st.just("COUNT(*)"),
                st.sampled_from(["SUM", "AVG", "COUNT"]).map(lambda f: f"{f}(income)"),
                st.tuples(st.sampled_from(["SUM", "AVG"]), safe).map(lambda p: f"{p[0]}({p[1]})"),
                st.just("COUNT(DISTINCT pid)"),
            ),
            min_size=1,
            max_size=3,
        )
    )
    text = f"SELECT {', '.join(keys + measures)} FROM {draw(st.sampled_from(TABLES))}"
    if draw(st.booleans()):
        text += f" WHERE {draw(safe)} {draw(st.sampled_from(['<', '>=', '=']))} {draw(safe)}"
    if keys:
        text += f" GROUP BY {', '.join(keys)}"
    if draw(st.booleans()):
        text += f" ORDER BY {draw(st.integers(1, len(keys) + len(measures)))} DESC LIMIT 5"
    return text


@st.composite
def statements(draw: st.DrawFn) -> str:
    """A statement string: mostly one SELECT, sometimes wrapped, chained or hostile."""
    select = draw(st.one_of(selects(), accepted_selects()))
    if draw(st.integers(0, 9)) < 6:
        return select
    return draw(
        st.sampled_from(
            [
                select,
                select,
                select,
                select,
                f"WITH t AS (SELECT * FROM pums) {select}",
                f"{select} UNION ALL {select}",
                f"{select}; {select}",
                f"{select}; DROP TABLE pums",
                f"EXPLAIN {select}",
                f"SELECT COUNT(*) FROM ({select}) AS sub",
                f"SELECT DISTINCT {select[7:]}",
                f"/* leading comment */ {select} -- trailing",
                f"{select} QUALIFY 1 = 1",
                f"{select} FOR UPDATE",
                "SELECT * FROM pums",
                "COPY pums TO '/tmp/x.csv'",
                "SET threads = 1",
                "SET dpsql.epsilon = 'abc'",
                "SHOW dpsql.nothing",
                "PRAGMA version",
                "INSERT INTO pums SELECT * FROM pums",
            ]
        )
    )


parameters = st.one_of(
    st.none(),
    st.lists(
        st.one_of(
            st.integers(-(2**63), 2**63 - 1),
            st.floats(),
            st.text(max_size=5),
            st.none(),
            st.booleans(),
        ),
        max_size=3,
    ),
)


# -- a table with text, date, timestamp and truth-value columns ----------------------
# The PUMS tables hold numbers only; these reach what they cannot: comparisons across
# types, quoted constants, units, patterns and positions (each a way for the database
# to fail only once a row reaches it).

TYPED_COLUMNS = ["age", "income", "state", "day", "ts", "flag"]
typed_literals = st.sampled_from([
    "0", "5", "95", "1.5", "-1", "1e308", "1000000", "DATE '0001-01-01'",
    "'x'", "'CA'", "''", "'5'", "'NaN'", "'true'",
    "'2020-01-01'", "'2020-02-30'", "'2020-01-01 10:00:00'", "'20200101'", "NULL", "TRUE",
    "DATE '2020-03-01'", "TIMESTAMP '2020-03-01 12:00:00'", "INTERVAL '3' DAY",
    "INTERVAL '999999' YEAR", "CAST('x' AS INT)", "CAST('NaN' AS DOUBLE)",
    "CAST('1e999' AS DOUBLE)",
])  # fmt: skip
UNITS = ["year", "month", "day", "hour", "second", "week", "quarter", "foo", "dow", "epoch"]
TYPED_FUNCTIONS = ["COALESCE", "GREATEST", "LEAST", "NULLIF", "LOWER", "UPPER", "TRIM",
                   "LENGTH", "CONCAT", "STARTS_WITH", "YEAR", "MONTH", "DAY", "QUARTER",
                   "DAYOFWEEK", "DAYOFYEAR", "ABS", "FLOOR", "CEIL", "ROUND", "SIGN", "SQRT",
                   "LN", "EXP"]  # fmt: skip
TYPED_OPERATORS = ["=", "<>", "<", ">=", "+", "-", "*", "/", "||", "LIKE", "ILIKE", "NOT LIKE",
                   "IS DISTINCT FROM", "AND", "OR"]  # fmt: skip


def typed_expressions() -> st.SearchStrategy[str]:
    """Row expressions mixing the typed table's columns with constants of every kind."""
    leaves = st.one_of(st.sampled_from(TYPED_COLUMNS), typed_literals)
    units = st.sampled_from(UNITS)
    positions = st.sampled_from(["1", "0", "-1", "2", "1.5"])

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, st.sampled_from(TYPED_OPERATORS), inner).map(_binary),
            inner.map(lambda e: f"NOT {e}"),
            st.tuples(units, inner).map(lambda p: f"DATE_TRUNC('{p[0]}', {p[1]})"),
            st.tuples(units, inner).map(lambda p: f"EXTRACT({p[0]} FROM {p[1]})"),
            st.tuples(inner, positions, positions).map(
                lambda p: f"SUBSTRING({p[0]}, {p[1]}, {p[2]})"
            ),
            st.tuples(inner, st.sampled_from(["'C%'", "'x!%'", "'x!'", "'x!!'"]),
                      st.sampled_from(["'!'", "'ab'"]))
            .map(lambda p: f"{p[0]} LIKE {p[1]} ESCAPE {p[2]}"),
            st.tuples(st.sampled_from(TYPED_FUNCTIONS),
                      st.lists(inner, min_size=1, max_size=2).map(", ".join))
            .map(lambda p: f"{p[0]}({p[1]})"),
            st.tuples(inner, st.sampled_from(["+", "-"]),
                      st.sampled_from(["INTERVAL '2' HOUR", "1", "day", "ts"]))
            .map(_binary),
            st.tuples(inner, st.sampled_from(["TEXT", "BIGINT", "DOUBLE", "DATE", "TIMESTAMP",
                                              "BOOLEAN", "INTEGER"]))
            .map(lambda p: f"CAST({p[0]} AS {p[1]})"),
            st.tuples(inner, inner, inner).map(
                lambda p: f"CASE WHEN {p[0]} THEN {p[1]} ELSE {p[2]} END"
            ),
            st.tuples(inner, st.lists(typed_literals, min_size=1, max_size=3).map(", ".join))
            .map(lambda p: f"{p[0]} IN ({p[1]})"),
            st.tuples(inner, inner, inner).map(lambda p: f"{p[0]} BETWEEN {p[1]} AND {p[2]}"),
            inner.map(lambda e: f"{e} IS NULL"),
        )  # fmt: skip

    return st.recursive(leaves, extend, max_leaves=5)


@st.composite
def typed_statements(draw: st.DrawFn) -> str:
    """A COUNT or SUM over the typed table whose WHERE first narrows it to a few rows, so
    a condition that fails for some rows fails on the full table and not on an empty one."""
    condition = draw(typed_expressions())
    narrow = draw(st.sampled_from(["age > 95", "age = 40", "flag", "state = 'NY'"]))
    shape = draw(st.sampled_from([
        "SELECT COUNT(*) FROM typed WHERE {narrow} AND {c}",
        "SELECT SUM(CASE WHEN {c} THEN 1 ELSE 0 END) FROM typed WHERE {narrow}",
        "SELECT {c} AS k, COUNT(*) FROM typed WHERE {narrow} GROUP BY 1",
        "SELECT SUM({c}) FROM typed WHERE {narrow}",
    ]))  # fmt: skip
    return shape.format(narrow=narrow, c=condition)
