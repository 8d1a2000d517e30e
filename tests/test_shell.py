"""`dpsql shell`: script splitting, formatting of intervals, meta-commands, completion,
the non-interactive command end to end (demo data and PUMS), and an interactive session
on prompt_toolkit's pipe input and in a real pseudo-terminal."""

from __future__ import annotations

import csv
import io
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from prompt_toolkit.application import create_app_session
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

import dpsql
from dpsql import demo
from dpsql.mechanisms.laplace import DiscreteLaplace
from dpsql.results import Accuracy
from dpsql.session import Budget
from dpsql.shell import render
from dpsql.shell.connection import LocalConnection, StatementFailed, parse_accuracy
from dpsql.shell.engine import Piece, Quit, Shell, split_script, statement_complete
from dpsql.shell.repl import ShellCompleter, repl
from tests.conftest import pums_policy

COUNT_EPS1 = DiscreteLaplace(1, 1.0).interval95()  # COUNT(*) of one unit per row at epsilon 1


# -- splitting and formatting --------------------------------------------------


def test_split_script_cuts_at_semicolons_outside_quotes_and_comments() -> None:
    script = (
        "-- a comment; not a statement\n"
        "SELECT 'a;b' AS x\n"
        '  FROM t; SELECT "c;" FROM t /* ; */;\n'
        "\\budget\n"
        "\n"
        "SELECT 1\n"
    )
    assert list(split_script(script)) == [
        Piece("sql", "SELECT 'a;b' AS x\n  FROM t", 2),
        Piece("sql", 'SELECT "c;" FROM t /* ; */', 3),
        Piece("meta", "\\budget", 4),
        Piece("sql", "SELECT 1", 6),
    ]


def test_a_backslash_inside_a_statement_is_not_a_meta_command() -> None:
    pieces = list(split_script("SELECT COUNT(*)\n\\budget\n;"))
    assert [p.kind for p in pieces] == ["sql"]


def test_enter_runs_only_a_finished_statement() -> None:
    assert not statement_complete("SELECT COUNT(*)\nFROM t")
    assert not statement_complete("SELECT ';")  # the quote is still open
    assert statement_complete("SELECT COUNT(*)\nFROM t;")
    assert statement_complete("\\budget")
    assert statement_complete("")


def test_noisy_values_carry_their_interval_at_the_precision_it_supports() -> None:
    count = Accuracy("discrete_laplace", 3.0, 9.0, 1.0)
    total = Accuracy("discrete_laplace", 1.5e6, 4493598.0, 5e5)
    mean = Accuracy("discrete_laplace", 1.5e6, None, 5e5, "conservative", ((29000.5, 47000.2),))
    table = render.result_table(
        ["n", "total", "mean"], [(24550, 942188990.0, 38379.91), (None, None, None)],
        {"n": count, "total": total, "mean": mean},
    )  # fmt: skip
    console = Console(file=io.StringIO(), width=200)
    console.print(table)
    text = console.file.getvalue()
    assert "24,550 ± 9" in text and "942,200,000 ± 4,500,000" in text
    assert "38,400 (29,000 to 47,100)" in text and "NULL" in text
    assert render.accuracy_notes({"avg": mean, "n": count}) == [
        "avg: conservative (discrete_laplace, noise scale 1,500,000)"
    ]


def test_csv_puts_each_interval_in_its_own_column() -> None:
    out = io.StringIO()
    accuracy = {"n": Accuracy("discrete_laplace", 3.0, 9.0, 1.0)}
    render.write_csv(out, ["sex", "n"], [(0, 24550), (1, 25454)], accuracy)
    assert list(csv.reader(io.StringIO(out.getvalue()))) == [
        ["sex", "n", "n_interval95"],
        ["0", "24550", "9"],
        ["1", "25454", "9"],
    ]


def test_cost_line_is_the_change_in_spent_budget() -> None:
    before = Budget("ann", 10.0, 1.0, 9.0, 1e-5, 0.0, 1e-5)
    after = Budget("ann", 10.0, 1.5, 8.5, 1e-5, 1e-6, 9e-6)
    assert render.cost_line(before, after).startswith("cost: epsilon 0.5, delta 1e-06 · ")
    assert "nothing charged" in render.cost_line(after, after)


def test_accuracy_notice_of_the_wire_server_is_parsed() -> None:
    detail = (
        '{"n": {"mechanism": "discrete_laplace", "scale": 3, "interval95": 9, "sensitivity": 1}}'
    )
    assert parse_accuracy(detail) == {"n": Accuracy("discrete_laplace", 3.0, 9.0, 1.0)}
    per_row = (
        '{"m": {"mechanism": "laplace", "scale": 3, "interval95": null, "sensitivity": 1, '
        '"note": "conservative", "intervals": [[1, 2.5], [0, 5000]]}}'
    )
    assert parse_accuracy(per_row) == {
        "m": Accuracy("laplace", 3.0, None, 1.0, "conservative", ((1.0, 2.5), (0.0, 5000.0)))
    }
    assert parse_accuracy("not json") == {}


# -- the engine on the demo database, in process ------------------------------


@pytest.fixture
def shell(tmp_path: Path):
    connection = dpsql.connect(
        demo.demo_connection(), policy=demo.DEMO_POLICY, ledger=tmp_path / "ledger.sqlite", seed=3
    )
    out, err = io.StringIO(), io.StringIO()
    engine = Shell(
        LocalConnection(connection, "the demo census"),
        Console(file=out, width=200),
        Console(file=err, width=200),
    )
    engine.start()
    engine.output = out  # type: ignore[attr-defined]  # for the tests to read
    engine.errors = err  # type: ignore[attr-defined]
    yield engine
    connection.close()


def _take(stream: io.StringIO) -> str:
    text = stream.getvalue()
    stream.seek(0)
    stream.truncate()
    return text


def test_a_query_shows_interval_cost_and_remaining_budget(shell: Shell) -> None:
    assert shell.run_text("SELECT COUNT(*) AS n FROM census;")
    out = _take(shell.output)
    assert f"± {COUNT_EPS1}" in out
    assert "cost: epsilon 1, delta 0" in out
    assert "epsilon 19 of 20 remaining" in out
    assert shell.run_text("SELECT COUNT(*) AS n FROM census;")  # the same query again
    assert "nothing charged" in _take(shell.output)
    assert shell.connection.budget().epsilon_spent == 1.0


def test_meta_set_changes_the_cost_of_the_next_query(shell: Shell) -> None:
    assert shell.run_text("\\set epsilon 0.25")
    assert "epsilon 0.25" in _take(shell.output)
    assert shell.run_text("SELECT COUNT(*) AS n FROM census;")
    out = _take(shell.output)
    assert f"± {DiscreteLaplace(1, 0.25).interval95()}" in out
    assert "cost: epsilon 0.25" in out
    assert shell.run_text("\\set mechanism laplace")
    assert shell.settings["mechanism"] == "laplace"


def test_meta_set_reaches_every_session_option(shell: Shell) -> None:
    """\\set knows every option SET dpsql.* does, not only epsilon, delta and mechanism."""
    options = shell.connection._connection.session.options  # type: ignore[attr-defined]
    assert (options.continual, options.ldp_postprocess) == ("policy", "none")
    assert shell.run_text("\\set continual factorization")
    assert "continual factorization" in _take(shell.output)
    assert shell.run_text("\\set ldp_postprocess = norm-sub")
    assert "ldp_postprocess norm-sub" in _take(shell.output)
    options = shell.connection._connection.session.options  # type: ignore[attr-defined]
    assert (options.continual, options.ldp_postprocess) == ("factorization", "norm-sub")
    assert shell.settings["continual"] == "factorization"
    assert shell.run_text("\\set")
    out = _take(shell.output)
    assert all(name in out for name in ("epsilon", "delta", "mechanism", "continual", "ldp_"))
    assert shell.run_text("\\set continual policy")
    assert shell.settings["continual"] == "policy"


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("\\set epsilon lots", "epsilon is a number, e.g. \\set epsilon 0.5"),
        ("\\set epsilon -1", "dpsql.epsilon must be a positive finite number"),
        ("\\set mechanism 'x'; DROP", "a mechanism is a name"),
        ("\\set mechanism magic", "unknown mechanism 'magic'; choose one of:"),
        ("\\set continual magic", "unknown continual mechanism 'magic'; choose one of:"),
        ("\\set continual", "\\set continual needs a value, e.g. \\set continual factorization"),
        (
            "\\set continual 'x'; DROP",
            "a continual mechanism is a name (binary, factorization, "
            "policy), e.g. \\set continual factorization",
        ),
        ("\\set ldp_postprocess magic", "unknown local-DP post-processing 'magic'; choose one"),
        ("\\set ldp_postprocess 1", "a post-processing method is a name (none, base-pos, "),
        ("\\set colour red", "give one of epsilon, delta, mechanism, continual, ldp_postprocess"),
        ("\\frobnicate", "unknown command \\frobnicate; \\help lists the commands"),
        ("\\explain", "\\explain needs a query"),
        ("SELECT * FROM census;", "refused SELECT *: it returns raw rows. Instead:"),
        ("SELECT COUNT(*) FROM nowhere;", "nowhere"),
        ("SELEC 1;", "refused malformed SQL"),
    ],
)
def test_mistakes_are_messages_that_say_what_to_do(shell: Shell, line: str, says: str) -> None:
    assert not shell.run_text(line)
    errors = _take(shell.errors)
    assert errors.startswith("error (line 1):") and says in errors
    assert "Traceback" not in errors
    assert shell.connection.budget().epsilon_spent == 0.0


def test_meta_budget_policy_explain_and_help(shell: Shell) -> None:
    assert shell.run_text("\\explain SELECT COUNT(*) FROM census")
    out = _take(shell.output)
    assert "epsilon=1" in out and f"+/-{COUNT_EPS1}" in out
    assert shell.connection.budget().epsilon_spent == 0.0  # EXPLAIN is free
    assert shell.run_text("\\budget")
    out = _take(shell.output)
    assert "privacy budget of default" in out and "remaining" in out
    assert shell.run_text("\\policy")
    out = _take(shell.output)
    assert "census" in out and "privacy unit pid" in out
    assert "[0, 100]" in out and "public: 1 .. 16" in out and "public: 0, 1" in out
    assert "only in COUNT(DISTINCT pid)" in out and "from the data" in out
    assert shell.run_text("\\help")
    out = _take(shell.output)
    assert all(command in out for command in ("\\budget", "\\policy", "\\explain", "\\q"))
    assert "\\set continual factorization" in out and "\\set ldp_postprocess" in out
    with pytest.raises(Quit):
        shell.run(Piece("meta", "\\q", 1))


def test_a_script_stops_at_the_first_error_unless_told_to_continue(shell: Shell) -> None:
    script = "SELECT COUNT(*) FROM census;\nSELECT * FROM census;\nSELECT SUM(age) FROM census;"
    assert not shell.run_text(script)
    assert "error (line 2)" in _take(shell.errors)
    assert shell.connection.budget().epsilon_spent == 1.0  # the third never ran
    assert not shell.run_text(script, keep_going=True)
    assert shell.connection.budget().epsilon_spent == 2.0  # the first is cached, the third ran


# -- completion ----------------------------------------------------------------


def _complete(text: str, requested: bool = False) -> list[str]:
    schema = LocalConnection(
        dpsql.connect(demo.demo_connection(), policy=demo.DEMO_POLICY, ledger=":memory:"), ""
    ).schema()
    completer = ShellCompleter(schema)
    event = CompleteEvent(completion_requested=requested)
    return [c.text for c in completer.get_completions(Document(text), event)]


def test_completion_of_columns_tables_keywords_and_meta_commands() -> None:
    assert _complete("SELECT ag") == ["age"]
    assert _complete("SELECT COUNT(*) FROM ce") == ["census"]
    assert _complete("SELECT COUNT(*) FROM census WHERE census.in") == ["census.income"]
    assert "GROUP BY" in _complete("SELECT sex, COUNT(*) FROM census GR")
    assert _complete("sel") == ["select"]  # keywords follow the typed case
    assert "SUM" in _complete("SELECT S")
    assert _complete("SHOW dpsql.bu") == ["dpsql.budget"]
    assert _complete("\\bu") == ["\\budget"]
    assert _complete("\\set mech") == ["mechanism"]
    assert _complete("\\set mechanism la") == ["laplace"]
    assert _complete("\\set cont") == ["continual"]
    assert _complete("\\set ldp") == ["ldp_postprocess"]
    assert _complete("\\set continual fa") == ["factorization"]
    assert _complete("\\set continual ", requested=True) == ["binary", "factorization", "policy"]
    assert _complete("\\set ldp_postprocess norm-") == ["norm-sub"]
    assert _complete("SHOW dpsql.cont") == ["dpsql.continual"]
    assert _complete("SET dpsql.ldp") == ["dpsql.ldp_postprocess"]
    assert _complete("SELECT ") == []  # not on every space
    assert "census" in _complete("SELECT COUNT(*) FROM ", requested=True)


def test_completion_offers_private_columns_only_where_they_are_accepted() -> None:
    """The privacy unit is offered in COUNT(DISTINCT ...) and join conditions, not where
    it is refused (the select list, WHERE, GROUP BY)."""
    assert _complete("SELECT pi") == []
    assert _complete("SELECT COUNT(*) FROM census WHERE census.pi") == []
    assert _complete("SELECT COUNT(DISTINCT pi") == ["pid"]
    joined = "SELECT COUNT(*) FROM census JOIN census b ON b.pid = census.pi"
    assert _complete(joined) == ["census.pid"]
    assert _complete("SELECT COUNT(*) FROM census a JOIN census b ON a.pid = b.pid WHERE pi") == []


# -- interactive ---------------------------------------------------------------


def test_interactive_session_on_prompt_toolkit_input(shell: Shell, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    keys = "SELECT COUNT(*) AS n\rFROM census;\r\\budget\rSELECT * FROM census;\r\\q\r"
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        pipe.send_text(keys)
        assert repl(shell) == 0
    out = _take(shell.output)
    assert f"± {COUNT_EPS1}" in out and "privacy budget of default" in out
    assert "refused SELECT *" in _take(shell.errors)
    history = (tmp_path / ".dpsql" / "history").read_text()
    assert "SELECT COUNT(*) AS n\n+FROM census;" in history


def test_ctrl_d_leaves_the_shell(shell: Shell, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        pipe.send_text("SELECT\x03\x04")  # Ctrl-C drops the line, Ctrl-D quits
        assert repl(shell) == 0


def test_interactive_session_in_a_pseudo_terminal(tmp_path: Path) -> None:
    """The real `dpsql shell --demo` on a real terminal: prompt, query, answer, quit."""
    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "dpsql.cli", "shell", "--demo"],
        stdin=secondary, stdout=secondary, stderr=secondary,
        env={**os.environ, "HOME": str(tmp_path), "TERM": "xterm", "COLUMNS": "120"},
    )  # fmt: skip
    os.close(secondary)
    try:
        _expect(primary, b"dpsql>")
        os.write(primary, b"SELECT COUNT(*) AS n\r")
        os.write(primary, b"FROM census;\r")
        answer = _expect(primary, b"remaining")
        assert f"± {COUNT_EPS1}".encode() in answer
        os.write(primary, b"\\q\r")
        assert process.wait(timeout=20) == 0
    finally:
        process.kill()
        os.close(primary)


def _expect(fd: int, marker: bytes, timeout: float = 30.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} from the shell; it printed: {seen[-2000:]!r}"
        if select.select([fd], [], [], left)[0]:
            seen += os.read(fd, 65536)
    return seen


# -- the `dpsql shell` command end to end ---------------------------------------


def _dpsql(*args: str, stdin: str = "", home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dpsql.cli", "shell", *args],
        input=stdin, capture_output=True, text=True, timeout=120,
        env={**os.environ, "HOME": str(home), "COLUMNS": "200"},
    )  # fmt: skip


def test_command_line_queries_on_the_demo(tmp_path: Path) -> None:
    done = _dpsql("--demo", "-c", "SELECT COUNT(*) AS n FROM census", "-c", "\\budget",
                  home=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"± {COUNT_EPS1}" in done.stdout and "privacy budget of default" in done.stdout
    refused = _dpsql("--demo", "-c", "SELECT age FROM census", "-c", "SELECT 1", home=tmp_path)
    assert refused.returncode == 1
    assert "error (command 1, line 1): QueryRefused: refused" in refused.stderr
    assert "Traceback" not in refused.stderr and "no table is read" not in refused.stdout


def test_script_on_standard_input_as_csv(tmp_path: Path) -> None:
    script = "SELECT sex, COUNT(*) AS n\n  FROM census GROUP BY sex;\nSELECT age FROM census;\n"
    script += "SELECT educ, COUNT(*) AS n FROM census GROUP BY educ;\n"
    stopped = _dpsql("--demo", "--csv", stdin=script, home=tmp_path)
    assert stopped.returncode == 1 and "error (line 3)" in stopped.stderr
    rows = list(csv.reader(io.StringIO(stopped.stdout)))
    assert rows[0] == ["sex", "n", "n_interval95"] and len(rows) == 3  # the third never ran
    go_on = _dpsql("--demo", "--csv", "--continue", "--epsilon", "0.5", stdin=script,
                   home=tmp_path)  # fmt: skip
    assert go_on.returncode == 1
    rows = list(csv.reader(io.StringIO(go_on.stdout)))
    assert rows[3] == ["educ", "n", "n_interval95"] and len(rows) == 3 + 1 + 16
    assert "cost: epsilon 0.5" in go_on.stderr


def test_pums_through_the_command(pums_db: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(pums_policy()))
    done = _dpsql(
        "--database", str(pums_db), "--policy", str(policy), "--ledger", str(tmp_path / "l.db"),
        "--csv", "-c", "SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex", home=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    import duckdb

    with duckdb.connect(str(pums_db), read_only=True) as raw:
        exact = dict(raw.execute("SELECT sex, COUNT(*) FROM pums GROUP BY sex").fetchall())
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert [int(row["sex"]) for row in rows] == [0, 1]
    for row in rows:
        interval = float(row["n_interval95"])
        assert interval == DiscreteLaplace(1, 1.0).interval95()
        # P(|noise| > 10 * interval95) < 1e-12 for discrete Laplace at epsilon 1
        assert abs(int(row["n"]) - exact[int(row["sex"])]) <= 10 * interval


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--database", "nowhere.duckdb", "--policy", "p.yaml"], "cannot read the policy file"),
        (["--server", "postgresql://x@127.0.0.1:1/db", "-c", "SELECT 1"], "cannot connect"),
        (["--demo", "--server", "postgresql://x@127.0.0.1:1/db"], "not both"),
        (["--demo", "--mechanism", "magic", "-c", "SELECT 1"], "unknown mechanism"),
    ],
)
def test_startup_errors_are_messages(tmp_path: Path, args: list[str], says: str) -> None:
    done = _dpsql(*args, home=tmp_path)
    assert done.returncode != 0 and says in done.stderr
    assert "Traceback" not in done.stderr


# -- against a running `dpsql serve` --------------------------------------------


@pytest.fixture
def server(tmp_path: Path):
    from dpsql.server import BackgroundServer, build

    connection = dpsql.connect(
        demo.demo_connection(), policy=demo.DEMO_POLICY, ledger=tmp_path / "served.sqlite"
    )
    with BackgroundServer(build(connection, trust=True)) as running:
        yield f"postgresql://default@127.0.0.1:{running.port}/census"


def test_the_shell_against_a_running_server(server: str, tmp_path: Path) -> None:
    script = "SELECT COUNT(*) AS n FROM census;\n\\set epsilon 0.5\n"
    script += (
        "SELECT sex, COUNT(*) AS n FROM census GROUP BY sex;\n\\policy\nSELECT age FROM census;\n"
    )
    done = _dpsql("--server", server, stdin=script, home=tmp_path)
    assert done.returncode == 1
    assert f"± {COUNT_EPS1}" in done.stdout  # the accuracy notice reached the table
    assert f"± {DiscreteLaplace(1, 0.5).interval95()}" in done.stdout
    assert "cost: epsilon 1, delta 0" in done.stdout and "cost: epsilon 0.5" in done.stdout
    assert "epsilon 18.5 of 20 remaining" in done.stdout  # SHOW dpsql.budget
    assert "income" in done.stdout and "kept by the server" in done.stdout  # \policy
    assert "error (line 5): refused the column age" in done.stderr
    assert "SQLSTATE" in done.stderr and "Traceback" not in done.stderr


def test_meta_set_of_every_option_against_a_running_server(server: str, tmp_path: Path) -> None:
    script = "\\set continual factorization\n\\set ldp_postprocess base-pos\n"
    script += "SHOW dpsql.continual;\nSHOW dpsql.ldp_postprocess;\n\\set continual magic\n"
    done = _dpsql("--server", server, stdin=script, home=tmp_path)
    assert done.returncode == 1
    assert "continual factorization" in done.stdout and "ldp_postprocess base-pos" in done.stdout
    assert "│ factorization " in done.stdout and "│ base-pos " in done.stdout  # the SHOWs
    assert "error (line 5): unknown continual mechanism 'magic'; choose one of" in done.stderr
    assert "SQLSTATE" in done.stderr and "Traceback" not in done.stderr


def test_completion_over_the_wire_uses_the_servers_catalog(server: str) -> None:
    from dpsql.shell.connection import WireConnection

    connection = WireConnection(server)
    try:
        completer = ShellCompleter(connection.schema())
    finally:
        connection.close()
    document = Document("SELECT COUNT(*) FROM census WHERE census.ed")
    assert [c.text for c in completer.get_completions(document, CompleteEvent())] == ["census.educ"]


def test_the_password_is_asked_for_when_the_server_wants_one(tmp_path: Path) -> None:
    from dpsql.server import BackgroundServer, build
    from dpsql.server.auth import make_verifier
    from dpsql.shell.connection import WireConnection

    connection = dpsql.connect(demo.demo_connection(), policy=demo.DEMO_POLICY, ledger=":memory:")
    server = build(connection, users={"default": make_verifier("s3cret", iterations=4096)})
    with BackgroundServer(server) as running:
        url = f"postgresql://default@127.0.0.1:{running.port}/census"
        asked = []
        wire = WireConnection(url, lambda: asked.append(1) or "s3cret")
        assert asked == [1] and wire.budget().epsilon_total == 20.0
        wire.close()
        with pytest.raises(dpsql.OperationalError, match="cannot connect to the dpsql server"):
            WireConnection(url, lambda: "wrong")


def test_every_command_help_reads_as_written(capsys):
    """argparse prints a description as written: a '%%' escape showed up doubled."""
    import argparse

    from dpsql.cli import _parser

    parser = _parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(commands.choices) >= 5
    for name, command in commands.choices.items():
        text = command.format_help()
        assert "%%" not in text, name


def test_demo_into_a_folder_it_cannot_write_says_so(tmp_path):
    from dpsql.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit, match=r"dpsql demo: cannot write to .*give a folder"):
        main(["demo", str(blocker / "demo")])


def test_every_command_and_action_has_something_to_run():
    """`dpsql ldp perturb` printed dpsql's help and did nothing: its parser had no `run`."""
    import argparse

    from dpsql.cli import _parser

    def leaves(parser: argparse.ArgumentParser, path: str):
        children = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not children:
            yield path, parser
        for action in children:
            for name, child in action.choices.items():
                yield from leaves(child, f"{path} {name}")

    found = dict(leaves(_parser(), "dpsql"))
    assert "dpsql ldp perturb" in found and "dpsql cache clear" in found
    for path, parser in found.items():
        assert callable(parser.get_default("run")), path


def test_dpsql_query_shows_the_cost_and_a_free_repeat_and_the_way_on_when_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """`dpsql query` says what a query cost, that a repeat came free from the cache, and,
    once the budget is spent, to lower --epsilon (its own option, not SQL's SET) and how
    to start the demo's ledger afresh."""
    from dpsql.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))  # the demo's ledger lives under HOME
    sql = "SELECT COUNT(*) AS n FROM census"
    assert main(["query", "--demo", "--epsilon", "0.5", sql]) == 0
    assert "cost: epsilon 0.5," in capsys.readouterr().out
    assert main(["query", "--demo", "--epsilon", "0.5", sql]) == 0
    assert "nothing charged (answered from an earlier release)" in capsys.readouterr().out
    assert main(["query", "--demo", "--epsilon", "99999", sql + " WHERE age > 30"]) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert "BudgetExhausted" in said and "--epsilon <smaller value>" in said
    assert "SET dpsql" not in said
    assert f"delete{demo.demo_ledger_path()}" in said.replace(" ", "")  # rich wraps at "-"


def test_passwd_warns_when_the_policy_lacks_the_analyst(tmp_path, monkeypatch, capsys):
    """`dpsql passwd --policy` says so on stderr when the analyst is not in the policy, and
    still writes the verifier; for a known analyst it says nothing."""
    from dpsql.cli import main

    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "analysts": {"alice": {"epsilon": 1.0}},
                "tables": {"t": {"columns": {"x": {"type": "int", "lower": 0, "upper": 9}}}},
            }
        )
    )
    users = tmp_path / "users.txt"
    for name, warned in (("bob", True), ("alice", False)):
        monkeypatch.setattr(sys, "stdin", io.StringIO("pw\n"))
        argv = ["passwd", name, "--users", str(users), "--policy", str(policy), "--password-stdin"]
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert ("bob is not an analyst" in err and "alice" in err) == warned, err
    assert [line.split(":")[0] for line in users.read_text().splitlines()] == ["bob", "alice"]


def test_long_messages_wrap_at_word_boundaries_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal a refusal wraps to the width between words; into a file it stays on
    one line (for grep and logs)."""
    sql = "SELECT income FROM census"
    for terminal in (True, False):
        connection = dpsql.connect(
            demo.demo_connection(), policy=demo.DEMO_POLICY, ledger=tmp_path / f"{terminal}.l"
        )
        err = io.StringIO()
        engine = Shell(
            LocalConnection(connection, "demo"),
            Console(file=io.StringIO(), width=40, force_terminal=terminal, color_system=None),
            Console(file=err, width=40, force_terminal=terminal, color_system=None),
        )
        engine.run_text(sql + ";", keep_going=True)
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        if terminal:
            assert len(lines) > 2 and all(len(line) <= 40 for line in lines), lines
            with pytest.raises(dpsql.QueryRefused) as refused:
                connection.execute(sql)
            assert " ".join(" ".join(lines).split()).endswith(" ".join(str(refused.value).split()))
        else:
            assert len(lines) == 1, lines
        connection.close()


def test_budget_exhausted_says_how_to_go_on_in_the_shell(tmp_path: Path) -> None:
    """In the shell, a spent budget is answered with `\\set epsilon`, not a CLI flag, and
    (when the shell says how) how to start afresh."""
    policy = dict(demo.DEMO_POLICY, analysts={"default": {"epsilon": 1.0, "delta": 1e-4}})
    connection = dpsql.connect(demo.demo_connection(), policy=policy, ledger=":memory:")
    local = LocalConnection(connection, "demo", reset="To start afresh, delete x.")
    local.execute("SELECT COUNT(*) FROM census")
    with pytest.raises(StatementFailed) as failed:
        local.execute("SELECT SUM(age) FROM census")
    message = str(failed.value)
    assert "BudgetExhausted" in message and "\\set epsilon" in message, message
    assert message.endswith("To start afresh, delete x."), message
    connection.close()
