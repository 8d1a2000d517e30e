"""Backends: open the adapter that fits a database argument.

`open_adapter` maps what a user passes to `dpsql.connect()` (or `--database`)
to an Adapter: a DuckDB path, ":memory:" or DuckDB connection; a
`postgresql://` URL; any other SQLAlchemy URL (`spark://` is refused until
the Spark backend exists). Drivers are
imported only when their backend is asked for.
"""

from __future__ import annotations

import os
from typing import Any

from dpsql.adapters.base import Adapter
from dpsql.errors import NotSupportedError

POSTGRES_SCHEMES = ("postgresql", "postgres")


def is_url(database: Any) -> bool:
    """Whether `database` names a database server by URL (not a file or a connection)."""
    return isinstance(database, str) and "://" in database


def open_adapter(database: Any, **options: Any) -> Adapter:
    """The adapter for `database`; `options` go to the adapter (e.g. pool_size)."""
    if not is_url(database):
        from dpsql.adapters.duckdb import DuckDBAdapter

        path = os.fspath(database) if isinstance(database, os.PathLike) else database
        return DuckDBAdapter(path, **options)
    scheme = database.split("://", 1)[0].lower()
    if scheme in POSTGRES_SCHEMES:
        from dpsql.adapters.postgres import PostgresAdapter

        return PostgresAdapter(database, **options)
    if scheme == "spark":
        raise NotSupportedError(
            "spark:// databases come with the Spark backend, which is not available yet; "
            "use a DuckDB file, a postgresql:// URL or a SQLAlchemy URL"
        )
    from dpsql.adapters.sqlalchemy import SQLAlchemyAdapter

    return SQLAlchemyAdapter(database, **options)


__all__ = ["Adapter", "is_url", "open_adapter"]
