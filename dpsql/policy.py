"""The privacy policy: load and validate the YAML of DESIGN section 4, with defaults.

Every mistake in a policy is reported as a PolicyError naming the file, the key
and what to write instead; a policy that loads is internally consistent (bounds
ordered, epsilons positive, the privacy unit a declared column). Whether its
tables and columns exist in a database, with the types it declares, is checked
by `Policy.check_schema`, given that database's columns.

The bottom of the layout with accounting and errors, the only two it imports:
every other part reads it, so the names it validates (mechanisms, the local-DP
oracles, their epsilon range) are kept here, not imported from above.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import sqlglot
import yaml
from sqlglot import exp

from dpsql.accounting import Cost
from dpsql.errors import PolicyError

COLUMN_TYPES = ("int", "float", "string", "bool", "date", "timestamp")
NUMERIC_TYPES = ("int", "float")
# PostgreSQL fails a product or quotient of doubles that underflows to zero, so there a
# float value nearer zero than this is read as 0 where the query computes with it, and
# a float column's bounds are 0 or at least this far from it (DESIGN section 3).
NEAR_ZERO = 1e-30
MECHANISMS = ("laplace", "staircase", "gaussian", "auto")
# An epsilon above this protects nothing, and a cost this large would not fit the ledger.
MAX_EPSILON = 1e6
# Groups one query may release from a public domain: a larger domain is never released.
MAX_PUBLIC_KEYS = 1_000_000
# The most rows (or groups) one unit may add. Every sensitivity scales with both, so at
# this bound a count's noise is already a million times a unit's row; beyond it the
# noise swamps any answer, and a product of both no longer fits a float (a SUM's plan
# raised OverflowError after the policy had loaded).
MAX_PER_UNIT = 1_000_000

_TOP_KEYS = {"version", "defaults", "analysts", "tables", "ledger", "data_version", "budget"}
_DEFAULT_KEYS = {"epsilon_per_query", "delta", "mechanism"}
_ANALYST_KEYS = {"epsilon", "delta", "password"}
_TABLE_KEYS = {
    "privacy_unit", "max_groups_per_unit", "max_rows_per_unit", "columns", "local", "source",
    "public", "trust_statistics",
}  # fmt: skip
SOURCE_FORMATS = ("parquet", "csv")
_LOCAL_KEYS = {"mechanism", "epsilon", "domain", "report", "value", "branching"}
_COLUMN_KEYS = {
    "type", "private", "lower", "upper", "values", "public", "nullable", "synopsis", "continual",
}  # fmt: skip
_SYNOPSIS_KEYS = {"bin", "branching", "epsilon", "delta", "mechanism"}
_CONTINUAL_KEYS = {"step", "epsilon", "delta", "mechanism", "history"}
SYNOPSIS_MECHANISMS = ("laplace", "gaussian")
CONTINUAL_MECHANISMS = ("binary", "factorization")
# What a stream assumes of its source's past (docs/continual.md): by default a changed
# released step ends the stream; `mutable` bounds each unit by a record of what it used.
CONTINUAL_HISTORIES = ("append-only", "mutable")
# The local-DP frequency oracles a table of reports may name (`local.mechanism`): the
# names dpsql.ldp.mechanism() builds. Kept here, below dpsql/ldp/, which reads them:
# the policy names them without importing the randomisers.
LOCAL_MECHANISMS = (
    "grr", "sue", "oue", "olh", "hr", "hm", "rappor", "she", "the", "hh", "dse", "rm",
)  # fmt: skip
_TIME_UNITS = {"day": dt.timedelta(days=1), "hour": dt.timedelta(hours=1)}

# The epsilons every local-DP oracle (dpsql/ldp/) randomises and estimates with, so
# what a policy's `local.epsilon` may be. Above 40 a report is the true value with
# probability 1 - e^-40 (it protects nothing), and OLH's hash range e^epsilon + 1 no
# longer fits 64 bits; below 1e-12 (the ledger's quantum) the randomisers'
# probabilities differ from 1/2 in no float digit, and their estimators divide by zero.
LOCAL_EPSILON_RANGE = (1e-12, 40.0)


def require_local_epsilon(epsilon: float) -> None:
    """A ValueError saying the range unless `epsilon` is within LOCAL_EPSILON_RANGE."""
    low, high = LOCAL_EPSILON_RANGE
    if not low <= epsilon <= high:  # NaN fails both comparisons
        raise ValueError(
            f"a local-DP epsilon must be between {low:g} and {high:g}, got {epsilon}: "
            "above it a report is its true value with near certainty, below it nothing "
            "can be estimated"
        )


@dataclass(frozen=True)
class SynopsisSpec:
    """A range-count synopsis declared on a column: bins of `bin`, a `branching`-ary tree.

    `bin` is a number for int/float columns and a timedelta for dates and
    timestamps. `mechanism` is 'laplace' (pure epsilon) or 'gaussian' (zCDP,
    converted with `delta`).
    """

    bin: Any
    epsilon: float
    branching: int = 16
    delta: float = 0.0
    mechanism: str = "laplace"


@dataclass(frozen=True)
class LocalSpec:
    """A table of local-DP reports: each row is one person's randomised report.

    `report` is the column holding the report text (as `dpsql ldp perturb`
    writes it); `value` is the name analysts use for the underlying value in
    SQL (it is not a database column); `domain` is the public list of values.
    """

    mechanism: str
    epsilon: float
    domain: tuple[Any, ...]
    report: str = "report"
    value: str = "value"
    branching: int = 4  # the 'hh' hierarchy only


@dataclass(frozen=True)
class ContinualSpec:
    """Running totals over a column's domain in steps of `step` (the horizon is the domain)."""

    step: Any
    epsilon: float
    delta: float = 0.0
    mechanism: str = "binary"
    history: str = "append-only"  # one of CONTINUAL_HISTORIES


@dataclass(frozen=True)
class Column:
    """One column a policy declares: its type, bounds and whether it is a public key."""

    name: str
    type: str
    private: bool = False
    lower: Any = None
    upper: Any = None
    values: tuple[Any, ...] | None = None
    public: bool = False
    synopsis: SynopsisSpec | None = None
    continual: ContinualSpec | None = None
    # `nullable: false`: the owner says the column holds no NULLs, so COUNT(col) is
    # COUNT(*) and one measurement serves both (sql/outputs.py). A wrong claim biases an
    # AVG, never its privacy: both counts move by the same bound on neighbours.
    nullable: bool = True
    # Stored in a number type the database compares (or converts) through a conversion
    # that can fail row by row: every query reads it as a DOUBLE (read_as_double, set
    # from the database's columns by Policy.as_stored).
    read_as_double: bool = False

    @property
    def bounded(self) -> bool:
        return self.lower is not None and self.upper is not None

    @property
    def public_domain(self) -> tuple[Any, ...] | None:
        """Every key this column can take, when the policy makes them public."""
        if self.values is not None:
            return self.values
        if self.public and self.type == "int" and self.bounded:
            return tuple(range(int(self.lower), int(self.upper) + 1))
        return None


@dataclass(frozen=True)
class Source:
    """Files a table is read from (`source: "parquet:data/events/*.parquet"`)."""

    format: str  # one of SOURCE_FORMATS
    path: str  # a path or glob; one relative to the policy file is made absolute


@dataclass(frozen=True)
class Reference:
    """A table's unit read through another's: `privacy_unit: {via: l_orderkey, references:
    orders.o_orderkey}` makes a lineitem the unit's whose order it references."""

    column: str  # this table's column (lower case)
    table: str  # the referenced table's policy key (lower case)
    target: str  # the referenced column, which the database must keep unique


@dataclass(frozen=True)
class Proven:
    """A range the database proves every stored value of a column lies in, NULL aside
    (sql/proofs.py); a side it proves nothing of is infinite. A finite upper side also
    proves there is no NaN (NaN compares above every number)."""

    column: str  # lower case
    lower: float
    upper: float
    by: str  # what proves it, as EXPLAIN says it


@dataclass(frozen=True)
class Table:
    """A table analysts may query, with its privacy unit and contribution bounds."""

    name: str
    columns: Mapping[str, Column]
    privacy_unit: str | None = None
    max_groups_per_unit: int = 1
    max_rows_per_unit: int = 1
    unique_unit: bool = False  # the database enforces one row per unit (a key)
    local: LocalSpec | None = None  # a table of local-DP reports
    source: Source | None = None  # files the backend registers as this table
    public: bool = False  # no person's data: read freely, answered exactly
    via: Reference | None = None  # the unit is another table's, through this reference
    # For a relation built from several tables (sql/relations.py): the SELECT (a sqlglot
    # tree) computing its rows, which the rewrite reads in place of a stored table.
    relation: Any = None
    # Ranges the database proves of its columns' values, read at connect like unique_unit
    # (sql/proofs.py): the rewrite leaves out the clamps they make redundant.
    proven: tuple[Proven, ...] = ()
    # The owner lets the database's column statistics prove bounds (sql/proofs.py): their
    # proofs show, noiselessly, whether the stored values lie within the declared bounds.
    trust_statistics: bool = False

    def column(self, name: str) -> Column | None:
        """The declared column called `name`, matched case-insensitively as SQL does."""
        return self.columns.get(name.lower())

    def proven_range(self, name: str) -> Proven | None:
        """What the database proves of column `name`'s values, if anything."""
        return next((p for p in self.proven if p.column == name.lower()), None)


@dataclass(frozen=True)
class Defaults:
    epsilon_per_query: float = 1.0
    delta: float = 1e-6
    mechanism: str = "laplace"


@dataclass(frozen=True)
class Policy:
    """A loaded, validated privacy policy."""

    tables: Mapping[str, Table]
    analysts: Mapping[str, Cost]
    defaults: Defaults = Defaults()
    ledger: str | None = None
    data_version: str = ""
    source: str = "<policy>"
    digest: str = field(default="", compare=False)
    # One budget for the whole policy, not per table: tables of one dataset
    # usually hold the same people, so per-table budgets would let analysts
    # who pool their answers spend each person's privacy once per table.
    dataset_budget: Cost | None = None  # all analysts together; None: no shared limit
    # analyst -> SCRAM-SHA-256 verifier ("SCRAM-SHA-256$<iterations>:<salt>$<key>:<key>")
    credentials: Mapping[str, str] = field(default_factory=dict, compare=False)
    # Other names (lower case) the database resolves to a table's entry, to that entry's
    # key: `FROM pums` reads the entry `main.pums` (set by with_spellings at connect).
    spellings: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def sources(self) -> dict[str, Source]:
        """The tables read from files, by key: the backend registers each under its key."""
        return {key: table.source for key, table in self.tables.items() if table.source}

    def table(self, name: str) -> Table | None:
        """The table whose (possibly schema-qualified) key is `name`, case-insensitively,
        or whose key the database resolves to the table `name` reads (spellings)."""
        key = name.lower()
        return self.tables.get(key) or self.tables.get(self.spellings.get(key, ""))

    def with_spellings(self, spellings: Mapping[str, set[str]]) -> Policy:
        """This policy reading each entry under the other names that the database
        resolves to its table (`spellings`: key to names, as the adapter's
        table_spellings gives them). A name that is itself an entry's key stays that
        entry's: two entries of one table are refused before (check_one_entry_per_table)."""
        named = {
            spelling: key
            for key, names in spellings.items()
            for spelling in names
            if spelling not in self.tables
        }
        return replace(self, spellings=named)

    def budget(self, analyst: str) -> Cost:
        try:
            return self.analysts[analyst]
        except KeyError:
            known = ", ".join(sorted(self.analysts)) or "none"
            raise PolicyError(
                f"analyst '{analyst}' has no budget (known analysts: {known}); add "
                f"'analysts: {{{analyst}: {{epsilon: 10.0, delta: 1.0e-5}}}}' to the policy",
                source=self.source,
                key=f"analysts.{analyst}",
            ) from None

    def check_one_entry_per_table(self, identities: Mapping[str, set]) -> None:
        """Refuse two table entries that the database resolves to one table (`identities`
        maps each key to what it reads, by the database's own rules): `census`
        (user-level) beside `main.census` (row-level) let an analyst read the table
        under the weaker entry. `pums` beside `PUMS.PUMS` (SmartNoise's schema PUMS)
        are two tables, and load."""
        seen: dict[Any, str] = {}
        for key, names in identities.items():
            for identity in names:
                other = seen.setdefault(identity, key)
                if other != key:
                    first, second = self.tables[other].name, self.tables[key].name
                    raise PolicyError(
                        f"'{first}' and '{second}' can name the same table in the database, "
                        "and a query could use either entry's protection; keep one entry "
                        "(a query may name its table either way)",
                        source=self.source,
                        key=f"tables.{second}",
                    )

    def with_contribution_bounds(self, rows: int | None, groups: int | None) -> Policy:
        """This policy with every table that has a privacy unit (its own or through a
        reference) bounded to `rows` rows per group and `groups` groups per unit (None:
        its own). The bounds choose utility only: every sensitivity follows them."""
        if rows is None and groups is None:
            return self
        tables = {
            key: replace(
                table,
                max_rows_per_unit=rows or table.max_rows_per_unit,
                max_groups_per_unit=groups or table.max_groups_per_unit,
            )
            if table.privacy_unit or table.via
            else table
            for key, table in self.tables.items()
        }
        return replace(self, tables=tables)

    def with_public_columns(
        self, table_columns: Mapping[str, Mapping[str, str] | None], dialect: str
    ) -> Policy:
        """The policy with the columns of each public table that lists none read from the
        database (`table_columns`, as `check_schema` takes it): each column whose stored
        type a policy type fits, under the first that does; others stay unreadable."""
        tables = dict(self.tables)
        for key, table in self.tables.items():
            actual = table_columns.get(key)
            if not table.public or table.columns or actual is None:
                continue
            columns = {}
            for name, stored in actual.items():
                fits = stored_types(stored, dialect)
                if fits and dialect != "sqlite":
                    columns[name] = Column(name=name, type=fits[0])
                elif fits:  # SQLite: every type fits; read the declared type's affinity
                    columns[name] = Column(name=name, type=sqlite_type(stored))
            tables[key] = replace(table, columns=columns)
        return replace(self, tables=tables)

    def as_stored(
        self, table_columns: Mapping[str, Mapping[str, str] | None], dialect: str
    ) -> Policy:
        """This policy with each float column marked to be read as a DOUBLE where the
        database stores it in a type `read_as_double` names (`table_columns` as for
        check_schema, which it follows)."""
        tables = {}
        for key, table in self.tables.items():
            stored = table_columns.get(key) or {}
            columns = {
                name: replace(column, read_as_double=True)
                if column.type == "float" and read_as_double(stored.get(name, ""), dialect)
                else column
                for name, column in table.columns.items()
            }
            tables[key] = replace(table, columns=columns)
        return replace(self, tables=tables)

    def check_schema(
        self, table_columns: Mapping[str, Mapping[str, str] | None], dialect: str
    ) -> None:
        """Refuse a policy whose tables, columns or column types the database does not have.

        `table_columns` maps each policy table key to the database's columns for it
        (lower-case name to type, spelled in sqlglot's `dialect`), or None when the
        database has no such table.
        """
        for key, table in self.tables.items():
            actual = table_columns.get(key)
            if actual is None:
                raise PolicyError(
                    f"table '{table.name}' is not in the database; correct the name or "
                    "remove the entry",
                    source=self.source,
                    key=f"tables.{table.name}",
                )
            if table.local is not None and table.local.report.lower() not in actual:
                raise PolicyError(
                    f"report column '{table.local.report}' is not in table '{table.name}' "
                    f"(it has: {', '.join(sorted(actual))}); name it with 'local: {{report: ...}}'",
                    source=self.source,
                    key=f"tables.{table.name}.local.report",
                )
            for column in table.columns.values():
                where = f"tables.{table.name}.columns.{column.name}"
                stored = actual.get(column.name.lower())
                if stored is None:
                    raise PolicyError(
                        f"column '{column.name}' is not in table '{table.name}' (it has: "
                        f"{', '.join(sorted(actual))}; names are read as the database folds "
                        "unquoted names, so a column created in quotes in another case, such "
                        'as "Income" in PostgreSQL, is read through a view that renames it)',
                        source=self.source,
                        key=where,
                    )
                fits = stored_types(stored, dialect)
                if column.type not in fits:
                    raise PolicyError(
                        f"column '{column.name}' is declared {column.type} but the database "
                        f"stores it as {stored}; a database that converts its values row by "
                        "row could fail on some rows, revealing them. "
                        + _declare_instead(fits, table.name, stored, dialect),
                        source=self.source,
                        key=f"{where}.type",
                    )


# The database types each policy type may declare. An int column is widened to
# BIGINT, which these reach without overflow (a DOUBLE could hold NaN, a HUGEINT
# more than BIGINT); a float one to DOUBLE, which any number reaches.
_BIGINT_FITS = ("tinyint", "utinyint", "smallint", "usmallint", "mediumint", "umediumint",
                "int", "uint", "bigint")  # fmt: skip


def stored_types(stored: str, dialect: str) -> tuple[str, ...]:
    """The policy types a column stored as `stored` (a type as `dialect` writes it) may
    be declared as; every type for SQLite, whose columns hold values of any type."""
    if not stored.strip() or dialect == "sqlite":
        return COLUMN_TYPES  # SQLite's values carry their own types; it fails no conversion
    data_type = _parsed(stored, dialect)
    if data_type is None:
        return ()
    kinds = {
        "int": data_type.is_type(*_BIGINT_FITS),
        "float": data_type.is_type(*exp.DataType.NUMERIC_TYPES)
        # MONEY has no cast to double precision; BIT (a NUMERIC_TYPE to sqlglot) is bits
        and not data_type.is_type(exp.DataType.Type.MONEY, exp.DataType.Type.BIT),
        "string": data_type.is_type(*exp.DataType.TEXT_TYPES),
        "bool": data_type.is_type("boolean"),
        "date": data_type.is_type("date"),
        "timestamp": data_type.is_type(*exp.DataType.TEMPORAL_TYPES)
        # DuckDB's TIMESTAMP_NS holds only the years 1677-2262, and DuckDB converts a
        # date or timestamp compared with it to it row by row, failing outside them
        and not data_type.is_type("date", "time", "timetz", exp.DataType.Type.TIMESTAMP_NS),
    }
    return tuple(kind for kind, fits in kinds.items() if fits)


def sqlite_type(stored: str) -> str:
    """The policy type of a SQLite column by its declared type's affinity (SQLite rules)."""
    declared = stored.upper()
    if "INT" in declared:
        return "int"
    if any(word in declared for word in ("REAL", "FLOA", "DOUB", "NUM", "DEC")):
        return "float"
    return "string"


def _parsed(stored: str, dialect: str) -> exp.DataType | None:
    try:
        return exp.DataType.build(stored, dialect=dialect)
    except (sqlglot.errors.SqlglotError, ValueError):
        return None


_DUCKDB_COMMON_TYPE_HAZARDS = (
    exp.DataType.Type.DECIMAL, exp.DataType.Type.INT128, exp.DataType.Type.UINT128,
    exp.DataType.Type.UBIGINT,
)  # fmt: skip


def read_as_double(stored: str, dialect: str) -> bool:
    """Whether a float column stored as `stored` must be read as a DOUBLE, in every
    comparison too, because reading it as stored can fail for some rows.

    DuckDB compares a DECIMAL, HUGEINT, UHUGEINT or UBIGINT with a constant or
    another column in a common type it converts to row by row:
    `amount < 99999999999999999999999999999999999999` (a DECIMAL(38,2)), `x = age`
    (a DECIMAL(38,37)) and `uh > -1` (a UHUGEINT) failed only for some rows.
    CAST(column AS DOUBLE) never fails for any of them (the largest, a UHUGEINT,
    is below 3.5e38), and a DOUBLE compares with every number DuckDB has without
    a conversion that can fail. A PostgreSQL `numeric` without a precision (or of
    more than 307 digits on either side of the point) holds values beyond 1e308
    and nonzero ones below 1e-307, whose conversion to double precision
    PostgreSQL fails (it rounds neither to infinity nor to zero): the rewrite reads
    it through a guard that makes those infinite or 0 first
    (rewrite.read_double). A `numeric` of smaller precision converts without
    failing and compares exactly as stored. Other engines' decimals have at most
    38 digits.
    """
    data_type = _parsed(stored, dialect) if stored.strip() else None
    if data_type is None:
        return False
    if dialect == "duckdb":
        return data_type.is_type(*_DUCKDB_COMMON_TYPE_HAZARDS)
    if dialect != "postgres" or not data_type.is_type(exp.DataType.Type.DECIMAL):
        return False
    digits = [int(param.name) for param in data_type.expressions]
    if not digits:
        return True
    precision, scale = digits[0], digits[1] if len(digits) > 1 else 0
    return precision - scale > 307 or scale > 307


def _declare_instead(fits: tuple[str, ...], table: str, stored: str, dialect: str) -> str:
    data_type = _parsed(stored, dialect)
    if data_type is not None and data_type.is_type(exp.DataType.Type.TIMESTAMP_NS):
        return (
            "DuckDB converts a date or timestamp compared with a TIMESTAMP_NS to it row by "
            "row, which fails outside the years 1677-2262: declare a view over "
            f"{table} with CAST(column AS TIMESTAMP), which never fails, and name the view."
        )
    if fits:
        return f"Declare it as {' or '.join(fits)}."
    return (
        f"dpsql reads no policy type from that; expose the column through a view over "
        f"{table} that casts it to a plain number, text, date or timestamp."
    )


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping.

    PyYAML keeps the last of duplicate keys without a word (it has no option to
    refuse them), so `default:` given twice, or `private: true, private: false`,
    loaded the later and weaker entry silently.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults`: keys written beside it override its, as meant
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice; keep one", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_policy(source: str | os.PathLike | Mapping[str, Any]) -> Policy:
    """Load a policy from a YAML file path, YAML text, or an already parsed mapping."""
    if isinstance(source, Mapping):
        return _build(dict(source), "<policy dict>")
    path = Path(source)
    if "\n" not in str(source) and path.suffix in (".yaml", ".yml", ".json"):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyError(
                f"cannot read the policy file: {exc.strerror}", source=str(path)
            ) from None
        name = str(path)
    else:
        text, name = str(source), "<policy text>"
    try:
        document = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no Python objects
    except yaml.YAMLError as exc:
        raise PolicyError(f"not valid YAML: {exc}", source=name) from None
    if not isinstance(document, dict):
        raise PolicyError("the policy must be a YAML mapping with a 'tables' key", source=name)
    return _build(document, name)


def _require_new(read: _Reader, known: dict, name: str, key: str, what: str) -> None:
    """Refuse a second entry of one name in another case: SQL names are case-insensitive,
    so 'State' and 'state' are one column, and the later entry silently replaced the
    earlier (a private column became public)."""
    earlier = known.get(name.lower())
    if earlier is not None:
        raise read.fail(
            f"{key}.{name}",
            f"'{earlier.name}' and '{name}' name the same {what} (SQL does not tell them "
            "apart by case); keep one entry",
        )


class _Reader:
    """Validation helpers that know which file and key they are reading."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, message: str) -> PolicyError:
        return PolicyError(message, source=self.source, key=key)

    def mapping(self, value: Any, key: str) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a mapping, got {type(value).__name__}")
        return value

    def names(self, value: Any, key: str) -> dict:
        """A mapping keyed by names (tables, columns, analysts). YAML reads an unquoted
        `1:`, `true:` or `null:` as a number, boolean or null: such a key became a name
        like 'True' or 'None', and beside a text key crashed the digest's sort."""
        spec = self.mapping(value, key)
        for name in spec:
            if not isinstance(name, str):
                raise self.fail(
                    f"{key}.{name}",
                    f"a name must be text, but YAML read this unquoted one as {name!r} "
                    "(1, true and null are not text); quote it as written, e.g. '1': or 'true':",
                )
            if not name:
                raise self.fail(f"{key}.''", "a name cannot be empty; give it one")
        return spec

    def known_keys(self, value: dict, allowed: set[str], key: str) -> None:
        for name in value:
            if name not in allowed:
                raise self.fail(
                    f"{key}.{name}" if key else str(name),
                    f"unknown key; allowed here: {', '.join(sorted(allowed))}",
                )

    def positive(self, value: Any, key: str, *, allow_zero: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"must be a number, got {value!r}")
        number = _finite_float(value)
        if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
            want = "a non-negative" if allow_zero else "a positive"
            raise self.fail(key, f"must be {want} finite number, got {value!r}")
        return number

    def epsilon(self, value: Any, key: str) -> float:
        """A per-query or per-release epsilon: positive, finite and at most MAX_EPSILON."""
        number = self.positive(value, key)
        if number > MAX_EPSILON:
            raise self.fail(key, f"must be at most {MAX_EPSILON:g}, got {value!r}")
        return number

    def probability(self, value: Any, key: str) -> float:
        number = self.positive(value, key, allow_zero=True)
        if number >= 1:
            raise self.fail(key, f"delta must be below 1 (e.g. 1.0e-6), got {value!r}")
        return number

    def count(self, value: Any, key: str, *, most: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(key, f"must be a whole number >= 1, got {value!r}")
        if most is not None and value > most:
            raise self.fail(
                key,
                f"must be at most {most:,}, got {value:,}: the noise grows with it, and "
                "beyond that swamps any answer; bound what one unit adds more tightly",
            )
        return value


def _build(document: dict, source: str) -> Policy:
    read = _Reader(source)
    read.known_keys(document, _TOP_KEYS, "")
    if document.get("version", 1) != 1:
        raise read.fail("version", "only policy version 1 exists; write 'version: 1'")
    defaults = _defaults(read, read.mapping(document.get("defaults"), "defaults"))
    raw_analysts = read.names(document.get("analysts"), "analysts")
    analysts = _analysts(read, raw_analysts)
    raw_tables = read.names(document.get("tables"), "tables")
    if not raw_tables:
        raise read.fail(
            "tables", "declare at least one table, e.g. 'tables: {pums: {columns: ...}}'"
        )
    tables = {}
    for name, spec in raw_tables.items():
        table = _table(read, name, read.mapping(spec, f"tables.{name}"))
        _require_new(read, tables, table.name, "tables", "table")
        tables[table.name.lower()] = table
    _check_references(read, tables)
    return Policy(
        tables=tables,
        analysts=analysts,
        defaults=defaults,
        ledger=_ledger(read, document.get("ledger")),
        data_version=str(document.get("data_version", "")),
        source=source,
        digest=_digest(document),
        credentials=_credentials(read, raw_analysts),
        dataset_budget=_dataset_budget(read, document.get("budget")),
    )


def _ledger(read: _Reader, value: Any) -> str | None:
    """The ledger's path or URL, if the policy names one. An empty one was taken as
    none, and the budget silently went to the default ledger instead."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise read.fail(
            "ledger",
            f"must be a path or URL of the ledger, e.g. 'ledger: budget.sqlite', got {value!r}; "
            "remove the key to use the default ledger",
        )
    return value


def _digest(document: dict) -> str:
    """A hash of what the policy says about data and privacy, keyed into cached releases.

    Password verifiers are left out: changing a password changes nothing a release depends on,
    so it must not make every cached release (and its free repeat) disappear.
    """
    analysts = document.get("analysts")
    if isinstance(analysts, dict):
        document = document | {
            "analysts": {
                name: {k: v for k, v in spec.items() if k != "password"}
                if isinstance(spec, dict)
                else spec
                for name, spec in analysts.items()
            }
        }
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()


def _defaults(read: _Reader, spec: dict) -> Defaults:
    read.known_keys(spec, _DEFAULT_KEYS, "defaults")
    base = Defaults()
    mechanism = spec.get("mechanism", base.mechanism)
    if mechanism not in MECHANISMS:
        raise read.fail(
            "defaults.mechanism", f"unknown mechanism {mechanism!r}; choose one of {MECHANISMS}"
        )
    return Defaults(
        epsilon_per_query=read.epsilon(
            spec.get("epsilon_per_query", base.epsilon_per_query), "defaults.epsilon_per_query"
        ),
        delta=read.probability(spec.get("delta", base.delta), "defaults.delta"),
        mechanism=mechanism,
    )


def _analysts(read: _Reader, spec: dict) -> dict[str, Cost]:
    if not spec:
        raise read.fail(
            "analysts",
            "declare each analyst's total budget, e.g. 'analysts: {default: "
            "{epsilon: 10.0, delta: 1.0e-5}}'",
        )
    analysts = {}
    for name, budget in spec.items():
        problem = analyst_name_problem(name)
        if problem:  # the key is left out of the path: it may hold a newline
            raise read.fail("analysts", f"{problem}; rename the analyst")
        analysts[name] = _budget(read, budget, f"analysts.{name}", _ANALYST_KEYS)
    return analysts


def analyst_name_problem(name: str) -> str | None:
    """What is wrong with an analyst name, or None. The rule `dpsql passwd` applies to
    its users file (one 'analyst:verifier' line each): a control character split a line
    or an entry, a colon ended the name early, and surrounding spaces made two names
    that look alike. The ledger's own accounts start with '*' (e.g. *dataset*)."""
    if not name:
        return "an analyst name cannot be empty"
    if name.startswith("*"):
        return "analyst names starting with '*' are reserved"
    if ":" in name or name != name.strip() or not name.isprintable():
        return f"invalid analyst name {name!r}: no colons, control characters or surrounding spaces"
    return None


def _dataset_budget(read: _Reader, spec: Any) -> Cost | None:
    return None if spec is None else _budget(read, spec, "budget", {"epsilon", "delta"})


def _budget(read: _Reader, raw: Any, key: str, allowed: set[str]) -> Cost:
    """A total (epsilon, delta): an analyst's, or the dataset's that all analysts share."""
    spec = read.mapping(raw, key)
    read.known_keys(spec, allowed, key)
    if "epsilon" not in spec:
        raise read.fail(key, "missing 'epsilon' (the total budget), e.g. epsilon: 10.0")
    return Cost.of(
        read.positive(spec["epsilon"], f"{key}.epsilon"),
        read.probability(spec.get("delta", 0.0), f"{key}.delta"),
    )


def _credentials(read: _Reader, spec: dict) -> dict[str, str]:
    credentials = {}
    for name, entry in spec.items():
        verifier = entry.get("password")
        if verifier is None:
            continue
        if not isinstance(verifier, str) or not verifier.startswith("SCRAM-SHA-256$"):
            raise read.fail(
                f"analysts.{name}.password",
                "must be a SCRAM-SHA-256 verifier, never a plain password; create one with "
                "'dpsql passwd <analyst>'",
            )
        credentials[name] = verifier
    return credentials


def _table(read: _Reader, name: str, spec: dict) -> Table:
    key = f"tables.{name}"
    read.known_keys(spec, _TABLE_KEYS, key)
    if "local" in spec:
        return _local_table(read, name, spec, key)
    if _flag(read, spec, "public", key):
        return _public_table(read, name, spec, key)
    raw_columns = read.names(spec.get("columns"), f"{key}.columns")
    if not raw_columns:
        raise read.fail(f"{key}.columns", "declare the columns analysts may use")
    columns = {}
    for column_name, column_spec in raw_columns.items():
        column = _column(
            read,
            column_name,
            read.mapping(column_spec, f"{key}.columns.{column_name}"),
            f"{key}.columns.{column_name}",
        )
        _require_new(read, columns, column.name, f"{key}.columns", "column")
        columns[column.name.lower()] = column
    unit = spec.get("privacy_unit")
    via = None
    if isinstance(unit, Mapping):
        via = _reference(read, unit, columns, f"{key}.privacy_unit")
        columns[via.column] = replace(columns[via.column], private=True)
        unit = None
    if unit is not None:
        if str(unit).lower() not in columns:
            raise read.fail(
                f"{key}.privacy_unit",
                f"'{unit}' is not a declared column; declare it under columns "
                f"(e.g. '{unit}: {{type: int, private: true}}') or omit privacy_unit for "
                "row-level privacy",
            )
        unit = str(unit).lower()
        if not columns[unit].private:
            # The unit identifies a person: grouping or filtering on it would isolate one.
            columns[unit] = replace(columns[unit], private=True)
    bounds = {
        part: read.count(spec.get(part, 1), f"{key}.{part}", most=MAX_PER_UNIT)
        for part in ("max_groups_per_unit", "max_rows_per_unit")
    }
    if unit is None and via is None and any(value != 1 for value in bounds.values()):
        raise read.fail(
            key,
            "max_groups_per_unit and max_rows_per_unit need a privacy_unit; without one each "
            "row is its own unit and both are 1",
        )
    source = _source(read, spec["source"], f"{key}.source") if "source" in spec else None
    if source is not None and "." in name:
        raise read.fail(
            f"{key}.source",
            "a table read from files is registered under its name, which cannot have a "
            f"schema; name it without one (e.g. '{name.rsplit('.', 1)[1]}')",
        )
    trust = _flag(read, spec, "trust_statistics", key)
    return Table(
        name=name,
        columns=columns,
        privacy_unit=unit,
        source=source,
        via=via,
        trust_statistics=trust,
        **bounds,
    )


def _reference(read: _Reader, spec: Mapping, columns: dict[str, Column], key: str) -> Reference:
    """`{via: column, references: table.column}`, checked against this table's columns
    (the referenced table is checked once every table is read: `_check_references`)."""
    read.known_keys(dict(spec), {"via", "references"}, key)
    column, target = spec.get("via"), spec.get("references")
    if not isinstance(column, str) or column.lower() not in columns:
        raise read.fail(
            f"{key}.via",
            f"'{column}' is not a declared column; name the column holding the referenced "
            "row's key, e.g. 'privacy_unit: {via: l_orderkey, references: orders.o_orderkey}'",
        )
    if not isinstance(target, str) or "." not in target:
        raise read.fail(
            f"{key}.references", f"write the referenced column as table.column, got {target!r}"
        )
    table, _, referenced = target.lower().rpartition(".")
    return Reference(column.lower(), table, referenced)


def _check_references(read: _Reader, tables: Mapping[str, Table]) -> None:
    """Each reference names a declared column of a table with a unit of its own."""
    for table in tables.values():
        if table.via is None:
            continue
        key = f"tables.{table.name}.privacy_unit.references"
        target = tables.get(table.via.table)
        if target is None or target.privacy_unit is None:
            raise read.fail(
                key,
                f"'{table.via.table}' is not a table of the policy with a privacy_unit of its "
                "own; a reference leads to the table that says whose each row is",
            )
        if target.column(table.via.target) is None:
            raise read.fail(key, f"'{table.via.target}' is not a declared column of {target.name}")


def _public_table(read: _Reader, name: str, spec: dict, key: str) -> Table:
    """A table holding no person's data (a dimension: nations, products, calendars).

    Its columns may be listed (each public, with its type); with none listed, every
    column the database has is read at connect (`Policy.with_public_columns`)."""
    for part in ("privacy_unit", "max_groups_per_unit", "max_rows_per_unit", "local"):
        if part in spec:
            raise read.fail(
                f"{key}.{part}",
                "a public table holds no person's data, so it has no privacy unit or "
                "contribution bounds; remove 'public: true' if it does",
            )
    columns = {}
    raw_columns = spec.get("columns")
    if raw_columns is not None:
        for column_name, column_spec in read.names(raw_columns, f"{key}.columns").items():
            where = f"{key}.columns.{column_name}"
            column = _column(read, column_name, read.mapping(column_spec, where), where)
            if column.private:
                raise read.fail(f"{where}.private", "a public table has no private columns")
            _require_new(read, columns, column.name, f"{key}.columns", "column")
            columns[column.name.lower()] = column
    source = _source(read, spec["source"], f"{key}.source") if "source" in spec else None
    return Table(name=name, columns=columns, source=source, public=True)


def _source(read: _Reader, value: Any, key: str) -> Source:
    kind, _, path = value.partition(":") if isinstance(value, str) else ("", "", "")
    if kind not in SOURCE_FORMATS or not path:
        raise read.fail(
            key,
            f"must be '<format>:<path or glob>' with format {' or '.join(SOURCE_FORMATS)}, "
            f"e.g. 'parquet:data/events/*.parquet'; got {value!r}",
        )
    # Like the ledger, a relative path means: beside the policy file. URLs
    # (s3a://, hdfs://) and absolute paths are taken as written.
    if "://" not in path and not os.path.isabs(path) and Path(read.source).is_file():
        path = str(Path(read.source).resolve().parent / path)
    return Source(kind, path)


def _local_table(read: _Reader, name: str, spec: dict, key: str) -> Table:
    extra = sorted(set(spec) - {"local"})
    if extra:
        raise read.fail(
            f"{key}.{extra[0]}",
            "a table of local reports takes only 'local: {...}': privacy was spent on the "
            "clients, so it has no privacy unit, bounds or columns",
        )
    local = read.mapping(spec["local"], f"{key}.local")
    read.known_keys(local, _LOCAL_KEYS, f"{key}.local")
    mechanism = _choice(read, local.get("mechanism"), LOCAL_MECHANISMS, f"{key}.local")
    domain = _local_domain(read, local.get("domain"), f"{key}.local.domain")
    names = {}
    for part in ("report", "value"):
        names[part] = local.get(part, part)
        if not isinstance(names[part], str) or not names[part].isidentifier():
            raise read.fail(f"{key}.local.{part}", f"must be a column name, got {names[part]!r}")
    branching = local.get("branching", 4)
    if isinstance(branching, bool) or not isinstance(branching, int) or branching < 2:
        raise read.fail(f"{key}.local.branching", f"must be a whole number >= 2, got {branching!r}")
    epsilon = _required_epsilon(read, local, f"{key}.local")
    try:
        require_local_epsilon(epsilon)
    except ValueError as exc:
        raise read.fail(f"{key}.local.epsilon", str(exc)) from None
    spec_local = LocalSpec(
        mechanism=mechanism,
        epsilon=epsilon,
        domain=domain,
        branching=branching,
        **names,
    )
    return Table(name=name, columns={}, local=spec_local)


def _local_domain(read: _Reader, raw: Any, key: str) -> tuple[Any, ...]:
    """The values local reports may hold: a list, or the whole numbers of a range, whose
    size is checked before the range is built (a range of 10^8 built a list for minutes)."""
    if isinstance(raw, dict) and set(raw) == {"lower", "upper"}:
        lower, upper = raw["lower"], raw["upper"]
        if not all(isinstance(b, int) and not isinstance(b, bool) for b in (lower, upper)):
            raise read.fail(key, f"a range needs whole-number bounds, got {lower!r} and {upper!r}")
        _require_releasable(read, upper - lower + 1, key, "collect a coarser value")
        raw = list(range(lower, upper + 1))
    elif isinstance(raw, list):
        _require_releasable(read, len(raw), key, "collect a coarser value")
    if (
        not isinstance(raw, list)
        or len(raw) < 2
        or any(isinstance(value, list | dict) for value in raw)
        or len(set(map(repr, raw))) < len(raw)
    ):
        raise read.fail(
            key,
            "must list the distinct values reports may hold (at least two), e.g. "
            "'domain: [a, b, c]' or 'domain: {lower: 0, upper: 99}'",
        )
    return tuple(raw)


def _require_releasable(read: _Reader, size: int, key: str, instead: str) -> None:
    """Refuse a domain with more values than one query may release (MAX_PUBLIC_KEYS),
    counted before any list of them is built."""
    if size > MAX_PUBLIC_KEYS:
        raise read.fail(
            key,
            f"a domain of {size:,} values is more than one query may release "
            f"({MAX_PUBLIC_KEYS:,}): {instead}",
        )


# What each policy type's public values must be; dates and timestamps also as ISO text.
_VALUE_TYPES = {"int": int, "float": int | float, "string": str, "bool": bool,
                "date": dt.date, "timestamp": dt.date}  # fmt: skip
# Dates and timestamps as text every backend reads the same: Python's fromisoformat also
# takes '20200103' and '2020-W01-1', which Spark fails to cast (after the charge).
ISO_TEXT = {
    "date": re.compile(r"\d{4}-\d{2}-\d{2}"),
    "timestamp": re.compile(r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?"),
}


def _of_type(value: Any, kind: str) -> bool:
    if isinstance(value, bool) and kind != "bool":  # YAML's true is an int to Python
        return False
    if isinstance(value, str) and kind in ("date", "timestamp"):
        if not ISO_TEXT[kind].fullmatch(value):
            return False
        try:
            dt.datetime.fromisoformat(value)
        except ValueError:
            return False
        return True
    return isinstance(value, _VALUE_TYPES[kind])


def _public_values(read: _Reader, values: Any, kind: str, key: str) -> tuple[Any, ...]:
    """The declared public keys: distinct values of the column's type (the rewrite writes
    them into the SQL, where one of another type failed after the charge)."""
    if not isinstance(values, list) or not values:
        raise read.fail(key, "must be a non-empty list of the public keys")
    for value in values:
        if not _of_type(value, kind):
            raise read.fail(
                key, f"must list {kind} values, got {value!r}; write each as the column holds it"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise read.fail(key, f"must list finite numbers, got {value!r}; remove it")
    if len(set(values)) != len(values):
        raise read.fail(
            key, f"lists a value twice: {sorted(values, key=str)!r}; list each key once"
        )
    return tuple(values)


def _flag(read: _Reader, spec: dict, name: str, key: str, default: bool = False) -> bool:
    """A yes/no setting, written true or false: bool() made a quoted 'false' or 'no'
    true (a public key domain nobody asked for)."""
    value = spec.get(name, default)
    if not isinstance(value, bool):
        raise read.fail(f"{key}.{name}", f"must be true or false (unquoted), got {value!r}")
    return value


def _column(read: _Reader, name: str, spec: dict, key: str) -> Column:
    read.known_keys(spec, _COLUMN_KEYS, key)
    kind = spec.get("type")
    if kind not in COLUMN_TYPES:
        raise read.fail(f"{key}.type", f"must be one of {', '.join(COLUMN_TYPES)}, got {kind!r}")
    lower = _bound(read, spec.get("lower"), kind, f"{key}.lower")
    upper = _bound(read, spec.get("upper"), kind, f"{key}.upper")
    if (lower is None) != (upper is None):
        raise read.fail(key, "give both 'lower' and 'upper', or neither")
    if lower is not None and _ordered(lower) > _ordered(upper):
        raise read.fail(key, f"lower ({lower}) is greater than upper ({upper}); swap them")
    values = spec.get("values")
    if values is not None:
        values = _public_values(read, values, kind, f"{key}.values")
    private = _flag(read, spec, "private", key)
    public = _flag(read, spec, "public", key)
    if public and not (values is not None or (kind == "int" and lower is not None)):
        raise read.fail(
            f"{key}.public",
            "a public key domain needs 'values: [...]' or integer 'lower'/'upper'",
        )
    if public and values is None:
        _require_releasable(
            read, upper - lower + 1, f"{key}.public", "drop 'public', or group by a coarser column"
        )
    if private and (public or values is not None):
        raise read.fail(key, "a private column cannot also have a public domain")
    return Column(
        name=name,
        type=kind,
        private=private,
        lower=lower,
        upper=upper,
        values=values,
        public=public,
        nullable=_flag(read, spec, "nullable", key, default=True),
        synopsis=_synopsis(read, spec.get("synopsis"), kind, lower, f"{key}.synopsis"),
        continual=_continual(read, spec.get("continual"), kind, lower, f"{key}.continual"),
    )


def _over_domain(
    read: _Reader,
    raw: Any,
    kind: str,
    lower: Any,
    key: str,
    allowed: set[str],
    mechanisms: tuple[str, ...],
) -> tuple[dict, str]:
    """A synopsis or stream entry (its mapping and mechanism, the first one by default),
    on a column whose ordered domain the policy bounds."""
    spec = read.mapping(raw, key)
    read.known_keys(spec, allowed, key)
    if kind not in ("int", "float", "date", "timestamp"):
        raise read.fail(key, f"needs an int, float, date or timestamp column, not {kind}")
    if lower is None:
        raise read.fail(key, "needs the column's 'lower' and 'upper' (the domain it covers)")
    return spec, _choice(read, spec.get("mechanism", mechanisms[0]), mechanisms, key)


def _synopsis(read: _Reader, raw: Any, kind: str, lower: Any, key: str) -> SynopsisSpec | None:
    if raw is None:
        return None
    spec, mechanism = _over_domain(read, raw, kind, lower, key, _SYNOPSIS_KEYS, SYNOPSIS_MECHANISMS)
    branching = spec.get("branching", 16)
    if isinstance(branching, bool) or not isinstance(branching, int) or branching < 2:
        raise read.fail(f"{key}.branching", f"must be a whole number >= 2, got {branching!r}")
    return SynopsisSpec(
        bin=_width(read, spec.get("bin", 1), kind, f"{key}.bin"),
        epsilon=_required_epsilon(read, spec, key),
        branching=branching,
        delta=_mechanism_delta(read, spec, mechanism == "gaussian", key),
        mechanism=mechanism,
    )


def _continual(read: _Reader, raw: Any, kind: str, lower: Any, key: str) -> ContinualSpec | None:
    if raw is None:
        return None
    spec, mechanism = _over_domain(
        read, raw, kind, lower, key, _CONTINUAL_KEYS, CONTINUAL_MECHANISMS
    )
    return ContinualSpec(
        step=_width(read, spec.get("step", 1), kind, f"{key}.step"),
        epsilon=_required_epsilon(read, spec, key),
        delta=_mechanism_delta(read, spec, mechanism == "factorization", key),
        mechanism=mechanism,
        history=_history(read, spec.get("history", "append-only"), f"{key}.history"),
    )


def _history(read: _Reader, value: Any, key: str) -> str:
    if value not in CONTINUAL_HISTORIES:
        raise read.fail(
            key,
            f"must be one of {', '.join(CONTINUAL_HISTORIES)}, got {value!r} (mutable: rows "
            "of released steps may be updated or deleted)",
        )
    return value


def _choice(read: _Reader, value: Any, allowed: tuple[str, ...], key: str) -> str:
    if value not in allowed:
        raise read.fail(f"{key}.mechanism", f"must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _required_epsilon(read: _Reader, spec: dict, key: str) -> float:
    if "epsilon" not in spec:
        raise read.fail(key, "missing 'epsilon' (what building it costs), e.g. epsilon: 1.0")
    return read.epsilon(spec["epsilon"], f"{key}.epsilon")


def _mechanism_delta(read: _Reader, spec: dict, needs_delta: bool, key: str) -> float:
    if not needs_delta:
        if "delta" in spec:
            raise read.fail(f"{key}.delta", "only a zCDP mechanism takes a delta; remove it")
        return 0.0
    if "delta" not in spec:
        raise read.fail(key, "a zCDP mechanism needs 'delta' for the conversion, e.g. 1.0e-9")
    return read.probability(spec["delta"], f"{key}.delta")


def _width(read: _Reader, value: Any, kind: str, key: str) -> Any:
    """A bin or step width: a positive number, or '<n> day(s)|hour(s)' for dates and times."""
    if kind in NUMERIC_TYPES:
        width = read.positive(value, key)
        if kind == "int" and not float(width).is_integer():
            raise read.fail(key, f"must be a whole number for an int column, got {value!r}")
        return int(width) if kind == "int" else width
    count, _, unit = str(value).strip().partition(" ")
    unit = unit.strip().lower().removesuffix("s")
    if not count.isdigit() or int(count) < 1 or unit not in _TIME_UNITS:
        raise read.fail(key, f"must be like '1 day' or '6 hours', got {value!r}")
    if kind == "date" and unit == "hour":
        raise read.fail(key, "a date column has bins of whole days, e.g. '1 day'")
    return int(count) * _TIME_UNITS[unit]


def _finite_float(value: int | float) -> float:
    """`value` as a float, infinite where an integer is beyond a float's range (float()
    raised OverflowError there, a traceback instead of the policy's message)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _ordered(bound: Any) -> Any:
    """A bound as it orders: a date beside a timestamp is midnight of that day, as running
    totals and synopses read a date bound of a timestamp column (comparing a date with a
    datetime raised TypeError). Numbers are themselves."""
    if isinstance(bound, dt.date) and not isinstance(bound, dt.datetime):
        return dt.datetime.combine(bound, dt.time())
    return bound


def _bound(read: _Reader, value: Any, kind: str, key: str) -> Any:
    if value is None:
        return None
    if kind in NUMERIC_TYPES:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise read.fail(key, f"must be a number for a {kind} column, got {value!r}")
        if not math.isfinite(_finite_float(value)):
            raise read.fail(
                key, "must be a finite number within a double's range, e.g. 'upper: 100000'"
            )
        if 0 < abs(value) < NEAR_ZERO:
            raise read.fail(
                key,
                f"must be 0 or at least {NEAR_ZERO:g} in magnitude: PostgreSQL reads values "
                "nearer zero as 0 where a query computes with them (it fails a product "
                "that underflows, row by row); write 0 instead",
            )
        return int(value) if kind == "int" and float(value).is_integer() else value
    if kind in ("date", "timestamp"):
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            # dpsql's time zone is UTC: an aware time is that wall clock, as in queries
            return value.astimezone(dt.UTC).replace(tzinfo=None)
        if isinstance(value, dt.date):
            return value
        try:
            if kind == "timestamp" and len(str(value)) > 10:  # a time of day too
                return dt.datetime.fromisoformat(str(value)).replace(tzinfo=None)
            return dt.date.fromisoformat(str(value))
        except ValueError:
            example = "2014-01-01 or 2014-01-01 12:00:00" if kind == "timestamp" else "2014-01-01"
            raise read.fail(key, f"must be a date like {example}, got {value!r}") from None
    raise read.fail(key, f"a {kind} column has no bounds; remove '{key.rsplit('.', 1)[1]}'")
