"""End-to-end DP time / raw query time on PostgreSQL, at 1 million rows by default.

The census table of bench_e2e (the demo generator) is copied into a schema of
its own on the server DPSQL_TEST_POSTGRES_URL names (default: the local one),
with its PRIMARY KEY on pid, or with `--bounded` without it, so that
user-level queries run the per-unit ROW_NUMBER/DENSE_RANK bounding. The
queries, the timing and the printed ratios are bench_e2e's. The schema is
dropped at the end. Usage:
    python benchmarks/bench_postgres.py [--rows 1000000] [--repeat 3] [--bounded]
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
from pathlib import Path

import duckdb
import psycopg

sys.path.insert(0, str(Path(__file__).parent))
from bench_e2e import build, compare  # the sibling benchmark, shared

from dpsql.adapters.postgres import PostgresAdapter

URL = os.environ.get("DPSQL_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def load(admin: psycopg.Connection, schema: str, source: Path, keyed: bool) -> None:
    """Copy the census table from the DuckDB file into `schema`, by CSV and COPY."""
    admin.execute(
        f"CREATE TABLE {schema}.census (pid bigint{' PRIMARY KEY' if keyed else ''}, age bigint, "
        "sex bigint, educ bigint, race bigint, income double precision, married bigint, "
        "state text)"
    )
    with tempfile.TemporaryDirectory() as folder, duckdb.connect(str(source), read_only=True) as db:
        csv = Path(folder) / "census.csv"
        db.execute(
            "COPY (SELECT pid, age, sex, educ, race, income, married, state FROM census) "
            f"TO '{csv}' (HEADER false)"
        )
        command = f"COPY {schema}.census FROM STDIN WITH (FORMAT csv)"
        with admin.cursor().copy(command) as copy, open(csv, "rb") as handle:
            while chunk := handle.read(1 << 20):
                copy.write(chunk)
    admin.execute(f"ANALYZE {schema}.census")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bounded", action="store_true", help="no PRIMARY KEY on pid")
    args = parser.parse_args()
    source = build(args.rows)
    schema = f"dpsql_bench_{secrets.token_hex(4)}"
    with psycopg.connect(URL, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            print(f"copying {args.rows:,} rows into {schema} ...", flush=True)
            load(admin, schema, source, keyed=not args.bounded)
            admin.execute(f"SET search_path = {schema}")
            url = f"{URL}{'&' if '?' in URL else '?'}options=-csearch_path%3D{schema}"
            adapter = PostgresAdapter(url)
            try:
                compare(lambda sql: admin.execute(sql).fetchall(), adapter, args)
            finally:
                adapter.close()
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
