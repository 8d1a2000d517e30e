"""Session.describe and the wire server's Describe reach no data: over a table whose every
read fails in the database, describing succeeds and executing does not."""

from __future__ import annotations

import asyncio

import duckdb
import pytest

import dpsql
from dpsql.server import BackgroundServer, build

asyncpg = pytest.importorskip("asyncpg")

QUERY = "SELECT sex, COUNT(*) AS n, AVG(age) AS mean_age FROM pums WHERE age > 1 GROUP BY sex"
POLICY = {
    "version": 1,
    "analysts": {"default": {"epsilon": 100.0, "delta": 1e-5}},
    "tables": {
        "pums": {
            "columns": {
                "sex": {"type": "int", "values": [0, 1]},
                "age": {"type": "int", "lower": 0, "upper": 100},
                "income": {"type": "float", "lower": 0, "upper": 1000},
            }
        }
    },
}


@pytest.fixture
def unreadable(tmp_path) -> dpsql.Connection:
    """A table whose schema is readable but whose data fails in the database when read."""
    database = duckdb.connect()
    database.execute("CREATE TABLE base AS SELECT i % 2 AS sex, 30 AS age FROM range(50) t(i)")
    database.execute(
        "CREATE VIEW pums AS SELECT sex::BIGINT AS sex, CASE WHEN age > 0 THEN "
        "error('the data was read') END::BIGINT AS age, 1.0::DOUBLE AS income FROM base"
    )
    with dpsql.connect(database, policy=POLICY, ledger=str(tmp_path / "l.sqlite")) as con:
        yield con


def test_describe_reads_no_data_and_charges_nothing(unreadable) -> None:
    session = unreadable.session
    described = session.describe(QUERY)
    assert (described.columns, described.types, described.rows) == (
        ["sex", "n", "mean_age"],
        ["int", "int", "float"],
        [],
    )
    assert session.charges() == []
    refused = "SELECT age FROM pums"
    with pytest.raises(dpsql.QueryRefused) as at_describe:
        session.describe(refused)
    with pytest.raises(dpsql.QueryRefused) as at_execute:
        session.execute(refused)
    assert str(at_describe.value) == str(at_execute.value)
    assert session.describe("SET dpsql.epsilon = 5").columns == [] and session.options.epsilon == 1
    with pytest.raises(dpsql.OperationalError, match="could not run the rewritten query"):
        session.execute(QUERY)  # the same query, run: it reads the table
    assert len(session.charges()) == 1


def test_wire_describe_reads_no_data(unreadable) -> None:
    async def run(port: int) -> tuple[list, str]:
        conn = await asyncpg.connect(f"postgresql://default@127.0.0.1:{port}/db")
        try:
            statement = await conn.prepare(QUERY)
            attributes = [(a.name, a.type.name) for a in statement.get_attributes()]
            with pytest.raises(asyncpg.PostgresError) as failed:
                await statement.fetch()
            return attributes, failed.value.sqlstate
        finally:
            await conn.close()

    with BackgroundServer(build(unreadable, trust=True, workers=1)) as server:
        attributes, sqlstate = asyncio.run(run(server.port))
    assert attributes == [("sex", "int8"), ("n", "int8"), ("mean_age", "float8")]
    assert sqlstate == "58000"  # only the Execute reached the database
