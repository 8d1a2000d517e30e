"""Public key domains read from the data (`--read-domains`), only because the owner asks.

A domain read from the data is data: the list says which values occur, exactly and
without noise. The owner, who may read their own data, decides whether it is public
knowledge; the draft says where each list came from. Only plain text columns of
private tables are read, and only up to MAX_DOMAIN values each.
"""

from __future__ import annotations

from dpsql.adapters.base import Adapter
from dpsql.draft.guess import TableDraft
from dpsql.draft.queries import distinct_values, in_dialect

# A domain longer than this is a poor public domain (every key is released, each with
# noise) and more likely a list of people's values than of categories.
MAX_DOMAIN = 20


def read_domains(adapter: Adapter, tables: list[TableDraft]) -> None:
    """Give each plain text column of the private tables with at most MAX_DOMAIN distinct
    values those values as its public domain, saying they were read from the data."""
    for table in tables:
        if table.public:
            continue
        for column in table.columns.values():
            if column.kind != "string" or column.private:
                continue
            sql = distinct_values(table.name, column.name, MAX_DOMAIN + 1)
            _, rows = adapter.execute(in_dialect(sql, adapter.dialect))
            values = sorted(str(row[0]) for row in rows)
            column.notes = [n for n in column.notes if not n.startswith("its groups pass")]
            if not values:
                continue  # every value NULL: nothing to list
            if len(values) > MAX_DOMAIN:
                column.notes.append(
                    f"more than {MAX_DOMAIN} values (read with --read-domains): its keys are "
                    "released by a noisy count of units (needs delta)"
                )
                continue
            column.spec["values"] = values
            column.notes.append(
                "values read from the data because you asked (--read-domains), exactly, "
                "without noise: keep them only if they are public knowledge; every listed "
                "value is released (empty ones too), rows with other values are left out"
            )
