"""`dpsql cache show | clear` and the Session's view of what the ledger stores beside charges.

Clearing is what the owner does when the data changed: the kinds cleared are
answered and charged afresh, the others stay free, and charges never go.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
import yaml

import dpsql
from dpsql.cli import main
from dpsql.errors import ProgrammingError

POLICY = {
    "version": 1,
    "defaults": {"epsilon_per_query": 0.5, "delta": 1e-6},
    "analysts": {"default": {"epsilon": 1e5, "delta": 1e-5}, "bob": {"epsilon": 1e5}},
    "tables": {"stored_events": {
        "privacy_unit": "uid", "max_groups_per_unit": 40, "max_rows_per_unit": 3,
        "columns": {
            "uid": {"type": "int", "private": True},
            "day": {"type": "date", "lower": "2024-01-01", "upper": "2024-02-09",
                    "continual": {"step": "1 day", "epsilon": 1.0}},
            "age": {"type": "int", "lower": 0, "upper": 99,
                    "synopsis": {"bin": 1, "epsilon": 2.0}},
            "sex": {"type": "int", "values": [0, 1]},
        }}},
}  # fmt: skip
ANSWER = "SELECT sex, COUNT(*) FROM stored_events GROUP BY sex"
RANGE = "SELECT COUNT(*) FROM stored_events WHERE age BETWEEN 10 AND 40"
STREAM = (
    "SELECT day, SUM(COUNT(*)) OVER (ORDER BY day) AS so_far FROM stored_events "
    "WHERE day < '2024-01-11' GROUP BY day"
)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    database, policy = tmp_path / "events.duckdb", tmp_path / "policy.yaml"
    with duckdb.connect(str(database)) as con:
        con.execute(
            "CREATE TABLE stored_events AS SELECT i % 700 AS uid, "
            "DATE '2024-01-01' + (i % 20)::INT AS day, (i * 7) % 100 AS age, i % 2 AS sex "
            "FROM range(3000) t(i)"
        )
    policy.write_text(yaml.safe_dump(POLICY | {"ledger": "ledger.sqlite"}))
    return database, policy


def _connect(files: tuple[Path, Path], analyst: str = "default") -> dpsql.Connection:
    database, policy = files
    return dpsql.connect(str(database), policy=str(policy), analyst=analyst)


def _ask_all(con: dpsql.Connection) -> list[list[tuple]]:
    return [con.execute(sql).fetchall() for sql in (ANSWER, RANGE, STREAM)]


def _counts(con: dpsql.Connection, every_analyst: bool = False) -> dict[tuple[str, str], int]:
    stored = con.session.stored(every_analyst=every_analyst)
    return {(s.analyst, s.kind): s.count for s in stored}


def test_stored_counts_each_kind_per_analyst(files: tuple[Path, Path]) -> None:
    with _connect(files) as con, _connect(files, "bob") as bob:
        _ask_all(con)
        bob.execute(ANSWER).fetchall()
        own = _counts(con)
        assert set(own) == {("default", kind) for kind in ("answers", "synopses", "streams")}
        # one answer: a synopsis's answers are free and not kept, a stream's ticks are
        # streams, and the synopsis is stored once
        assert own["default", "synopses"] == 1 and own["default", "answers"] == 1
        assert own["default", "streams"] >= 2  # its meta and at least one tick
        assert _counts(con, every_analyst=True) == own | {("bob", "answers"): 1}


def test_clearing_answers_charges_repeats_again_and_keeps_synopses_and_streams(
    files: tuple[Path, Path],
) -> None:
    with _connect(files) as con:
        first = _ask_all(con)
        spent = con.budget().epsilon_spent
        assert _ask_all(con) == first and con.budget().epsilon_spent == spent  # all free
        charges = len(con.session.ledger.charges(None))
        dropped = con.session.clear_stored(["answers"])
        assert dropped["answers"] >= 1 and set(dropped) == {"answers"}
        assert len(con.session.ledger.charges(None)) == charges  # charges stay
        again = _ask_all(con)
        assert con.budget().epsilon_spent == pytest.approx(spent + 0.5)  # the answer only
        assert again[1:] == first[1:]  # the synopsis and the stream still answer as before


def test_clearing_everything_rebuilds_the_synopsis_and_restarts_the_stream(
    files: tuple[Path, Path],
) -> None:
    with _connect(files) as con:
        _ask_all(con)
        spent = con.budget().epsilon_spent
        dropped = con.session.clear_stored()
        assert set(dropped) == {"answers", "synopses", "streams"} and all(dropped.values())
        assert _counts(con) == {}
        _ask_all(con)
        # the answer (0.5), a new synopsis (2.0) and a new stream (1.0)
        assert con.budget().epsilon_spent == pytest.approx(2 * spent)
        assert spent == pytest.approx(3.5)


def test_clearing_one_analyst_leaves_the_others(files: tuple[Path, Path]) -> None:
    with _connect(files) as con, _connect(files, "bob") as bob:
        con.execute(ANSWER).fetchall()
        bob.execute(ANSWER).fetchall()
        assert bob.session.clear_stored() == {"answers": 1, "synopses": 0, "streams": 0}
        assert _counts(con, every_analyst=True) == {("default", "answers"): 1}


def test_an_unknown_kind_is_refused(files: tuple[Path, Path]) -> None:
    with _connect(files) as con:
        con.execute(ANSWER).fetchall()
        with pytest.raises(ProgrammingError, match="unknown kind of stored release: rows"):
            con.session.clear_stored(["answers", "rows"])
        assert _counts(con) == {("default", "answers"): 1}  # nothing was dropped


def test_cli_shows_and_clears(files: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    database, policy = files
    where = ["--database", str(database), "--policy", str(policy)]
    with _connect(files) as con, _connect(files, "bob") as bob:
        _ask_all(con)
        bob.execute(ANSWER).fetchall()
    assert main(["cache", "show", *where]) == 0
    shown = capsys.readouterr().out
    for row in ("default", "bob", "answers", "synopses", "streams"):
        assert row in shown
    assert main(["cache", "clear", *where, "--analyst", "bob"]) == 0
    assert "answers: dropped 1 (of bob)" in capsys.readouterr().out
    assert main(["cache", "clear", *where, "--kind", "synopses"]) == 0
    out = capsys.readouterr().out
    assert "synopses: dropped 1 (of every analyst)" in out and "answers" not in out
    with _connect(files) as con:
        assert set(_counts(con, every_analyst=True)) == {
            ("default", "answers"),
            ("default", "streams"),
        }
    with pytest.raises(SystemExit) as refused:
        main(["cache", "clear", *where, "--kind", "charges"])
    assert refused.value.code == 2
    assert "invalid choice: 'charges'" in capsys.readouterr().err


def test_cli_show_with_nothing_stored(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture
) -> None:
    database, policy = files
    assert main(["cache", "show", "--database", str(database), "--policy", str(policy)]) == 0
    assert "nothing stored" in capsys.readouterr().out
