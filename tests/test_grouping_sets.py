"""GROUPING SETS, ROLLUP and CUBE (dpsql/sql/grouping_sets.py): the sets in PostgreSQL's
order, one measurement per set with an equal share of the query's budget, neighbouring
databases move each set's exact aggregates by at most the stated sensitivity, answers
near the truth with 95% intervals that cover it, on DuckDB and PostgreSQL, through the
DB-API cursor, the wire server and `dpsql query`; refusals before anything runs."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import sqlglot
import yaml
from conftest import on_every_backend, pums_policy

from dpsql.cli import main
from dpsql.errors import QueryRefused
from dpsql.policy import load_policy
from dpsql.sql import GroupingSetsPlan
from dpsql.sql.grouping_sets import MAX_SETS, _resolver, expand

CUBE = (
    "SELECT sex, married, COUNT(*) AS n, AVG(age) AS a, GROUPING(sex, married) AS g "
    "FROM pums GROUP BY CUBE (sex, married)"
)
TRUTH = (
    "SELECT sex, married, COUNT(*), AVG(LEAST(GREATEST(age, 0), 100)), "
    "GROUPING(sex) * 2 + GROUPING(married) "
    "FROM pums GROUP BY CUBE (sex, married)"
)
TRIALS = 200


def _sets(sql: str) -> list[str]:
    select = sqlglot.parse_one(sql, read="postgres")
    resolve = _resolver(select, load_policy(pums_policy()))
    return ["".join(key.sql() for key in grouping) for grouping in expand(select, resolve)]


@pytest.mark.parametrize(
    ("group_by", "sets"),
    [
        ("GROUPING SETS ((a, b), (a), ())", ["ab", "a", ""]),
        ("ROLLUP (a, b)", ["ab", "a", ""]),
        ("CUBE (a, b)", ["ab", "a", "b", ""]),
        ("a, ROLLUP (b, c)", ["abc", "ab", "a"]),
        ("ROLLUP ((a, b), c)", ["abc", "ab", ""]),
        # PostgreSQL's documented example: the product, the first item varying slowest
        ("a, CUBE (b, c), GROUPING SETS ((d), (e))",
         ["abcd", "abce", "abd", "abe", "acd", "ace", "ad", "ae"]),
        ("GROUPING SETS (a, ROLLUP (b))", ["a", "b", ""]),
        ("ROLLUP (1, 2)", ["ab", "a", ""]),  # positions read as the select items
    ],
)  # fmt: skip
def test_sets_expand_in_postgresql_order(group_by: str, sets: list[str]) -> None:
    assert _sets(f"SELECT a, b, COUNT(*) FROM t GROUP BY {group_by}") == sets


@on_every_backend
def test_cube_is_near_the_truth_with_intervals_per_row(connect, backend) -> None:
    """Every key of every set comes back (public domains), in the order of the sets, each
    COUNT within its 95% half-width's reach and each AVG within its own interval's."""
    raw = backend.raw()
    truth = {(*row[:2], row[4]): row[2:4] for row in raw.rows(TRUTH)}
    raw.close()
    cursor = connect(epsilon=20.0).cursor()
    cursor.execute(CUBE)
    assert [d[0] for d in cursor.description] == ["sex", "married", "n", "a", "g"]
    rows = cursor.fetchall()
    assert Counter((r[0], r[1], r[4]) for r in rows) == Counter(truth.keys())  # no set twice
    assert [r[4] for r in rows] == sorted(r[4] for r in rows)  # CUBE's order: g 0, 1, 2, 3
    n, a = cursor.accuracy["n"], cursor.accuracy["a"]
    assert n.interval95 is not None  # row-level: every set's COUNT has sensitivity 1
    assert len(a.intervals) == len(rows)
    for row, (low, high) in zip(rows, a.intervals, strict=True):
        count, mean = truth[(row[0], row[1], row[4])]
        assert abs(row[2] - count) <= 3 * n.interval95
        assert low <= row[3] <= high
        assert abs(row[3] - float(mean)) <= 3 * (high - low)


def _plan(connection, sql: str) -> GroupingSetsPlan:
    plan = connection.session.plan(sqlglot.parse_one(sql, read=connection.session.adapter.dialect))
    assert isinstance(plan, GroupingSetsPlan)
    return plan


def test_intervals_cover_the_truth(connect, backend) -> None:
    """Over releases at seeds 0, 1, ... of one read per set, each row's COUNT and AVG
    intervals cover the truth at least 95% of the time, within four binomial deviations."""
    raw = backend.raw()
    truth = {(*row[:2], row[4]): row[2:4] for row in raw.rows(TRUTH)}
    connection = connect()
    plan = _plan(connection, CUBE)
    reads = [connection.session.adapter.execute(part.sql) for part in plan.parts]
    raw.close()
    covered: Counter = Counter()
    for trial in range(TRIALS):
        rng = np.random.default_rng(trial)
        release = plan.combine(
            [part.release(*read, rng) for part, read in zip(plan.parts, reads, strict=True)]
        )
        n, a = release.accuracy["n"], release.accuracy["a"]
        for index, row in enumerate(release.rows):
            key = (row[0], row[1], row[4])
            count, mean = truth[key]
            covered[key, "n"] += abs(row[2] - count) <= n.interval95
            low, high = a.intervals[index]
            covered[key, "a"] += low <= float(mean) <= high
    floor = 0.95 - 4 * math.sqrt(0.95 * 0.05 / TRIALS)
    assert len(covered) == 2 * len(truth)
    assert all(hits / TRIALS >= floor for hits in covered.values()), covered


NEIGHBOURS = (
    "SELECT sex, race, COUNT(*) AS n, SUM(income) AS s, AVG(age) AS a FROM pums_dup "
    "GROUP BY GROUPING SETS ((sex, race), (sex), (age), ())"
)


@on_every_backend
def test_neighbours_move_each_set_by_at_most_its_sensitivity(connect, backend) -> None:
    """Remove each of the heaviest units with all its rows: every set's exact bounded
    measurements (summed over its groups) move by at most that set's noise sensitivity,
    which is the table's bounds (2 rows in each of 2 groups), 2 for the set ()."""
    plan = _plan(connect(), NEIGHBOURS)
    assert [part.measures[0].noise.sensitivity for part in plan.parts] == [4, 4, 4, 2]
    assert plan.parts[2].selection is not None  # age: keys from the data, selected
    raw = backend.scratch({"pums_dup": "pums_dup", "pums_full": "pums_dup"})
    try:
        heavy = [u for (u,) in raw.rows(
            "SELECT pid FROM pums_full GROUP BY pid ORDER BY COUNT(*) DESC, pid LIMIT 3"
        )]  # fmt: skip
        base = [_exact(part, raw.rows(part.sql)) for part in plan.parts]
        moved_any = False
        for unit in heavy:
            raw.replace_table("pums_dup", f"SELECT * FROM pums_full WHERE pid <> {unit}")
            for part, full in zip(plan.parts, base, strict=True):
                neighbour = _exact(part, raw.rows(part.sql))
                for i, measure in enumerate(part.measures):
                    moved = sum(
                        abs(values[i] - neighbour.get(key, (0,) * len(values))[i])
                        for key, values in full.items()
                    )
                    assert moved <= measure.noise.sensitivity, (part.sql, unit, i)
                    moved_any |= moved > 0
        assert moved_any
    finally:
        raw.close()


def _exact(part, rows: list[tuple]) -> dict[tuple, tuple]:
    """A set's exact measurements per group, as integers (grid steps for SUMs)."""
    width, count = len(part.analysis.keys), len(part.measures)
    return {row[:width]: tuple(int(v or 0) for v in row[width : width + count]) for row in rows}


def test_each_set_has_an_equal_share_and_the_query_is_charged_once(connect) -> None:
    connection = connect(epsilon=1.2)
    plan = _plan(connection, NEIGHBOURS)
    assert len(plan.parts) == 4
    for part in plan.parts:
        assert float(part.cost.epsilon) == pytest.approx(0.3)
    assert float(plan.cost.epsilon) == pytest.approx(1.2)
    cursor = connection.cursor()
    cursor.execute(NEIGHBOURS)
    first = cursor.fetchall()
    assert connection.session.budget().epsilon_spent == pytest.approx(1.2)
    assert len(connection.session.charges()) == 1
    cursor.execute(NEIGHBOURS)  # a repeat: the same release, free
    assert cursor.fetchall() == first
    assert connection.session.budget().epsilon_spent == pytest.approx(1.2)
    # user-level: the set () has half the grouped sets' sensitivity, so intervals per row
    assert len(cursor.accuracy["n"].intervals) == len(first)


@on_every_backend
def test_mixed_rollup_having_order_and_limit(connect, backend) -> None:
    """GROUP BY sex, ROLLUP (married, race): HAVING per set, then ORDER BY and LIMIT over
    all sets' rows (a hidden ORDER BY item, GROUPING in it), as post-processing."""
    cursor = connect(epsilon=30.0).cursor()
    cursor.execute(
        "SELECT sex, married, race, SUM(income) AS s, STDDEV(age) AS sd FROM pums "
        "GROUP BY sex, ROLLUP (married, race) HAVING COUNT(*) > 40 "
        "ORDER BY GROUPING(married, race) DESC, COUNT(*) DESC LIMIT 5"
    )
    rows = cursor.fetchall()
    assert len(rows) == 5
    assert [(r[1], r[2]) for r in rows[:2]] == [(None, None), (None, None)]  # the sets (sex)
    assert sorted(r[0] for r in rows[:2]) == [0, 1]
    assert all(r[1] is not None and r[2] is None for r in rows[2:])  # then (sex, married)
    assert len(cursor.accuracy["sd"].intervals) == 5
    raw = backend.raw()
    (sd,) = raw.rows("SELECT STDDEV_SAMP(LEAST(GREATEST(age, 0), 100)) FROM pums")[0]
    raw.close()
    assert all(abs(r[4] - sd) < 0.3 * sd for r in rows[:2])


def test_having_filters_within_each_set(connect) -> None:
    """Only the total passes HAVING COUNT(*) > 700 (about 1,000 rows; each sex about 500),
    and GROUPING in HAVING reads as each set's constant."""
    cursor = connect(epsilon=10.0).cursor()
    cursor.execute(
        "SELECT sex, married, COUNT(*) AS n FROM pums GROUP BY ROLLUP (sex, married) "
        "HAVING COUNT(*) > 700 OR GROUPING(sex, married) = 1"
    )
    rows = cursor.fetchall()
    assert [(r[0], r[1]) for r in rows] == [(0, None), (1, None), (None, None)]
    assert rows[2][2] > 700


def test_rollup_of_a_median_over_public_keys(connect) -> None:
    cursor = connect(epsilon=10.0).cursor()
    cursor.execute("SELECT sex, MEDIAN(age) AS m FROM pums GROUP BY ROLLUP (sex) ORDER BY sex")
    rows = cursor.fetchall()
    assert [r[0] for r in rows] == [0, 1, None]
    assert all(20 <= r[1] <= 70 for r in rows)


def test_absent_keys_read_as_null_inside_expressions(connect) -> None:
    cursor = connect(epsilon=10.0).cursor()
    cursor.execute(
        "SELECT COALESCE(CAST(sex AS TEXT), 'all') AS s, COUNT(*) AS n FROM pums "
        "GROUP BY GROUPING SETS ((sex), (sex), ())"
    )
    rows = cursor.fetchall()
    assert [r[0] for r in rows] == ["0", "1", "0", "1", "all"]  # a repeated set, repeated
    assert rows[:2] == rows[2:4]  # measured once: the same noisy values


def test_over_a_join_with_a_scalar_subquery(connect) -> None:
    """Each set is planned as any query is: a relation in FROM, a scalar subquery in HAVING
    (measured within each set's share); the whole charged once, at the query's epsilon."""
    connection = connect(epsilon=2.0)
    cursor = connection.cursor()
    cursor.execute(
        "SELECT p.sex, COUNT(*) AS n FROM pums_pid p JOIN pums_null q ON p.pid = q.pid "
        "GROUP BY ROLLUP (p.sex) HAVING COUNT(*) > (SELECT COUNT(*) / 10 FROM pums_pid)"
    )
    rows = cursor.fetchall()
    assert [r[0] for r in rows] == [0, 1, None]
    assert rows[2][1] == pytest.approx(rows[0][1] + rows[1][1], abs=60)
    assert connection.session.budget().epsilon_spent == pytest.approx(2.0)
    assert len(connection.session.charges()) == 1


@on_every_backend
def test_public_tables_run_as_written_and_free(connect, backend) -> None:
    policy = pums_policy()
    policy["tables"]["pums"] = {"public": True}
    connection = connect(policy)
    sql = (
        "SELECT sex, married, COUNT(*) AS n, GROUPING(sex) * 2 + GROUPING(married) AS g "
        "FROM pums GROUP BY CUBE (sex, married) ORDER BY g, sex, married"
    )
    cursor = connection.cursor()
    cursor.execute(sql)
    raw = backend.raw()
    assert cursor.fetchall() == raw.rows(sql)
    raw.close()
    assert connection.session.budget().epsilon_spent == 0


def test_describe_gives_the_names_and_types_execute_releases(connect) -> None:
    session = connect().session
    sql = "SELECT sex, COUNT(*) AS n, GROUPING(sex), AVG(age) FROM pums GROUP BY ROLLUP (sex)"
    described = session.describe(sql)
    assert described.types == ["int", "int", "int", "float"]
    released = session.execute(sql)
    assert described.columns == released.columns
    assert [row[2] for row in released.rows] == [0, 0, 1]


def test_explain_lists_each_set_and_its_measurements(connect) -> None:
    cursor = connect().cursor()
    cursor.execute(f"EXPLAIN {NEIGHBOURS}")
    lines = cursor.fetchall()
    items = [item for item, _ in lines]
    assert [detail for item, detail in lines if item.startswith("grouping set")] == [
        "(sex, race)", "(sex)", "(age)", "()",
    ]  # fmt: skip
    assert items.count("  measure count(*)") == 4
    assert "split evenly over the 4 grouping sets" in dict(lines)["budget"]


def test_the_wire_server_and_the_command_line(pums_db, tmp_path, capsys) -> None:
    import psycopg

    import dpsql
    from dpsql.server import BackgroundServer, build

    sql = "SELECT sex, COUNT(*) AS n, AVG(income) AS a FROM pums_pid GROUP BY ROLLUP (sex)"
    connection = dpsql.connect(str(pums_db), policy=pums_policy(), ledger=tmp_path / "l.sqlite")
    with (
        BackgroundServer(build(connection, trust=True, workers=1)) as background,
        psycopg.connect(f"host=127.0.0.1 port={background.port} user=default") as client,
    ):
        rows = client.execute(sql).fetchall()
    assert [r[0] for r in rows] == [0, 1, None]
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(pums_policy()))
    common = ["query", "--database", str(pums_db), "--policy", str(policy)]
    assert main([*common, "--ledger", str(tmp_path / "cli.sqlite"), "--csv", sql]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "sex,n,n_interval95,a,a_low95,a_high95"  # one bound per unit
    assert len(lines) == 4 and lines[3].startswith(",")


@pytest.mark.parametrize(
    ("sql", "refused", "hint"),
    [
        ("SELECT sex, SUM(COUNT(*)) OVER (ORDER BY sex) FROM pums GROUP BY ROLLUP (sex)",
         "running total", "as its own query"),
        ("SELECT COUNT(*) FROM pums GROUP BY CUBE (age, sex, educ, race, income, married, "
         "age + 1)", "128 grouping sets", "GROUPING SETS ((a, b), (a), ())"),
        ("SELECT sex, GROUPING(race), COUNT(*) FROM pums GROUP BY ROLLUP (sex)",
         "GROUPING(race)", "written in GROUP BY"),
        ("SELECT DISTINCT sex, COUNT(*) FROM pums GROUP BY ROLLUP (sex)", "DISTINCT",
         "drop DISTINCT"),
        ("SELECT sex FROM pums GROUP BY ROLLUP (sex)", "without an aggregate", "COUNT(*)"),
        ("SELECT sex, race, COUNT(*) FROM pums GROUP BY ROLLUP (sex)",
         "in the grouping set (sex)", "add race to GROUP BY"),
        ("SELECT pid, COUNT(*) FROM pums_pid GROUP BY ROLLUP (pid)", "pid", ""),
    ],
)  # fmt: skip
def test_refused_before_the_database_and_the_charge(connect, sql, refused, hint) -> None:
    connection = connect()
    with pytest.raises(QueryRefused) as caught:
        connection.session.plan(sqlglot.parse_one(sql))  # planning reads no data
    with pytest.raises(QueryRefused):
        connection.cursor().execute(sql)
    text = str(caught.value).replace('"', "")
    assert refused.lower() in text.lower(), text
    assert hint.lower() in caught.value.hint.lower(), text
    assert connection.session.budget().epsilon_spent == 0
    assert MAX_SETS == 64
