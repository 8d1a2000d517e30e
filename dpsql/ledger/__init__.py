"""The persistent privacy-budget ledger: charges, the releases kept beside them, claims.

The package's surface is `Ledger` and `open_ledger` (with the quanta the log is
kept in and the dataset-wide account); its modules each have one job:

- book.py      the Ledger: a charge checked against the budget and appended in one
               transaction, the release cache, what the Session reads back
- store.py     the queries every store shares (the charges log, the releases table)
- sqlite.py    the SQLite store: one file, the default
- postgres.py  the PostgreSQL store: one schema several proxies share (imported only
               for a postgresql:// ledger: psycopg is slow to import)
- claims.py    claims on a statement: one answer at a time across threads, processes
               and proxies
"""

from dpsql.ledger.book import (
    DATASET_ACCOUNT,
    DEFAULT_TIMEOUT,
    DELTA_QUANTUM,
    EPSILON_QUANTUM,
    RHO_QUANTUM,
    SCHEMA_VERSION,
    Charge,
    Ledger,
    open_ledger,
)

__all__ = [
    "DATASET_ACCOUNT",
    "DEFAULT_TIMEOUT",
    "DELTA_QUANTUM",
    "EPSILON_QUANTUM",
    "RHO_QUANTUM",
    "SCHEMA_VERSION",
    "Charge",
    "Ledger",
    "open_ledger",
]
