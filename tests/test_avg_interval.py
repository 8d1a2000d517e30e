"""AVG's stated 95% interval, per released row: it covers the true mean at least 95% of the
time over many seeded releases (small groups included), it is never narrower than the
SUM's own noise allows, it follows its row through ORDER BY, HAVING and LIMIT, and every
front end shows it, each value at the precision its interval supports."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import duckdb
import numpy as np
import psycopg
import pytest
import sqlglot
import yaml

import dpsql
from dpsql.cli import main
from dpsql.results import Accuracy, csv_cells, decimal_place, noisy_text
from dpsql.server import BackgroundServer, build
from dpsql.shell import render

UPPER = 5000.0
# rows per group: an empty group, tiny ones (whose noisy averages used to look exact), large
SIZES = {0: 0, 1: 2, 2: 12, 3: 80, 4: 3000}
TRIALS = 600
MISS = 0.05
AVG = "SELECT g, AVG(v) AS m FROM t GROUP BY g"
# An interval this much narrower about the value must miss too often in the large group.
# Conservative by design (both measurements at their extremes at once), the interval is
# about 1.7 times the width a tight one would need there: the group's mean, 800, is far
# from the centre 2500 its SUM is measured about, so the COUNT's term is a third of it.
NARROWED = 0.4


def _policy() -> dict:
    return {
        "version": 1,
        "defaults": {"epsilon_per_query": 1.0, "delta": 1e-6},
        "analysts": {"default": {"epsilon": 1000.0, "delta": 1e-3}},
        "tables": {
            "t": {
                "columns": {
                    "g": {"type": "int", "lower": 0, "upper": max(SIZES), "public": True},
                    "v": {"type": "float", "lower": 0, "upper": UPPER},
                }
            }
        },
    }


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, float]]:
    """A DuckDB table whose groups' true means are known; skewed values, all in bounds."""
    path = tmp_path_factory.mktemp("avg") / "t.duckdb"
    rng = np.random.default_rng(2026)
    columns = {
        "g": np.repeat(np.array(list(SIZES), dtype=np.int32), list(SIZES.values())),
        "v": np.minimum(rng.exponential(800.0, sum(SIZES.values())), UPPER),
    }
    with duckdb.connect(str(path)) as connection:
        connection.register("source", columns)
        connection.execute("CREATE TABLE t AS SELECT g, v FROM source")
        truth = dict(connection.execute("SELECT g, AVG(v) FROM t GROUP BY g").fetchall())
    return path, truth


def _connect(path: Path, tmp_path: Path, **options: object) -> dpsql.Connection:
    options = {"seed": 1} | options
    return dpsql.connect(str(path), policy=_policy(), ledger=tmp_path / "ledger.sqlite", **options)


def _releases(connection: dpsql.Connection, sql: str, trials: int):
    """`trials` releases of one plan over one read of the database, seeded 0, 1, ..."""
    session = connection.session
    plan = session.plan(sqlglot.parse_one(sql))
    columns, rows = session.adapter.execute(plan.sql)
    return plan, [plan.release(columns, rows, np.random.default_rng(i)) for i in range(trials)]


def _coverage_tolerance(trials: int) -> float:
    # four binomial standard deviations at exactly 95% coverage: never flaky at fixed seeds
    return 4 * math.sqrt(MISS * (1 - MISS) / trials)


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian", "staircase"])
def test_the_interval_covers_the_true_mean_in_every_group(
    table, tmp_path: Path, mechanism: str
) -> None:
    path, truth = table
    connection = _connect(path, tmp_path, mechanism=mechanism, epsilon=0.5)
    _, releases = _releases(connection, AVG, TRIALS)
    covered = dict.fromkeys(truth, 0)
    narrowed = dict.fromkeys(truth, 0)
    for release in releases:
        intervals = release.accuracy["m"].intervals
        assert len(intervals) == len(release.rows) == len(SIZES)
        for (group, value), (low, high) in zip(release.rows, intervals, strict=True):
            assert 0 <= low <= value <= high <= UPPER  # the released value lies inside
            if group in truth:  # the empty group has no mean to cover
                covered[group] += low <= truth[group] <= high
                narrowed[group] += (
                    value - (value - low) * NARROWED
                    <= truth[group]
                    <= value + (high - value) * NARROWED
                )
    floor = (1 - MISS) - _coverage_tolerance(TRIALS)
    assert all(covered[g] / TRIALS >= floor for g in truth), covered
    # the check has power, and the interval is not needlessly wide: narrowed about the
    # value, it misses far too often in the large group
    assert narrowed[4] / TRIALS < floor, narrowed
    connection.close()


def test_the_interval_is_never_narrower_than_the_sums_noise(table, tmp_path: Path) -> None:
    path, truth = table
    connection = _connect(path, tmp_path, epsilon=0.5)
    plan, releases = _releases(connection, AVG, 200)
    total, count = plan.measures
    sum_width = total.noise.interval95() * total.step  # the SUM's own 95% half-width
    # the noisy count C~ the interval divides by is at most this far above the true one
    count_slack = count.noise.half_width(1e-9)
    unclipped = 0
    for release in releases:
        for (group, _), (low, high) in zip(
            release.rows, release.accuracy["m"].intervals, strict=True
        ):
            if group in truth and low > 0 and high < UPPER:
                unclipped += 1
                # the SUM's noise at the noisy count allows no less (a / C~)
                assert (high - low) / 2 >= sum_width / (SIZES[group] + count_slack)
    assert unclipped >= 200  # the large groups' intervals lie inside the bounds
    connection.close()


def test_small_groups_are_not_shown_as_exact(table, tmp_path: Path) -> None:
    path, _ = table
    connection = _connect(path, tmp_path, epsilon=0.5)
    cursor = connection.execute(AVG)
    rows = cursor.fetchall()
    accuracy = cursor.accuracy["m"]
    assert accuracy.interval95 is None and "conservative" in accuracy.note
    widths = {
        g: (high - low) / 2 for (g, _), (low, high) in zip(rows, accuracy.intervals, strict=True)
    }
    assert widths[1] > 50 * widths[4]  # two rows' mean is far less certain than 3000 rows'
    shown = noisy_text(rows[1][1], accuracy, 1)
    value_digits = re.sub(r"[^0-9]", "", shown.split(" (")[0]).rstrip("0")
    assert len(value_digits) <= 2, shown  # not five exact-looking digits
    connection.close()


@pytest.mark.parametrize(
    "ordered",
    [
        "SELECT g, AVG(v) AS m FROM t GROUP BY g ORDER BY m DESC LIMIT 3",  # sorted in Python
        "SELECT g, AVG(v) AS m, AVG(v) * 2 AS twice FROM t GROUP BY g "
        "HAVING AVG(v) > 1 ORDER BY g DESC",  # evaluated by DuckDB
    ],
)
def test_each_rows_interval_follows_it(table, tmp_path: Path, ordered: str) -> None:
    path, _ = table
    connection = _connect(path, tmp_path)
    _, (plain,) = _releases(connection, AVG, 1)
    _, (release,) = _releases(connection, ordered, 1)  # the same seed: the same noise
    by_group = {row[0]: (row[1], interval) for row, interval in
                zip(plain.rows, plain.accuracy["m"].intervals, strict=True)}  # fmt: skip
    assert 0 < len(release.rows) < len(plain.rows) or "LIMIT" not in ordered
    assert "twice" not in release.accuracy  # an expression of a noisy value states none
    for row, interval in zip(release.rows, release.accuracy["m"].intervals, strict=True):
        assert by_group[row[0]] == (row[1], interval)
    connection.close()


def test_keys_from_the_data_and_a_global_avg_state_intervals_too(table, tmp_path) -> None:
    path, truth = table
    policy = _policy()
    policy["tables"]["t"]["columns"]["g"] = {"type": "int"}  # no public domain: selection
    connection = dpsql.connect(
        str(path), policy=policy, ledger=tmp_path / "ledger.sqlite", seed=3, epsilon=2.0
    )
    grouped = connection.execute(AVG)
    rows, accuracy = grouped.fetchall(), grouped.accuracy["m"]
    assert 4 in {row[0] for row in rows} and len(accuracy.intervals) == len(rows)
    low, high = accuracy.interval(rows.index(next(r for r in rows if r[0] == 4)), 0.0)
    assert low <= truth[4] <= high
    overall = connection.execute("SELECT AVG(v) AS m FROM t")
    ((low, high),) = overall.accuracy["m"].intervals
    ((value,),) = overall.fetchall()
    assert low <= value <= high
    explained = dict(connection.execute(f"EXPLAIN {AVG}").fetchall())
    assert "conservative" in explained["AVG interval"]
    connection.close()


def test_cursor_keeps_full_values_and_the_cache_keeps_intervals(table, tmp_path: Path) -> None:
    path, _ = table
    connection = _connect(path, tmp_path)
    first = connection.execute(AVG)
    rows, accuracy = first.fetchall(), first.accuracy
    again = connection.execute(AVG)  # answered from the release cache, free
    assert again.fetchall() == rows and again.accuracy == accuracy
    assert isinstance(rows[3][1], float) and rows[3][1] != round(rows[3][1])
    connection.close()
    reopened = _connect(path, tmp_path)  # the cache is the ledger's, read back from JSON
    assert reopened.execute(AVG).accuracy == accuracy
    reopened.close()


def test_the_wire_notice_carries_the_intervals_and_a_readable_hint(table, tmp_path) -> None:
    path, _ = table
    connection = _connect(path, tmp_path, seed=None)  # the server refuses a seeded one
    expected = connection.execute(AVG).accuracy["m"]  # the server answers it from the cache
    notices = []
    with BackgroundServer(build(connection, trust=True)) as served:
        dsn = f"host=127.0.0.1 port={served.port} user=default"
        with psycopg.connect(dsn, autocommit=True) as client:
            client.add_notice_handler(
                lambda d: notices.append((d.message_primary, d.message_detail, d.message_hint))
            )
            rows = client.execute(AVG).fetchall()
    detail, hint = next((d, h) for message, d, h in notices if message == "dpsql accuracy")
    stated = json.loads(detail)["m"]
    assert [tuple(pair) for pair in stated["intervals"]] == list(expected.intervals)
    assert "conservative" in stated["note"]
    assert hint.startswith("m: per row, ")
    assert noisy_text(rows[4][1], expected, 4) in hint  # the readable form of the same row


def test_dpsql_query_prints_intervals_in_the_table_and_the_csv(
    table, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path, _ = table
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(_policy()))
    common = ["query", "--database", str(path), "--policy", str(policy)]
    common += ["--ledger", str(tmp_path / "cli.sqlite")]
    assert main([*common, "--csv", AVG]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == "g,m,m_low95,m_high95" and len(lines) == 1 + len(SIZES)
    for line in lines[1:]:
        _, value, low, high = line.split(",")
        assert float(low) <= float(value) <= float(high) or float(value) in (0.0, UPPER)
    assert "conservative" in captured.err  # the notes, off the CSV
    assert main([*common, AVG]) == 0  # the same query: the same release, as a table
    table_text = capsys.readouterr().out
    assert re.search(r"\d \(\d[\d,.]* to \d[\d,.]*\)", table_text)


# -- the precision a value is shown to -----------------------------------------------------


def test_values_show_only_the_digits_their_interval_supports() -> None:
    def column(half_width: float) -> Accuracy:
        return Accuracy("laplace", 1.0, half_width, 1.0)

    assert noisy_text(97723.1, column(95000.0), 0) == "98,000 ± 95,000"
    assert noisy_text(3.0000000000000004, column(0.25), 0) == "3.00 ± 0.25"
    assert noisy_text(0.1 + 0.2, column(0.0123), 0) == "0.300 ± 0.013"
    assert noisy_text(24550, column(9.0), 0) == "24,550 ± 9"  # a count keeps its units
    assert noisy_text(-0.4, column(3.0), 0) == "-0.4 ± 3.0"
    assert noisy_text(5, column(0.0), 0) == "5 ± 0"  # an exact answer reads exactly
    per_row = Accuracy("laplace", 1.0, None, 1.0, "", ((1900.2, 3100.7), (0.0, 5000.0)))
    assert noisy_text(2500.123, per_row, 0) == "2,500 (1,900 to 3,110)"
    assert noisy_text(97.7, per_row, 1) == "100 (0 to 5,000)"
    assert csv_cells(2500.123, per_row, 0) == ["2500", "1900", "3110"]
    assert render.format_value(0.1 + 0.2) == "0.3"
    assert noisy_text(2.0**100, column(1.0), 0) == f"{2**100:,}.0 ± 1.0"  # 31 digits, past 28


@pytest.mark.parametrize("seed", range(5))
def test_shown_numbers_are_the_value_rounded_and_the_interval_widened(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(200):
        half_width = float(10 ** rng.uniform(-4, 7))
        value = float(rng.normal(0, 10 ** rng.uniform(-3, 8)))
        low, high = value - half_width * rng.uniform(0.2, 1.8), value + half_width
        accuracy = Accuracy("laplace", 1.0, None, 1.0, "", ((low, high),))
        shown, shown_low, shown_high = (float(cell) for cell in csv_cells(value, accuracy, 0))
        step = 10.0 ** decimal_place((high - low) / 2)
        assert abs(shown - value) <= step / 2 * (1 + 1e-9)
        assert shown_low <= low and shown_high >= high  # what is shown still covers it
        assert high - low < 200 * step  # no more than two digits of the half-width vary
