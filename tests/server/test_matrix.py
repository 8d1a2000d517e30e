"""The client matrix: what real tools do by themselves against one `dpsql serve` (DuckDB
backend, shared by the module): psql's meta-commands, SQLAlchemy reflection with
psycopg 3 and psycopg2, pandas, pgJDBC's DatabaseMetaData, node-postgres and pgcli's
completion; and the catalog's guarantees (only the policy's tables, no statistics,
errors rather than empty answers, nothing charged)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pandas
import psycopg
import pytest
import sqlalchemy

TABLES = ["pums", "pums_dup", "pums_null", "pums_pid"]
COLUMNS = ["age", "sex", "educ", "race", "income", "married"]
JDBC_JAR = "/usr/share/java/postgresql.jar"
NPM_CACHE = Path(os.environ.get("DPSQL_NPM_CACHE", "/tmp/dpsql-test-npm"))


def _psql(duck, command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PGPASSWORD": "alice-secret", "PGCONNECT_TIMEOUT": "10"}
    return subprocess.run(
        ["psql", "-X", "-h", "127.0.0.1", "-p", str(duck.port), "-U", "alice", "pums", "-c",
         command],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip


# -- the catalog ---------------------------------------------------------------------


def test_psql_meta_commands_describe_the_policy(duck) -> None:
    before = duck.spent("alice")
    listed = _psql(duck, r"\dt")
    assert listed.returncode == 0, listed.stderr
    assert [line.split("|")[1].strip() for line in listed.stdout.splitlines()[3:-2]] == TABLES
    described = _psql(duck, r"\d+ pums_pid")
    assert described.returncode == 0, described.stderr
    rows = {line.split("|")[0].strip(): line for line in described.stdout.splitlines()[3:]}
    assert {"pid", *COLUMNS} <= set(rows)
    assert "bigint" in rows["age"] and "bounded to [0, 100]" in rows["age"]
    assert "double precision" in rows["income"]
    databases = _psql(duck, r"\l")
    assert databases.returncode == 0 and " pums " in databases.stdout
    assert "public" in _psql(duck, r"\dn").stdout
    functions = _psql(duck, r"\df")
    assert functions.returncode == 0 and "(0 rows)" in functions.stdout
    assert _psql(duck, r"\d pums").stdout.count("bigint") == 5
    assert duck.spent("alice") == before  # catalog queries are free


def test_only_the_policys_tables_and_no_statistics(served) -> None:
    """Over DuckDB and over PostgreSQL, whose database holds other tables too."""
    before = served.spent("alice")
    with psycopg.connect(served.dsn(), autocommit=True) as connection:
        tables = connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema NOT IN "
            "('pg_catalog', 'information_schema') ORDER BY 1"
        ).fetchall()
        assert [name for (name,) in tables] == TABLES
        # an empty, never analysed table's figures, whatever the data holds
        sizes = connection.execute(
            "SELECT reltuples, relpages FROM pg_catalog.pg_class WHERE relname = %s", ["pums"]
        ).fetchone()
        assert sizes == (-1.0, 0)
        for view in ("pg_stats", "pg_catalog.pg_statistic", "pg_stats_ext"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="statistics"):
                connection.execute(f"SELECT * FROM {view}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            connection.execute("SELECT pg_read_file('/etc/passwd')")
    assert served.spent("alice") == before


def test_a_catalog_query_it_cannot_answer_is_an_error(duck) -> None:
    with psycopg.connect(duck.dsn(), autocommit=True) as connection:
        with pytest.raises(psycopg.errors.UndefinedColumn):
            connection.execute("SELECT nosuch FROM pg_catalog.pg_class")
        with pytest.raises(psycopg.errors.UndefinedTable):
            connection.execute("SELECT * FROM pg_catalog.pg_nosuch")
        # what made pg-mimic's catalog answer zero rows
        found = connection.execute(
            "SELECT c.relname, d.description FROM pg_catalog.pg_class c LEFT JOIN "
            "pg_catalog.pg_description d ON d.objoid = c.oid AND d.objsubid = 0 "
            "WHERE c.relkind = ANY (ARRAY['r', 'p']) AND c.relnamespace = "
            "'public'::regnamespace ORDER BY 1"
        ).fetchall()
        assert [name for name, _ in found] == TABLES
        assert connection.execute("SELECT current_schemas(true)").fetchone()[0] == [
            "pg_catalog", "public"
        ]  # fmt: skip


# -- SQLAlchemy, pandas --------------------------------------------------------------


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_sqlalchemy_reflection(duck, driver: str) -> None:
    pytest.importorskip(driver, reason=f"{driver} is not installed (pip install -e '.[test]')")
    engine = sqlalchemy.create_engine(duck.url(scheme=f"postgresql+{driver}"))
    try:
        inspector = sqlalchemy.inspect(engine)
        assert sorted(inspector.get_table_names()) == TABLES
        assert [c["name"] for c in inspector.get_columns("pums")] == COLUMNS
        assert str(inspector.get_columns("pums")[4]["type"]) == "DOUBLE PRECISION"
        assert inspector.get_pk_constraint("pums")["constrained_columns"] == []
        table = sqlalchemy.Table("pums", sqlalchemy.MetaData(), autoload_with=engine)
        assert list(table.c.keys()) == COLUMNS
        with engine.connect() as connection:
            count = connection.execute(
                sqlalchemy.select(sqlalchemy.func.count()).select_from(table)
                .where(table.c.age > 30)
            ).scalar_one()  # fmt: skip
        assert isinstance(count, int) and count > 0
        frame = pandas.read_sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex", engine)
        assert sorted(frame["sex"]) == [0, 1]
        # it reads raw rows: refused with the query's 42501 and its message
        with pytest.raises(pandas.errors.DatabaseError, match="refused the column age"):
            pandas.read_sql_table("pums", engine)
    finally:
        engine.dispose()


# -- pgJDBC --------------------------------------------------------------------------

JDBC_METADATA = """
import java.sql.*;
public class Meta {
  public static void main(String[] a) throws Exception {
    try (Connection c = DriverManager.getConnection(a[0], "alice", "alice-secret")) {
      DatabaseMetaData m = c.getMetaData();
      try (ResultSet r = m.getTables(null, "public", "%", new String[] {"TABLE"})) {
        while (r.next()) System.out.println("table " + r.getString("TABLE_NAME"));
      }
      try (ResultSet r = m.getColumns(null, "public", "pums", "%")) {
        while (r.next()) System.out.println("column " + r.getString("COLUMN_NAME") + " "
            + r.getString("TYPE_NAME") + " " + r.getString("REMARKS"));
      }
      try (ResultSet r = m.getSchemas()) {
        while (r.next()) System.out.println("schema " + r.getString("TABLE_SCHEM"));
      }
      try (ResultSet r = m.getPrimaryKeys(null, "public", "pums")) {
        while (r.next()) System.out.println("key " + r.getString("COLUMN_NAME"));
      }
      try (ResultSet r = m.getImportedKeys(null, "public", "pums_pid")) {
        while (r.next()) System.out.println("imported " + r.getString("FKCOLUMN_NAME"));
      }
      System.out.println("imported done");
      try (Statement s = c.createStatement();
           ResultSet r = s.executeQuery("SELECT COUNT(*) AS n FROM pums")) {
        r.next();
        ResultSetMetaData d = r.getMetaData();
        System.out.println("count " + d.getColumnName(1) + " " + d.getColumnTypeName(1)
            + " " + (r.getLong(1) > 0));
      }
      try (PreparedStatement p = c.prepareStatement(
             "SELECT COUNT(*) AS n FROM pums WHERE age > ?")) {
        p.setInt(1, 30);
        try (ResultSet r = p.executeQuery()) {
          r.next();
          System.out.println("prepared " + (r.getLong(1) > 0));
        }
      }
    }
    try (Connection c = DriverManager.getConnection(a[1], "default", "")) {
      DatabaseMetaData m = c.getMetaData();
      for (String t : new String[] {"customer", "orders", "lineitem"}) {
        try (ResultSet r = m.getPrimaryKeys(null, "public", t)) {
          while (r.next()) System.out.println("primary " + t + " " + r.getString("COLUMN_NAME"));
        }
        try (ResultSet r = m.getImportedKeys(null, "public", t)) {
          while (r.next()) System.out.println("imported " + t + " " + r.getString("FKCOLUMN_NAME")
              + " " + r.getString("PKTABLE_NAME") + " " + r.getString("PKCOLUMN_NAME"));
        }
      }
    }
  }
}
"""


def test_jdbc_database_metadata(duck, tpch, tmp_path) -> None:
    """Over pums (tables, columns, queries) and TPC-H (primary and foreign keys)."""
    if not os.path.exists(JDBC_JAR) or shutil.which("java") is None:
        pytest.skip(f"pgJDBC ({JDBC_JAR}: apt-get install libpostgresql-jdbc-java) or java absent")
    source = tmp_path / "Meta.java"
    source.write_text(JDBC_METADATA)
    # prepareThreshold=1: the metadata queries are prepared at once, and pgJDBC then asks
    # for its binary types in binary next to text columns
    url = f"jdbc:postgresql://127.0.0.1:{duck.port}/pums?prepareThreshold=1"
    keys_url = f"jdbc:postgresql://127.0.0.1:{tpch}/tpch"
    result = subprocess.run(
        ["java", "-cp", JDBC_JAR, str(source), url, keys_url],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("table ")] == TABLES
    columns = [line.split() for line in lines if line.startswith("column ")]
    assert [c[1] for c in columns] == COLUMNS and columns[0][2] == "int8"
    assert "schema public" in lines and "imported done" in lines
    assert "count n int8 true" in lines and "prepared true" in lines
    assert {"primary customer c_custkey", "primary orders o_orderkey",
            "imported lineitem l_orderkey orders o_orderkey"} <= set(lines)  # fmt: skip


# -- node-postgres -------------------------------------------------------------------

NODE_CLIENT = """
const { Client, Pool } = require('pg');
(async () => {
  const config = { host: '127.0.0.1', port: Number(process.argv[2]), user: 'alice',
                   password: 'alice-secret', database: 'pums' };
  const client = new Client(config);
  await client.connect();
  const simple = await client.query('SELECT COUNT(*) AS n FROM pums');
  const extended = await client.query('SELECT COUNT(*) AS n FROM pums WHERE age > $1', [30]);
  const tables = await client.query(
    "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = 'public' ORDER BY 1");
  await client.end();
  const pool = new Pool(config);
  const pooled = await Promise.all([1, 2, 3].map(
    () => pool.query('SELECT COUNT(*) AS n FROM pums WHERE sex = $1', [1])));
  await pool.end();
  console.log(JSON.stringify({ simple: simple.rows[0].n, extended: extended.rows[0].n,
    tables: tables.rows.map(r => r.tablename), pooled: pooled.map(r => r.rows[0].n) }));
})().catch(e => { console.error(e.code, e.message); process.exit(1); });
"""


@pytest.fixture(scope="session")
def node_pg() -> Path:
    """npm's `pg`, installed once into a cache folder outside the repository."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node or npm is not installed")
    if not (NPM_CACHE / "node_modules" / "pg").exists():
        NPM_CACHE.mkdir(parents=True, exist_ok=True)
        installed = subprocess.run(
            ["npm", "install", "--silent", "--no-audit", "--no-fund", "pg@8"],
            cwd=NPM_CACHE, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if installed.returncode != 0:
            pytest.skip(f"npm install pg failed: {installed.stderr.strip()[-300:]}")
    return NPM_CACHE


def test_node_postgres(duck, node_pg: Path) -> None:
    import json

    script = node_pg / "client.js"
    script.write_text(NODE_CLIENT)
    result = subprocess.run(
        ["node", str(script), str(duck.port)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["tables"] == TABLES
    assert int(answer["simple"]) > 0 and int(answer["extended"]) > 0
    assert len(set(answer["pooled"])) == 1  # one release, the repeats free


# -- pgcli ---------------------------------------------------------------------------


def test_pgcli_completes_tables_and_columns(duck, tmp_path) -> None:
    pexpect = pytest.importorskip("pexpect", reason="pexpect is not installed")
    if shutil.which("pgcli") is None:
        pytest.skip("pgcli is not installed (pip install -e '.[test]')")
    env = {**os.environ, "PGPASSWORD": "alice-secret", "TERM": "xterm", "COLUMNS": "120",
           "HOME": str(tmp_path)}  # fmt: skip
    child = pexpect.spawn(
        "pgcli", ["-h", "127.0.0.1", "-p", str(duck.port), "-U", "alice", "pums",
                  "--less-chatty"], env=env, encoding="utf-8", timeout=30, dimensions=(40, 120),
    )  # fmt: skip
    try:
        child.expect("pums>")
        time.sleep(2)  # pgcli reads the catalog in a thread after connecting
        child.send("SELECT * FROM pums_\t")
        child.expect("pums_dup")  # the completion menu lists the policy's tables
        child.expect("pums_pid")
        child.send("\x15")  # Ctrl-U: clear the line
        child.send("SELECT * FROM pums WHERE inc\t")
        child.expect("income")
    finally:
        child.terminate(force=True)


# -- keys, formats, neighbouring data ----------------------------------------------


@pytest.fixture(scope="module")
def tpch(tmp_path_factory: pytest.TempPathFactory):
    """A trusted server over a TPC-H database (primary keys) and policy (a `via`): its port."""
    import duckdb
    from tpch import generate
    from tpch import policy as tpch_policy

    import dpsql
    from dpsql.server import BackgroundServer, build

    folder = tmp_path_factory.mktemp("tpch")
    with duckdb.connect(str(folder / "tpch.duckdb")) as connection:
        generate(connection)
    connection = dpsql.connect(
        str(folder / "tpch.duckdb"), policy=tpch_policy(), analyst="default",
        ledger=str(folder / "ledger.sqlite"),
    )  # fmt: skip
    with BackgroundServer(build(connection, trust=True, workers=1)) as server:
        yield server.port


def test_keys_come_from_the_database_and_the_policy(tpch) -> None:
    """The database's primary keys are the catalog's (a unit kept unique is the PRIMARY
    KEY); lineitem reads its unit through orders: a FOREIGN KEY; comments say what the
    policy says of each table."""
    dsn = f"host=127.0.0.1 port={tpch} user=default dbname=tpch"
    with psycopg.connect(dsn, autocommit=True) as client:
        keys = client.execute(
            "SELECT tc.table_name, tc.constraint_type, kcu.column_name "
            "FROM information_schema.table_constraints tc JOIN "
            "information_schema.key_column_usage kcu USING (constraint_name) "
            "WHERE tc.table_schema = 'public' ORDER BY 1, 2, 3"
        ).fetchall()
        comment = client.execute(
            "SELECT obj_description('public.orders'::regclass, 'pg_class')"
        ).fetchone()[0]
    assert ("customer", "PRIMARY KEY", "c_custkey") in keys
    assert ("orders", "PRIMARY KEY", "o_orderkey") in keys
    assert ("lineitem", "FOREIGN KEY", "l_orderkey") in keys
    assert comment == "private, unit o_custkey: answers are noisy aggregates"


def test_asyncpg_reads_the_catalog_in_binary(duck) -> None:
    asyncpg = pytest.importorskip("asyncpg")
    import asyncio

    async def run() -> list:
        connection = await asyncpg.connect(duck.url())
        try:
            return await connection.fetch(
                "SELECT c.relname, c.reltuples, c.relpages, c.relhasindex, c.oid "
                "FROM pg_catalog.pg_class c WHERE c.relnamespace = $1::regnamespace "
                "ORDER BY 1", "public",
            )  # fmt: skip
        finally:
            await connection.close()

    rows = asyncio.run(run())
    assert [row["relname"] for row in rows] == TABLES
    assert {(row["reltuples"], row["relpages"]) for row in rows} == {(-1.0, 0)}


def test_the_catalog_does_not_depend_on_the_data(pums_db, tmp_path) -> None:
    """Neighbouring databases (one person removed) get byte-identical catalog answers."""
    import duckdb

    import dpsql
    from dpsql.server import BackgroundServer, build

    from .conftest import _policy

    smaller = tmp_path / "smaller.duckdb"
    shutil.copy(pums_db, smaller)
    with duckdb.connect(str(smaller)) as connection:
        for table in TABLES:
            connection.execute(
                f"DELETE FROM {table} WHERE rowid = (SELECT MIN(rowid) FROM {table})"
            )
    query = (
        "SELECT c.relname, c.reltuples, c.relpages, a.attname, a.atttypid, "
        "pg_catalog.col_description(c.oid, a.attnum) FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 "
        "WHERE c.relnamespace = 'public'::regnamespace ORDER BY 1, 4"
    )
    answers = []
    for database in (pums_db, smaller):
        connection = dpsql.connect(
            str(database),
            policy=_policy(),
            analyst="alice",
            ledger=str(tmp_path / f"{database.stem}.sqlite"),
        )
        with BackgroundServer(build(connection, trust=True, workers=1)) as server:
            dsn = f"host=127.0.0.1 port={server.port} user=alice dbname=pums"
            with psycopg.connect(dsn, autocommit=True) as client:
                answers.append(client.execute(query).fetchall())
            assert float(connection.session.ledger.spent("alice").epsilon) == 0.0
    assert answers[0] == answers[1] and len(answers[0]) > 20


def test_a_private_table_next_to_the_catalog_is_the_sessions(duck) -> None:
    """Not the catalog's empty copy of pums: the Session's refusal or noisy answer."""
    with psycopg.connect(duck.dsn(), autocommit=True) as connection:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not in the privacy"):
            connection.execute("SELECT * FROM pums, pg_catalog.pg_class")
        with pytest.raises(psycopg.Error) as refused:
            connection.execute("SELECT COUNT(*) FROM pums WHERE age OPERATOR(pg_catalog.>) 30")
        assert refused.value.sqlstate in ("42601", "42501")


def test_psycopg2_simple_parameters_and_copy(duck) -> None:
    psycopg2 = pytest.importorskip("psycopg2", reason="psycopg2 is not installed")
    import io

    connection = psycopg2.connect(duck.dsn())
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) AS n FROM pums WHERE age > %s", (30,))
            (count,) = cursor.fetchone()
            assert isinstance(count, int) and count > 0
            cursor.execute("SELECT COUNT(*) AS n FROM pums WHERE age > %s", (30,))
            assert cursor.fetchone() == (count,)  # the same release, free
            out = io.StringIO()
            cursor.copy_expert(
                "COPY (SELECT COUNT(*) AS n FROM pums WHERE age > 30) TO STDOUT WITH CSV", out
            )
            assert out.getvalue() == f"{count}\n"
    finally:
        connection.close()


def test_sqlalchemy_orm_query(duck) -> None:
    from sqlalchemy.ext.automap import automap_base
    from sqlalchemy.orm import Session

    engine = sqlalchemy.create_engine(duck.url(scheme="postgresql+psycopg"))
    try:
        metadata = sqlalchemy.MetaData()
        pums = sqlalchemy.Table("pums", metadata, autoload_with=engine)
        base = automap_base(metadata=metadata)

        class Person(base):  # no key in the policy: the ORM maps it by all its columns
            __table__ = pums
            __mapper_args__ = {"primary_key": [pums.c.age, pums.c.sex]}  # noqa: RUF012

        base.prepare()
        with Session(engine) as session:
            rows = session.execute(
                sqlalchemy.select(Person.sex, sqlalchemy.func.count().label("n"))
                .group_by(Person.sex).order_by(Person.sex)
            ).all()  # fmt: skip
        assert [row.sex for row in rows] == [0, 1] and all(row.n > 0 for row in rows)
    finally:
        engine.dispose()


def test_session_functions_have_postgresqls_column_names(duck) -> None:
    with psycopg.connect(duck.dsn() + " dbname=pums", autocommit=True) as connection:
        cursor = connection.execute(
            "SELECT current_setting('search_path'), current_user, current_database(), "
            "session_user, current_schemas(true) IS NOT NULL AS listed"
        )
        assert [c.name for c in cursor.description] == [
            "current_setting", "current_user", "current_database", "session_user", "listed"
        ]  # fmt: skip
        assert cursor.fetchone() == ('"$user", public', "alice", "pums", "alice", True)
        cursor = connection.execute(
            "SELECT current_schemas(true), current_setting('statement_timeout')"
        )
        assert cursor.fetchone() == (["pg_catalog", "public"], "0")


def test_a_slow_catalog_query_is_cancelled(duck, monkeypatch) -> None:
    from dpsql.server import catalog

    monkeypatch.setattr(catalog, "TIMEOUT_MS", 300)
    with psycopg.connect(duck.dsn(), autocommit=True) as connection:
        with pytest.raises(psycopg.errors.QueryCanceled):
            connection.execute("SELECT pg_sleep(5) FROM pg_catalog.pg_class LIMIT 1")
        count = connection.execute("SELECT COUNT(*) FROM pg_catalog.pg_namespace").fetchone()
        assert count[0] > 0


def test_a_dead_servers_catalog_is_stopped_by_the_next() -> None:
    """A server killed with SIGKILL leaves its cluster running: the next one stops it."""
    from dpsql.policy import load_policy
    from dpsql.server.catalog import Catalog

    from .conftest import _policy

    policy = load_policy(_policy())
    killed, following = Catalog(policy), Catalog(policy)
    try:
        killed.query("SELECT 1", [], "alice", "pums")
        folder = killed._folder
        dead = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True)
        (folder / "owner").write_text(dead.stdout.strip())  # a process that has exited
        following.query("SELECT 1", [], "alice", "pums")
        assert not folder.exists()
    finally:
        following.stop()
        killed.stop()
