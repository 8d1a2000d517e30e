"""`dpsql serve --database spark://local[2]`: the wire server in front of Spark.

The command runs in this process (its argument parsing, its connection and
its server), so its `spark://local[2]` shares the suite's running Spark
context instead of starting a JVM of its own; only `serve_forever` is
replaced, by a listener in the background while the clients run: psycopg,
pandas.read_sql through SQLAlchemy, and psql when it is installed. The PUMS
table is read from the Parquet file the policy names (`source:`).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import duckdb
import pandas
import psycopg
import pytest
import sqlalchemy
import yaml
from conftest import PUMS_TABLES, load_pums, pums_policy

from dpsql.cli import main
from dpsql.server import runner

pytestmark = pytest.mark.spark

QUERY = "SELECT sex, COUNT(*) AS n, SUM(income) AS total FROM pums GROUP BY sex ORDER BY sex"


@pytest.fixture
def policy_file(tmp_path):
    with duckdb.connect() as source:
        load_pums(source, {"pums": PUMS_TABLES["pums"]})
        source.execute(f"COPY pums TO '{tmp_path / 'pums.parquet'}' (FORMAT parquet)")
        truth = dict(
            (sex, (n, total))
            for sex, n, total in source.execute(
                "SELECT sex, COUNT(*), SUM(income) FROM pums GROUP BY sex"
            ).fetchall()
        )
    columns = pums_policy()["tables"]["pums"]["columns"]
    policy = pums_policy(tables={"pums": {"source": "parquet:pums.parquet", "columns": columns}})
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path, truth


def _clients(port: int, truth: dict) -> dict[str, list]:
    """The rows each client gets for QUERY through the server on `port`."""
    seen = {}
    with psycopg.connect(f"host=127.0.0.1 port={port} user=default", autocommit=True) as conn:
        seen["psycopg"] = conn.execute(QUERY).fetchall()
    engine = sqlalchemy.create_engine(f"postgresql+psycopg://default@127.0.0.1:{port}/pums")
    try:
        with engine.connect() as conn:
            frame = pandas.read_sql(QUERY, conn)
        seen["pandas"] = [tuple(row) for row in frame.itertuples(index=False)]
    finally:
        engine.dispose()
    if shutil.which("psql"):
        done = subprocess.run(
            ["psql", "-X", "-A", "-t", "-h", "127.0.0.1", "-p", str(port), "-U", "default",
             "pums", "-c", QUERY],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "PGCONNECT_TIMEOUT": "10"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        seen["psql"] = [
            (int(sex), int(n), float(total))
            for sex, n, total in (line.split("|") for line in done.stdout.split())
        ]
    return seen


def test_dpsql_serve_on_spark_answers_psycopg_pandas_and_psql(
    spark_session, policy_file, tmp_path, monkeypatch
):
    policy, truth = policy_file
    seen: dict[str, list] = {}

    def serve_in_background(server, host, port, ready=print) -> None:
        with runner.BackgroundServer(server, host, 0) as background:
            ready(f"dpsql serve: listening on {host}:{background.port}")
            seen.update(_clients(background.port, truth))

    monkeypatch.setattr(runner, "serve_forever", serve_in_background)
    argv = ["serve", "--database", "spark://local[2]", "--policy", str(policy),
            "--ledger", str(tmp_path / "ledger.sqlite"), "--trust", "--workers", "2"]  # fmt: skip
    assert main(argv) == 0
    assert set(seen) >= {"psycopg", "pandas"}
    # every client asked the same query of one analyst: the cached release, charged once
    first = seen["psycopg"]
    assert all(rows == first for rows in seen.values())
    for sex, n, total in first:
        true_n, true_total = truth[sex]
        # epsilon 1 over two columns: Laplace scales 2 and 1e6 (95% half-widths 6 and
        # 3e6); each margin is exceeded with probability exp(-15) or less
        assert abs(n - true_n) <= 30 and abs(total - true_total) <= 2e7
    assert spark_session.sql("SELECT COUNT(*) FROM pums").collect()[0][0] == 1000  # still up
