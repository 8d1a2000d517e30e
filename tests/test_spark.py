"""The Spark adapter: URLs, policy sources, sanitised errors, bounding on neighbours.

The backend-parametrised suite (test_queries, test_refusals, test_budget) runs on
Spark through the `spark` backend of conftest; this file holds what is Spark's
own, on the same shared local SparkSession. The neighbouring-database checks of
test_sensitivity run here batched: the full table and every neighbour go into
one Spark job per plan (a UNION ALL of CTE-shadowed copies of the table).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import duckdb
import numpy as np
import pytest
import sqlglot
import yaml
from conftest import PUMS_TABLES, load_pums, pums_policy
from sqlglot import exp
from test_sensitivity import SHAPES, _l1_change, _plans

import dpsql
from dpsql.adapters import open_adapter
from dpsql.adapters.spark import SparkAdapter, _local_cores
from dpsql.errors import BackendError, PolicyError
from dpsql.ledger import Ledger
from dpsql.policy import Source, load_policy
from dpsql.session import Session
from dpsql.sql.parse import parse_statement


@pytest.fixture(scope="module")
def spark(spark_session):
    """The shared session, with a row-numbered copy of PUMS for row-level neighbours."""
    spark_session.sql(
        "CREATE OR REPLACE TEMP VIEW spark_rows AS SELECT *, row_number() OVER (ORDER BY "
        "age, sex, educ, race, income, married) AS row_id FROM pums"
    )  # identical rows may swap numbers: their neighbours are the same database
    yield spark_session
    spark_session.catalog.dropTempView("spark_rows")


# -- bounding: sensitivity on neighbouring databases ----------------------------


def _neighbour_rows(spark, sql: str, table: str, source: str, column: str, removed: list):
    """The rows of `sql` on `source` (index 0) and on `source` less each removed value.

    All in one Spark job: the table becomes one copy per neighbour, tagged by
    __removal, which joins every window's partition and the grouping, so each
    copy is bounded and aggregated exactly as the plan would on its own.
    """
    tree = sqlglot.parse_one(sql, dialect="spark")
    tag = exp.column("__removal")
    for window in tree.find_all(exp.Window):
        window.set("partition_by", [tag.copy(), *(window.args.get("partition_by") or [])])
    for inner in list(tree.find_all(exp.Select)):  # carry the tag through named projections
        if inner is not tree and not any(isinstance(e, exp.Star) for e in inner.expressions):
            inner.select(tag.copy(), copy=False)
    tree.select(tag.copy(), copy=False).group_by(tag.copy(), copy=False)
    pairs = ", ".join(f"({index}, {value})" for index, value in enumerate(removed, start=1))
    copies = (
        f"SELECT r.__removal, t.* FROM {source} AS t JOIN (SELECT * FROM VALUES (0, NULL), "
        f"{pairs} AS r(__removal, removed)) AS r ON r.__removal = 0 OR t.{column} <> r.removed"
    )
    for node in tree.find_all(exp.Table):
        if node.name == table:
            node.replace(sqlglot.parse_one(f"({copies}) AS {table}", dialect="spark"))
    results: list[list[tuple]] = [[] for _ in range(len(removed) + 1)]
    for row in spark.sql(tree.sql(dialect="spark")).collect():
        results[row[-1]].append(tuple(row)[:-1])
    return results


def _assert_bounded(spark, plans, table, source, column, removed, max_groups):
    for plan in plans:
        keys = len(plan.analysis.keys)
        columns = len(plan.measures) + (plan.selection is not None)
        limits = [m.noise.sensitivity for m in plan.measures]
        if plan.selection is not None:  # distinct units per group, for key selection
            limits.append(max_groups)
        full, *neighbours = _neighbour_rows(spark, plan.sql, table, source, column, removed)
        changes = np.array([_l1_change(full, rows, keys, columns) for rows in neighbours])
        assert np.all(changes <= np.array(limits)), (plan.sql, changes.max(axis=0), limits)
        if plan is plans[0]:  # COUNT(*): some removal moves it by exactly its sensitivity
            assert changes[:, 0].max() == limits[0]


def _first_column(spark, query: str) -> list:
    return [row[0] for row in spark.sql(query).collect()]


@pytest.mark.spark
@pytest.mark.parametrize(("base", "bounds"), [("pums_dup", (2, 2)), ("pums_null", (3, 1))])
def test_user_level_measurements_change_at_most_by_their_sensitivity(spark, base, bounds):
    policy = pums_policy()
    table = policy["tables"]["pums_dup"]
    table["max_groups_per_unit"], table["max_rows_per_unit"] = bounds
    plans = _plans(SHAPES, "pums_dup", load_policy(policy), "spark")
    removed = _first_column(
        spark,
        f"SELECT pid FROM {base} WHERE pid IS NOT NULL GROUP BY pid ORDER BY COUNT(*) DESC, pid "
        "LIMIT 25",
    )
    _assert_bounded(spark, plans, "pums_dup", base, "pid", removed, bounds[0])


@pytest.mark.spark
def test_row_level_measurements_change_at_most_by_their_sensitivity(spark):
    plans = _plans(
        [s for s in SHAPES if "pid" not in s], "pums", load_policy(pums_policy()), "spark"
    )
    removed = _first_column(
        spark, "SELECT row_id FROM spark_rows ORDER BY income DESC, row_id LIMIT 25"
    )
    _assert_bounded(spark, plans, "pums", "spark_rows", "row_id", removed, 1)


# -- tables read from files named in the policy ---------------------------------


def _policy_file(folder, tables: dict) -> str:
    """A policy file over PUMS-shaped tables read from `tables` (key -> source)."""
    columns = pums_policy()["tables"]["pums"]["columns"]
    specs = {key: {"source": source, "columns": columns} for key, source in tables.items()}
    path = folder / "policy.yaml"
    path.write_text(yaml.safe_dump(pums_policy(tables=specs)))
    return str(path)


def test_sources_are_validated_and_resolved_beside_the_policy(tmp_path):
    policy = load_policy(_policy_file(tmp_path, {"a": "parquet:data/*.parquet", "b": "csv:/x.csv"}))
    assert policy.sources == {
        "a": Source("parquet", str(tmp_path.resolve() / "data" / "*.parquet")),
        "b": Source("csv", "/x.csv"),
    }
    for source, complaint in [("json:x.json", "parquet or csv"), ("parquet:", "parquet or csv"),
                              (7, "parquet or csv")]:  # fmt: skip
        with pytest.raises(PolicyError, match=complaint) as raised:
            load_policy(
                pums_policy(tables={"a": {"source": source, "columns": {"x": {"type": "int"}}}})
            )
        assert "tables.a.source" in str(raised.value)
    with pytest.raises(PolicyError, match="without one"):
        load_policy(_policy_file(tmp_path, {"s.t": "csv:t.csv"}))


def test_sources_need_the_spark_backend(tmp_path):
    with pytest.raises(dpsql.NotSupportedError, match="spark://local"):
        dpsql.connect(":memory:", policy=_policy_file(tmp_path, {"pums": "csv:pums.csv"}))


TOTALS = "SELECT sex, SUM(income) FROM pums GROUP BY sex"


@pytest.mark.spark
def test_parquet_and_csv_sources_are_queried_in_a_session_of_their_own(spark_session, tmp_path):
    with duckdb.connect() as source:
        load_pums(source, {"pums": PUMS_TABLES["pums"]})
        source.execute(f"COPY pums TO '{tmp_path / 'pums.parquet'}' (FORMAT parquet)")
        source.execute(f"COPY pums TO '{tmp_path / 'pums.csv'}' (HEADER)")
    policy = _policy_file(tmp_path, {"from_parquet": "parquet:pums.parquet",
                                     "from_csv": "csv:pums.csv"})  # fmt: skip
    with dpsql.connect("spark://local[2]", policy, ledger=tmp_path / "l.sqlite", seed=3) as con:
        for table in ("from_parquet", "from_csv"):
            cursor = con.execute(f"SELECT sex, SUM(income) AS total FROM {table} GROUP BY sex")
            truth = dict(
                spark_session.sql("SELECT sex, SUM(income) FROM pums GROUP BY sex").collect()
            )
            half_width = cursor.accuracy["total"].interval95
            for sex, total in cursor.fetchall():
                assert abs(total - truth[sex]) <= 2 * half_width  # 2 x the 95% half-width
        # the views live in the adapter's own session, not in the shared one
        assert not spark_session.catalog.tableExists("from_parquet")
    assert spark_session.sql("SELECT COUNT(*) FROM pums").collect()[0][0] == 1000  # still up


@pytest.mark.spark
def test_a_missing_source_is_a_backend_error_naming_the_policy_entry(spark_session, tmp_path):
    with pytest.raises(BackendError, match=r"table 'gone'.*correct its 'source:'"):
        SparkAdapter("spark://local[2]", {"gone": Source("parquet", str(tmp_path / "no.parquet"))})


@pytest.mark.spark
def test_a_source_never_replaces_a_view_of_a_session_passed_in(spark_session, tmp_path):
    """A policy's source named like a temporary view of the session a caller passed
    replaced that view, and closing dpsql dropped it from under its owner (found when
    the Spark Connect tests compared against the suite's session)."""
    with pytest.raises(BackendError, match="already has a temporary view 'pums'"):
        SparkAdapter(spark_session, {"pums": Source("parquet", str(tmp_path / "any.parquet"))})
    assert spark_session.sql("SELECT COUNT(*) FROM pums").collect()[0][0] == 1000


# -- the sessions dpsql opens ----------------------------------------------------


def test_local_masters_get_shuffle_partitions_by_their_cores():
    masters = ("local", "local[3]", "local[4,2]", "spark://host:7077", "yarn", "local[x]")
    assert [_local_cores(master) for master in masters] == [1, 3, 4, None, None, None]
    assert _local_cores("local[*]") == os.cpu_count()


@pytest.mark.spark
def test_sessions_dpsql_opens_are_in_utc_with_few_shuffle_partitions(spark_session):
    def setting(adapter: SparkAdapter, name: str) -> str:
        return dict(adapter.execute(f"SET {name}")[1])[name]

    new_year = "SELECT UNIX_TIMESTAMP(DATE '2024-01-01')"  # a date's seconds: at local time
    spark_session.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        assert spark_session.sql(new_year).collect()[0][0] == 1704085200  # 05:00 UTC
        adapter = SparkAdapter("spark://local[2]")  # shares the running context
        overridden = SparkAdapter("spark://local[2]?spark.sql.shuffle.partitions=7")
    finally:
        spark_session.conf.unset("spark.sql.session.timeZone")
    try:
        assert adapter.execute(new_year)[1] == [(1704067200,)]  # midnight UTC, as in DuckDB
        assert setting(adapter, "spark.sql.shuffle.partitions") == "4"  # 2 per local core
        assert setting(overridden, "spark.sql.shuffle.partitions") == "7"
        assert setting(overridden, "spark.sql.session.timeZone") == "UTC"
    finally:
        adapter.close()
        overridden.close()


# -- what leaves the adapter ----------------------------------------------------


@pytest.mark.spark
def test_errors_name_the_condition_never_a_stored_value(spark_session, capfd):
    adapter = SparkAdapter(spark_session)
    with pytest.raises(BackendError, match="CAST_INVALID_INPUT") as raised:
        adapter.execute("SELECT CAST('secret-4711' AS INT)")
    assert "4711" not in str(raised.value)
    assert "4711" not in "".join(capfd.readouterr())  # PySpark's query-context log is off
    assert set(adapter.table_columns("pums")) == {"age", "sex", "educ", "race", "income", "married"}
    assert adapter.table_columns("no_such_table") is None
    assert adapter.unique_columns("pums_pid") == set()  # Spark enforces no keys


@pytest.mark.spark
def test_one_row_per_group_comes_back(spark_session, tmp_path):
    adapter = open_adapter(spark_session)
    returned = []
    stream = adapter.stream

    @contextmanager
    def recorded(sql: str, *batching: int):  # the Session reads results as a stream
        with stream(sql, *batching) as (columns, batches):
            returned.append((columns, [row for batch in batches for row in batch]))
            yield columns, iter([returned[-1][1]])

    adapter.stream = recorded
    session = Session(adapter, load_policy(pums_policy()), Ledger(tmp_path / "l.sqlite"), seed=5)
    session.execute("SELECT age, COUNT(*) FROM pums_dup GROUP BY age")
    ((columns, rows),) = returned
    ages = spark_session.sql("SELECT COUNT(DISTINCT age) FROM pums_dup").collect()[0][0]
    assert len(rows) == ages and len({row[0] for row in rows}) == ages
    assert all(name.startswith("__dpsql_") for name in columns)


def test_spark_connect_without_its_client_says_what_to_install():
    pytest.importorskip("pyspark")
    try:
        import grpc  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(BackendError, match=r"pip install 'pyspark\[connect\]'"):
            SparkAdapter("sc://localhost:1")
    else:
        with pytest.raises(BackendError, match="Connect server runs there"):
            SparkAdapter("sc://localhost:1")


@pytest.mark.spark
def test_timestamps_come_back_in_utc_whatever_the_process_time_zone(
    spark_session, tmp_path, monkeypatch
):
    """PySpark gives a TIMESTAMP in the Python process's local time: keys moved with the
    process's zone, and the years 1 and 9999 failed (year 0 or 10000 there) after the
    charge, exactly when such a row was in the result."""
    import datetime as dt
    import time

    spark_session.sql(
        "CREATE OR REPLACE TEMP VIEW edge_times AS SELECT id % 3 AS age, CASE id % 3 "
        "WHEN 0 THEN TIMESTAMP '0001-01-01 00:00:00' WHEN 1 THEN TIMESTAMP '9999-12-31 "
        "23:59:59' ELSE TIMESTAMP '2020-01-01 00:00:00' END AS ts FROM range(300)"
    )
    policy = {
        "analysts": {"default": {"epsilon": 100.0, "delta": 0.5}},
        "tables": {"edge_times": {"columns": {"age": {"type": "int", "lower": 0, "upper": 2},
                                              "ts": {"type": "timestamp"}}}},
    }  # fmt: skip
    session = Session(
        open_adapter(spark_session), load_policy(policy), Ledger(tmp_path / "l.sqlite"), seed=5
    )
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        keys = [
            row[0]
            for row in session.execute("SELECT ts, COUNT(*) FROM edge_times GROUP BY ts").rows
        ]
    finally:
        monkeypatch.undo()
        time.tzset()
        spark_session.catalog.dropTempView("edge_times")
    assert sorted(keys) == [
        dt.datetime(1, 1, 1),
        dt.datetime(2020, 1, 1),
        dt.datetime(9999, 12, 31, 23, 59, 59),
    ]


@pytest.mark.spark
def test_years_spark_holds_but_python_cannot_never_fail_a_query(spark_session, tmp_path):
    """Spark holds years before 1 and after 9999 (here from a Parquet file DuckDB wrote):
    PySpark failed to make Python dates of them after the charge, exactly when such a row
    passed the WHERE, and its message quoted the year. They read as NULL now, as on
    PostgreSQL (found by an audit)."""
    path = tmp_path / "far.parquet"
    with duckdb.connect() as source:
        source.execute(
            "COPY (SELECT i % 100 AS age, CASE WHEN i = 7 THEN CAST('10000-01-01' AS DATE) "
            "WHEN i = 8 THEN DATE '0001-01-01' - 400 "
            "ELSE DATE '2020-01-01' + CAST(i % 3 AS INTEGER) END AS day "
            f"FROM range(3000) r(i)) TO '{path}' (FORMAT parquet)"
        )
    columns = {"age": {"type": "int", "lower": 0, "upper": 99}, "day": {"type": "date"}}
    policy = {
        "analysts": {"default": {"epsilon": 100.0, "delta": 0.5}},
        "tables": {"far": {"source": f"parquet:{path}", "columns": columns}},
    }
    with dpsql.connect("spark://local[2]", policy, ledger=tmp_path / "l.sqlite", seed=5) as con:
        for sql in (
            "SELECT day, COUNT(*) FROM far WHERE age < 10 GROUP BY day",
            "SELECT DATE_TRUNC('month', day) AS m, COUNT(*) FROM far WHERE age < 10 GROUP BY m",
        ):
            keys = [row[0] for row in con.execute(sql).fetchall()]
            assert keys and all(key is None or 1 <= key.year <= 9999 for key in keys), sql


def test_two_entries_for_one_catalog_table_are_refused(spark_session, tmp_path):
    """`tw` and `default.tw` resolve to one catalog table: an analyst could read it under
    the weaker of two entries (DuckDB and PostgreSQL checked this, Spark did not)."""
    spark_session.sql(
        f"CREATE TABLE tw (a INT) USING parquet LOCATION '{tmp_path / 'tw'}'"
    )  # external, in the session's in-memory catalog: nothing in the working directory
    try:
        columns = {"columns": {"a": {"type": "int", "lower": 0, "upper": 9}}}
        policy = {"version": 1, "analysts": {"default": {"epsilon": 1.0}},
                  "tables": {"tw": columns, "default.tw": columns}}  # fmt: skip
        with pytest.raises(dpsql.PolicyError, match="can name the same table"):
            dpsql.connect(spark_session, policy=policy, ledger=tmp_path / "l.sqlite")
        policy["tables"] = {"tw": columns, "pums": {"columns": {"age": {"type": "int"}}}}
        dpsql.connect(spark_session, policy=policy, ledger=tmp_path / "l.sqlite").close()
    finally:
        spark_session.sql("DROP TABLE IF EXISTS tw")


def test_sums_round_to_the_nearest_step_ties_to_even_within_the_bounds(spark_session, tmp_path):
    # Spark's ROUND of a DOUBLE goes through a BigDecimal per row; the rewrite sends RINT,
    # whose ties go to even, and which keeps every value within the bounds' steps.
    def table(values: list[float]) -> None:
        frame = spark_session.createDataFrame([(v,) for v in values], "x double")
        frame.createOrReplaceTempView("rounded")

    table([0.0])
    policy = {
        "analysts": {"default": {"epsilon": 1e9, "delta": 0.5}},
        "tables": {"rounded": {"columns": {"x": {"type": "float", "lower": 0, "upper": 100}}}},
    }
    session = Session(open_adapter(spark_session), load_policy(policy), Ledger(":memory:"))
    try:
        plan = session.plan(parse_statement("SELECT SUM(x) FROM rounded", "spark").tree)
        step = plan.measures[0].step
        assert "RINT(" in plan.sql and "ROUND(" not in plan.sql, plan.sql
        ties = [(k + 0.5) * step for k in (0, 1, 2, 3, 1000)]  # exact: step is a power of 2
        table([-3.0, 1.2, 99.875, 250.0, float("nan"), *ties])
        # NaN orders above every number in Spark: clamped to the upper bound
        steps = [round(min(max(v, 0.0), 100.0) / step) if v == v else round(100 / step)
                 for v in (-3.0, 1.2, 99.875, 250.0, float("nan"), *ties)]  # fmt: skip
        assert [round(t / step) for t in ties] == [0, 2, 2, 4, 1000]  # ties to even
        assert int(session.adapter.execute(plan.sql)[1][0][0]) == sum(steps)
    finally:
        spark_session.catalog.dropTempView("rounded")
