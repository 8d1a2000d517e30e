"""Backends: open the adapter that fits a database argument.

`open_adapter` maps what a user passes to `dpsql.connect()` (or `--database`)
to an Adapter: a DuckDB path, ":memory:" or DuckDB connection; a
`postgresql://` URL; a `spark://` or `sc://` URL or a SparkSession; any
other SQLAlchemy URL. Drivers are imported only when their backend is asked
for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dpsql.adapters.base import Adapter
from dpsql.adapters.spark import is_spark_session
from dpsql.errors import NotSupportedError
from dpsql.policy import Source

POSTGRES_SCHEMES = ("postgresql", "postgres")
SPARK_SCHEMES = ("spark", "sc")


def is_url(database: Any) -> bool:
    """Whether `database` names a database server by URL (not a file or a connection)."""
    return isinstance(database, str) and "://" in database


def open_adapter(
    database: Any, sources: Mapping[str, Source] | None = None, **options: Any
) -> Adapter:
    """The adapter for `database`; `options` go to the adapter (e.g. pool_size).

    `sources` are the policy's tables read from files (Policy.sources).
    """
    if is_spark_session(database) or (
        is_url(database) and database.split("://", 1)[0].lower() in SPARK_SCHEMES
    ):
        from dpsql.adapters.spark import SparkAdapter

        return SparkAdapter(database, sources, **options)
    if sources:
        raise NotSupportedError(
            f"table '{next(iter(sources))}' is read from files ('source:' in the policy), "
            "which the Spark backend does; open the database as spark://local[2], or load "
            "the files into the database and drop 'source:'"
        )
    if not is_url(database):
        from dpsql.adapters.duckdb import DuckDBAdapter

        path = os.fspath(database) if isinstance(database, os.PathLike) else database
        return DuckDBAdapter(path, **options)
    scheme = database.split("://", 1)[0].lower()
    if scheme in POSTGRES_SCHEMES:
        from dpsql.adapters.postgres import PostgresAdapter

        return PostgresAdapter(database, **options)
    from dpsql.adapters.sqlalchemy import SQLAlchemyAdapter

    return SQLAlchemyAdapter(database, **options)


__all__ = ["Adapter", "is_url", "open_adapter"]
