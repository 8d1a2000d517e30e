"""The SQL a draft runs on the data: its text, quoted and written in the backend's dialect.

Two kinds, both returning few rows and never a row of the data: the distinct values
of a column (at most a limit, only when the owner asks for domains), and a histogram
of one value per privacy unit over a fixed grid (one row per non-empty bucket).
Written in DuckDB's dialect and translated by sqlglot to the backend's.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlglot

from dpsql.draft.guess import TableDraft


def quoted(name: str) -> str:
    """A (possibly schema-qualified) name, each part in double quotes."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


def in_dialect(sql: str, dialect: str) -> str:
    return sqlglot.transpile(sql, read="duckdb", write=dialect)[0]


def distinct_values(table: str, column: str, limit: int) -> str:
    """Up to `limit` distinct non-NULL values of a column."""
    c = quoted(column)
    return f"SELECT DISTINCT {c} FROM {quoted(table)} WHERE {c} IS NOT NULL LIMIT {limit}"


class UnitRelation:
    """A private table's rows beside the unit each belongs to: its own unit column, the
    unit of the row its reference leads to, or (row-level) the row itself."""

    def __init__(self, table: TableDraft, tables: dict[str, TableDraft]):
        self.row_level = table.unit is None and table.via is None
        if table.via is not None:
            column, target, key = table.via
            target_unit = tables[target].unit
            assert target_unit is not None  # guess.py draws references to such tables only
            self.source = (
                f"{quoted(table.name)} AS r JOIN {quoted(target)} AS p "
                f"ON r.{quoted(column)} = p.{quoted(key)}"
            )
            self.unit = f"p.{quoted(target_unit)}"
        else:
            self.source = f"{quoted(table.name)} AS r"
            self.unit = f"r.{quoted(table.unit)}" if table.unit else ""

    def per_unit(self, aggregate: str) -> str:
        """One row per unit: `aggregate` (over the unit's rows r) AS v; units whose value
        is NULL (a NULL unit, or no non-NULL value) are left out."""
        if self.row_level:
            raise ValueError("a row-level table has one row per unit: read its values as they are")
        return (
            f"SELECT {aggregate} AS v FROM {self.source} WHERE {self.unit} IS NOT NULL "
            f"GROUP BY {self.unit}"
        )

    def per_row(self, expression: str) -> str:
        return f"SELECT {expression} AS v FROM {self.source}"


def histogram(values: str, edges: Sequence[float | int]) -> str:
    """Counts of the non-NULL values `v` of the query `values` per bucket: bucket i holds
    those in (edges[i-1], edges[i]], the first and last also those beyond the ends."""
    cases = " ".join(f"WHEN v <= {edge!r} THEN {i}" for i, edge in enumerate(edges[:-1]))
    return (
        f"SELECT CASE {cases} ELSE {len(edges) - 1} END AS bucket, COUNT(*) AS n "
        f"FROM ({values}) AS s WHERE v IS NOT NULL GROUP BY 1"
    )
