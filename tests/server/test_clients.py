"""Real clients against the wire server: psql, psycopg 3, asyncpg, SQLAlchemy 2 and pandas.

These double as the compatibility suite for the pinned pg-mimic: each one
fails if an upgrade changes what a client sees.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import signal
import subprocess
import threading
import time

import pandas
import psycopg
import pytest
import sqlalchemy

import dpsql
from dpsql.server import BackgroundServer, build
from dpsql.server.runner import shutdown

from .conftest import _policy

QUERY = "SELECT sex, COUNT(*) AS n, AVG(income) AS income FROM pums GROUP BY sex ORDER BY sex"


def _psql(served, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PGPASSWORD": "alice-secret", "PGCONNECT_TIMEOUT": "10"}
    command = ["psql", "-X", "-h", "127.0.0.1", "-p", str(served.port), "-U", "alice", "pums"]
    return subprocess.run(
        command + list(args), input=stdin, capture_output=True, text=True, env=env, timeout=60
    )


def test_psql_command(served) -> None:
    result = _psql(served, "-c", QUERY)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [name.strip() for name in lines[0].split("|")] == ["sex", "n", "income"]
    assert "(2 rows)" in result.stdout
    assert "NOTICE:  dpsql accuracy" in result.stderr
    detail = json.loads(result.stderr.split("DETAIL:", 1)[1].strip().splitlines()[0])
    assert set(detail) == {"n", "income"}
    keys = {"mechanism", "scale", "interval95", "sensitivity", "note", "intervals"}
    assert set(detail["n"]) == keys and detail["n"]["intervals"] is None
    assert len(detail["income"]["intervals"]) == 2  # AVG: one 95% interval per row
    assert "HINT:  n: 95% interval ± " in result.stderr and "income: per row, " in result.stderr


def test_psql_several_statements_in_one_query(duck) -> None:
    """One simple-query message with several statements (split by sqlglot), and one whose
    only semicolons are the last and one in a string (sent whole)."""
    result = _psql(
        duck, "-c", "SET dpsql.epsilon = 0.5; SHOW dpsql.epsilon; SELECT COUNT(*) FROM pums;"
    )
    assert result.returncode == 0, result.stderr
    assert "SET" in result.stdout and " 0.5" in result.stdout and " count " in result.stdout
    result = _psql(duck, "-c", 'SELECT COUNT(*) AS "a;b" FROM pums WHERE sex <> 3;')
    assert result.returncode == 0, result.stderr
    assert " a;b " in result.stdout and "(1 row)" in result.stdout


def test_psql_interactive_session(served) -> None:
    script = "\\dt\n\\d pums\nSELECT COUNT(*) FROM pums WHERE age > 40;\n\\q\n"
    result = _psql(served, stdin=script)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "List of relations" in out and "pums_pid" in out
    assert 'Table "public.pums"' in out
    assert "income  | double precision" in out
    assert " count \n-------" in out and "(1 row)" in out


class Terminal:
    """An interactive psql on a pseudo-terminal, so it prompts, reads lines and takes Ctrl-C
    as a person's psql does (psql is only interactive when its input is a terminal)."""

    def __init__(self, served) -> None:
        self.master, slave = pty.openpty()
        env = {**os.environ, "PGPASSWORD": "alice-secret", "TERM": "dumb"}
        command = ["psql", "-X", "-P", "pager=off", "-h", "127.0.0.1", "-p", str(served.port)]
        self.process = subprocess.Popen(
            [*command, "-U", "alice", "pums"], stdin=slave, stdout=slave, stderr=slave, env=env
        )
        os.close(slave)
        self.output = ""

    def read_until(self, text: str, seconds: float = 20, interrupt: float = 0) -> str:
        """Read until `text` appears; with `interrupt`, press Ctrl-C every that many seconds."""
        deadline = pressed = time.monotonic()
        deadline += seconds
        while text not in self.output and time.monotonic() < deadline:
            if interrupt and time.monotonic() - pressed > interrupt:
                self.process.send_signal(signal.SIGINT)
                pressed = time.monotonic()
            if select.select([self.master], [], [], 0.1)[0]:
                self.output += os.read(self.master, 4096).decode(errors="replace")
        assert text in self.output, self.output
        return self.output

    def type(self, line: str) -> None:
        self.output = ""
        os.write(self.master, line.encode() + b"\n")

    def close(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)
        os.close(self.master)


def test_psql_ctrl_c_cancels_a_waiting_query(duck) -> None:
    """Ctrl-C in psql (libpq's PQcancel: a CancelRequest on a new connection) stops a query
    stuck behind busy workers; it never runs, costs nothing, and the session goes on."""
    backend, release = duck.server.server.backend, threading.Event()
    terminal = Terminal(duck)
    try:
        terminal.read_until("pums=>")  # logged in: the Session is open before the prompt
        before = duck.spent("alice")
        # occupy every worker; bounded, so a lost cancel fails the test instead of hanging it
        blockers = [backend.pool.submit(release.wait, 60) for _ in range(2)]
        terminal.type("SELECT COUNT(*) FROM pums WHERE age > 62;")
        terminal.read_until("62;\r\n")  # psql has read the line (its echo), and sends it
        # psql sends a cancel per Ctrl-C; one that beats the query to the server is ignored
        out = terminal.read_until("canceling statement due to user request", interrupt=0.5)
        assert "Cancel request sent" in out
        assert "pums=>" in terminal.read_until("pums=>")
        release.set()
        for blocker in blockers:
            blocker.result(timeout=10)
        assert duck.spent("alice") == before
        terminal.type("SELECT COUNT(*) FROM pums WHERE age > 63;")
        assert "(1 row)" in terminal.read_until("pums=>")
        terminal.type("\\q")
        assert terminal.process.wait(timeout=10) == 0
    finally:
        release.set()
        terminal.close()


def test_ready_only_once_the_session_is_open(duck) -> None:
    """Opening the analyst's Session takes a worker; until one is free the client is not
    told it may send queries (a query sent earlier waited unread, and its cancel was lost)."""
    backend, release, connected = duck.server.server.backend, threading.Event(), threading.Event()
    answers = []

    def client() -> None:
        with psycopg.connect(duck.dsn(), autocommit=True, connect_timeout=30) as conn:
            connected.set()
            answers.append(conn.execute("SELECT COUNT(*) FROM pums WHERE age > 64").fetchone())

    blockers = [backend.pool.submit(release.wait, 60) for _ in range(2)]
    thread = threading.Thread(target=client)
    thread.start()
    try:
        assert not connected.wait(1.0)
    finally:
        release.set()
        thread.join(timeout=30)
        for blocker in blockers:
            blocker.result(timeout=10)
    assert connected.is_set() and len(answers) == 1


@pytest.mark.parametrize("cancelled", [False, True])
def test_shutdown_ends_a_connection_in_a_query(pums_db, tmp_path, cancelled: bool) -> None:
    """The server's shutdown cancels each connection's task, as a client's cancel does: a
    connection waiting on a query ends at once, also with a client's cancel in the same turn."""
    connection = dpsql.connect(
        str(pums_db), policy=_policy(), analyst="alice", ledger=str(tmp_path / "ledger.sqlite")
    )
    release, errors = threading.Event(), []
    with BackgroundServer(build(connection, trust=True, workers=1)) as background:
        server = background.server
        client = psycopg.connect(f"host=127.0.0.1 port={background.port} user=alice")
        blocker = server.backend.pool.submit(release.wait, 60)

        def query() -> None:
            try:
                client.execute("SELECT COUNT(*) FROM pums WHERE age > 65")
            except psycopg.OperationalError as error:
                errors.append(error)

        thread = threading.Thread(target=query)
        thread.start()
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any(
                c._current_task for c in server._connections.values()
            ):
                time.sleep(0.05)  # until the server handles the query

            async def stop() -> None:
                if cancelled:  # a client's cancel and the shutdown in one turn of the loop
                    for handler in list(server._connections.values()):
                        handler.request_cancel()
                await shutdown(server)

            start = time.monotonic()
            asyncio.run_coroutine_threadsafe(stop(), background.loop).result(timeout=10)
            assert time.monotonic() - start < 4  # shutdown waits 5 s for tasks that linger
            thread.join(timeout=10)
            assert len(errors) == 1 and not isinstance(errors[0], psycopg.errors.QueryCanceled)
        finally:
            release.set()
            blocker.result(timeout=10)
            thread.join(timeout=10)
            client.close()


def test_psql_refusal_exits_with_error(served) -> None:
    result = _psql(served, "-v", "ON_ERROR_STOP=1", "-c", "SELECT age FROM pums")
    assert result.returncode != 0
    assert "ERROR:  refused" in result.stderr and "Instead:" in result.stderr


@pytest.mark.parametrize("binary", [False, True])
def test_psycopg_with_and_without_parameters(served, binary: bool) -> None:
    notices = []
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        # a Diagnostic is only valid inside the handler
        conn.add_notice_handler(lambda n: notices.append((n.message_primary, n.message_detail)))
        rows = conn.execute(QUERY, binary=binary).fetchall()
        assert [r[0] for r in rows] == [0, 1]
        assert all(isinstance(r[1], int) and isinstance(r[2], float) for r in rows)
        count = conn.execute(
            "SELECT COUNT(*) FROM pums WHERE age BETWEEN %s AND %s AND sex = %s",
            (30, 50, 1), binary=binary,
        ).fetchone()[0]  # fmt: skip
        assert isinstance(count, int) and 0 < count < 1000
    accuracy = [detail for message, detail in notices if message == "dpsql accuracy"]
    assert len(accuracy) == 2
    assert json.loads(accuracy[0])["n"]["sensitivity"] == 1.0


def test_psycopg_errors_carry_sqlstate(served) -> None:
    with psycopg.connect(served.dsn()) as conn:  # not autocommit: psycopg sends BEGIN
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="refused") as refused:
            conn.execute("SELECT income FROM pums")
        assert refused.value.sqlstate == "42501"
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("SELECT COUNT(*) FROM pums")
        conn.rollback()
        with pytest.raises(psycopg.errors.SyntaxError):
            conn.execute("SELEC COUNT(*) FROM pums")
        conn.rollback()
        conn.execute("SAVEPOINT s1")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM pums")
        conn.execute("ROLLBACK TO SAVEPOINT s1")
        assert conn.execute("SELECT COUNT(*) FROM pums").fetchone()[0] > 0


def test_psycopg_introspection_and_options(served) -> None:
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT version()").fetchone()[0].startswith("PostgreSQL 15")
        assert conn.execute("SHOW transaction isolation level").fetchone() == ("read committed",)
        assert conn.execute("SELECT current_setting('standard_conforming_strings')").fetchone() == (
            "on",
        )
        conn.execute("SET application_name = 'test'")  # accepted and ignored
        start = conn.execute("SHOW dpsql.epsilon").fetchone()
        conn.execute("SET dpsql.epsilon = 0.25")
        assert conn.execute("SHOW dpsql.epsilon").fetchone() == (0.25,)
        plan = dict(conn.execute("EXPLAIN SELECT COUNT(*) FROM pums").fetchall())
        assert "0.25" in plan["cost"]
        # RESET and DISCARD ALL (as pools send) go back to the connection's start; SET
        # LOCAL, set_config and current_setting of dpsql.* are refused: each left the
        # charge other than the client believed (found by an audit)
        for reset in ("RESET dpsql.epsilon", "RESET ALL", "DISCARD ALL"):
            conn.execute("SET dpsql.epsilon = 7")
            conn.execute(reset)
            assert conn.execute("SHOW dpsql.epsilon").fetchone() == start, reset
        # however written (comments, quotes, spaces around the dot), a dpsql option goes
        # to dpsql: taken for an ordinary setting, it was ignored (found by an audit)
        for spelled in ("SET /* x */ dpsql.epsilon = 0.5", 'SET "dpsql"."epsilon" = 0.5',
                        "SET dpsql . epsilon TO 0.5"):  # fmt: skip
            conn.execute(spelled)
            assert conn.execute("SHOW /* y */ dpsql.epsilon").fetchone() == (0.5,), spelled
            conn.execute('RESET /* z */ "dpsql".epsilon')
            assert conn.execute("SHOW dpsql.epsilon").fetchone() == start, spelled
        for refused in ("SET LOCAL dpsql.epsilon = 7", "SELECT set_config('dpsql.epsilon', '7', "
                        "false)", "SELECT current_setting('dpsql.epsilon')"):  # fmt: skip
            with pytest.raises(psycopg.Error):
                conn.execute(refused)
        assert conn.execute("SHOW dpsql.epsilon").fetchone() == start
        conn.execute("SET dpsql.epsilon = 0.25")
        budget = conn.execute("SHOW dpsql.budget").fetchone()
        assert budget[0] == "alice"
        names = conn.execute(
            "SELECT table_name FROM information_schema.tables ORDER BY table_name"
        ).fetchall()
        assert ("pums",) in names


def test_startup_settings_are_read_as_postgresql_reads_them() -> None:
    from dpsql.server.introspection import startup_settings

    options = r"-c dpsql.epsilon=1 --dpsql.continual=binary -cdpsql.mechanism=a\ b -c x=1"
    assert startup_settings({"options": options, "dpsql.epsilon": "2"}) == {
        "dpsql.epsilon": "2",  # a startup parameter wins over `options`
        "dpsql.continual": "binary",
        "dpsql.mechanism": "a b",
    }


def test_startup_options_set_dpsql_options(duck) -> None:
    """dpsql.* settings asked for when connecting (libpq's options / PGOPTIONS, asyncpg's
    server_settings) are the connection's starting options; ignored, a client that
    connected with -c dpsql.epsilon=0.01 was charged the policy's default epsilon."""
    options = r"-c dpsql.epsilon=0.125 --dpsql.mechanism=staircase -c search_path=public\ x"
    with psycopg.connect(duck.dsn(), autocommit=True, options=options) as conn:
        assert conn.execute("SHOW dpsql.epsilon").fetchone() == (0.125,)
        assert conn.execute("SHOW dpsql.mechanism").fetchone() == ("staircase",)
        plan = dict(conn.execute("EXPLAIN SELECT COUNT(*) FROM pums").fetchall())
        assert "0.125" in plan["cost"]
        conn.execute("SET dpsql.epsilon = 2")
        conn.execute("RESET ALL")  # back to the connection's start, as PostgreSQL does
        assert conn.execute("SHOW dpsql.epsilon").fetchone() == (0.125,)
    asyncpg = pytest.importorskip("asyncpg")

    async def shown() -> str:
        conn = await asyncpg.connect(duck.url(), server_settings={"dpsql.epsilon": "0.25"})
        try:
            return await conn.fetchval("SHOW dpsql.epsilon")
        finally:
            await conn.close()

    assert float(asyncio.run(shown())) == 0.25
    for bad, message in (("-c dpsql.epsilon=-1", "positive"),
                         ("-c dpsql.epsilon", "no value"),
                         ("-c dpsql.mechanism=nope", "unknown mechanism"),
                         ("-c dpsql.nope=1", "unknown option")):  # fmt: skip
        with pytest.raises(psycopg.OperationalError, match=message):
            psycopg.connect(duck.dsn(), options=bad)
    with psycopg.connect(duck.dsn(), autocommit=True) as conn:  # the server is fine
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_asyncpg(served) -> None:
    asyncpg = pytest.importorskip("asyncpg")

    async def run() -> tuple:
        conn = await asyncpg.connect(served.url())
        try:
            rows = await conn.fetch(QUERY)
            count = await conn.fetchval("SELECT COUNT(*) FROM pums WHERE age > $1", 40)
            statement = await conn.prepare("SELECT AVG(income) AS m FROM pums WHERE sex = $1")
            mean = await statement.fetchval(1)
            # prepared, so its columns are announced before it runs: a filtered COUNT is int8
            filtered = await conn.prepare("SELECT COUNT(*) FILTER (WHERE age > $1) FROM pums")
            older = await filtered.fetchval(40)
            return rows, count, mean, [p.name for p in statement.get_parameters()], older
        finally:
            await conn.close()

    rows, count, mean, parameters, older = asyncio.run(run())
    assert [r["sex"] for r in rows] == [0, 1] and isinstance(rows[0]["n"], int)
    assert isinstance(count, int) and isinstance(mean, float) and isinstance(older, int)
    assert parameters == ["int8"]


def test_sqlalchemy_and_pandas(served) -> None:
    engine = sqlalchemy.create_engine(served.url(scheme="postgresql+psycopg"))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sqlalchemy.text("SELECT COUNT(*) AS n FROM pums WHERE age > :age"), {"age": 30}
            ).all()
            assert rows[0].n > 0
            assert "pums" in sqlalchemy.inspect(conn).get_table_names()
        frame = pandas.read_sql(sqlalchemy.text(QUERY), engine)
        assert list(frame.columns) == ["sex", "n", "income"] and len(frame) == 2
    finally:
        engine.dispose()


def test_asyncpg_cursor_fetches_rows_one_at_a_time(served) -> None:
    asyncpg = pytest.importorskip("asyncpg")

    async def run() -> tuple[list, list]:
        conn = await asyncpg.connect(served.url())
        try:
            whole = await conn.fetch(QUERY)  # the release, then the same rows from the cache
            async with conn.transaction():  # Execute with a row limit: PortalSuspended between
                paged = [row async for row in conn.cursor(QUERY, prefetch=1)]
            return whole, paged
        finally:
            await conn.close()

    whole, paged = asyncio.run(run())
    assert len(whole) == 2 and [tuple(r) for r in paged] == [tuple(r) for r in whole]
