"""The draft's guesses from names and keys alone, each with the reason it was made.

- A **privacy unit** (whose rows a table holds): a people-like table's key (customers,
  users, patients, ...), unless it references another people-like table (accounts of
  customers); a foreign key to such a key; a column named like a person's id (`pid`,
  `user_id`); else a `{via, references}` reference to a table with a unit of its own.
  A table with none is drafted row-level, saying so.
- **Private** columns: the unit, keys and references (identifiers), and columns whose
  names say identifier or free text (email, name, phone, address, comment, notes, ...).
- **Public** tables only where the owner names them (`--public`): a guess that a table
  holds no person's data would release it exactly.
- **Public key domains** never from a guess: a bool column's two values follow from its
  type; text domains are read from the data only when the owner asks (domains.py).

No row of data is read here.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from dpsql.draft.schema import TableSchema
from dpsql.errors import ProgrammingError
from dpsql.policy import NUMERIC_TYPES, sqlite_type, stored_types

# Words in a table's name that say its rows are people (one row per person).
PEOPLE = (
    "customer", "client", "user", "person", "people", "patient", "member", "employee",
    "student", "subscriber", "visitor", "account", "individual", "citizen", "respondent",
    "voter", "passenger", "buyer", "consumer", "guest", "player", "author",
)  # fmt: skip
# A column named like a person's id, in a table with no key to say so (TPC-H's custkey).
_PERSON_ID = re.compile(
    r"(^|_)(pid|uid|person_?id|cust_?key|(" + "|".join(PEOPLE) + r")_?(id|key|no|number))$"
)
# Name parts that say a column identifies someone or something: never released.
_IDENTIFIER_PARTS = {
    "id", "key", "uuid", "guid", "pid", "uid", "ssn", "email", "mail", "phone", "mobile",
    "fax", "name", "firstname", "lastname", "surname", "fullname", "username", "login",
    "address", "street", "ip", "password", "iban", "passport", "license", "licence",
    "card", "token", "custkey", "orderkey", "partkey", "suppkey",
}  # fmt: skip
# Whole suffixes only: "paid" and "valid" end in "id" but identify nothing.
_IDENTIFIER_SUFFIXES = ("_id", "_key", "_no", "_number", "_uuid")
# Name parts that say a column holds free text, which can say anything about anyone.
_FREE_TEXT_PARTS = {
    "comment", "comments", "note", "notes", "description", "text", "message", "body",
    "review", "remark", "remarks", "feedback", "bio", "memo",
}  # fmt: skip


@dataclass
class ColumnDraft:
    """One column of the draft: its policy keys and the comments saying why."""

    name: str
    spec: dict[str, Any]  # the policy's column keys: type, private, lower, upper, values
    notes: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.spec["type"]

    @property
    def private(self) -> bool:
        return bool(self.spec.get("private"))


@dataclass
class TableDraft:
    """One table of the draft."""

    name: str
    columns: dict[str, ColumnDraft]
    public: bool = False
    unit: str | None = None
    via: tuple[str, str, str] | None = None  # column, referenced table, referenced column
    unique_unit: bool = False  # the database keeps the unit unique: one row per unit
    max_rows: int = 1
    max_groups: int = 1
    notes: list[str] = field(default_factory=list)
    bound_notes: list[str] = field(default_factory=list)  # about max_rows / max_groups
    left_out: list[str] = field(default_factory=list)  # columns no policy type fits

    @property
    def private(self) -> bool:
        return not self.public


def people_like(table: str) -> bool:
    """Whether a table's name says that each of its rows is a person (customers, users)."""
    bare = table.rpartition(".")[2]
    return any(word in bare for word in PEOPLE)


def _parts(column: str) -> set[str]:
    return set(column.lower().split("_"))


def identifier_name(column: str) -> bool:
    """Whether a column's name says it identifies someone or something (an id, an email)."""
    lower = column.lower()
    return (
        bool(_parts(lower) & _IDENTIFIER_PARTS)
        or lower.endswith(_IDENTIFIER_SUFFIXES)
        or bool(_PERSON_ID.search(lower))
    )


def free_text_name(column: str) -> bool:
    return bool(_parts(column) & _FREE_TEXT_PARTS)


def guess_tables(
    schemas: Iterable[TableSchema], dialect: str, public: Collection[str] = ()
) -> list[TableDraft]:
    """Drafts of `schemas`: the tables named in `public` drafted public, the others
    private with the unit, references and private columns the names and keys suggest."""
    schemas = list(schemas)
    public = {name.lower() for name in public}
    unknown = public - {s.name for s in schemas}
    if unknown:
        raise ProgrammingError(
            f"--public names {', '.join(sorted(unknown))}, which is not among the tables "
            "drafted; name a drafted table"
        )
    drafts = {s.name: _columns(s, dialect, s.name in public) for s in schemas}
    by_name = {s.name: s for s in schemas}
    for schema in schemas:
        if schema.name not in public:
            _people_key(schema, drafts[schema.name], by_name, public)
    for schema in schemas:
        draft = drafts[schema.name]
        if draft.private and draft.unit is None:
            _unit_column(schema, draft, drafts)
    for schema in schemas:
        draft = drafts[schema.name]
        if draft.private and draft.unit is None:
            _reference_or_row_level(schema, draft, drafts, by_name)
    for schema in schemas:
        _mark_private(schema, drafts[schema.name], drafts)
    return list(drafts.values())


def _columns(schema: TableSchema, dialect: str, public: bool) -> TableDraft:
    columns, left_out = {}, []
    for name, stored in schema.columns.items():
        fits = stored_types(stored, dialect)
        if not fits:
            left_out.append(f"{name} ({stored})")
            continue
        kind = fits[0] if dialect != "sqlite" else sqlite_type(stored)
        column = ColumnDraft(name, {"type": kind})
        if kind == "bool" and not public:
            column.spec["values"] = [False, True]
            column.notes.append("public domain false/true: it follows from the type")
        columns[name] = column
    draft = TableDraft(schema.name, columns, public=public, left_out=left_out)
    if public:
        draft.notes.append(
            "public: you said it holds no person's data (--public); it is read freely "
            "and answered exactly, and joins with it on any condition"
        )
    return draft


def _people_key(
    schema: TableSchema, draft: TableDraft, schemas: dict[str, TableSchema], public: set[str]
) -> None:
    """A people-like table's key as its unit, unless the table references another
    people-like table (accounts of customers): then its rows are that table's people's."""
    keys = [c for c in schema.columns if c in schema.unique and c in draft.columns]
    references_people = any(
        target != schema.name and target in schemas and target not in public
        and people_like(target)
        for target, _ in schema.references.values()
    )  # fmt: skip
    if people_like(schema.name) and keys and not references_people:
        draft.unit, draft.unique_unit = keys[0], True
        draft.notes.append(
            f"privacy unit {keys[0]}: the key of a table whose name says each row is a "
            "person, so neighbouring databases differ by one of them and all their rows "
            "in every table"
        )


def _unit_column(schema: TableSchema, draft: TableDraft, drafts: dict[str, TableDraft]) -> None:
    """A unit column of the table itself: a foreign key to the key of a table whose unit
    is its key (a people table), or a column named like a person's id."""
    to_people = [
        (column, target)
        for column, (target, key) in schema.references.items()
        if column in draft.columns
        and target in drafts
        and drafts[target].unique_unit
        and drafts[target].unit == key
    ]
    if to_people:
        column, target = to_people[0]
        draft.unit = column
        draft.notes.append(
            f"privacy unit {column}: it references {target}, whose rows are people; the "
            f"same kind of unit as {target} has, so joins on it are answered"
        )
        for other, other_target in to_people[1:]:
            draft.notes.append(
                f"{other} also references {other_target}: a row belongs to two people, "
                f"and only {column}'s is protected as the unit; decide which one it is"
            )
        return
    # A reference says what a column is, whatever its name.
    named = [c for c in draft.columns if _PERSON_ID.search(c) and c not in schema.references]
    if named:
        draft.unit, draft.unique_unit = named[0], named[0] in schema.unique
        draft.notes.append(
            f"privacy unit {named[0]}: its name says it is a person's id (no foreign key "
            "says so); check that it is"
            + ("; the database keeps it unique: one row per person" if draft.unique_unit else "")
        )


def _reference_or_row_level(
    schema: TableSchema,
    draft: TableDraft,
    drafts: dict[str, TableDraft],
    schemas: dict[str, TableSchema],
) -> None:
    """`privacy_unit: {via, references}` along a foreign key to a unique column of a table
    with a unit of its own; else row-level, saying what would make it user-level."""
    for column, (target, key) in schema.references.items():
        other = drafts.get(target)
        if column not in draft.columns or other is None or other.public:
            continue
        if other.unit is not None and other.via is None and key in schemas[target].unique:
            draft.via = (column, target, key)
            draft.notes.append(
                f"privacy unit through {column}: a row is the person's whose {target} row "
                f"it references (a foreign key to {target}.{key}, which the database keeps "
                "unique)"
            )
            return
    candidates = [
        c
        for c in draft.columns
        if c.endswith(_IDENTIFIER_SUFFIXES)
        and c not in schema.unique
        and c not in schema.references
    ]
    chained = [t for _, (t, _) in schema.references.items() if t in drafts and drafts[t].via]
    draft.notes.append(
        "no privacy unit found: each row is its own unit (row-level privacy), which protects "
        "one row, not a person with several"
        + (
            f"; it references {chained[0]}, whose unit is itself a reference (dpsql follows "
            "one): add the person's column to this table, or a view that joins it"
            if chained
            else ""
        )
        + (f"; a unit column could be one of: {', '.join(candidates)}" if candidates else "")
        + ". If it holds no person's data, draft it with --public "
        + draft.name
    )


def _mark_private(schema: TableSchema, draft: TableDraft, drafts: dict[str, TableDraft]) -> None:
    """Identifiers, keys, references to private tables and free text: private."""
    if draft.public:
        return
    for name, column in draft.columns.items():
        reason = None
        target = schema.references.get(name)
        if name == draft.unit:
            reason = "the privacy unit: never selected, grouped or filtered on"
        elif draft.via and name == draft.via[0]:
            reason = "the reference the unit is read through"
        elif target is not None and target[0] in drafts and drafts[target[0]].public:
            column.notes.append(
                f"references the public table {target[0]}: kept a plain column, so that "
                "joins with it are answered"
            )
        elif target is not None:
            reason = f"an identifier (it references {target[0]})"
        elif name in schema.unique:
            reason = "an identifier (the database keeps it unique)"
        elif identifier_name(name):
            reason = "an identifier, by its name"
        elif column.kind == "string" and free_text_name(name):
            reason = "free text, by its name: it can say anything about anyone"
        if reason is None:
            continue
        column.spec.pop("values", None)
        column.notes = [n for n in column.notes if not n.startswith("public domain")]
        column.spec["private"] = True
        column.notes.append(reason)
    for column in draft.columns.values():
        if not column.private:
            _usable_note(column)


def _usable_note(column: ColumnDraft) -> None:
    """What an analyst can do with a plain column, and what it still needs."""
    if identifier_name(column.name):
        return  # a key kept plain to join a public table: nobody sums it
    if column.kind in NUMERIC_TYPES and "lower" not in column.spec:
        column.notes.append("no bounds yet: SUM/AVG need lower/upper (or --suggest-bounds)")
    elif column.kind == "string" and "values" not in column.spec:
        column.notes.append(
            "its groups pass a noisy count of units (needs delta); list values: [...] if public"
        )
