"""dpsql on a real Spark Connect server: `sc://host:port` as users write it.

The test module starts a Spark Connect server in a process of its own
(spark_connect_server.py, local[2]) whose JVM runs in the America/New_York
time zone, as a server far from its analysts may, and reads the PUMS tables
and a table of dates and timestamps from Parquet files the policy names
(`source:`). The same statements with the same seed must give the same
bounded SQL and exact aggregates over Spark Connect as on the suite's local
Spark session, and the same releases where the keys come from the policy
(keys from the data get their noise in the order the engine returns them).
Then what Connect alone exercises: the session dpsql opens there, a
refusal that runs nothing, and `dpsql serve --processes 2` with each process
a Connect client.
"""

from __future__ import annotations

import importlib.util
import os
import select
import socket
import subprocess
import sys
from pathlib import Path

import duckdb
import psycopg
import pytest
import yaml
from conftest import PUMS_TABLES, load_pums, pums_policy

import dpsql
from dpsql.adapters.spark import SparkAdapter

pytestmark = pytest.mark.spark

SERVER = Path(__file__).with_name("spark_connect_server.py")
STARTUP_SECONDS = 240  # a JVM and Spark on a busy 2-core machine
EDGE_TIMES = """
    SELECT i % 3 AS age,
           CASE i % 3 WHEN 0 THEN DATE '0001-01-01' WHEN 1 THEN DATE '9999-12-31'
                      ELSE DATE '2020-03-01' END AS d,
           CASE i % 3 WHEN 0 THEN TIMESTAMP '0001-01-01 00:00:00'
                      WHEN 1 THEN TIMESTAMP '9999-12-31 23:59:59'
                      ELSE TIMESTAMP '2020-01-01 02:30:00' END AS ts
    FROM range(300) AS t(i)
"""
# keys from the policy (or none): their noise is drawn in the domain's order
PUBLIC_KEYS = [
    "SELECT COUNT(*) FROM pums",
    "SELECT COUNT(*) FROM pums WHERE age > 40 AND sex = 1",
    "SELECT sex, COUNT(*) AS n, SUM(income) AS total, AVG(income) FROM pums GROUP BY sex",
    "SELECT educ, COUNT(*) FROM pums GROUP BY educ",
    "SELECT COUNT(DISTINCT pid), AVG(age) FROM pums_dup",
]
# keys from the data: their noise is drawn in the order the engine returns the groups
DATA_KEYS = [
    "SELECT FLOOR(age / 10) AS decade, COUNT(*) FROM pums GROUP BY decade",
    "SELECT race, SUM(income) FROM pums_dup WHERE income < 100000 GROUP BY race",
    "SELECT ts, COUNT(*) FROM edge_times GROUP BY ts",
    "SELECT YEAR(d) AS y, COUNT(*) FROM edge_times GROUP BY y",
    "SELECT DATE_TRUNC('DAY', ts) AS day, COUNT(*) FROM edge_times GROUP BY day",
    "SELECT EXTRACT(HOUR FROM ts) AS h, COUNT(*) FROM edge_times "
    "WHERE ts > TIMESTAMP '2000-01-01' GROUP BY h",
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_line(process: subprocess.Popen, expected: str, seconds: float) -> str:
    """The first line of `process`'s output, which must contain `expected`."""
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    line = process.stdout.readline() if ready else ""
    if expected not in line:
        process.kill()
        raise AssertionError(f"expected {expected!r} within {seconds} s, got {line!r}")
    return line


@pytest.fixture(scope="module")
def policy(spark_session, tmp_path_factory) -> dict:
    """The PUMS tables and a table of edge dates and timestamps, as Parquet sources."""
    folder = tmp_path_factory.mktemp("connect")
    with duckdb.connect() as source:
        load_pums(source, {name: PUMS_TABLES[name] for name in ("pums", "pums_dup")})
        source.execute(f"CREATE TABLE edge_times AS {EDGE_TIMES}")
        for table in ("pums", "pums_dup", "edge_times"):
            source.execute(f"COPY {table} TO '{folder / table}.parquet' (FORMAT parquet)")
    tables = pums_policy()["tables"]
    tables = {name: {**tables[name], "source": f"parquet:{folder / name}.parquet"}
              for name in ("pums", "pums_dup")}  # fmt: skip
    tables["edge_times"] = {
        "source": f"parquet:{folder / 'edge_times'}.parquet",
        "columns": {"age": {"type": "int", "lower": 0, "upper": 2},
                    "d": {"type": "date"}, "ts": {"type": "timestamp"}},
    }  # fmt: skip
    return pums_policy(tables=tables)


@pytest.fixture(scope="module")
def connect_url(spark_session) -> str:
    """`sc://` URL of a Spark Connect server started for this module (stopped after it)."""
    missing = [name for name in ("grpc", "pyarrow", "google.protobuf", "zstandard")
               if importlib.util.find_spec(name) is None]  # fmt: skip
    if missing:
        pytest.skip(
            "Spark Connect tests need pyspark's Connect client: pip install 'pyspark[connect]' "
            f"(missing: {', '.join(missing)})"
        )
    port = _free_port()
    env = {key: value for key, value in os.environ.items()
           if key not in ("SPARK_REMOTE", "SPARK_CONNECT_AUTHENTICATE_TOKEN")}  # fmt: skip
    env["TZ"] = "America/New_York"
    server = subprocess.Popen(
        [sys.executable, str(SERVER), str(port)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, env=env,
    )  # fmt: skip
    try:
        _wait_for_line(server, "ready", STARTUP_SECONDS)
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.stdin.close()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()


def test_public_key_releases_over_connect_equal_those_on_local_spark(
    connect_url, spark_session, policy, tmp_path
):
    releases = {}
    # a session of its own: the suite's holds views of the same names as these sources
    for name, database in (("connect", connect_url), ("local", spark_session.newSession())):
        ledger = tmp_path / f"{name}.sqlite"
        with dpsql.connect(database, policy=policy, ledger=ledger, seed=11) as connection:
            releases[name] = [connection.execute(sql).fetchall() for sql in PUBLIC_KEYS]
    for sql, over_connect, on_local in zip(PUBLIC_KEYS, *releases.values(), strict=True):
        assert over_connect == on_local, sql


def test_bounded_aggregates_over_connect_equal_those_on_local_spark(
    connect_url, spark_session, policy, tmp_path
):
    """What the noise is added to: the exact result of the bounded SQL (the same text on
    both, keyed hashes included), and a release of every statement over Connect."""
    exact = {}
    # a session of its own: the suite's holds views of the same names as these sources
    for name, database in (("connect", connect_url), ("local", spark_session.newSession())):
        ledger = tmp_path / f"{name}.sqlite"
        with dpsql.connect(database, policy=policy, ledger=ledger, seed=11) as connection:
            exact[name] = []
            for sql in PUBLIC_KEYS + DATA_KEYS:
                bounded = dict(connection.execute(f"EXPLAIN {sql}").fetchall())["sql"]
                _, rows = connection.session.adapter.execute(bounded)
                exact[name].append((bounded, sorted(rows, key=repr)))
                assert connection.execute(sql).fetchall(), sql  # every group has 100+ units
    for sql, over_connect, on_local in zip(PUBLIC_KEYS + DATA_KEYS, *exact.values(), strict=True):
        assert over_connect == on_local, sql
    # the edge timestamps are read as written, not moved by the server's zone
    _, rows = exact["connect"][len(PUBLIC_KEYS) + DATA_KEYS.index(DATA_KEYS[2])]
    assert sorted(row[0].year for row in rows) == [1, 2020, 9999]


def test_the_session_dpsql_opens_over_connect_is_in_utc(connect_url):
    adapter = SparkAdapter(connect_url)
    try:
        setting = dict(adapter.execute("SET spark.sql.session.timeZone")[1])
        assert setting["spark.sql.session.timeZone"] == "UTC"
        # a date's seconds are read at the session's zone: UTC, not the JVM's New York
        ((seconds,),) = adapter.execute("SELECT UNIX_TIMESTAMP(DATE '2024-01-01')")[1]
        assert seconds == 1704067200
    finally:
        adapter.close()


def test_a_refusal_over_connect_runs_nothing_and_charges_nothing(connect_url, policy, tmp_path):
    with dpsql.connect(connect_url, policy=policy, ledger=tmp_path / "l.sqlite") as connection:
        before = connection.budget()
        with pytest.raises(dpsql.ProgrammingError, match=r"raw rows|not an aggregate|refused"):
            connection.execute("SELECT income FROM pums")
        assert connection.budget() == before
        connection.execute("SELECT COUNT(*) FROM pums").fetchall()
        assert connection.budget().epsilon_spent > before.epsilon_spent


def test_serve_with_two_processes_each_a_connect_client(connect_url, policy, tmp_path):
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy))
    server = subprocess.Popen(
        [sys.executable, "-m", "dpsql.cli", "serve", "--database", connect_url,
         "--policy", str(policy_file), "--ledger", str(tmp_path / "ledger.sqlite"),
         "--trust", "--port", "0", "--processes", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = _wait_for_line(server, "listening on", STARTUP_SECONDS)
        port = int(line.rsplit(":", 1)[1])
        # two connections at once: the parent hands them to different processes
        clients = [
            psycopg.connect(f"host=127.0.0.1 port={port} user=default", autocommit=True)
            for _ in range(2)
        ]
        try:
            counts = [
                client.execute(f"SELECT COUNT(*) FROM pums WHERE age > {age}").fetchall()
                for client, age in zip(clients, (30, 50), strict=True)
            ]
        finally:
            for client in clients:
                client.close()
    finally:
        server.terminate()
        _, errors = server.communicate(timeout=60)
    with duckdb.connect() as source:
        load_pums(source, {"pums": PUMS_TABLES["pums"]})
        truth = [source.execute(f"SELECT COUNT(*) FROM pums WHERE age > {age}").fetchone()[0]
                 for age in (30, 50)]  # fmt: skip
    # epsilon 1, sensitivity 1: a Laplace scale of 1, beyond 20 with probability e^-20
    assert all(abs(rows[0][0] - true) <= 20 for rows, true in zip(counts, truth, strict=True))
    assert server.returncode == 0, errors
