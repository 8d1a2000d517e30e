"""Order statistics at scale: median and p90 of a 10-million-row column on DuckDB.

Prints, measured in this run:

* DP time (plan, bounded histogram in DuckDB, exact exponential mechanism) over raw
  `quantile_cont` time on the same table, beside the target (<= 1.5x);
* the rank error of dpsql's release at epsilon 1 (mean over a few releases) and, if it
  can be imported, OpenDP's quantile at the same epsilon on the same data over 1025
  candidates (`pip install opendp`; it is no test dependency), with the ratio
  dpsql / OpenDP (below 1: dpsql is closer). Tumult Analytics is reported as not run
  when `tmlt.analytics` cannot be imported.

Usage: python benchmarks/bench_quantiles.py [--rows 10000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

import duckdb
import numpy as np

import dpsql

POLICY = {
    "analysts": {"default": {"epsilon": 1e9, "delta": 1e-6}},
    "tables": {"t": {"columns": {"x": {"type": "float", "lower": 0, "upper": 1000}}}},
}


def _timed(run) -> tuple[float, object]:
    start = time.perf_counter()
    value = run()
    return time.perf_counter() - start, value


def _rank(values: np.ndarray, value: float) -> float:
    return float(np.searchsorted(values, value, side="right"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    database = duckdb.connect()
    threads = database.execute("SELECT current_setting('threads')").fetchone()[0]
    database.execute("SET threads = 1; SELECT setseed(0.25)")  # the same data each run
    database.execute(f"CREATE TABLE t AS SELECT 1000 * random() ** 2 AS x FROM range({args.rows})")
    database.execute(f"SET threads = {threads}")
    ordered = np.sort(database.execute("SELECT x FROM t").fetchnumpy()["x"])
    connection = dpsql.connect(database, policy=POLICY, epsilon=1.0, ledger=":memory:")
    for name, q in (("median", 0.5), ("p90", 0.9)):
        raw = min(
            _timed(lambda q=q: database.execute(f"SELECT quantile_cont(x, {q}) FROM t").fetchall())[
                0
            ]
            for _ in range(args.repeat)
        )
        runs = []
        for i in range(args.repeat):  # a new text each run: no release cache
            elapsed, rows = _timed(
                lambda q=q, i=i: connection.execute(
                    f"SELECT quantile_cont(x, {q}) FROM t WHERE x >= -{i + 1}"
                ).fetchall()
            )
            runs.append((elapsed, rows[0][0]))
        dp = min(elapsed for elapsed, _ in runs)
        error = np.mean([abs(_rank(ordered, v) - q * len(ordered)) for _, v in runs])
        print(
            f"{name}: DP {dp:.3f}s / raw {raw:.3f}s = {dp / raw:.2f}x (target <= 1.5x); "
            f"dpsql rank error at epsilon 1: {error:.1f} of {len(ordered)}"
        )
        peer, text = _opendp(ordered, q, args.repeat)
        ratio = f"; dpsql / OpenDP = {error / peer:.2f}" if peer else ""
        print(f"  OpenDP: {text}{ratio}")
        print(f"  Tumult Analytics: {_tumult()}")


def _tumult() -> str:
    try:
        import tmlt.analytics  # noqa: F401
    except ImportError as exc:
        return f"not run ({exc})"
    return "importable, but not compared here (it needs a Spark session)"


def _opendp(ordered: np.ndarray, q: float, repeat: int) -> tuple[float | None, str]:
    """OpenDP's mean rank error at epsilon 1 (None when it did not run), and the text."""
    try:
        import opendp.prelude as dp
    except ImportError as exc:
        return None, f"not run ({exc})"
    dp.enable_features("contrib")
    candidates = [float(c) for c in np.linspace(0, 1000, 1025)]
    space = dp.vector_domain(dp.atom_domain(bounds=(0.0, 1000.0), nan=False))

    def make(scale: float):
        return dp.m.make_private_quantile(
            space, dp.symmetric_distance(), dp.max_divergence(), candidates, q, scale
        )

    try:  # the scale whose privacy map gives epsilon 1 for one added or removed value
        measurement = make(dp.binary_search_param(make, d_in=1, d_out=1.0))
    except Exception as exc:  # report any failure of the peer, do not hide it
        return None, f"not run ({type(exc).__name__}: {str(exc).strip()[:120]})"
    sample = ordered[:: max(1, len(ordered) // 1_000_000)]  # OpenDP reads the data in memory
    scale = len(ordered) / len(sample)
    errors = []
    for _ in range(repeat):
        value = measurement(sample.tolist())
        value = candidates[value] if isinstance(value, int) else value
        errors.append(abs(_rank(sample, value) - q * len(sample)) * scale)
    error = float(np.mean(errors))
    return error, f"rank error {error:.1f} (on a 1-in-{int(scale)} sample, scaled)"


if __name__ == "__main__":
    main()
