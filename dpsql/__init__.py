"""dpsql: a differential-privacy SQL proxy.

import dpsql
con = dpsql.connect("pums.duckdb", policy="policy.yaml", analyst="alice")
cur = con.cursor()
cur.execute("SELECT sex, COUNT(*) FROM pums GROUP BY sex")
cur.fetchall(), cur.accuracy, con.budget()
"""

from dpsql.dbapi import (
    BINARY,
    DATETIME,
    NUMBER,
    ROWID,
    STRING,
    Binary,
    Connection,
    Cursor,
    Date,
    DateFromTicks,
    Time,
    TimeFromTicks,
    Timestamp,
    TimestampFromTicks,
    apilevel,
    connect,
    paramstyle,
    threadsafety,
)
from dpsql.errors import (
    BackendError,
    BudgetExhausted,
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    PolicyError,
    ProgrammingError,
    QueryRefused,
    Warning,
)

__version__ = "0.1.0"

__all__ = [
    "BINARY", "DATETIME", "NUMBER", "ROWID", "STRING", "BackendError", "Binary",
    "BudgetExhausted", "Connection", "Cursor", "DataError", "DatabaseError", "Date",
    "DateFromTicks", "Error", "IntegrityError", "InterfaceError", "InternalError",
    "NotSupportedError", "OperationalError", "PolicyError", "ProgrammingError", "QueryRefused",
    "Time", "TimeFromTicks", "Timestamp", "TimestampFromTicks", "Warning", "__version__",
    "apilevel", "connect", "paramstyle", "threadsafety",
]  # fmt: skip
