"""Protocol fidelity with real clients: pools' housekeeping batches, typed parameters, a `$n`
without a value, Describe without Execute, and COPY (SELECT ...) TO STDOUT.

Where PostgreSQL's own answer is the reference (command tags, SQLSTATEs, COPY bytes),
the same client runs the same statement against the test PostgreSQL server too.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess

import psycopg
import pytest
import sqlalchemy
from psycopg import generators, waiting

from dpsql.server import batches

asyncpg = pytest.importorskip("asyncpg")

GROUPED = "SELECT sex, COUNT(*) AS n FROM pums WHERE age > {age} GROUP BY sex ORDER BY sex"
# what asyncpg's Pool sends when a connection is released
POOL_RESET = "SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL;"


def _psql(served, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PGPASSWORD": "alice-secret", "PGCONNECT_TIMEOUT": "10"}
    command = ["psql", "-X", "-h", "127.0.0.1", "-p", str(served.port), "-U", "alice", "pums"]
    return subprocess.run(command + list(args), capture_output=True, text=True, env=env, timeout=60)


def _charges(served) -> int:
    return len(served.connection.session.ledger.charges("alice"))


def _tags(dsn: str, sql: str) -> list[tuple[str, list | None]]:
    """Each result of a simple-query batch: its command tag and rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(sql)
        results = []
        while True:
            rows = cursor.fetchall() if cursor.description else None
            results.append((cursor.statusmessage, rows))
            if not cursor.nextset():
                return results


# -- batches -------------------------------------------------------------------------


def test_split_keeps_statements_as_written() -> None:
    sql = "SELECT 'a;b', $$c;d$$ /* e;f */; -- g;h\n SELECT \"i;j\" ;; UNLISTEN *;"
    assert batches.split(sql) == [
        "SELECT 'a;b', $$c;d$$ /* e;f */",
        ' -- g;h\n SELECT "i;j" ',
        " UNLISTEN *",
    ]
    assert batches.split("SELECT 'unterminated; x") == ["SELECT 'unterminated; x"]
    # a tag is read off the statement's first words, not off a comment before them
    assert batches.command_tag("/* DISCARD ALL */ SELECT 1", 1) == "SELECT 1"
    assert batches.command_tag("-- reset\n close ALL;", 0) == "CLOSE CURSOR ALL"


def test_housekeeping_batch_is_answered_as_postgresql_answers_it(duck, postgres_url) -> None:
    sql = POOL_RESET + " BEGIN; COMMIT; ROLLBACK; SET application_name = 'x'; DEALLOCATE ALL"
    expected = _tags(postgres_url, sql)
    assert [tag for tag, _ in expected][:4] == ["SELECT 1", "CLOSE CURSOR ALL", "UNLISTEN", "RESET"]
    assert _tags(duck.dsn(), sql) == expected
    assert _tags(duck.dsn(), "DISCARD ALL") == _tags(postgres_url, "DISCARD ALL")


def test_asyncpg_pool_connections_work_after_release(served) -> None:
    async def run() -> list[int]:
        async with asyncpg.create_pool(served.url(), min_size=1, max_size=1) as pool:
            counts = []
            for age in (21, 22, 23):  # one connection, released (and reset) between queries
                async with pool.acquire() as conn:
                    counts.append(
                        await conn.fetchval(f"SELECT COUNT(*) FROM pums WHERE age > {age}")
                    )
            return counts

    counts = asyncio.run(run())
    assert len(counts) == 3 and all(isinstance(count, int) for count in counts)


def test_a_batch_with_queries_charges_each_once(duck) -> None:
    spent = duck.spent("alice")
    sql = (
        "SELECT COUNT(*) FROM pums WHERE age > 31; RESET ALL; "
        "SELECT COUNT(*) FROM pums WHERE age > 32"
    )
    results = _tags(duck.dsn(), sql)
    assert [tag for tag, _ in results] == ["SELECT 1", "RESET", "SELECT 1"]
    assert duck.spent("alice") == pytest.approx(spent + 2.0)  # the policy's epsilon, twice
    assert _tags(duck.dsn(), sql) == results and duck.spent("alice") == pytest.approx(spent + 2.0)


# -- parameters ----------------------------------------------------------------------


def test_sqlalchemy_core_typed_parameters(served) -> None:
    """SQLAlchemy with psycopg sends `age > $1::INTEGER`: a cast of a bound constant."""
    table = sqlalchemy.table("pums", sqlalchemy.column("age", sqlalchemy.Integer))
    engine = sqlalchemy.create_engine(served.url(scheme="postgresql+psycopg"))
    try:
        with engine.connect() as conn:
            query = sqlalchemy.select(sqlalchemy.func.count()).select_from(table)
            older = conn.execute(query.where(table.c.age > 40)).scalar()
            typed = conn.execute(
                sqlalchemy.text(
                    "SELECT COUNT(*) FROM pums WHERE age > :a ::SMALLINT AND income < :b ::FLOAT8 "
                    "AND income > :c ::NUMERIC"
                ),
                {"a": 20, "b": 90000.5, "c": 10},
            ).scalar()
    finally:
        engine.dispose()
    assert isinstance(older, int) and isinstance(typed, int)


def test_a_parameter_without_a_value_is_42p02_and_the_connection_lives(
    served, postgres_url
) -> None:
    sql = "SELECT COUNT(*) FROM pums WHERE age > $1"
    for dsn, statement in ((served.dsn(), sql), (postgres_url, "SELECT $1")):
        with psycopg.connect(dsn, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.UndefinedParameter, match=r"no parameter \$1"):
                conn.execute(statement)
            assert conn.execute("SELECT 1").fetchone() == (1,)
    result = _psql(served, "-c", sql)
    assert result.returncode == 1 and "there is no parameter $1" in result.stderr


# -- Describe without Execute ----------------------------------------------------------


def test_asyncpg_prepare_describes_without_charging(served) -> None:
    before, charges = served.spent("alice"), _charges(served)
    query = GROUPED.format(age=41)

    async def run() -> tuple:
        conn = await asyncpg.connect(served.url())
        try:
            statement = await conn.prepare(query)
            attributes = [(a.name, a.type.name) for a in statement.get_attributes()]
            with_parameter = await conn.prepare("SELECT AVG(income) AS m FROM pums WHERE age > $1")
            announced = [(a.name, a.type.name) for a in with_parameter.get_attributes()]
            with pytest.raises(asyncpg.InsufficientPrivilegeError) as described:
                await conn.prepare("SELECT income FROM pums")
            with pytest.raises(asyncpg.InsufficientPrivilegeError) as executed:
                await conn.execute("SELECT income FROM pums")
            unchanged = served.spent("alice"), _charges(served)
            rows = await statement.fetch()
            return attributes, announced, str(described.value), str(executed.value), unchanged, rows
        finally:
            await conn.close()

    attributes, announced, described, executed, unchanged, rows = asyncio.run(run())
    assert attributes == [("sex", "int8"), ("n", "int8")]
    assert announced == [("m", "float8")]
    assert described == executed and "refused" in described
    assert unchanged == (before, charges)  # described twice, refused once: nothing charged
    assert [row["sex"] for row in rows] == [0, 1] and isinstance(rows[0]["n"], int)
    assert served.spent("alice") == pytest.approx(before + 1.0) and _charges(served) == charges + 1


def _libpq(pgconn: psycopg.pq.PGconn) -> list:
    """The results of what was just sent on `pgconn`, read as psycopg reads them."""
    waiting.wait(generators.send(pgconn), pgconn.socket)
    return waiting.wait(generators.fetch_many(pgconn), pgconn.socket)


def test_psycopg_describe_prepared_costs_nothing(served) -> None:
    before, charges = served.spent("alice"), _charges(served)
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        pgconn = conn.pgconn
        pgconn.send_prepare(b"s1", GROUPED.format(age=42).encode())
        assert [r.status for r in _libpq(pgconn)] == [psycopg.pq.ExecStatus.COMMAND_OK]
        pgconn.send_describe_prepared(b"s1")
        (described,) = _libpq(pgconn)
        names = [described.fname(i) for i in range(described.nfields)]
        types = [described.ftype(i) for i in range(described.nfields)]
        assert names == [b"sex", b"n"] and types == [20, 20]  # int8, before anything runs
        assert (served.spent("alice"), _charges(served)) == (before, charges)
        # prepare=True: Parse, Describe, then Bind and Execute, charged once
        cursor = conn.execute(GROUPED.format(age=43), prepare=True)
        assert [c.name for c in cursor.description] == ["sex", "n"]
        assert len(cursor.fetchall()) == 2
    assert served.spent("alice") == pytest.approx(before + 1.0) and _charges(served) == charges + 1


JDBC_JAR = "/usr/share/java/postgresql.jar"
JDBC_DESCRIBE = """
import java.sql.*;
public class Describe {
  public static void main(String[] a) throws Exception {
    try (Connection c = DriverManager.getConnection(a[0], "alice", "alice-secret");
         PreparedStatement s = c.prepareStatement(a[1])) {
      ResultSetMetaData m = s.getMetaData();
      for (int i = 1; i <= m.getColumnCount(); i++)
        System.out.println(m.getColumnName(i) + " " + m.getColumnTypeName(i));
    }
  }
}
"""


def test_jdbc_get_metadata_costs_nothing(duck, tmp_path) -> None:
    if not (os.path.exists(JDBC_JAR) and _has("java")):
        pytest.skip(
            f"pgJDBC is absent ({JDBC_JAR}: apt-get install libpostgresql-jdbc-java) or java is"
        )
    source = tmp_path / "Describe.java"
    source.write_text(JDBC_DESCRIBE)
    before, charges = duck.spent("alice"), _charges(duck)
    url = f"jdbc:postgresql://127.0.0.1:{duck.port}/pums?prepareThreshold=1"
    result = subprocess.run(
        ["java", "-cp", JDBC_JAR, str(source), url, GROUPED.format(age=44)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["sex", "int8", "n", "int8"]
    assert (duck.spent("alice"), _charges(duck)) == (before, charges)


def _has(program: str) -> bool:
    return subprocess.run(["which", program], capture_output=True).returncode == 0


# -- COPY ---------------------------------------------------------------------------


def test_psql_copy_is_charged_as_the_select(served) -> None:
    query = GROUPED.format(age=45)
    before = served.spent("alice")
    copied = _psql(served, "-c", f"\\copy ({query}) TO STDOUT WITH (FORMAT csv, HEADER)")
    assert copied.returncode == 0, copied.stderr
    lines = copied.stdout.splitlines()
    assert lines[0] == "sex,n" and [line.split(",")[0] for line in lines[1:]] == ["0", "1"]
    assert served.spent("alice") == pytest.approx(before + 1.0)
    selected = _psql(served, "-A", "-t", "-F", ",", "-c", query)  # the same release, free
    assert selected.stdout.splitlines() == lines[1:]
    assert served.spent("alice") == pytest.approx(before + 1.0)
    again = _psql(served, "-c", f"COPY ({query}) TO STDOUT")
    assert again.stdout.splitlines() == [line.replace(",", "\t") for line in lines[1:]]


CONSTANT = "SELECT 1::int8 AS a, 'x\ty,\"z' AS b, NULL AS c, 2.5::float8 AS d"


@pytest.mark.parametrize(
    "options",
    [
        "",
        "(FORMAT csv, HEADER)",
        "WITH (FORMAT binary)",
        "CSV HEADER",
        "(FORMAT text, HEADER true)",
    ],
)
def test_copy_bytes_are_postgresqls(duck, postgres_url, options: str) -> None:
    sql = f"COPY ({CONSTANT}) TO STDOUT {options}"

    def copied(dsn: str) -> bytes:
        with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cursor:
            with cursor.copy(sql) as copy:
                data = b"".join(bytes(chunk) for chunk in copy)
            return data

    assert copied(duck.dsn()) == copied(postgres_url)


def test_psycopg_copy_reads_text_and_binary_rows(served) -> None:
    query = GROUPED.format(age=46)
    with psycopg.connect(served.dsn(), autocommit=True) as conn, conn.cursor() as cursor:
        with cursor.copy(f"COPY ({query}) TO STDOUT (FORMAT binary)") as copy:
            copy.set_types(["int8", "int8"])
            binary = list(copy.rows())
        with cursor.copy(f"COPY ({query}) TO STDOUT") as copy:
            text = list(copy.rows())
    assert [tuple(int(v) for v in row) for row in text] == binary
    assert [row[0] for row in binary] == [0, 1]


def test_asyncpg_copy_from_query(served) -> None:
    query = GROUPED.format(age=47)

    async def run() -> tuple[str, bytes]:
        conn = await asyncpg.connect(served.url())
        try:
            output = io.BytesIO()
            status = await conn.copy_from_query(query, output=output, format="csv", header=True)
            return status, output.getvalue()
        finally:
            await conn.close()

    status, data = asyncio.run(run())
    assert status == "COPY 2" and data.decode().splitlines()[0] == "sex,n"


@pytest.mark.parametrize(
    "sql",
    ["COPY pums TO STDOUT", "COPY pums FROM STDIN", "COPY (SELECT COUNT(*) FROM pums) TO '/tmp/x'",
     "COPY (SELECT 1) FROM STDIN", "COPY (SELECT COUNT(*) FROM pums) TO PROGRAM 'cat'"],
)  # fmt: skip
def test_other_copy_forms_are_refused_42501(duck, sql: str) -> None:
    before = duck.spent("alice")
    with psycopg.connect(duck.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=r"refused .*Instead: COPY"):
            conn.execute(sql)
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert duck.spent("alice") == before


def test_copy_holds_a_query_and_comes_as_a_simple_query(duck) -> None:
    before = duck.spent("alice")
    with psycopg.connect(duck.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.SyntaxError, match="holds a query"):
            conn.execute("COPY (SET dpsql.epsilon = 5) TO STDOUT")
        assert conn.execute("SHOW dpsql.epsilon").fetchone() == (1.0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="simple query"):
            conn.execute("COPY (SELECT COUNT(*) FROM pums) TO STDOUT", prepare=True)
    assert duck.spent("alice") == before
