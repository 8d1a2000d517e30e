"""Rewrite an analysed query into bounded, exact aggregate SQL in the backend's dialect.

The rewritten query filters with the analyst's WHERE, bounds each unit's
contribution (at most `max_rows_per_unit` rows per group, ranked by a keyed
hash, and at most `max_groups_per_unit` groups), clamps summed values and
rounds them to the release grid as integers, so the database returns one row
per group of exact integers: key columns, one column per measurement, and the
number of distinct units (for key selection). Noise is added later, in Python.
On request it also counts, for the bounding note, the rows each unit had before the
bounding (capped) and the rows kept (BEFORE_COLUMN, KEPT_COLUMN: sql/bounding.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from dpsql.policy import NEAR_ZERO, Column, Table
from dpsql.sql.analysis import KEY_PREFIX, RESERVED_PREFIX, Analysis, Measurement
from dpsql.sql.clamps import clamp, needed_sides
from dpsql.sql.intervals import MIN_NONZERO, Interval, column_interval
from dpsql.sql.keys import canonical_sql, key_kinds
from dpsql.sql.kinds import compared_operands, dates_only, is_day_count
from dpsql.sql.parse import sqlglot_dialect
from dpsql.sql.ranges import where_range
from dpsql.sql.resolve import undeclared
from dpsql.sql.spellings import kinds as spelled_kinds
from dpsql.sql.spellings import spell
from dpsql.sql.temporal import YEARS_PYTHON_HOLDS, held_by, prefilter, temporal_or_null

MEASURE_PREFIX = "__dpsql_m"
UNITS_COLUMN = "__dpsql_units"
UNIT_KEY = "__dpsql_unit"  # the unit, a last group key, for per_unit
BUCKET_KEY = "__dpsql_bucket"  # a histogram's bucket, a last group key
DIGEST_COLUMN = "__dpsql_digest"
BEFORE_COLUMN = "__dpsql_cut_before"  # each unit's rows before the bounding, capped
KEPT_COLUMN = "__dpsql_cut_kept"  # the rows the bounding kept (no KEY_PREFIX in it)
# Dialects whose keyed hash is an integer, which a digest sums (elsewhere it is MD5 text)
DIGEST_DIALECTS = frozenset({"duckdb", "spark", "postgres"})
_DIGEST_MODULUS = 2**31 - 1  # a sum of a billion terms stays within BIGINT
_ROW_RANK = "__dpsql_row_rank"
_GROUP_RANK = "__dpsql_group_rank"
_BOUNDED = "__dpsql_bounded"
_UNIT_ROWS = "__dpsql_unit_rows"
_SOURCE = "__dpsql_source"
_ROWS = "__dpsql_rows"  # a unit's rows in one group (_per_group_query)
_FILTERED, _PER_GROUP, _KEPT = "__dpsql_filtered", "__dpsql_per_group", "__dpsql_kept"
_GROUPS = "__dpsql_groups"  # one row per unit and group, each group's rows bounded
_UNITS = "__dpsql_units_over"  # one row per unit: what says it is over a bound
_MOST_ROWS = "__dpsql_most_rows"  # a unit's rows in its largest group
_GROUP_COUNT = "__dpsql_group_count"  # a unit's groups
# Dialects where _per_group_query was measured faster
# than the row windows (DuckDB: a COUNT over lineitem joined to orders 3x faster, a
# grouped SUM 4-6x, unless most units exceed max_rows_per_unit: up to 1.6x slower)
_PER_GROUP_DIALECTS = frozenset({"duckdb"})


_DOUBLE = exp.DataType.build("DOUBLE")
_BIGINT = exp.DataType.build("BIGINT")
_TEXT = exp.DataType.build("TEXT")
# Dialects whose CAST of a DOUBLE to BIGINT rounds to the nearest integer (ties to
# even): there a SUM's per-row ROUND, one more operation on every row, is left
# out. Spark's cast truncates, so it keeps ROUND; any rounding keeps each value in
# [floor(lower/step), ceil(upper/step)], so this is about accuracy, not privacy.
_CASTS_ROUND = frozenset({"duckdb", "postgres"})
# Dialects whose ROUND of a DOUBLE is slow (Spark rounds each value through a BigDecimal)
# and which have RINT, the nearest whole DOUBLE (ties to even, as PostgreSQL's cast).
_RINTS = frozenset({"spark"})
# Dialects that fail a product or quotient of nonzero doubles that rounds to zero
# ("value out of range: underflow" in PostgreSQL), for the rows that reach it.
_UNDERFLOWS = frozenset({"postgres"})
_SEEDED_HASHES = {"duckdb": "hash", "spark": "xxhash64"}  # hash(secret, values...)


@dataclass(frozen=True)
class SumGrid:
    """How a SUM is measured as an integer: values clamped, divided by `step`, rounded."""

    step: float  # a power of two
    bounds: Interval  # clamp interval in the query's units


def rewrite(
    analysis: Analysis,
    grids: dict[int, SumGrid],
    dialect: str,
    seed: int,
    with_units: bool,
    *,
    earliest_groups: bool = False,
    per_unit: bool = False,
    digest_seed: int | None = None,
    bucket: exp.Expression | None = None,
    bucket_rows: exp.Expression | None = None,
    before_cap: int | None = None,
) -> str:
    """The bounded exact SQL for `analysis`; `grids` gives each SUM measurement its grid.

    `with_units` adds the count of distinct units per group, which key selection needs.
    `earliest_groups` keeps each unit's first groups in key order instead of a
    keyed-hash choice: a stream released step by step then never lets a later
    step displace one already counted (dpsql/sql/running.py). `per_unit` (a table with a
    privacy unit) groups by the unit too, after the bounding, as the last key (UNIT_KEY):
    one row per unit and group, for a caller that bounds units further by a record of
    what each used before (a running stream over a mutable source). `digest_seed` (a
    table with a privacy unit, a dialect of DIGEST_DIALECTS) adds a last column: the sum,
    over the rows each group counts, of a hash keyed by it of the row's unit and what
    the row adds to the first measurement, modulo 2^31 - 1. It changes, but for a
    chance of about 2^-31, whenever which unit adds what to the group changes (a row
    moved between units, which leaves the group's total as it was), and tells nothing
    without the seed.
    `bucket` (a row expression) groups by it too, after the bounding, as the last key
    (BUCKET_KEY): one row per group and bucket, a bounded histogram (sql/quantiles.py);
    `bucket_rows` (a row predicate) keeps only the rows it holds, after the bounding: the
    rows of some buckets, each unit's chosen as for the whole histogram.
    `before_cap` (a table whose rows are bounded) adds two last columns: BEFORE_COLUMN,
    the sum of min(a unit's rows before the bounding, before_cap) over the units whose
    first kept row is in the group (_per_group_query: over all units, on the first group
    returned), and KEPT_COLUMN, the rows the group kept; only their totals over the
    groups returned are used.
    """
    table = analysis.table
    keys = _canonical_keys(analysis, dialect)
    where = _where(analysis, keys)
    source = _clamped_source(table, *columns_read(analysis), dialect, analysis.where)
    unit = (
        exp.column(table.column(table.privacy_unit).name, quoted=True)
        if table.privacy_unit
        else None
    )
    measures = [
        _measure_sql(m, grids.get(i), unit, analysis, dialect).as_(
            f"{MEASURE_PREFIX}{i}", copy=False
        )
        for i, m in enumerate(analysis.measurements)
    ]
    one_row_per_unit = unit is None or table.unique_unit
    # Bounds of one row in one group: a single window over the unit keeps one row
    # of each unit, which bounds both at once with half the sorting of two windows.
    single = (
        not one_row_per_unit
        and table.max_rows_per_unit == 1
        and table.max_groups_per_unit == 1
        and not earliest_groups
    )
    units = (
        exp.Count(this=exp.Star())
        if one_row_per_unit or single
        else exp.Count(this=exp.Distinct(expressions=[unit.copy()]))
    ).as_(UNITS_COLUMN, copy=False)
    key_items = [key.copy().as_(f"{KEY_PREFIX}{i}", copy=False) for i, key in enumerate(keys)]
    grouped = [_groupable(key) for key in keys]
    if per_unit:
        key_items.append(unit.copy().as_(UNIT_KEY, copy=False))
        grouped.append(unit.copy())
    if bucket is not None:
        key_items.append(bucket.copy().as_(BUCKET_KEY, copy=False))
        grouped.append(bucket.copy())
    if (
        dialect in _PER_GROUP_DIALECTS
        and not (one_row_per_unit or single or earliest_groups or per_unit)
        and digest_seed is None
        and bucket is None
        and all(m.kind != "count_distinct" for m in analysis.measurements)
    ):
        query = _per_group_query(
            analysis, source, unit, keys, where, seed, dialect, measures, with_units, before_cap
        )
        return _checked_sql(query, table, dialect)
    if one_row_per_unit:
        # one row per unit (row-level, or a unit the database keeps unique): nothing to bound
        relation: exp.Expression = source
        filters = where
        if unit is not None:
            owned = exp.Not(this=exp.Is(this=unit.copy(), expression=exp.Null()))
            filters = owned if where is None else exp.and_(owned, where, copy=False)
    else:
        relation = _bounded(
            analysis, source, unit, keys, where, seed, dialect, earliest_groups, single,
            before_cap is not None,
        )  # fmt: skip
        filters = _rank_filter(analysis, single)
    if bucket_rows is not None:
        kept = bucket_rows.copy()
        filters = kept if filters is None else exp.and_(filters, kept, copy=False)
    if digest_seed is not None:
        added = _row_value(analysis.measurements[0], grids.get(0), analysis, dialect)
        hashed = keyed_hash(dialect, digest_seed, [unit, added])
        digest = exp.Sum(this=exp.Mod(this=hashed, expression=exp.convert(_DIGEST_MODULUS)))
        measures.append(digest.as_(DIGEST_COLUMN, copy=False))
    items = [*key_items, *measures, *([units] if with_units else [])]
    if before_cap is not None and not one_row_per_unit:
        items.extend(_before_and_kept(analysis, before_cap, single))
    query = exp.select(*items, copy=False).from_(relation, copy=False)
    if filters is not None:
        query = query.where(filters, copy=False)
    if grouped:
        query = query.group_by(*grouped, copy=False)
    return _checked_sql(query, table, dialect)


def _checked_sql(query: exp.Select, table: Table, dialect: str) -> str:
    """The query's text, once it names only declared columns, reading the relation's rows
    in place of the virtual table's name."""
    _require_declared(query, table)
    if table.relation is not None:
        _read_relation(query, table)
    return in_dialect(query, dialect, table)


def _read_relation(query: exp.Select, table: Table) -> None:
    """The stored table's name replaced by the SQL computing the relation's rows
    (sql/relations.py), after _require_declared: the relation reads its base tables'
    columns under their own names."""
    for node in list(query.find_all(exp.Table)):
        if node.name == table.name and not node.args.get("db"):
            alias = node.alias or table.name
            node.replace(table.relation.copy().subquery(alias, copy=False))


def _groupable(key: exp.Expression) -> exp.Expression:
    """A GROUP BY element meaning `key`. A constant one (`SELECT 5 AS k ... GROUP BY 1`) is
    written COALESCE(key, key): a bare integer there is a select-list position to DuckDB,
    PostgreSQL and Spark, and PostgreSQL refuses other bare constants, each after the
    charge."""
    if any(True for _ in key.find_all(exp.Column)):
        return key.copy()
    return exp.Coalesce(this=key.copy(), expressions=[key.copy()])


def _require_declared(query: exp.Select, table: Table) -> None:
    """Refuse SQL that names a column the policy does not declare.

    Defense in depth: the analysis already refuses such names; this checks the SQL
    actually built, because when every column is read as stored the query reads the
    table itself, with no subquery of declared columns in between to make the name fail."""
    for column in query.find_all(exp.Column):
        name = column.name
        if table.column(name) is None and not name.lower().startswith(RESERVED_PREFIX):
            raise undeclared(name, table)


# Reading a column only to compare it cannot fail, whatever its value.
_COMPARISONS = (
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
    exp.In, exp.Between, exp.Is,
)  # fmt: skip


def columns_read(analysis: Analysis) -> tuple[set[str], set[str], set[str]]:
    """Lower-case names of the columns the query reads; of those it computes with
    (arithmetic, functions, CASE values); and of those it groups by or aggregates
    bare (an aggregate clamps its own argument). The rest it only compares."""
    roots = [
        analysis.where,
        *[key.expression for key in analysis.keys],
        *[m.argument for m in analysis.measurements],
    ]
    read, computed, bare = set(), set(), set()
    for root in roots:
        if root is None:
            continue
        for column in root.find_all(exp.Column):
            name = column.name.lower()
            read.add(name)
            if column is root:
                bare.add(name)
            elif not isinstance(column.parent, _COMPARISONS) or _beside_times(
                column, analysis.table
            ):
                computed.add(name)
    return read, computed, bare


def _beside_times(column: exp.Column, table: Table) -> bool:
    """Whether a date column is compared with something other than dates: DuckDB converts
    the date to a TIMESTAMP, which fails for dates past its timestamps' year 294247
    (`day <= ts`, `day = DATE_TRUNC('month', ts)` failed only for such a row). Read
    through the guard instead, as a date the query computes with."""
    spec = table.column(column.name)
    if spec is None or spec.type != "date":
        return False
    others = [operand for operand in compared_operands(column.parent) if operand is not column]
    return not dates_only(others, table)


def _clamped_source(
    table: Table,
    read: set[str],
    computed: set[str],
    bare: set[str],
    dialect: str,
    where: exp.Expression | None = None,
) -> exp.Expression:
    """The columns the query reads (and the unit), each bounded numeric one widened to
    BIGINT or DOUBLE and clamped to its declared bounds when the query computes with
    it, before WHERE, GROUP BY or an aggregate reads it.

    This is what makes total.require_total's proofs hold for every row, whatever
    the data: arithmetic on clamped, widened values cannot overflow or leave the
    domain it was proven in, so no row can make the query fail (a failure would
    be a noiseless answer). Values outside the bounds count as the nearest bound,
    as they already did inside SUM and AVG. A column that is only compared, grouped
    by or aggregated bare is only widened, not clamped: those uses cannot fail,
    aggregates clamp their arguments themselves, and a clamp there would cost a
    CASE per row for nothing. A column that is only compared is read as stored:
    a comparison cannot fail either, and a cast in the way keeps the database
    from filtering as it scans (a COUNT with a WHERE cost 1.3x the raw query).
    Except a float stored as an exact number whose comparisons could fail
    (Column.read_as_double): it is read as a DOUBLE wherever it is used.
    A date or timestamp computed with or read bare is NULL where the database could
    not compute with it or Python could not hold it (YEARS_PYTHON_HOLDS); the
    comparisons of such a column with constants in `where` (the analyst's WHERE)
    are also made here, on the stored value (temporal.prefilter). One read bare only
    (grouped by, compared) is read as stored when `where` holds it between two
    dates Python holds (temporal.held_by): then no other value reaches a group key.
    """
    stored = stored_table(table)
    items, identity, guarded = [], True, {}
    for column in table.columns.values():
        name = column.name.lower()
        if name not in read and name != table.privacy_unit:
            continue
        value: exp.Expression = exp.column(column.name, quoted=True)
        interval = column_interval(column)
        doubled = column.read_as_double and name != table.privacy_unit
        if doubled:
            # Read as a DOUBLE wherever the query uses it, comparisons too: compared as
            # stored, DuckDB converted a DECIMAL to a common type row by row, failing for
            # some rows. (The unit is only hashed and partitioned by: kept exact.)
            value = read_double(value, dialect)
            identity = False
        if (
            interval is not None
            and name != table.privacy_unit
            and (name in computed or name in bare)
        ):
            if name in computed:
                zero_below = near_zero(interval, dialect) if column.type == "float" else None
                lower, upper = needed_sides(table, name, interval)  # proven sides left out
                value = clamp(value, interval, lower=lower, upper=upper, zero_below=zero_below)
            if name in computed or not doubled:  # a clamp's CASE is typed by its branches
                widened = _BIGINT if column.type == "int" else _DOUBLE
                value = exp.Cast(this=value, to=widened.copy())
            identity = False
        elif (
            column.type in YEARS_PYTHON_HOLDS
            and dialect in ("duckdb", "postgres", "spark")
            and (name in computed or (name in bare and not held_by(where, name)))
        ):
            value = temporal_or_null(value, column.type)
            identity, guarded = False, {**guarded, name: column.type}
        items.append(exp.alias_(value, column.name, quoted=True, copy=False))
    if identity:
        # Every column read as stored: the table itself, since a subquery of plain
        # columns costs DuckDB a projection per row that passes WHERE (a COUNT with
        # a WHERE took 1.10x the raw query's time with it, 1.04x without).
        return exp.alias_(stored, _SOURCE, table=True, copy=False)
    select = exp.select(*items, copy=False).from_(stored, copy=False)
    conditions = prefilter(where, guarded, table)
    if conditions:
        select = select.where(*conditions, copy=False)
    return select.subquery(_SOURCE, copy=False)


# Beyond these PostgreSQL fails to convert a numeric to double precision (its strtod
# overflows, or underflows to 0): a guarded read makes such values infinite or 0 first.
_DOUBLE_REACH = (exp.Literal.number("1e308"), exp.Literal.number("1e-307"))


def read_double(value: exp.Expression, dialect: str) -> exp.Expression:
    """`value`, a number column the policy marks read_as_double, as a DOUBLE that no row
    fails to reach.

    Elsewhere CAST(value AS DOUBLE): it never fails for DuckDB's DECIMAL, HUGEINT,
    UHUGEINT and UBIGINT (policy.read_as_double). PostgreSQL fails the cast of a
    numeric beyond 1e308 or nonzero below 1e-307; a CASE compares it first, in
    numeric, which is exact and cannot fail, and reads those as infinite or 0,
    and NaN as NaN (it compares above every number).
    """
    double = exp.Cast(this=value.copy(), to=_DOUBLE.copy())
    if dialect != "postgres":
        return double
    huge, tiny = _DOUBLE_REACH

    def constant(text: str) -> exp.Expression:
        return exp.Cast(this=exp.Literal.string(text), to=_DOUBLE.copy())

    nan = exp.Cast(this=exp.Literal.string("NaN"), to=exp.DataType.build("DECIMAL"))
    near = exp.and_(
        exp.GT(this=value.copy(), expression=exp.Neg(this=tiny.copy())),
        exp.LT(this=value.copy(), expression=tiny.copy()),
    )
    cases = [
        (exp.EQ(this=value.copy(), expression=nan), constant("NaN")),
        (exp.GT(this=value.copy(), expression=huge.copy()), constant("Infinity")),
        (exp.LT(this=value.copy(), expression=exp.Neg(this=huge.copy())), constant("-Infinity")),
        (near, exp.Cast(this=exp.convert(0), to=_DOUBLE.copy())),
    ]
    return exp.Case(ifs=[exp.If(this=c, true=t) for c, t in cases], default=double)


def stored_table(table: Table) -> exp.Table:
    """The policy's table as the database names it, each part quoted: catalog too, for a
    `database.schema.table` entry (dropped, the query read the current database's
    table of that schema and name instead)."""
    *qualifiers, name = table.name.split(".")
    parts = [exp.to_identifier(part, quoted=True) for part in qualifiers[-2:]]
    return exp.Table(
        this=exp.to_identifier(name, quoted=True),
        db=parts[-1] if parts else None,
        catalog=parts[0] if len(parts) == 2 else None,
    )


def near_zero(interval: Interval, dialect: str) -> float | None:
    """How near zero a float value within `interval` is read as 0 before `dialect` computes
    with it (None: not at all).

    PostgreSQL fails a product or quotient of nonzero doubles that rounds to zero:
    `x / 1000` failed for a subnormal x only. Read as 0 there, a float column's
    values are 0 or at least NEAR_ZERO from it (or within bounds that exclude 0,
    which the policy keeps as far from it), as intervals.column_interval assumes.
    """
    if dialect in _UNDERFLOWS and interval.lower <= 0 <= interval.upper:
        return NEAR_ZERO
    return None


def in_dialect(query: exp.Select, dialect: str, table: Table | None = None) -> str:
    """The query's text in `dialect`, with names under the backend's case rules.

    Policy names are case-insensitive, like unquoted SQL names: each is folded
    as the backend folds unquoted names (lower case in PostgreSQL, upper case
    in Snowflake) and then quoted, so a name that is also a keyword still works.
    """
    backend = sqlglot_dialect(dialect)
    # Deepest first, so that a replaced node (ROUND cast back to DOUBLE) has its insides
    # done already; transform() would not look inside a node it has just replaced. Only
    # the kinds _portable changes: find_all filters in sqlglot's code, not in Python.
    kinds = _PORTABLE_KINDS + spelled_kinds(dialect)
    for node in reversed(list(query.find_all(*kinds))):
        portable = _portable(node, dialect=dialect, table=table)
        if portable is not node:
            node.replace(portable)
    # One walk that unquotes and folds each name (sqlglot's normalize_identifiers
    # would walk the tree a second time, for metadata this query never has).
    by_name = _folds_by_name(dialect)
    for identifier in query.find_all(exp.Identifier):
        identifier.set("quoted", False)
        if by_name:
            identifier.set("this", _folded(dialect, identifier.this))
        else:
            backend.normalize_identifier(identifier)
    # copy=False: the query was built for this call only, so the generator may mutate it
    return query.sql(dialect=backend, identify=True, copy=False)


@functools.cache  # the adapters' few dialect names
def _folds_by_name(dialect: str) -> bool:
    """Whether `dialect` folds a name by the name alone (sqlglot's rule for most); BigQuery
    reads where it stands too (a qualified table's name keeps its case)."""
    rule = type(sqlglot_dialect(dialect)).normalize_identifier
    return rule is sqlglot.Dialect.normalize_identifier


@functools.lru_cache(maxsize=4096)  # the policy's names and dpsql's own, met in every query
def _folded(dialect: str, name: str) -> str:
    """`name` as `dialect` folds it unquoted, where it folds by the name alone
    (_folds_by_name): folding cost more than this lookup."""
    unquoted = exp.Identifier(this=name, quoted=False)
    return sqlglot_dialect(dialect).normalize_identifier(unquoted).this


# The nodes _portable may change for every backend (spellings.kinds: per backend).
_PORTABLE_KINDS = (exp.Sub, exp.Is)


def _portable(node: exp.Expression, *, dialect: str, table: Table | None) -> exp.Expression:
    """`node` as every backend runs it, meaning what DuckDB means (spellings.spell): a
    failure there comes after the charge, and one that depends on the rows is a
    noiseless answer.

    - A date minus a date is widened to BIGINT: PostgreSQL and Spark count the days
      in a 32-bit integer, so `(day - DATE '0001-01-01') * 1000000` overflowed for
      every row that reached it. The analysis bounds the count, and everything
      computed from it, within 2^53.
    - sqlglot writes `(age IN (1)) IS NULL` without its parentheses, which Spark's
      grammar cannot parse.
    """
    if isinstance(node, exp.Literal):  # most nodes visited: the query's constants
        return spell(node, dialect)
    if table is not None and is_day_count(node, table):
        return exp.cast(node, exp.DataType.Type.BIGINT)
    if isinstance(node, exp.Is) and isinstance(
        node.this, exp.Predicate | exp.Connector | exp.Not | exp.Escape
    ):
        node.set("this", exp.paren(node.this, copy=False))
        return node
    return spell(node, dialect)


def _canonical_keys(analysis: Analysis, dialect: str) -> list[exp.Expression]:
    """The keys as every part of the query groups them (sql/keys.py): one representation
    per group, whichever of its rows the database meets first."""
    return [
        canonical_sql(key.expression, kind, dialect)
        for key, kind in zip(analysis.keys, key_kinds(analysis), strict=True)
    ]


def _where(analysis: Analysis, keys: list[exp.Expression]) -> exp.Expression | None:
    """The analyst's WHERE, plus: keys of a public domain must lie in it (compared as they
    are grouped, so a row counts in the domain's group only if it is in that group)."""
    conditions = [analysis.where.copy()] if analysis.where is not None else []
    for key, expression in zip(analysis.keys, keys, strict=True):
        if key.domain is not None:
            conditions.append(
                exp.In(this=expression.copy(), expressions=[exp.convert(v) for v in key.domain])
            )
    if not conditions:
        return None
    return exp.and_(*[exp.paren(c, copy=False) for c in conditions], copy=False)


def _measure_sql(
    measurement: Measurement,
    grid: SumGrid | None,
    unit: exp.Expression | None,
    analysis: Analysis,
    dialect: str,
) -> exp.Expression:
    if measurement.kind == "count_units":
        return exp.Count(this=exp.Distinct(expressions=[unit.copy()]))
    if measurement.kind == "count":
        argument = measurement.argument.copy() if measurement.argument is not None else exp.Star()
        return exp.Count(this=argument)
    if measurement.kind == "count_distinct":  # over each unit's bounded rows (_bounded)
        return exp.Count(this=exp.Distinct(expressions=[measurement.argument.copy()]))
    return exp.Coalesce(this=exp.Sum(this=_grid_steps(measurement, grid, analysis, dialect)),
                        expressions=[exp.convert(0)])  # fmt: skip


def _row_value(
    measurement: Measurement, grid: SumGrid | None, analysis: Analysis, dialect: str
) -> exp.Expression:
    """What one counted row adds to a COUNT or a SUM measurement."""
    if measurement.kind == "sum":
        return _grid_steps(measurement, grid, analysis, dialect)
    if measurement.argument is None:
        return exp.convert(1)
    counted = exp.Not(this=exp.Is(this=measurement.argument.copy(), expression=exp.Null()))
    return exp.Case(ifs=[exp.If(this=counted, true=exp.convert(1))], default=exp.convert(0))


def _grid_steps(
    measurement: Measurement, grid: SumGrid, analysis: Analysis, dialect: str
) -> exp.Expression:
    """A SUM's argument per row: clamped to the grid's bounds, in whole grid steps.

    This is the per-row work of every SUM, so it does no more than it must
    (each step costs about as much as DuckDB's whole raw SUM): a bare column
    skips the side of the clamp its WHERE already implies (the value read here is
    the one WHERE compared); a bare integer column on a grid of 1 is summed as
    it is, already whole (BIGINT, in the clamped source); a bare float column is
    already DOUBLE there. Other values are cast to DOUBLE, scaled by 1/step (a
    power of two, so exactly the division by step) and rounded to BIGINT:
    whatever the rounding mode, each lies in [floor(lower/step), ceil(upper/step)].
    A side the database proves (clamps.needed_sides) is skipped alike.
    """
    column = _bare_column(measurement, analysis.table)
    zero_below = _scaled_to_zero(grid, column, dialect)
    if measurement.within and zero_below is None:
        # a VAR/STDDEV's centred value of a bare column (sql/dispersion.py): three CASEs
        # per row fewer, which were most of its cost
        value = measurement.clamped.copy()
        if grid.bounds.integer and grid.step == 1.0:
            return value
    elif column is None:
        value = clamp(measurement.clamped, grid.bounds, zero_below=zero_below)
    else:
        low, high = where_range(analysis.where, column)
        lower, upper = needed_sides(analysis.table, column.name, grid.bounds)
        value = clamp(
            measurement.clamped,
            grid.bounds,
            lower=lower and low < grid.bounds.lower,
            upper=upper and high > grid.bounds.upper,
            zero_below=zero_below,
        )
        if column.type == "int" and grid.bounds.integer and grid.step == 1.0:
            return value
    if column is None or column.type != "float":
        value = exp.Cast(this=value, to=_DOUBLE.copy())
    if grid.step != 1.0:
        value = exp.Mul(
            this=value, expression=exp.Cast(this=exp.convert(1 / grid.step), to=_DOUBLE.copy())
        )
    if dialect in _RINTS:
        value = exp.Anonymous(this="RINT", expressions=[value])
    elif dialect not in _CASTS_ROUND:
        value = exp.Round(this=value)
    return exp.Cast(this=value, to=_BIGINT.copy())


def _scaled_to_zero(grid: SumGrid, column: Column | None, dialect: str) -> float | None:
    """How near zero a SUM's value is read as 0 before it is scaled by 1/step, where the
    product could underflow (PostgreSQL fails it): a quarter step, which rounds to 0
    steps anyway. None where no value can come that near zero: the analysis's bound
    on the argument, or its clamp bounds (a bare float column is read as stored)."""
    if dialect not in _UNDERFLOWS or grid.step <= 1.0:
        return None
    bounds = grid.bounds
    own = 0.0 if column is not None and column.type == "float" else bounds.least_nonzero
    least = min([own, *[abs(end) for end in (bounds.lower, bounds.upper) if end != 0]])
    return None if least / grid.step >= MIN_NONZERO else grid.step / 4


def _bare_column(measurement: Measurement, table: Table) -> Column | None:
    """The policy column a SUM adds up as it is (SUM(income)), if it does."""
    if not isinstance(measurement.clamped, exp.Column):
        return None
    return table.column(measurement.clamped.name)


def keyed_hash(dialect: str, seed: int, values: list[exp.Expression]) -> exp.Expression:
    """A hash keyed by a per-release secret: which rows a unit keeps is unpredictable.

    DuckDB's `hash`, Spark's `xxhash64` (the secret as first argument seeds
    the rest) and PostgreSQL's `hashtextextended` take a seed and are fast;
    elsewhere the secret is prefixed to the text of the values under MD5,
    which every common SQL dialect has (sqlglot spells it for each).
    """
    if dialect in _SEEDED_HASHES:
        return exp.Anonymous(
            this=_SEEDED_HASHES[dialect],
            expressions=[exp.convert(seed), *[v.copy() for v in values]],
        )
    texts = [exp.Cast(this=v.copy(), to=_TEXT.copy()) for v in values]
    if dialect == "postgres":
        text = exp.Anonymous(this="concat_ws", expressions=[exp.convert("|"), *texts])
        return exp.Anonymous(this="hashtextextended", expressions=[text, exp.convert(seed)])
    keyed: exp.Expression = exp.convert(str(seed))
    for text in texts:
        # the separator and COALESCE keep NULL and adjacent values apart
        part = exp.Coalesce(this=text, expressions=[exp.convert("")])
        keyed = exp.DPipe(this=exp.DPipe(this=keyed, expression=exp.convert("|")), expression=part)
    return exp.MD5(this=keyed)


def _bounded(
    analysis: Analysis,
    source: exp.Expression,
    unit: exp.Expression,
    keys: list[exp.Expression],
    where: exp.Expression | None,
    seed: int,
    dialect: str,
    earliest_groups: bool = False,
    single: bool = False,
    unit_rows: bool = False,
    group_rank: bool = True,
) -> exp.Expression:
    """The table's rows with each unit's rank of row within group and of group
    (`single`: only the rank of the row among all the unit's rows; not `group_rank`:
    only the rank of the row within its group); `unit_rows`: and the unit's number of
    rows (_UNIT_ROWS)."""
    columns = sorted(
        {c.name for m in analysis.measurements if m.argument is not None
         for c in m.argument.find_all(exp.Column)}
    )  # fmt: skip
    row_hash = keyed_hash(
        dialect, seed, [unit, *keys, *[exp.column(c, quoted=True) for c in columns]]
    )
    row_rank = exp.Window(
        this=exp.RowNumber(),
        partition_by=[unit.copy(), *([] if single else [k.copy() for k in keys])],
        order=exp.Order(expressions=[exp.Ordered(this=row_hash)]),
    ).as_(_ROW_RANK, copy=False)
    items: list[exp.Expression] = [exp.Star(), row_rank]
    if keys and not single and group_rank:
        group_hash = (
            # the unit in the hash: each unit keeps its own random groups (over the keys
            # alone, every unit would keep the groups of the lowest hashes, and one
            # group could lose every unit with more than max_groups_per_unit groups)
            []
            if earliest_groups
            else [exp.Ordered(this=keyed_hash(dialect, seed + 1, [unit, *keys]))]
        )
        items.append(
            exp.Window(
                this=exp.Anonymous(this="DENSE_RANK"),
                partition_by=[unit.copy()],
                # the keys themselves break hash ties, so distinct groups never share a rank
                order=exp.Order(
                    expressions=[
                        *group_hash,
                        *[exp.Ordered(this=k.copy()) for k in keys],
                    ]
                ),
            ).as_(_GROUP_RANK, copy=False)
        )
    if unit_rows:
        # over the last window's partition and order (the unit's), so no sort of its own
        last = items[-1].this
        frame = exp.WindowSpec(
            kind="ROWS", start="UNBOUNDED", start_side="PRECEDING",
            end="UNBOUNDED", end_side="FOLLOWING",
        )  # fmt: skip
        counted = exp.Window(
            this=exp.Count(this=exp.Star()),
            partition_by=[unit.copy()],
            order=last.args["order"].copy(),
            spec=frame,
        )
        items.append(counted.as_(_UNIT_ROWS, copy=False))
    # A row without a unit belongs to nobody we can bound: it is left out.
    owned = exp.Not(this=exp.Is(this=unit.copy(), expression=exp.Null()))
    inner = exp.select(*items, copy=False).from_(source, copy=False).where(owned, copy=False)
    if where is not None:
        inner = inner.where(where, copy=False)
    return inner.subquery(_BOUNDED, copy=False)


def _before_and_kept(analysis: Analysis, cap: int, single: bool) -> list[exp.Expression]:
    """BEFORE_COLUMN and KEPT_COLUMN (rewrite's `before_cap`): each unit's capped row
    count is added once, on its first row of its first group, which every bounding keeps."""
    first: exp.Expression = exp.EQ(this=exp.column(_ROW_RANK), expression=exp.convert(1))
    if analysis.keys and not single:
        first = exp.and_(
            first, exp.EQ(this=exp.column(_GROUP_RANK), expression=exp.convert(1)), copy=False
        )
    return [
        _capped_before(first, cap).as_(BEFORE_COLUMN, copy=False),
        exp.Count(this=exp.Star()).as_(KEPT_COLUMN, copy=False),
    ]


def _capped_before(first: exp.Expression, cap: int) -> exp.Expression:
    """The sum, over the rows where `first` holds (one per unit), of min(_UNIT_ROWS, cap)."""
    return exp.Sum(
        this=exp.Case(ifs=[exp.If(this=first, true=_capped_rows(cap))], default=exp.convert(0))
    )


def _capped_rows(cap: int, rows: str = _UNIT_ROWS) -> exp.Expression:
    """min(`rows`, cap), `rows` a column of a unit's rows."""
    # a CASE, not LEAST: DuckDB's LEAST would be spelled NULL-safe, a CASE more per row
    above = exp.GT(this=exp.column(rows), expression=exp.convert(cap))
    return exp.Case(ifs=[exp.If(this=above, true=exp.convert(cap))], default=exp.column(rows))


def _rank_filter(analysis: Analysis, single: bool) -> exp.Expression:
    table = analysis.table
    condition: exp.Expression = exp.LTE(
        this=exp.column(_ROW_RANK), expression=exp.convert(table.max_rows_per_unit)
    )
    if analysis.keys and not single:
        condition = exp.and_(
            condition,
            exp.LTE(
                this=exp.column(_GROUP_RANK), expression=exp.convert(table.max_groups_per_unit)
            ),
            copy=False,
        )
    return condition


def _per_group_query(
    analysis: Analysis,
    source: exp.Expression,
    unit: exp.Expression,
    keys: list[exp.Expression],
    where: exp.Expression | None,
    seed: int,
    dialect: str,
    measures: list[exp.Expression],
    with_units: bool,
    before_cap: int | None = None,
) -> exp.Select:
    """The bounded COUNTs and SUMs aggregated per unit and group first (docs/relations.md,
    "Bounding per unit and group"): the same rows kept as by _bounded's windows, with the
    row window run only over the units that have a group of more than max_rows_per_unit
    rows, and the group rank over one row per unit and group of the units with more
    than max_groups_per_unit groups only (the others keep all theirs).

    A unit none of whose groups has more than max_rows_per_unit rows keeps every row
    (the row window's ranks would all be within the bound); the others' rows are ranked
    as _bounded ranks them. Which side a unit is on is `unit IN (units over the bound)`
    and its complement, so each unit is counted on exactly one. One row per unit
    (_UNITS, from the per-group rows; without keys the per-group rows are that) says
    which units are over either bound.

    `before_cap` adds the bounding note's two columns (sql/bounding.py): each kept
    (unit, group) row carries the rows it kept, and the first group returned carries
    the sum over all units of min(the unit's rows before the bounding, before_cap), the
    rest 0: the totals over the groups are the windows' (every unit with a row keeps a
    group, so the windows add its capped count on one returned group too).
    """
    table = analysis.table
    max_rows, max_groups = table.max_rows_per_unit, table.max_groups_per_unit
    owned = exp.Not(this=exp.Is(this=unit.copy(), expression=exp.Null()))
    filtered = exp.select(exp.Star(), copy=False).from_(source, copy=False)
    filtered = filtered.where(owned, copy=False)
    if where is not None:
        filtered = filtered.where(where, copy=False)
    unit_column = exp.column(UNIT_KEY, quoted=True)
    key_columns = [exp.column(f"{KEY_PREFIX}{i}", quoted=True) for i in range(len(keys))]
    measured = [exp.column(m.alias, quoted=True) for m in measures]
    rows_column = exp.column(_ROWS, quoted=True)
    noted = before_cap is not None

    def per_group(rows: exp.Expression, counted: bool = True) -> exp.Select:
        items = [
            unit.copy().as_(UNIT_KEY, copy=False),
            *[key.copy().as_(f"{KEY_PREFIX}{i}", copy=False) for i, key in enumerate(keys)],
            *[m.copy() for m in measures],
            *([exp.Count(this=exp.Star()).as_(_ROWS, copy=False)] if counted else []),
        ]
        grouped = [unit.copy(), *[_groupable(key) for key in keys]]
        select = exp.select(*items, copy=False).from_(rows, copy=False)
        return select.group_by(*grouped, copy=False)

    # one row per unit: without keys the per-group rows are, and a unit's rows are _ROWS
    units_table, most_rows, unit_rows = (
        (_UNITS, _MOST_ROWS, _UNIT_ROWS) if keys else (_PER_GROUP, _ROWS, _ROWS)
    )

    def units_where(condition: exp.Expression) -> exp.Expression:
        chosen = exp.select(unit_column.copy(), copy=False).from_(_named(units_table), copy=False)
        return chosen.where(condition, copy=False).subquery()

    # per unit, from its few per-group rows: its largest group, its groups, its rows
    unit_items = [
        unit_column.copy(),
        exp.Max(this=rows_column.copy()).as_(_MOST_ROWS, copy=False),
        exp.Count(this=exp.Star()).as_(_GROUP_COUNT, copy=False),
        *([exp.Sum(this=rows_column.copy()).as_(_UNIT_ROWS, copy=False)] if noted else []),
    ]
    units = exp.select(*unit_items, copy=False).from_(_named(_PER_GROUP), copy=False)
    units = units.group_by(unit_column.copy(), copy=False)
    over = exp.GT(this=exp.column(most_rows), expression=exp.convert(max_rows))
    noted_columns = [rows_column] if noted else []
    within = exp.select(
        unit_column.copy(), *[c.copy() for c in key_columns + measured + noted_columns],
        copy=False,
    ).from_(_named(_PER_GROUP), copy=False)  # fmt: skip
    within = within.where(
        exp.Not(this=exp.In(this=unit_column.copy(), query=units_where(over))), copy=False
    )
    ranked = _bounded(
        analysis, _named(_FILTERED), unit, keys, None, seed, dialect, group_rank=False
    )
    ranked.this.set("where", None)  # its rows are owned and filtered already
    ranked.this.where(exp.In(this=unit.copy(), query=units_where(over.copy())), copy=False)
    beyond = per_group(ranked, counted=noted).where(
        exp.LTE(this=exp.column(_ROW_RANK), expression=exp.convert(max_rows)), copy=False
    )
    kept: exp.Expression = exp.union(within, beyond, distinct=False, copy=False)
    ctes = [(_FILTERED, filtered), (_PER_GROUP, per_group(_named(_FILTERED)))]
    if keys:
        ctes.append((_UNITS, units))
        # one row per unit and group: ROW_NUMBER ranks groups as DENSE_RANK ranked rows,
        # for the units with more than max_groups_per_unit groups only (the others keep
        # all theirs), each unit on one side as above
        ctes.append((_GROUPS, kept))
        crowded = exp.GT(this=exp.column(_GROUP_COUNT), expression=exp.convert(max_groups))
        group_hash = keyed_hash(dialect, seed + 1, [unit_column, *key_columns])
        group_rank = exp.Window(
            this=exp.RowNumber(),
            partition_by=[unit_column.copy()],
            order=exp.Order(
                expressions=[exp.Ordered(this=group_hash)]
                + [exp.Ordered(this=c.copy()) for c in key_columns]
            ),
        ).as_(_GROUP_RANK, copy=False)
        columns = [unit_column, *key_columns, *measured, *noted_columns]
        few = exp.select(*[c.copy() for c in columns], copy=False).from_(
            _named(_GROUPS), copy=False
        )
        few = few.where(
            exp.Not(this=exp.In(this=unit_column.copy(), query=units_where(crowded))),
            copy=False,
        )
        ranked_groups = exp.select(exp.Star(), group_rank, copy=False).from_(
            _named(_GROUPS), copy=False
        )
        ranked_groups = ranked_groups.where(
            exp.In(this=unit_column.copy(), query=units_where(crowded.copy())), copy=False
        )
        chosen = exp.select(*[c.copy() for c in columns], copy=False).from_(
            ranked_groups.subquery(_BOUNDED, copy=False), copy=False
        )
        chosen = chosen.where(
            exp.LTE(this=exp.column(_GROUP_RANK), expression=exp.convert(max_groups)), copy=False
        )
        kept = exp.union(few, chosen, distinct=False, copy=False)
    summed = [
        exp.Coalesce(this=exp.Sum(this=c.copy()), expressions=[exp.convert(0)]).as_(
            c.name, quoted=True, copy=False
        )
        for c in measured
    ]
    units_counted = [exp.Count(this=exp.Star()).as_(UNITS_COLUMN, copy=False)] if with_units else []
    note = _noted_totals(before_cap, units_table, unit_rows) if noted else []
    query = exp.select(
        *[c.copy().as_(c.name, copy=False) for c in key_columns], *summed, *units_counted,
        *note, copy=False,
    ).from_(kept.subquery(_KEPT, copy=False), copy=False)  # fmt: skip
    if keys:
        query = query.group_by(*[c.copy() for c in key_columns], copy=False)
    query.set(
        "with_",
        exp.With(
            expressions=[
                exp.CTE(this=q, alias=exp.TableAlias(this=exp.to_identifier(n))) for n, q in ctes
            ]
        ),
    )
    return query


def _noted_totals(cap: int, units: str, unit_rows: str) -> list[exp.Expression]:
    """_per_group_query's BEFORE_COLUMN and KEPT_COLUMN: on the first group returned, the
    capped count of each unit's rows before the bounding summed over the units (a scalar
    over `units`, one row per unit with its rows in `unit_rows`; 0 on the other groups),
    and on each group the rows it kept."""
    capped = exp.select(
        exp.Coalesce(this=exp.Sum(this=_capped_rows(cap, unit_rows)), expressions=[exp.convert(0)]),
        copy=False,
    ).from_(_named(units), copy=False)
    first = exp.EQ(
        this=exp.Window(this=exp.RowNumber(), partition_by=[]), expression=exp.convert(1)
    )
    return [
        exp.Case(ifs=[exp.If(this=first, true=capped.subquery())], default=exp.convert(0)).as_(
            BEFORE_COLUMN, copy=False
        ),
        exp.Coalesce(
            this=exp.Sum(this=exp.column(_ROWS, quoted=True)), expressions=[exp.convert(0)]
        ).as_(KEPT_COLUMN, copy=False),
    ]


def _named(name: str) -> exp.Table:
    """The table (a CTE) of this name, built without parsing it (exp.to_table parses)."""
    return exp.Table(this=exp.to_identifier(name))
