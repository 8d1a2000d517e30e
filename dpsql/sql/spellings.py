"""What sqlglot writes that a backend cannot run: spelled as it can, or refused before the
charge.

An analyst's query is read in the backend's own dialect and means what it means
there; the rewritten query must run there and mean the same:

* PostgreSQL has no DAYOFWEEK, DAYOFYEAR or QUARTER functions (sqlglot writes
  them anyway): they become EXTRACT(DOW|DOY|QUARTER ...) cast to BIGINT, Sunday
  being 0 as in DuckDB. PostgreSQL rounds to decimals only in NUMERIC:
  ROUND(x, n) rounds x::numeric and casts back to DOUBLE. LIKE, ILIKE and
  STARTS_WITH read their text under the default collation: PostgreSQL refuses
  them on a nondeterministic one (a case-insensitive ICU collation), once a row
  reaches them.
* Spark has no MICROSECOND(S), MILLISECOND(S), DECADE, CENTURY, MILLENNIUM,
  ISODOW, ISOYEAR or EPOCH field in EXTRACT (an error, after the charge), and
  its DATE_TRUNC returns NULL for every row for the units it lacks (plural
  MILLISECONDS and MICROSECONDS, DECADE, CENTURY, MILLENNIUM), though DuckDB
  and PostgreSQL know each: they are refused on Spark, saying what Spark has,
  as are both taken of an INTERVAL constant (Spark truncates no interval, and
  extracts only the fields an interval type holds).
* DuckDB and Spark read a constant with a decimal point as a DECIMAL whose scale
  adds up under `*`: `age > 0.000000000000000001 * 0.000000000000000001` is a
  DECIMAL(38,36), which holds nothing of 100 or more, and DuckDB converted each
  age to it, failing for the ages of 100. PostgreSQL reads it as a numeric,
  whose quotients it rounds to a scale of its own: `LN(1.0 / 3 * 3)` is -1e-20
  there, finer than the analysis's bound on how near zero a value can be, and a
  product of such values underflowed once divided by a large enough column
  value. So such constants are sent as DOUBLE everywhere (on PostgreSQL those
  with an exponent and whole numbers beyond 64 bits too, numerics there, unless
  compared as written), and so is PostgreSQL's EXTRACT(EPOCH ...), a numeric
  too: every value computed with is then an integer or a double, which the
  analysis models (intervals.Interval).
* PostgreSQL has no `%` of double precision: `ROUND(income) % 7` (a whole number,
  which is all `%` takes) failed for every row, after the charge. Its operands
  are cast to BIGINT there (exactly: the analysis keeps them within 2^53).
* DuckDB's SIGN returns a TINYINT, to which it fits the constants beside it:
  `SIGN(income - 17000) * 127 + SIGN(income - 17000)` overflowed exactly when an
  income was above 17000, a bit of one person's income per query. It is cast to
  BIGINT there, the integer every other number computed with is.
* Truncated to a decade, century or millennium, the first years of the
  calendar fall before the year 1 (DuckDB's century of the year 50 is the year
  0, PostgreSQL's decade of the year 5 is 1 BC), which Python cannot hold:
  fetching such a key failed, for some rows only, after the charge. Those
  years give NULL instead, on every backend.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.errors import QueryRefused
from dpsql.sql.guards import compared_as_written

# Parts of a date sqlglot writes for PostgreSQL as functions PostgreSQL lacks
# (DAY_OF_WEEK, DAY_OF_YEAR, QUARTER), and their EXTRACT fields. DOW counts from
# Sunday = 0, as DuckDB's DAYOFWEEK does.
_POSTGRES_PARTS = {exp.DayOfWeek: "DOW", exp.DayOfYear: "DOY", exp.Quarter: "QUARTER"}
# Units DuckDB and PostgreSQL know that Spark does not, in EXTRACT and in DATE_TRUNC.
_SPARK_LACKS_TRUNC = frozenset(("microseconds", "milliseconds", "decade", "century", "millennium"))
_SPARK_LACKS_FIELDS = _SPARK_LACKS_TRUNC | {
    "microsecond",
    "millisecond",
    "isodow",
    "isoyear",
    "epoch",
}
_SPARK_FIELDS = "year, quarter, month, week, day, dow (Sunday is 1), doy, hour, minute, second"
_SPARK_TRUNC = "year, quarter, month, week, day, hour, minute, second, millisecond, microsecond"

# Truncations that fall before the year 1 for the first years (DuckDB's decade and
# century of the year 5 are the year 0, PostgreSQL's decade too; neither PostgreSQL's
# "1 BC" nor DuckDB's can be held by Python), and the first year that does not.
_FIRST_YEAR_KEPT = {"decade": 10, "century": 100, "millennium": 1000}
_TRUNCATIONS = (exp.DateTrunc, exp.TimestampTrunc)
# Quoted as written: `default` is a keyword, and the rewrite unquotes identifiers
_DEFAULT_COLLATION = exp.Var(this='"default"')
# The node kinds spell() may change or refuse, per dialect.
_KINDS: dict[str, tuple[type[exp.Expression], ...]] = {
    "postgres": (
        *_POSTGRES_PARTS,
        exp.Round,
        exp.Like,
        exp.ILike,
        exp.StartsWith,
        exp.Literal,
        exp.TimeToUnix,
        exp.Mod,
        *_TRUNCATIONS,
    ),
    "duckdb": (exp.Literal, exp.Sign, *_TRUNCATIONS),
    "spark": (exp.Extract, exp.Literal, *_TRUNCATIONS),
}


def kinds(dialect: str) -> tuple[type[exp.Expression], ...]:
    """The node kinds `spell` may change or refuse in `dialect`."""
    return _KINDS.get(dialect, _TRUNCATIONS)


def spell(node: exp.Expression, dialect: str) -> exp.Expression:
    """`node` as `dialect` can run it (itself if it can as it is); QueryRefused if it cannot."""
    if isinstance(node, exp.Literal):
        return _as_double(node, dialect)
    if isinstance(node, exp.Sign):  # DuckDB's, a TINYINT
        return exp.cast(node, exp.DataType.Type.BIGINT)
    if dialect == "spark":
        _refuse_on_spark(node)
    if isinstance(node, _TRUNCATIONS):
        return _early_years_null(node)
    if dialect == "postgres":
        return _postgres(node)
    return node


def _as_double(literal: exp.Literal, dialect: str) -> exp.Expression:
    """A constant with a decimal point (on PostgreSQL also one with an exponent, or whole
    beyond 64 bits, unless compared as written) as a DOUBLE, unless
    it is cast already or stands where a whole number goes (ROUND's places, SUBSTRING's
    positions: DuckDB, Spark and PostgreSQL take no DOUBLE there)."""
    if literal.is_string:
        return literal
    text = literal.this.lower()
    if len(text) < 19 and text.isascii() and text.isdigit():
        return literal  # whole and within 64 bits (most constants: IN lists of keys)
    # 1e-5 is a DOUBLE already in DuckDB and Spark, but a numeric in PostgreSQL, and so
    # is a whole number beyond 64 bits (1.0e0 / 2^60 * 2^60 - 1 was -2.4e-19 there, and
    # 1 - 1 / 2^64 * 2^64 -5.4e-18, found by an audit); one compared as it is, converted
    # once, is left as written
    numeric = "e" in text or ("." not in text and _beyond_64_bits(text))
    if (
        ("." not in text and not numeric)
        or (numeric and (dialect != "postgres" or compared_as_written(literal)))
        or isinstance(literal.parent, exp.Cast | exp.Substring)
        or (isinstance(literal.parent, exp.Round) and literal.arg_key == "decimals")
    ):
        return literal
    return exp.cast(literal, exp.DataType.Type.DOUBLE)


def _beyond_64_bits(text: str) -> bool:
    try:
        return abs(int(text)) >= 2**63
    except ValueError:  # not a decimal whole number (hexadecimal, say)
        return False


def _unit(node: exp.Expression) -> str:
    unit = node.this if isinstance(node, exp.Extract) else node.args.get("unit")
    return unit.name.lower() if isinstance(unit, exp.Var | exp.Literal) else ""


def _early_years_null(truncation: exp.Expression) -> exp.Expression:
    """A truncation to a decade, century or millennium, NULL for the years it would take
    before the year 1: that key made the database driver or Python fail, for some rows
    only, after the charge (a failure that reveals such a row)."""
    first = _FIRST_YEAR_KEPT.get(_unit(truncation))
    if first is None:
        return truncation
    year = exp.Extract(this=exp.var("YEAR"), expression=truncation.this.copy())
    kept = exp.GTE(this=year, expression=exp.Literal.number(first))
    return exp.Case(ifs=[exp.If(this=kept, true=truncation.copy())])


def _postgres(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.TimeToUnix):  # EXTRACT(EPOCH ...), a numeric there
        return exp.cast(node, exp.DataType.Type.DOUBLE)
    if isinstance(node, exp.Mod):  # whole numbers, perhaps doubles, which % does not take
        for side in ("this", "expression"):
            node.set(side, exp.cast(node.args[side], exp.DataType.Type.BIGINT))
        return node
    part = _POSTGRES_PARTS.get(type(node))
    if part is not None:
        extract = exp.Extract(this=exp.var(part), expression=node.this)
        return exp.cast(extract, exp.DataType.Type.BIGINT)  # NUMERIC there, BIGINT in DuckDB
    if isinstance(node, exp.Like | exp.ILike | exp.StartsWith):
        # A column of a nondeterministic collation fails LIKE, ILIKE and starts_with,
        # and only once a row reaches them; under the default collation they run
        for side in ("this", "expression"):
            operand = node.args.get(side)
            if operand is not None and operand.find(exp.Column) is not None:
                node.set(side, exp.Collate(this=operand, expression=_DEFAULT_COLLATION.copy()))
        return node
    if isinstance(node, exp.Round) and node.args.get("decimals") is not None:
        # PostgreSQL rounds to decimals only in NUMERIC; the result goes back to DOUBLE
        node.set("this", exp.cast(node.this, exp.DataType.Type.DECIMAL))
        return exp.cast(node, exp.DataType.Type.DOUBLE)
    return node


def _refuse_on_spark(node: exp.Expression) -> None:
    extract, name = isinstance(node, exp.Extract), _unit(node)
    value = node.expression if extract else node.this
    if isinstance(value, exp.Interval):
        raise QueryRefused(
            f"{'EXTRACT' if extract else 'DATE_TRUNC'} of an INTERVAL on Spark",
            "Spark truncates no interval and extracts only the fields an interval type "
            "holds (an error, after the charge)",
            "compute it from a date or timestamp column, or write the constant it gives",
        )
    if name not in (_SPARK_LACKS_FIELDS if extract else _SPARK_LACKS_TRUNC):
        return
    call, fails = (
        (f"EXTRACT({name} FROM ...)", "an error, after the charge")
        if extract
        else (f"DATE_TRUNC('{name}', ...)", "NULL for every row")
    )
    raise QueryRefused(
        f"{call} on Spark",
        f"Spark has no '{name}' unit there ({fails}); DuckDB and PostgreSQL have it",
        f"use one Spark has: {_SPARK_FIELDS if extract else _SPARK_TRUNC}",
    )
