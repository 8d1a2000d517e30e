"""The draft as YAML text, with comments that say what each choice means.

The text is written here, not by a YAML library's dumper, because the comments
are the point: PyYAML drops comments, and ruamel.yaml (which keeps them) is not a
dependency. Every value is still written by PyYAML (`_flow`), so names and values
are quoted as YAML needs; `policy_document` is what the text loads as, and the
draft is checked to load as exactly that.
"""

from __future__ import annotations

import textwrap
from typing import Any

import yaml

from dpsql.draft.guess import TableDraft

_WIDTH = 100
DEFAULTS = {"epsilon_per_query": 1.0, "delta": 1.0e-6, "mechanism": "laplace"}
DEFAULT_ANALYST = {"epsilon": 10.0, "delta": 1.0e-5}


def table_spec(table: TableDraft) -> dict[str, Any]:
    """The policy's entry for one drafted table."""
    columns = {c.name: dict(c.spec) for c in table.columns.values()}
    if table.public:
        return {"public": True, "columns": columns}
    spec: dict[str, Any] = {}
    if table.via is not None:
        column, target, key = table.via
        spec["privacy_unit"] = {"via": column, "references": f"{target}.{key}"}
    elif table.unit is not None:
        spec["privacy_unit"] = table.unit
    if "privacy_unit" in spec:
        spec["max_groups_per_unit"] = table.max_groups
        spec["max_rows_per_unit"] = table.max_rows
    spec["columns"] = columns
    return spec


def policy_document(
    tables: list[TableDraft], analysts: dict[str, dict[str, float]], ledger: str | None
) -> dict[str, Any]:
    """What the draft's text loads as."""
    document: dict[str, Any] = {
        "version": 1,
        "defaults": dict(DEFAULTS),
        "analysts": {"default": dict(DEFAULT_ANALYST), **analysts},
    }
    if ledger is not None:
        document["ledger"] = ledger
    document["tables"] = {t.name: table_spec(t) for t in tables}
    return document


def render(
    document: dict[str, Any],
    tables: list[TableDraft],
    header: list[str],
    analyst_notes: dict[str, str],
) -> str:
    """The YAML text of `document`, with the drafts' notes as comments."""
    out: list[str] = []
    _comment(out, "", header)
    _line(out, "", "version", document["version"])
    _line(
        out,
        "",
        "defaults",
        document["defaults"],
        "each query's epsilon and delta unless an analyst sets dpsql.epsilon",
    )
    out.append("analysts:")
    _comment(out, "  ", ["each analyst's total budget; add one entry per analyst"])
    for name, budget in document["analysts"].items():
        _line(out, "  ", name, budget, analyst_notes.get(name, ""))
    if "ledger" in document:
        _line(out, "", "ledger", document["ledger"], "where every charge is kept")
    out.append("tables:")
    by_name = {t.name: t for t in tables}
    for name, spec in document["tables"].items():
        table = by_name[name]
        out.append("")
        _comment(out, "  ", table.notes)
        out.append(f"  {_flow(name)}:")
        if spec.get("public"):
            _line(out, "    ", "public", True)
        if "privacy_unit" in spec:
            _line(out, "    ", "privacy_unit", spec["privacy_unit"])
            _comment(out, "    ", _bound_notes(table))
            _line(
                out,
                "    ",
                "max_groups_per_unit",
                spec["max_groups_per_unit"],
                "L0: groups of one query a unit may add rows to",
            )
            _line(
                out,
                "    ",
                "max_rows_per_unit",
                spec["max_rows_per_unit"],
                "Linf: rows a unit may add to one group; the rest are left out",
            )
        out.append("    columns:")
        for column, column_spec in spec["columns"].items():
            notes = table.columns[column].notes
            _line(out, "      ", column, column_spec, "; ".join(notes))
        _comment(
            out,
            "    ",
            [
                f"left out: {c}: no policy type fits; declare a view that casts it"
                for c in table.left_out
            ],
        )
    return "\n".join(out) + "\n"


def _bound_notes(table: TableDraft) -> list[str]:
    if table.unique_unit:
        return ["one row per unit: the database keeps the unit unique (its key)"]
    if table.bound_notes:
        return [
            *table.bound_notes,
            "a grouped COUNT's noise grows with max_groups_per_unit x max_rows_per_unit: "
            "lower either if your queries need less",
        ]
    return [
        "TODO: 1 and 1 keep ONE row of each unit per query: a COUNT or SUM over units with "
        "several rows silently undercounts. Set them to the rows (and groups) a unit "
        "typically has, or draft with --suggest-bounds EPSILON"
    ]


def _flow(value: Any) -> str:
    """`value` as one line of YAML (a flow mapping or list, a quoted scalar where needed)."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 30)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _line(out: list[str], indent: str, key: str, value: Any, note: str = "") -> None:
    line = f"{indent}{_flow(key)}: {_flow(value)}"
    if note and len(line) + len(note) + 4 <= _WIDTH:
        line += f"  # {note}"
    elif note:
        _comment(out, indent, [note])
    out.append(line)


def _comment(out: list[str], indent: str, notes: list[str]) -> None:
    for note in notes:
        out.extend(
            textwrap.wrap(
                note, _WIDTH, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}#   "
            )
        )
