"""Adapter-specific behaviour: PostgreSQL (psycopg pool), SQLAlchemy URLs, and which
adapter a database argument opens. The query suite itself runs on every backend
in test_queries, test_refusals, test_sensitivity and test_budget."""

from __future__ import annotations

import csv
import os
import sqlite3
import threading
from pathlib import Path

import pytest
from conftest import PUMS_TABLES, pums_policy, require_pums

import dpsql
from dpsql.adapters import open_adapter
from dpsql.adapters.duckdb import DuckDBAdapter
from dpsql.adapters.postgres import PostgresAdapter
from dpsql.adapters.sqlalchemy import SQLAlchemyAdapter, sqlglot_dialect
from dpsql.errors import BackendError
from dpsql.policy import Source


@pytest.fixture(scope="module")
def pg(postgres_backend):
    """A schema of this module's own with keyed tables, and an adapter reading it."""
    import psycopg

    admin = psycopg.connect(postgres_backend.admin_url, autocommit=True)
    schema = "dpsql_backends_" + postgres_backend.database.rsplit("_", 1)[1]
    admin.execute(f"CREATE SCHEMA {schema}")
    admin.execute(
        f"CREATE TABLE {schema}.people (pid int PRIMARY KEY, email text UNIQUE, "
        "team int, badge int, secret text)"
    )
    admin.execute(f"CREATE UNIQUE INDEX ON {schema}.people (badge) WHERE badge > 0")
    admin.execute(f"CREATE UNIQUE INDEX ON {schema}.people (team, badge)")
    admin.execute(f'CREATE TABLE {schema}."Mixed" ("Value" int)')
    admin.execute(
        f"INSERT INTO {schema}.people SELECT i, 'p' || i || '@x', i % 3, i, 'hush' || i "
        "FROM generate_series(1, 50) AS i"
    )
    adapter = PostgresAdapter(postgres_backend.database, pool_size=2)
    yield adapter, schema, admin
    adapter.close()
    admin.execute(f"DROP SCHEMA {schema} CASCADE")
    admin.close()


def test_postgres_catalog_follows_postgresql_name_rules(pg):
    adapter, schema, _ = pg
    expected = {"pid", "email", "team", "badge", "secret"}
    assert set(adapter.table_columns(f"{schema}.people")) == expected
    assert set(adapter.table_columns(f"{schema.upper()}.PEOPLE")) == expected  # unquoted: folded
    # "Value" needs its quotes, which the rewrite, folding policy names, never writes
    assert adapter.table_columns(f'{schema}."Mixed"') == {}
    assert adapter.table_columns(f"{schema}.mixed") is None  # "Mixed" needs its quotes
    assert adapter.table_columns("pums") is not None  # found through the URL's search_path
    assert adapter.table_columns("no_such_table") is None
    assert adapter.table_columns("a.b.c.d") is None
    # PRIMARY KEY and UNIQUE count; a partial or a two-column unique index does not
    assert adapter.unique_columns(f"{schema}.people") == {"pid", "email"}
    assert adapter.unique_columns("pums_pid") == set()


def test_postgres_statements_are_read_only_and_rolled_back(pg):
    adapter, schema, admin = pg
    with pytest.raises(BackendError, match="25006"):
        adapter.execute(f"DELETE FROM {schema}.people")
    with pytest.raises(BackendError, match="42601"):  # one statement per call
        adapter.execute(f"SET TRANSACTION READ WRITE; DELETE FROM {schema}.people")
    assert adapter.execute("SELECT 'a%' LIKE 'a%'")[1] == [(True,)]
    assert admin.execute(f"SELECT COUNT(*) FROM {schema}.people").fetchone()[0] == 50
    columns, rows = adapter.execute("SHOW transaction_read_only")
    assert (columns, rows) == (["transaction_read_only"], [("on",)])


def test_postgres_errors_do_not_quote_stored_values(pg):
    adapter, schema, _ = pg
    with pytest.raises(BackendError) as raised:
        adapter.execute(f"SELECT CAST(secret AS int) FROM {schema}.people")
    assert "hush" not in str(raised.value) and "22P02" in str(raised.value)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_postgres_statement_timeout_cancels_long_queries(postgres_backend):
    adapter = PostgresAdapter(postgres_backend.database, statement_timeout=0.2)
    try:
        with pytest.raises(BackendError, match=r"statement timeout of 0\.2 s"):
            adapter.execute("SELECT pg_sleep(5)")
        assert adapter.execute("SELECT 1")[1] == [(1,)]  # the connection is still usable
    finally:
        adapter.close()


def test_postgres_pool_is_shared_by_threads(pg):
    adapter, schema, _ = pg
    results, errors = [], []

    def work(i: int) -> None:
        try:
            for _ in range(10):
                sql = f"SELECT COUNT(*) FROM {schema}.people WHERE pid <= {i}"
                results.append((i, adapter.execute(sql)[1][0][0]))
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(results) == 80 and all(i == n for i, n in results)


def test_postgres_unreachable_server_is_a_clear_error_without_the_password():
    with pytest.raises(BackendError) as raised:
        PostgresAdapter("postgresql://u:topsecret@127.0.0.1:1/db", connect_timeout=1)
    message = str(raised.value)
    assert "127.0.0.1:1/db" in message and "topsecret" not in message


def test_a_unique_unit_in_postgres_needs_no_bounding(pg, postgres_backend, tmp_path):
    _, schema, _ = pg
    policy = {
        "analysts": {"default": {"epsilon": 10.0}},
        "tables": {f"{schema}.people": {
            "privacy_unit": "pid", "max_rows_per_unit": 5,
            "columns": {"pid": {"type": "int", "private": True},
                        "team": {"type": "int", "values": [0, 1, 2]}},
        }},
    }  # fmt: skip
    with dpsql.connect(postgres_backend.database, policy=policy, ledger=tmp_path / "l") as con:
        explained = dict(con.execute(f"EXPLAIN SELECT COUNT(*) FROM {schema}.people").fetchall())
        assert "ROW_NUMBER" not in explained["sql"] and "keeps unique" in explained["privacy"]
        cursor = con.execute(f"SELECT team, COUNT(*) AS n FROM {schema}.people GROUP BY team")
        assert [row[0] for row in cursor.fetchall()] == [0, 1, 2]
        assert cursor.accuracy["n"].sensitivity == 1


def test_only_keys_postgresql_enforces_on_every_row_read_make_a_unit_unique(pg, postgres_url):
    """A parent's PRIMARY KEY does not cover its inheritance children, which FROM parent
    reads; a failed CREATE UNIQUE INDEX CONCURRENTLY leaves an invalid index over
    duplicates. Either made a unit with 501 rows "unique" (sensitivity 1; found by an
    audit). A partitioned table's key does cover its partitions. Both adapters."""
    import psycopg

    adapter, schema, admin = pg
    admin.execute(f"CREATE TABLE {schema}.parent (pid int PRIMARY KEY, age int)")
    admin.execute(f"CREATE TABLE {schema}.child () INHERITS ({schema}.parent)")
    admin.execute(f"INSERT INTO {schema}.child SELECT 7, i FROM generate_series(1, 501) i")
    admin.execute(f"CREATE TABLE {schema}.dups (pid int, age int)")
    admin.execute(f"INSERT INTO {schema}.dups SELECT 7, i FROM generate_series(1, 501) i")
    with pytest.raises(psycopg.errors.UniqueViolation):
        admin.execute(f"CREATE UNIQUE INDEX CONCURRENTLY dups_pid ON {schema}.dups (pid)")
    admin.execute(
        f"CREATE TABLE {schema}.parts (pid int PRIMARY KEY, age int) PARTITION BY RANGE (pid)"
    )
    admin.execute(f"CREATE TABLE {schema}.parts_low PARTITION OF {schema}.parts "
                  "FOR VALUES FROM (0) TO (100)")  # fmt: skip
    # a key on "PID" says nothing of pid, the column the rewrite reads (folded): read
    # as one, pid with 501 rows of one person was a unique unit (found by an audit)
    admin.execute(f'CREATE TABLE {schema}.twins ("PID" serial PRIMARY KEY, pid int, age int)')
    admin.execute(
        f"INSERT INTO {schema}.twins (pid, age) SELECT 7, i FROM generate_series(1, 501) i"
    )
    alchemy = SQLAlchemyAdapter(postgres_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        for each in (adapter, alchemy):
            assert each.unique_columns(f"{schema}.parent") == set()
            assert each.unique_columns(f"{schema}.dups") == set()
            assert each.unique_columns(f"{schema}.parts") == {"pid"}
            assert each.unique_columns(f"{schema}.people") == {"pid", "email"}
            assert each.unique_columns(f"{schema}.twins") == set()
            assert set(each.table_columns(f"{schema}.twins")) == {"pid", "age"}
    finally:
        alchemy.close()


def test_every_adapter_to_one_postgresql_database_names_it_alike(pg, postgres_url, tmp_path):
    """Release caches, streams and synopses are kept per database (Adapter.identity): the
    PostgreSQL and SQLAlchemy adapters to one database must name it alike, whatever
    host name reaches it (the cluster's system identifier); a SQLite file is named by
    its real path, whatever relative name reached it."""
    adapter, _, _ = pg
    other_name = postgres_url.replace("127.0.0.1", "localhost")
    assert other_name != postgres_url
    alchemy = SQLAlchemyAdapter(other_name.replace("postgresql://", "postgresql+psycopg://"))
    try:
        assert alchemy.identity == adapter.identity
        cluster = adapter.identity.split(":")[1]
        assert cluster.isdigit() and adapter.identity.startswith("postgres:")
    finally:
        alchemy.close()
    here = Path.cwd()
    try:
        os.chdir(tmp_path)
        relative = SQLAlchemyAdapter("sqlite:///people.db")
        assert relative.identity == f"sqlalchemy:sqlite:///{tmp_path / 'people.db'}"
        relative.close()
    finally:
        os.chdir(here)


# -- which adapter a database argument opens ------------------------------------


def test_open_adapter_dispatches_on_the_argument(pums_db, postgres_backend):
    assert isinstance(open_adapter(":memory:"), DuckDBAdapter)
    assert isinstance(open_adapter(pums_db), DuckDBAdapter)  # a path object
    postgres = open_adapter(postgres_backend.database)
    assert isinstance(postgres, PostgresAdapter) and postgres.dialect == "postgres"
    postgres.close()
    generic = open_adapter(
        postgres_backend.admin_url.replace("postgresql://", "postgresql+psycopg://")
    )
    assert isinstance(generic, SQLAlchemyAdapter) and generic.dialect == "postgres"
    generic.close()
    with pytest.raises(dpsql.NotSupportedError, match="Spark backend"):
        open_adapter(":memory:", {"events": Source("parquet", "events/*.parquet")})


def test_sqlglot_dialects_for_sqlalchemy_names():
    assert [sqlglot_dialect(n) for n in ("postgresql", "mssql", "mariadb", "sqlite", "trino")] == [
        "postgres", "tsql", "mysql", "sqlite", "trino"
    ]  # fmt: skip
    with pytest.raises(dpsql.NotSupportedError, match="supported: "):
        sqlglot_dialect("firebird")


def test_a_url_database_needs_a_persistent_ledger(postgres_backend, tmp_path):
    with pytest.raises(dpsql.InterfaceError, match="persistent budget ledger"):
        dpsql.connect(postgres_backend.database, policy=pums_policy())
    with dpsql.connect(
        postgres_backend.database, policy=pums_policy() | {"ledger": str(tmp_path / "b.sqlite")}
    ) as connection:
        connection.execute("SELECT COUNT(*) FROM pums")
        assert connection.budget().epsilon_spent == 1.0
    assert (tmp_path / "b.sqlite").exists()


# -- SQLAlchemy URLs ----------------------------------------------------------------


def test_sqlalchemy_on_postgres_answers_and_stays_read_only(postgres_backend, tmp_path):
    url = postgres_backend.database.replace("postgresql://", "postgresql+psycopg://")
    adapter = SQLAlchemyAdapter(url)
    try:
        assert set(adapter.table_columns("PUMS_PID")) == {
            "age", "sex", "educ", "race", "income", "married", "pid"
        }  # fmt: skip
        assert adapter.table_columns("nothing_here") is None
        assert adapter.execute("SELECT 'a%' LIKE 'a%'") == (["?column?"], [(True,)])
        with pytest.raises(BackendError, match="ReadOnlySqlTransaction"):
            adapter.execute("DROP TABLE pums")
    finally:
        adapter.close()
    policy = pums_policy()
    policy["tables"]["pums_dup"]["max_rows_per_unit"] = 1
    with dpsql.connect(url, policy=policy, ledger=tmp_path / "l", seed=3) as connection:
        cursor = connection.execute("SELECT sex, COUNT(*) AS n FROM pums_dup GROUP BY sex")
        rows = dict(cursor.fetchall())
    # 1,000 people, each counted once: the two noisy counts add up to about 1,000
    assert set(rows) == {0, 1}
    assert abs(sum(rows.values()) - 1000) <= 2 * 6 * cursor.accuracy["n"].scale


@pytest.fixture(scope="module")
def sqlite_url(tmp_path_factory):
    """The PUMS tables in an SQLite file (SQLite has no MD5: the adapter supplies it)."""
    folder = require_pums()
    path = tmp_path_factory.mktemp("sqlite") / "pums.sqlite"
    with sqlite3.connect(path) as connection:
        for table, name in PUMS_TABLES.items():
            with open(folder / name, newline="") as handle:
                reader = csv.reader(handle)
                header = next(reader)
                connection.execute(f"CREATE TABLE {table} ({', '.join(header)})")
                marks = ", ".join("?" * len(header))
                rows = [[float(v) if v else None for v in row] for row in reader]
                connection.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        connection.execute("CREATE UNIQUE INDEX pid_key ON pums_pid (pid)")
    return f"sqlite:///{path}"


def test_two_entries_for_one_sqlite_table_are_refused(sqlite_url, tmp_path):
    """`pums_pid` and `main.pums_pid` name one table: an analyst could read it under the
    weaker entry (DuckDB, PostgreSQL and Spark checked this; SQLAlchemy did not)."""
    policy = pums_policy()
    policy["tables"]["main.pums_pid"] = {"columns": {"pid": {"type": "int"}}}
    with pytest.raises(dpsql.PolicyError, match="can name the same table"):
        dpsql.connect(sqlite_url, policy=policy, ledger=tmp_path / "l")
    del policy["tables"]["main.pums_pid"]
    dpsql.connect(sqlite_url, policy=policy, ledger=tmp_path / "l").close()


def test_sqlalchemy_on_sqlite_bounds_users_and_finds_unique_units(sqlite_url, tmp_path):
    adapter = SQLAlchemyAdapter(sqlite_url)
    assert adapter.dialect == "sqlite"
    assert adapter.unique_columns("pums_pid") == {"pid"} and adapter.unique_columns("pums") == set()
    adapter.close()
    policy = pums_policy()
    policy["tables"]["pums_dup"]["max_rows_per_unit"] = 1
    with dpsql.connect(sqlite_url, policy=policy, ledger=tmp_path / "l", seed=5) as connection:
        explained = dict(connection.execute("EXPLAIN SELECT COUNT(*) FROM pums_dup").fetchall())
        assert "MD5(" in explained["sql"] and "ROW_NUMBER" in explained["sql"]
        cursor = connection.execute(
            "SELECT COUNT(*) AS n, COUNT(DISTINCT pid) AS people, AVG(age) AS age FROM pums_dup"
        )
        n, people, age = cursor.fetchone()
    # 1,948 rows of 1,000 people: one row per person kept
    assert abs(n - 1000) <= 6 * cursor.accuracy["n"].scale
    assert abs(people - 1000) <= 6 * cursor.accuracy["people"].scale
    assert 30 < age < 60


def test_date_parts_and_rounding_run_on_every_backend(visits):
    """sqlglot writes DAYOFWEEK, DAYOFYEAR and QUARTER for PostgreSQL as functions it
    lacks, and PostgreSQL rounds to decimals only in NUMERIC: each failed there after
    its charge. The rewrite spells them as PostgreSQL can run them."""
    connection, table = visits
    connection.execute("SET dpsql.epsilon = 50")  # no day of the week below the threshold
    rows = connection.execute(
        f"SELECT DAYOFWEEK(day) AS dow, COUNT(*) FROM {table} GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert [row[0] for row in rows] == list(range(7))  # Sunday is 0 on both
    rows = connection.execute(
        f"SELECT QUARTER(day) AS q, COUNT(*) FROM {table} GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert [row[0] for row in rows] == [1, 2, 3]  # 200 days from 1 January
    # DuckDB's DATE_PART is read as EXTRACT (sqlglot left it an unknown function there)
    rows = connection.execute(
        f"SELECT DATE_PART('quarter', day) AS q, COUNT(*) FROM {table} GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert [row[0] for row in rows] == [1, 2, 3]
    spent = connection.budget().epsilon_spent
    with pytest.raises(dpsql.QueryRefused, match="unit is not one every backend knows"):
        connection.execute(f"SELECT COUNT(*) FROM {table} WHERE DATE_PART('foo', day) = 1")
    assert connection.budget().epsilon_spent == spent
    (total,) = connection.execute(
        f"SELECT SUM(ROUND(age / 3, 2)) FROM {table} WHERE DAYOFYEAR(day) < 150"
    ).fetchone()
    assert total is not None


def test_a_duckdb_database_is_named_by_its_file_and_what_it_attaches(tmp_path):
    """Two in-memory connections that attach different files (and read them through
    views) were one database to the ledger: one's cached answer was served for the
    other (found by a review). A file is named by its real path, however reached."""
    import duckdb

    for name in ("a", "b"):
        duckdb.connect(str(tmp_path / f"{name}.duckdb")).close()
    (tmp_path / "link.duckdb").symlink_to(tmp_path / "a.duckdb")
    names = []
    for name in ("a", "b"):
        connection = duckdb.connect()
        connection.execute(f"ATTACH '{tmp_path / name}.duckdb' AS source")
        names.append(DuckDBAdapter(connection).identity)
        connection.close()
    assert names[0] != names[1] and str(tmp_path / "a.duckdb") in names[0]
    assert DuckDBAdapter(duckdb.connect()).identity == "duckdb:memory"
    by_link = DuckDBAdapter(str(tmp_path / "link.duckdb"))
    assert by_link.identity == f"duckdb:{os.path.realpath(tmp_path / 'a.duckdb')}"
    by_link.close()


def test_a_duckdb_file_this_process_holds_open_otherwise_says_what_to_do(tmp_path):
    """DuckDB opens a file once per process, with the first opener's configuration:
    its own message ("Can't open a connection to same database file with a different
    configuration") said neither why nor what to write."""
    import duckdb

    path = tmp_path / "held.duckdb"
    column = {"type": "int", "lower": 0, "upper": 9}
    policy = {"version": 1, "analysts": {"default": {"epsilon": 1.0}},
              "tables": {"t": {"columns": {"x": column}}}}  # fmt: skip
    held = duckdb.connect(str(path))
    held.execute("CREATE TABLE t AS SELECT 1 AS x")
    with pytest.raises(BackendError) as raised:
        dpsql.connect(str(path), policy=policy, ledger=":memory:")
    message = str(raised.value)
    assert "already has it open with another configuration" in message
    assert "dpsql.connect(con, policy=...)" in message and "close it" in message
    with dpsql.connect(held, policy=policy, ledger=":memory:") as through_it:  # as advised
        assert through_it.execute("SELECT COUNT(*) FROM t").fetchall()
    held.close()  # or close it first
    dpsql.connect(str(path), policy=policy, ledger=":memory:").close()


# -- table names resolve as the engine resolves them -------------------------------------


def _count_policy(*names: str) -> dict:
    column = {"x": {"type": "int", "lower": 0, "upper": 9}}
    return {"version": 1, "defaults": {"epsilon_per_query": 1000.0},
            "analysts": {"default": {"epsilon": 1e6}},
            "tables": {name: {"columns": column} for name in names}}  # fmt: skip


def _counts(connection: dpsql.Connection, *names: str) -> list[int]:
    """The (near exact) row counts a query reads under each table name."""
    return [round(connection.execute(f"SELECT COUNT(*) FROM {n}").fetchall()[0][0]) for n in names]


def test_duckdb_names_resolve_as_duckdb_resolves_them(tmp_path):
    """SmartNoise's `PUMS.PUMS` (schema PUMS, table PUMS) beside `pums` was refused as
    "could name the same table", and an entry `main.pums` did not match `FROM pums`:
    both follow DuckDB's rules now (current schema main, `a.t` is database a's if one
    exists), and only entries DuckDB resolves to one table are refused."""
    import duckdb

    database = duckdb.connect()
    database.execute("CREATE TABLE pums AS SELECT 1 AS x FROM range(10)")
    database.execute("CREATE SCHEMA PUMS")
    database.execute("CREATE TABLE PUMS.PUMS AS SELECT 2 AS x FROM range(30)")
    database.execute(f"ATTACH '{tmp_path / 'other.duckdb'}' AS other")
    database.execute("CREATE TABLE other.main.pums AS SELECT 3 AS x FROM range(50)")
    both = _count_policy("pums", "PUMS.PUMS", "other.main.pums")
    with dpsql.connect(database, policy=both, ledger=":memory:", seed=1) as connection:
        assert _counts(connection, "pums", "PUMS.PUMS", "other.main.pums") == [10, 30, 50]
        # other names of those tables read them under their entries
        assert _counts(connection, "main.pums", "memory.main.pums", "memory.PUMS.PUMS") == [
            10, 10, 30]  # fmt: skip
        assert _counts(connection, "other.pums") == [50]
    with dpsql.connect(database, policy=_count_policy("main.pums"), ledger=":memory:") as one:
        assert _counts(one, "pums", "main.pums") == [10, 10]
        with pytest.raises(dpsql.QueryRefused, match="not in the privacy policy"):
            one.execute("SELECT COUNT(*) FROM PUMS.PUMS")
    for twins in (("pums", "main.pums"), ("PUMS.PUMS", "memory.PUMS.pums"),
                  ("other.pums", "other.main.pums")):  # fmt: skip
        with pytest.raises(dpsql.PolicyError, match="can name the same table"):
            dpsql.connect(database, policy=_count_policy(*twins), ledger=":memory:")


def test_duckdb_columns_are_those_of_the_table_the_name_reads():
    """Columns were gathered from every same-named table: the DECIMAL of PUMS.PUMS typed
    pums's column, or the reverse, and a DECIMAL read as stored could fail row by row."""
    import duckdb

    database = duckdb.connect()
    database.execute("CREATE TABLE pums (x DECIMAL(38, 2), only_here INT)")
    database.execute("CREATE SCHEMA PUMS")
    database.execute("CREATE TABLE PUMS.PUMS (x DOUBLE)")
    adapter = DuckDBAdapter(database)
    assert adapter.table_columns("pums") == {"x": "DECIMAL(38,2)", "only_here": "INTEGER"}
    assert adapter.table_columns("PUMS.PUMS") == {"x": "DOUBLE"}


def test_postgres_names_resolve_through_the_search_path(postgres_url):
    """An entry `sales.orders` matches `FROM orders` when sales is first on the search
    path; the same name in a later schema is another table, and loads beside it."""
    from conftest import postgres_tables

    with postgres_tables(postgres_url, {"orders (x int)": [(1,)] * 10}) as url:
        schema = url.rsplit("search_path%3D", 1)[1]
        import psycopg

        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}_b")
            admin.execute(f"CREATE TABLE {schema}_b.orders AS SELECT 2 AS x FROM "
                          "generate_series(1, 30)")  # fmt: skip
            try:
                path = f"{url}%2C{schema}_b"
                policy = _count_policy(f"{schema}.orders", f"{schema}_b.orders")
                with dpsql.connect(path, policy=policy, ledger=":memory:", seed=1) as connection:
                    assert _counts(
                        connection, "orders", f"{schema}.orders", f"{schema}_b.orders"
                    ) == [10, 10, 30]
                with pytest.raises(dpsql.PolicyError, match="can name the same table"):
                    dpsql.connect(path, policy=_count_policy("orders", f"{schema}.orders"),
                                  ledger=":memory:")  # fmt: skip
            finally:
                admin.execute(f"DROP SCHEMA {schema}_b CASCADE")
