"""Resource limits of one query: memory of a huge GROUP BY, released groups, query time.

* A GROUP BY on a unique column of a few million rows: the result streams from
  the database in batches and partition selection keeps only passing keys, so
  Python's memory (tracemalloc) stays at a few batches, on DuckDB and PostgreSQL.
* Selection batch by batch has the distribution of selection at once (the
  threshold test is per key), and one batch draws exactly what `release` draws.
* More released groups than `max_groups` is refused after the charge when the
  keys come from the data (the count is known only after the noisy selection),
  before it when they are public (the policy fixes the count), with SQLSTATE
  54000 over the wire.
* A statement over `--query-timeout`, or cancelled by its client, is stopped in
  the database: the client gets 57014 within about the timeout and the single
  worker answers the next query at once; the charge stands and nothing is cached.
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import duckdb
import numpy as np
import psycopg
import pytest
import sqlglot
import yaml
from conftest import cancelling
from test_faults import serve_process

import dpsql
from dpsql.errors import BackendError, TooManyGroups
from dpsql.ledger import Ledger
from dpsql.server import BackgroundServer, build
from dpsql.server.limits import Limits

# Unique ids in `big`: a million keeps the suite fast (PostgreSQL sends ~100,000
# rows/s to Python); DPSQL_LIMITS_ROWS=5000000 runs the same test bigger.
ROWS = int(os.environ.get("DPSQL_LIMITS_ROWS", 1_000_000))
# Python memory while answering: a few 10,000-row batches of 3 small ints (~2 MB
# each as tuples) and the kept groups, where all rows at once take ~150 B a row.
MEMORY_BOUND = 32 * 2**20


def _policy(**analysts: dict) -> dict:
    return {
        "version": 1,
        "defaults": {"epsilon_per_query": 1.0, "delta": 1e-6},
        "analysts": analysts or {"default": {"epsilon": 1e6, "delta": 0.5}},
        "tables": {
            "big": {"columns": {"id": {"type": "int"}, "v": {"type": "int", "lower": 0,
                                                            "upper": 100}}},
            "slow": {"columns": {"id": {"type": "int"}, "v": {"type": "int", "lower": 0,
                                                             "upper": 100}}},
            "small": {"columns": {"v": {"type": "int", "lower": 0, "upper": 100}}},
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def duck_big(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A DuckDB file: `big` has ROWS unique ids; `slow` is a view that takes minutes to scan."""
    path = tmp_path_factory.mktemp("limits") / "big.duckdb"
    with duckdb.connect(str(path)) as connection:
        connection.execute(
            f"CREATE TABLE big AS SELECT range AS id, range % 101 AS v FROM range({ROWS})"
        )
        connection.execute(
            "CREATE VIEW slow AS SELECT range AS id, range % 101 AS v FROM range(1000000000000)"
        )
        connection.execute("CREATE TABLE small AS SELECT range % 101 AS v FROM range(1000)")
    return str(path)


@pytest.fixture(scope="module")
def pg_big(postgres_url: str) -> Iterator[str]:
    """The same tables in a PostgreSQL schema; `slow` sleeps 0.05 s per row of 2000."""
    schema = f"h2_limits_{int(time.time() * 1000) % 10**9}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        admin.execute(
            f"CREATE TABLE {schema}.big AS SELECT g::bigint AS id, (g % 101)::int AS v "
            f"FROM generate_series(1, {ROWS}) g"
        )
        admin.execute(
            # v sleeps (pg_sleep's void as text is ''): each row read takes 0.05 s
            f"CREATE VIEW {schema}.slow AS SELECT g::bigint AS id, "
            "(g % 101 + length(pg_sleep(0.05)::text))::int AS v FROM generate_series(1, 2000) g"
        )
        admin.execute(
            f"CREATE TABLE {schema}.small AS SELECT (g % 101)::int AS v "
            "FROM generate_series(1, 1000) g"
        )
    separator = "&" if "?" in postgres_url else "?"
    yield f"{postgres_url}{separator}options={quote(f'-c search_path={schema}')}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["duckdb", "postgres"])
def database(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue("duck_big" if request.param == "duckdb" else "pg_big")


# -- memory -------------------------------------------------------------------------------


def test_group_by_a_unique_column_holds_only_batches_in_memory(
    database: str, tmp_path: Path
) -> None:
    with dpsql.connect(database, policy=_policy(), ledger=tmp_path / "l.sqlite") as connection:
        tracemalloc.start()
        try:
            rows = connection.execute("SELECT id, COUNT(*) AS n FROM big GROUP BY id").fetchall()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # one row per id: each key passes with probability at most delta (1e-6), so
        # about ROWS * delta keys pass (Poisson, mean <= 5 for up to 5M rows)
        assert len(rows) <= 20
        assert peak < MEMORY_BOUND, f"peak {peak / 2**20:.0f} MB"
        assert connection.budget().epsilon_spent == 1.0


# -- released groups --------------------------------------------------------------------


@pytest.fixture()
def grouped(tmp_path: Path) -> Path:
    """40 groups of 400 rows: every key passes the selection."""
    path = tmp_path / "grouped.duckdb"
    with duckdb.connect(str(path)) as connection:
        connection.execute("CREATE TABLE big AS SELECT range % 40 AS id, 1 AS v FROM range(16000)")
        connection.execute("CREATE VIEW slow AS SELECT * FROM big")
        connection.execute("CREATE VIEW small AS SELECT v FROM big")
    return path


def test_more_released_groups_than_the_limit_is_refused_after_the_charge(
    grouped: Path, tmp_path: Path
) -> None:
    ledger = tmp_path / "l.sqlite"
    query = "SELECT id, COUNT(*) AS n FROM big GROUP BY id"
    with dpsql.connect(grouped, policy=_policy(), ledger=ledger, max_groups=39) as connection:
        for charged in (1.0, 2.0):  # nothing is cached: a repeat is charged again
            with pytest.raises(TooManyGroups, match=r"more than 39 groups.*charged.*Instead"):
                connection.execute(query)
            assert connection.budget().epsilon_spent == charged
    with dpsql.connect(grouped, policy=_policy(), ledger=ledger, max_groups=40) as connection:
        assert len(connection.execute(query).fetchall()) == 40


def test_more_public_groups_than_the_limit_is_refused_before_the_charge(
    grouped: Path, tmp_path: Path
) -> None:
    """Keys of a public domain are counted from the policy: refused, nothing is charged;
    a WHERE on the key that leaves few enough of them is answered."""
    policy = _policy()
    policy["tables"]["big"]["columns"]["id"] = {"type": "int", "values": list(range(40))}
    ledger = tmp_path / "l.sqlite"
    with dpsql.connect(grouped, policy=policy, ledger=ledger, max_groups=39) as connection:
        with pytest.raises(TooManyGroups, match=r"more than 39 groups.*nothing was charged"):
            connection.execute("SELECT id, COUNT(*) AS n FROM big GROUP BY id")
        assert connection.budget().epsilon_spent == 0
        rows = connection.execute("SELECT id, COUNT(*) FROM big WHERE id < 39 GROUP BY id")
        assert [row[0] for row in rows.fetchall()] == list(range(39))
        assert connection.budget().epsilon_spent == 1.0


def test_selection_over_an_empty_result_and_over_several_batches(
    grouped: Path, tmp_path: Path
) -> None:
    """Keys from the data: no row at all releases no group; 40 groups read 10 to a batch
    release all 40, with every measurement (a count and a sum) kept beside its key."""
    from dpsql.adapters.duckdb import DuckDBAdapter
    from dpsql.ledger import Ledger
    from dpsql.policy import load_policy
    from dpsql.session import Session

    adapter = DuckDBAdapter(str(grouped))
    small_batches = adapter.stream
    adapter.stream = lambda sql, batch_rows=10: small_batches(sql, 10)  # type: ignore[method-assign]
    session = Session(adapter, load_policy(_policy()), Ledger(tmp_path / "l.sqlite"), seed=4)
    empty = session.execute("SELECT id, COUNT(*), SUM(v) FROM big WHERE v > 5 GROUP BY id")
    assert empty.rows == []
    release = session.execute("SELECT id, COUNT(*) AS n, SUM(v) AS s FROM big GROUP BY id")
    assert [row[0] for row in release.rows] == list(range(40))
    bound = {name: 2 * release.accuracy[name].interval95 for name in ("n", "s")}
    for _, n, s in release.rows:  # 400 rows of v = 1 per key
        assert abs(n - 400) <= bound["n"] and abs(s - 400) <= bound["s"]
    adapter.close()


def test_the_wire_server_refuses_more_groups_than_max_groups_with_54000(
    grouped: Path, tmp_path: Path
) -> None:
    connection = dpsql.connect(grouped, policy=_policy(), ledger=tmp_path / "l.sqlite")
    with BackgroundServer(build(connection, trust=True, limits=Limits(max_groups=10))) as served:
        dsn = f"host=127.0.0.1 port={served.port} user=default"
        with psycopg.connect(dsn, autocommit=True) as client:
            with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="more than 10 groups"):
                client.execute("SELECT id, COUNT(*) FROM big GROUP BY id")
            assert client.execute("SELECT COUNT(*) FROM big WHERE id < 5").fetchone()[0] > 0


def test_selection_batch_by_batch_has_the_distribution_of_selection_at_once(
    grouped: Path, tmp_path: Path
) -> None:
    # 200 keys with exactly tau rows each: each passes with probability about 1/2
    connection = dpsql.connect(grouped, policy=_policy(), ledger=tmp_path / "l", seed=1)
    session = connection.session
    plan = session.plan(sqlglot.parse_one("SELECT id, COUNT(*) FROM big GROUP BY id"))
    tau = plan.selection.tau
    rows = [(key, tau, tau) for key in range(200)]  # key, exact count, distinct units
    columns = ["__dpsql_k0", "__dpsql_m0", "__dpsql_units"]
    same = np.random.default_rng(7), np.random.default_rng(7)
    at_once = plan.release(columns, rows, same[0])
    one_batch = plan.release_batches(columns, iter([rows]), same[1])
    assert at_once.rows == one_batch.rows  # one batch draws exactly what release draws
    rng = np.random.default_rng(11)
    runs = 200
    whole = [len(plan.release(columns, rows, rng).rows) for _ in range(runs)]
    batched = [
        len(plan.release_batches(columns, (rows[i : i + 7] for i in range(0, 200, 7)), rng).rows)
        for _ in range(runs)
    ]
    # each mean is of runs x 200 Bernoulli trials: standard error <= sqrt(200/4/runs) = 0.5
    assert abs(np.mean(whole) - np.mean(batched)) < 5 * 0.5 * np.sqrt(2)
    assert 60 < np.mean(batched) < 140  # near tau, the test is not trivially all or none


# -- query timeout and cancel -----------------------------------------------------------


@pytest.fixture()
def timed(database: str, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """`dpsql serve --workers 1 --query-timeout 1` over DuckDB or PostgreSQL."""
    policy, ledger = tmp_path / "policy.yaml", tmp_path / "ledger.sqlite"
    policy.write_text(yaml.safe_dump(_policy()))
    server, port = serve_process(database, policy, ledger, "--workers", "1", "--query-timeout", "1")
    try:
        yield port, ledger
    finally:
        server.terminate()
        server.wait(timeout=30)


SLOW = "SELECT COUNT(*) FROM slow WHERE v > 3"
QUICK = "SELECT COUNT(*) FROM small WHERE v > 3"


def _answers_promptly(client: psycopg.Connection) -> None:
    """The only worker is free again: the next query does not wait for the slow one."""
    start = time.monotonic()
    assert client.execute(QUICK).fetchone()[0] > 0
    assert time.monotonic() - start < 10


def test_a_query_over_the_timeout_is_stopped_in_the_database(timed: tuple[int, Path]) -> None:
    port, ledger = timed
    with psycopg.connect(f"host=127.0.0.1 port={port} user=default", autocommit=True) as client:
        start = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled, match="stopped in the database"):
            client.execute(SLOW)
        assert time.monotonic() - start < 5
        _answers_promptly(client)
        with pytest.raises(psycopg.errors.QueryCanceled):  # not cached: it runs (and stops) again
            client.execute(SLOW)
    with Ledger(ledger) as book:
        assert book.spent("default").epsilon == 3  # the charges stand: two slow, one quick


def test_a_cancelled_query_is_stopped_in_the_database(timed: tuple[int, Path]) -> None:
    port, _ = timed
    with psycopg.connect(f"host=127.0.0.1 port={port} user=default", autocommit=True) as client:
        with cancelling(client, 0.2), pytest.raises(psycopg.errors.QueryCanceled, match="user"):
            client.execute(SLOW)
        _answers_promptly(client)


@pytest.mark.spark
def test_spark_interrupts_the_jobs_of_one_thread(spark_session) -> None:
    from dpsql.adapters.spark import SparkAdapter

    adapter = SparkAdapter(spark_session)
    outcome: list[BaseException] = []

    def run() -> None:
        try:  # a trillion rows: many minutes, unless interrupted
            with adapter.stream("SELECT SUM(id % 7) FROM range(1000000000000)") as (_, batches):
                list(batches)
        except BackendError as error:
            outcome.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(3)  # the job has started
    start = time.monotonic()
    while worker.is_alive() and time.monotonic() - start < 60:
        adapter.interrupt(worker.ident)
        worker.join(timeout=0.5)
    assert not worker.is_alive() and time.monotonic() - start < 30, outcome
    assert outcome and "Spark stopped" in str(outcome[0])
    assert adapter.execute("SELECT 1")[1] == [(1,)]  # the session still answers
    adapter.close()
