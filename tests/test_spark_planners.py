"""Range synopses and running totals on Spark: built in Spark, with DuckDB's semantics.

The synopsis's per-bin build query and a stream's per-step GROUP BY are
written by their planners in the backend's dialect; here they run on the
shared local SparkSession over the same data as on DuckDB. Where the result
does not depend on the keyed hash (each unit has room for all its bins, or
keeps its earliest steps), Spark's exact counts must equal DuckDB's; the
whole pipeline (build, charge once, answer free; release steps, tick) runs
through dpsql.connect on the SparkSession.
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import replace

import duckdb
import pytest
from test_running import RUNNING, _add
from test_running import _policy as running_policy
from test_synopsis import visits_db, visits_policy  # noqa: F401 (a fixture)

import dpsql
from dpsql.policy import load_policy
from dpsql.sql import running
from dpsql.sql.synopsis import Domain, _histogram_sql

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def views(spark_session, visits_db, tmp_path_factory):  # noqa: F811 (the imported fixture)
    """The synopsis visits table and the running-total events, as Parquet views in Spark
    and as DuckDB tables."""
    folder = tmp_path_factory.mktemp("spark-planners")
    local = duckdb.connect()
    local.execute(f"ATTACH '{visits_db}' AS visits (READ_ONLY)")
    local.execute("CREATE TABLE synopsis_visits AS SELECT * FROM visits.synopsis_visits")
    local.execute(
        "CREATE TABLE running_events (uid INT, day DATE, shop INT, city INT, amount DOUBLE)"
    )
    _add(local, 0, 2000)
    for start in range(5000, 9000, 1000):  # four more rows on 2024-01-06 for every unit
        _add(local, start, start + 1000, day=5)
    for table in ("synopsis_visits", "running_events"):
        path = folder / f"{table}.parquet"
        local.execute(f"COPY {table} TO '{path}' (FORMAT parquet)")
        spark_session.read.parquet(str(path)).createOrReplaceTempView(table)
    yield local
    for table in ("synopsis_visits", "running_events"):
        spark_session.catalog.dropTempView(table)
    local.close()


def _spark_rows(spark, sql: str) -> list[tuple]:
    return [tuple(row) for row in spark.sql(sql).collect()]


# -- synopses -----------------------------------------------------------------


@pytest.mark.parametrize(("column", "rows"), [("age", 2), ("income", 1), ("day", 3)])
def test_synopsis_build_counts_equal_duckdbs(spark_session, views, column, rows):
    """With room for every bin of a unit, the kept rows do not depend on the hash: the
    build query's per-bin counts on Spark are DuckDB's, for int, float and date bins."""
    policy = load_policy(visits_policy(max_rows=rows))
    table = replace(policy.table("synopsis_visits"), max_groups_per_unit=3000)
    domain = Domain.of(table, table.column(column))
    on_spark = dict(_spark_rows(spark_session, _histogram_sql(domain, "spark", 5)))
    on_duckdb = dict(views.execute(_histogram_sql(domain, "duckdb", 5)).fetchall())
    assert on_spark == on_duckdb
    assert sum(on_spark.values()) > 20_000


def test_synopsis_builds_in_spark_and_answers_ranges_free(spark_session, views, tmp_path):
    within = "day BETWEEN '2016-03-01' AND '2016-08-31'"
    query = f"SELECT COUNT(*) FROM synopsis_visits WHERE {within}"
    with dpsql.connect(
        spark_session, policy=visits_policy(), ledger=tmp_path / "l.sqlite", seed=3
    ) as con:
        explain = dict(con.execute(f"EXPLAIN {query}").fetchall())
        assert explain["path"].startswith("builds the synopsis")
        cursor = con.execute(query)
        ((count,),) = cursor.fetchall()
        assert con.budget().epsilon_spent == pytest.approx(1.0)
        # each visitor keeps one visit: those with all their visits in the range
        # count, those with none do not; twice the 95% half-width of noise around that
        fewest, most = views.execute(
            "SELECT COUNT(*) FILTER (WHERE all_in), COUNT(*) FILTER (WHERE any_in) FROM "
            f"(SELECT visitor, bool_and({within}) AS all_in, bool_or({within}) AS any_in "
            "FROM synopsis_visits WHERE day IS NOT NULL GROUP BY visitor)"
        ).fetchone()
        half_width = next(iter(cursor.accuracy.values())).interval95
        assert fewest - 2 * half_width <= count <= most + 2 * half_width
        print("H4DEBUG", fewest, most, count, half_width)
        months = con.execute(
            "SELECT date_trunc('month', day) AS m, COUNT(*) FROM synopsis_visits GROUP BY 1"
        ).fetchall()
        assert len(months) == 72 and min(months)[0] == dt.datetime(2014, 1, 1)
        explain = dict(con.execute(f"EXPLAIN {query}").fetchall())
        assert explain["path"].startswith("answered from the stored synopsis")
        assert con.budget().epsilon_spent == pytest.approx(1.0)


# -- running totals -----------------------------------------------------------


def _running(source, ledger):
    # epsilon 1e4: noise of scale ~1e-3, so the released totals are the exact ones
    return dpsql.connect(source, policy=running_policy(1e4), ledger=ledger, seed=3)


def test_running_totals_on_spark_are_duckdbs(spark_session, views, tmp_path):
    """Each unit keeps at most 3 rows a day (of 4 to 6 on 2024-01-06): how many does not
    depend on the hash, so the released running counts are the same on both engines, as
    are the sums of days where no bound binds."""
    queries = [
        f"{RUNNING} WHERE day < '2024-01-11' GROUP BY day",
        "SELECT day, shop, SUM(SUM(amount)) OVER (PARTITION BY shop ORDER BY day) AS total "
        "FROM running_events WHERE day < '2024-01-05' AND city < 5 GROUP BY day, shop",
    ]
    with (
        _running(spark_session, tmp_path / "spark.sqlite") as on_spark,
        _running(views.cursor(), tmp_path / "duckdb.sqlite") as on_duckdb,
    ):
        for sql in queries:
            spark_rows = on_spark.execute(sql).fetchall()
            duckdb_rows = on_duckdb.execute(sql).fetchall()
            assert [r[:-1] for r in spark_rows] == [r[:-1] for r in duckdb_rows]
            assert [r[-1] for r in spark_rows] == pytest.approx([r[-1] for r in duckdb_rows])
        counts = on_spark.execute(queries[0]).fetchall()  # the stored stream, again
        assert counts[4:6] == [(dt.date(2024, 1, 5), 500), (dt.date(2024, 1, 6), 500 + 3000)]


def test_watch_ticks_on_spark(spark_session, views, tmp_path, monkeypatch):
    noon = dt.datetime(2024, 1, 3, 12, tzinfo=dt.UTC)
    times = itertools.chain([noon, noon], itertools.repeat(noon + dt.timedelta(days=3)))
    monkeypatch.setattr(running, "clock", lambda: next(times))
    with _running(spark_session, tmp_path / "l.sqlite") as con:
        ticks = list(con.watch(f"{RUNNING} GROUP BY day", every=0.001, ticks=2))
    day0 = dt.date(2024, 1, 1)
    assert [[r[0] for r in t.rows] for t in ticks] == [
        [day0, day0 + dt.timedelta(days=1)],
        [day0 + dt.timedelta(days=d) for d in (2, 3, 4)],
    ]
    truth = views.execute(
        "SELECT SUM(COUNT(*)) OVER (ORDER BY day) FROM running_events "
        "WHERE day < DATE '2024-01-06' GROUP BY day ORDER BY day"
    ).fetchall()
    assert [n for t in ticks for _, n in t.rows] == [int(n) for (n,) in truth]
