"""Range counts answered from synopses through the whole pipeline (DuckDB, DB-API, CLI)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
import pytest
from sqlglot import exp

import dpsql
from dpsql.accounting import zcdp_epsilon, zcdp_rho
from dpsql.cli import main
from dpsql.policy import load_policy
from dpsql.sql.analyze import analyze
from dpsql.sql.rewrite import rewrite
from dpsql.sql.synopsis import Domain, _histogram_sql
from tests.conftest import Backend, pums_policy

START = dt.date(2014, 1, 1)
DAYS = 2191  # 2014-01-01 .. 2019-12-31


@pytest.fixture(scope="module")
def visits_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic visitor table: one row per visit, a few visits per visitor."""
    path = tmp_path_factory.mktemp("synopsis") / "visits.duckdb"
    rng = np.random.default_rng(0)
    rows = 30_000
    with duckdb.connect(str(path)) as con:
        con.execute(
            "CREATE TABLE synopsis_visits (visitor INT, day DATE, age INT, income DOUBLE, sex INT)"
        )
        frame = {
            "visitor": rng.integers(0, 12_000, rows),
            "shift": rng.integers(0, DAYS, rows),
            "age": rng.integers(0, 101, rows),
            "income": np.round(rng.gamma(2.0, 20_000, rows), 2),
            "sex": rng.integers(0, 2, rows),
        }
        con.register("frame", frame)
        con.execute(
            "INSERT INTO synopsis_visits SELECT visitor, DATE '2014-01-01' + shift::INT, age, "
            "income, sex FROM frame"
        )
    return path


def visits_policy(max_rows: int = 1, unit: bool = True, **synopsis: object) -> dict:
    policy = {
        "version": 1,
        "analysts": {"default": {"epsilon": 10.0, "delta": 1e-6}},
        "tables": {
            "synopsis_visits": {
                "privacy_unit": "visitor",
                "max_groups_per_unit": 1,
                "max_rows_per_unit": max_rows,
                "columns": {
                    "visitor": {"type": "int", "private": True},
                    "day": {"type": "date", "lower": "2014-01-01", "upper": "2019-12-31",
                            "synopsis": {"bin": "1 day", "epsilon": 1.0, **synopsis}},
                    "age": {"type": "int", "lower": 0, "upper": 100,
                            "synopsis": {"bin": 1, "epsilon": 0.5}},
                    "income": {"type": "float", "lower": 0, "upper": 500_000,
                               "synopsis": {"bin": 1000, "epsilon": 0.5, "branching": 8}},
                    "sex": {"type": "int", "values": [0, 1]},
                },
            }
        },
    }  # fmt: skip
    if not unit:
        table = policy["tables"]["synopsis_visits"]
        for key in ("privacy_unit", "max_groups_per_unit", "max_rows_per_unit"):
            del table[key]
    return policy


def _connect(db: Path, ledger: Path, policy: dict | None = None, seed: int = 3):
    return dpsql.connect(str(db), policy=policy or visits_policy(), ledger=ledger, seed=seed)


def _one(connection, sql: str):
    cursor = connection.execute(sql)
    return cursor.fetchall(), cursor


def test_date_ranges_build_once_then_answer_free(visits_db: Path, tmp_path: Path) -> None:
    with _connect(visits_db, tmp_path / "ledger.sqlite") as con:
        explain = dict(_one(con, "EXPLAIN SELECT COUNT(*) FROM synopsis_visits "
                                 "WHERE day BETWEEN '2016-03-01' AND '2016-08-31'")[0])  # fmt: skip
        assert explain["path"].startswith("builds the synopsis")
        assert "bins [790, 974) of 2191" in explain["query"]
        assert "sensitivity 3 (3 levels x 1 rows per unit)" in explain["noise"]
        rows, cursor = _one(con, "SELECT COUNT(*) FROM synopsis_visits "
                                 "WHERE day BETWEEN '2016-03-01' AND '2016-08-31'")  # fmt: skip
        assert con.budget().epsilon_spent == pytest.approx(1.0)
        # the same range written with < and an open end, and a monthly histogram: free
        same, _ = _one(con, "SELECT COUNT(*) FROM synopsis_visits "
                            "WHERE day >= DATE '2016-03-01' AND '2016-09-01' > day")  # fmt: skip
        assert same == rows
        months, cursor = _one(con, "SELECT date_trunc('month', day) AS m, COUNT(*) AS n "
                                   "FROM synopsis_visits GROUP BY 1 ORDER BY 1")  # fmt: skip
        assert len(months) == 72 and months[0][0] == dt.datetime(2014, 1, 1)
        assert cursor.accuracy["n"].interval95 > 0
        explain = dict(_one(con, "EXPLAIN SELECT COUNT(*) FROM synopsis_visits "
                                 "WHERE day < '2015-01-01'")[0])  # fmt: skip
        assert explain["path"].startswith("answered from the stored synopsis")
        assert con.budget().epsilon_spent == pytest.approx(1.0)
    # monthly counts of the consistent tree add up to the tree's total (consistency)
    total = _one(_connect(visits_db, tmp_path / "ledger.sqlite"),
                 "SELECT COUNT(day) FROM synopsis_visits")[0][0][0]  # fmt: skip
    assert abs(sum(n for _, n in months) - total) <= 72  # each month rounded by <= 1/2


def test_thousand_queries_cost_exactly_the_synopsis_epsilon(
    visits_db: Path, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.sqlite"
    rng = np.random.default_rng(8)
    with _connect(visits_db, ledger) as con:
        for _ in range(1000):
            low = int(rng.integers(0, 100))
            high = int(rng.integers(low, 101))
            con.execute(f"SELECT COUNT(*) FROM synopsis_visits WHERE age BETWEEN {low} AND {high}")
        assert con.budget().epsilon_spent == 0.5
        assert len(con.session.ledger.charges("default")) == 1
        first, _ = _one(con, "SELECT COUNT(*) FROM synopsis_visits WHERE age >= 18")
    # a new connection on the same ledger (a restart) answers from the stored synopsis
    with _connect(visits_db, ledger, seed=99) as con:
        again, _ = _one(con, "SELECT COUNT(*) FROM synopsis_visits WHERE age > 17")
        assert again == first
        assert con.budget().epsilon_spent == 0.5


def test_answers_are_accurate_for_ints_floats_and_dates(visits_db: Path, tmp_path: Path) -> None:
    cases = [
        ("age BETWEEN 20 AND 39", "age >= 20 AND age <= 39"),
        ("income >= 10000 AND income < 50000", "income >= 10000 AND income < 50000"),
        ("day >= '2017-06-01'", "day >= DATE '2017-06-01'"),
    ]
    with duckdb.connect(str(visits_db), read_only=True) as raw:
        truths = [raw.execute(f"SELECT COUNT(*) FROM synopsis_visits WHERE {exact}").fetchone()[0]
                  for _, exact in cases]  # fmt: skip
    # row-level privacy: no bounding, so the exact count is known
    with _connect(visits_db, tmp_path / "l.sqlite", visits_policy(unit=False)) as con:
        for (where, _), truth in zip(cases, truths, strict=True):
            rows, cursor = _one(con, f"SELECT COUNT(*) AS n FROM synopsis_visits WHERE {where}")
            assert abs(rows[0][0] - truth) <= cursor.accuracy["n"].interval95


def test_histograms_align_with_bins(visits_db: Path, tmp_path: Path) -> None:
    with _connect(visits_db, tmp_path / "l.sqlite") as con:
        decades, _ = _one(con, "SELECT FLOOR(age / 10) AS d, COUNT(*) FROM synopsis_visits "
                               "WHERE age < 100 GROUP BY 1")  # fmt: skip
        assert [d for d, _ in decades] == [float(d) for d in range(10)]
        brackets, _ = _one(con, "SELECT income // 50000 AS b, COUNT(income) FROM "
                                "synopsis_visits GROUP BY 1")  # fmt: skip
        assert [b for b, _ in brackets] == list(range(11))
        assert con.budget().epsilon_spent == pytest.approx(1.0)  # age and income, once each


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("SELECT FLOOR(income / 1500), COUNT(*) FROM synopsis_visits GROUP BY 1",
         "do not align with the bins of 1000"),
        ("SELECT COUNT(*) FROM synopsis_visits WHERE income >= 1500", "bin edges"),
        ("SELECT COUNT(*) FROM synopsis_visits WHERE income <= 2000", "continuous column"),
        ("SELECT COUNT(*) FROM synopsis_visits WHERE age > 30 AND sex = 1",
         "is not a range on age"),
        ("SELECT COUNT(*) FROM synopsis_visits WHERE age > 30 AND income >= 0",
         "several synopsis columns"),
        ("SELECT SUM(sex) FROM synopsis_visits WHERE age > 30", "not SUM, AVG"),
        ("SELECT COUNT(*) FROM synopsis_visits WHERE age > 30 OR age < 5", "is not a range"),
        # answered from the synopsis as the empty range [20, 20) until an audit found it
        ("SELECT COUNT(*) FROM synopsis_visits WHERE age BETWEEN SYMMETRIC 20 AND 10",
         "BETWEEN SYMMETRIC"),
    ],
)  # fmt: skip
def test_fallbacks_go_direct_and_explain_why(
    visits_db: Path, tmp_path: Path, query: str, reason: str
) -> None:
    with _connect(visits_db, tmp_path / "l.sqlite") as con:
        lines = _one(con, f"EXPLAIN {query}")[0]
        notes = [detail for item, detail in lines if item == "note"]
        assert notes and notes[0].startswith("answered directly, not from the synopsis")
        assert reason in notes[0]
        _, cursor = _one(con, query)
        assert any(reason in note for note in cursor.notes)
        assert con.session.ledger.stored_releases("default", "synopsis:") == {}


def test_contribution_bound_multiplies_the_sensitivity(visits_db: Path, tmp_path: Path) -> None:
    with _connect(visits_db, tmp_path / "l.sqlite", visits_policy(max_rows=3)) as con:
        lines = dict(_one(con, "EXPLAIN SELECT COUNT(*) FROM synopsis_visits WHERE age < 50")[0])
        assert "sensitivity 6 (2 levels x 3 rows per unit)" in lines["noise"]
        assert '"__dpsql_row" <= 3' in lines["sql"]  # each unit bounded in the build query


def test_gaussian_synopsis_charges_rho_once_and_survives_a_restart(
    visits_db: Path, tmp_path: Path
) -> None:
    ledger = tmp_path / "l.sqlite"
    policy = visits_policy(unit=False, mechanism="gaussian", delta=1e-9)
    rho = zcdp_rho(1.0, 1e-9)
    query = (
        "SELECT COUNT(*) AS n FROM synopsis_visits WHERE day BETWEEN '2015-02-01' AND '2018-11-30'"
    )
    with duckdb.connect(str(visits_db), read_only=True) as raw:
        truth = raw.execute(query.replace("AS n", "")).fetchone()[0]
    with _connect(visits_db, ledger, policy) as con:
        explain = dict(_one(con, f"EXPLAIN {query}")[0])
        assert explain["path"].startswith("builds the synopsis")
        # 2191 days, b = 16: 3 levels; L2 sensitivity sqrt(3), sigma^2 = 3 / (2 rho)
        assert (
            "discrete Gaussian per node, L2 sensitivity 1.73205 (sqrt(3 levels)" in explain["noise"]
        )
        assert f"sigma {np.sqrt(3 / (2 * rho)):.6g}" in explain["noise"]
        rows, cursor = _one(con, query)
        accuracy = cursor.accuracy["n"]
        assert accuracy.mechanism == "discrete_gaussian tree (consistent)"
        assert abs(rows[0][0] - truth) <= accuracy.interval95
        for day in ("2014-06-01", "2016-01-01", "2019-12-01"):  # later ranges are free
            con.execute(f"SELECT COUNT(*) FROM synopsis_visits WHERE day < '{day}'")
        (charge,) = con.session.ledger.charges("default")
        assert charge.cost.rho == pytest.approx(rho, rel=1e-9)
        assert charge.cost.epsilon == 0 and charge.cost.delta == 0
        assert zcdp_epsilon(charge.cost.rho, Fraction(1, 10**9)) <= 1.0 + 1e-9
    with _connect(visits_db, ledger, policy, seed=42) as con:
        again, cursor = _one(con, query)
        assert again == rows
        assert cursor.accuracy["n"].interval95 == accuracy.interval95
        assert len(con.session.ledger.charges("default")) == 1


def test_session_build_list_drop(visits_db: Path, tmp_path: Path) -> None:
    with _connect(visits_db, tmp_path / "l.sqlite") as con:
        session = con.session
        assert [s.built for s in session.synopses()] == [None, None, None]
        built = session.build_synopsis("synopsis_visits", "age")
        assert built.built is not None and con.budget().epsilon_spent == 0.5
        assert session.build_synopsis("synopsis_visits", "age") == built  # no second charge
        assert con.budget().epsilon_spent == 0.5
        assert session.drop_synopsis("synopsis_visits", "age")
        assert not session.drop_synopsis("synopsis_visits", "age")
        con.execute("SELECT COUNT(*) FROM synopsis_visits WHERE age < 10")  # rebuilds: charged
        assert con.budget().epsilon_spent == 1.0
        with pytest.raises(dpsql.ProgrammingError, match="declares no synopsis"):
            session.build_synopsis("synopsis_visits", "sex")


def test_cli_synopsis_commands(
    visits_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import yaml

    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(visits_policy()))
    where = ["--database", str(visits_db), "--policy", str(policy), "--ledger",
             str(tmp_path / "l.sqlite")]  # fmt: skip
    assert main(["synopsis", "build", "synopsis_visits.day", *where]) == 0
    assert "charged epsilon 1" in capsys.readouterr().out
    assert main(["synopsis", "list", *where]) == 0
    listing = capsys.readouterr().out
    assert "synopsis_visits.day" in listing and "(paid)" in listing and "not built" in listing
    assert main(["synopsis", "drop", "synopsis_visits.day", *where]) == 0
    assert "charge stays" in capsys.readouterr().out
    policy.write_text(yaml.safe_dump(visits_policy(mechanism="gaussian", delta=1e-9)))
    assert main(["synopsis", "build", "synopsis_visits.day", *where]) == 0
    assert f"charged rho {zcdp_rho(1.0, 1e-9):.6g} (zCDP)" in capsys.readouterr().out
    assert main(["synopsis", "build", "synopsis_visits.day", *where]) == 0
    assert "already built" in capsys.readouterr().out


def test_pums_age_and_income(pums_db: Path, tmp_path: Path) -> None:
    policy = pums_policy()
    columns = policy["tables"]["pums"]["columns"]
    columns["age"]["synopsis"] = {"bin": 1, "epsilon": 1.0}
    columns["income"]["synopsis"] = {"bin": 10_000, "epsilon": 1.0}
    with duckdb.connect(str(pums_db), read_only=True) as raw:
        truth = dict(raw.execute(
            "SELECT 'age', COUNT(*) FROM pums WHERE age BETWEEN 30 AND 49 UNION ALL "
            "SELECT 'income', COUNT(*) FROM pums WHERE income >= 20000 AND income < 60000"
        ).fetchall())  # fmt: skip
    with dpsql.connect(str(pums_db), policy=policy, ledger=tmp_path / "l.sqlite", seed=5) as con:
        for column, where in (("age", "age BETWEEN 30 AND 49"),
                              ("income", "income >= 20000 AND income < 60000")):  # fmt: skip
            rows, cursor = _one(con, f"SELECT COUNT(*) FROM pums WHERE {where}")
            assert abs(rows[0][0] - truth[column]) <= cursor.accuracy["count"].interval95
        histogram, _ = _one(con, "SELECT FLOOR(income / 100000) AS k, COUNT(*) FROM pums "
                                 "GROUP BY 1")  # fmt: skip
        assert len(histogram) == 6
        assert con.budget().epsilon_spent == pytest.approx(2.0)


def test_seed000_example_runs_at_a_tiny_size(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import REPO

    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "seed000_ranges.py"), "--tiny", "--out",
         str(tmp_path)], capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert "| visits_256 | 256 | 1.0 |" in done.stdout
    assert (tmp_path / "seed000_visits_256.png").stat().st_size > 10_000


def _pums_domain(column: str, bin_width: float, groups: int, rows: int) -> Domain:
    policy = pums_policy()
    table = policy["tables"]["pums_dup"]
    table.update(max_groups_per_unit=groups, max_rows_per_unit=rows)
    table["columns"][column]["synopsis"] = {"bin": bin_width, "epsilon": 1.0}
    found = load_policy(policy).table("pums_dup")
    return Domain.of(found, found.column(column))


@pytest.mark.parametrize("backend", ["duckdb", "postgres"], indirect=True)
@pytest.mark.parametrize(("groups", "rows"), [(1, 1), (1, 3), (2, 2), (3, 1)])
def test_build_sql_bounds_units_as_the_general_rewrite_does(
    backend: Backend, groups: int, rows: int
) -> None:
    """The one-window build query keeps the same bins per unit as the general rewrite's
    two windows (same keyed hash: its group hash uses seed + 1) and as many rows."""
    raw = backend.raw()
    try:
        for column, width in (("age", 1), ("educ", 3), ("income", 10_000)):
            domain = _pums_domain(column, width, groups, rows)
            fast = dict(raw.rows(_histogram_sql(domain, backend.dialect, 11)))
            select = (
                exp.select(domain.bin_sql(backend.dialect), exp.Count(this=exp.Star()))
                .from_("pums_dup")
                .where(exp.Not(this=exp.Is(this=exp.column(column), expression=exp.Null())))
                .group_by(domain.bin_sql(backend.dialect))
            )
            general = rewrite(analyze(select, domain.table), {}, backend.dialect, 10, False)
            assert fast == dict(raw.rows(general))
            assert sum(fast.values()) > 0
    finally:
        raw.close()


def test_build_sql_caps_rows_per_unit_and_bin(visits_db: Path) -> None:
    """With room for every bin of a unit, each (unit, bin) keeps min(rows, cap) rows: the
    exact truth, whatever the hash."""
    policy = load_policy(visits_policy(max_rows=2))
    table = replace(policy.table("synopsis_visits"), max_groups_per_unit=200)
    domain = Domain.of(table, table.column("age"))
    with duckdb.connect(str(visits_db), read_only=True) as raw:
        truth = dict(raw.execute(
            "SELECT age, SUM(LEAST(n, 2)) FROM (SELECT visitor, age, COUNT(*) AS n FROM "
            "synopsis_visits WHERE age IS NOT NULL GROUP BY ALL) GROUP BY age"
        ).fetchall())  # fmt: skip
        built = dict(raw.execute(_histogram_sql(domain, "duckdb", 5)).fetchall())
    assert built == truth
    assert sum(truth.values()) < 30_000  # some visitors do have more than 2 rows of one age


def test_build_sql_skips_bounding_when_the_database_keeps_units_unique(visits_db: Path) -> None:
    table = replace(load_policy(visits_policy()).table("synopsis_visits"), unique_unit=True)
    sql = _histogram_sql(Domain.of(table, table.column("age")), "duckdb", 5)
    assert "OVER" not in sql and 'NOT "visitor" IS NULL' in sql  # rows of no unit left out
    with duckdb.connect(str(visits_db), read_only=True) as raw:
        truth = dict(
            raw.execute("SELECT age, COUNT(*) FROM synopsis_visits GROUP BY age").fetchall()
        )
        assert dict(raw.execute(sql).fetchall()) == truth


def test_gaussian_synopsis_without_delta_budget_goes_direct_saying_what_to_ask(
    visits_db: Path, tmp_path: Path
) -> None:
    policy = visits_policy(unit=False, mechanism="gaussian", delta=1e-9)
    policy["analysts"]["default"] = {"epsilon": 10.0}  # no delta: rho cannot be converted
    query = "SELECT COUNT(*) FROM synopsis_visits WHERE day < '2016-01-01'"
    with _connect(visits_db, tmp_path / "l.sqlite", policy) as con:
        notes = [d for item, d in _one(con, f"EXPLAIN {query}")[0] if item == "note"]
        assert "needs a delta budget, and yours has none" in notes[0]
        assert "'mechanism: laplace' in the synopsis" in notes[0]
        _one(con, query)  # answered directly with Laplace noise, charged epsilon only
        (charge,) = con.session.ledger.charges("default")
        assert charge.cost.epsilon > 0 and charge.cost.rho == 0
        with pytest.raises(dpsql.ProgrammingError, match="'mechanism: laplace' in the synopsis"):
            con.session.build_synopsis("synopsis_visits", "day")


def test_other_queries_of_a_synopsis_table_are_analysed_once(
    visits_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dpsql.sql as planning
    import dpsql.sql.synopsis as synopsis_module

    calls = []

    def counted(select, table):
        calls.append(select)
        return analyze(select, table)

    monkeypatch.setattr(planning, "analyze", counted)
    monkeypatch.setattr(synopsis_module, "analyze", counted)
    with _connect(visits_db, tmp_path / "l.sqlite") as con:
        rows, cursor = _one(con, "SELECT sex, COUNT(*) FROM synopsis_visits GROUP BY sex")
    assert len(calls) == 1
    assert [key for key, _ in rows] == [0, 1]  # the public domain, answered directly
    assert not any("synopsis" in note for note in cursor.notes)
