"""Order statistics at scale: median and p90 of a 10-million-row column on DuckDB.

Prints, measured in this run:

* DP time (plan, bounded histogram in DuckDB, exact exponential mechanism) over raw
  `quantile_cont` time on the same table, beside the target (<= 1.5x);
* the rank error of dpsql's release at epsilon 1 (mean over `--releases`, with its
  standard error) beside the expected rank error of the continuous exponential
  mechanism (Tumult Analytics' algorithm) computed exactly on the same table, and, if it
  can be imported, OpenDP's quantile at the same epsilon on the same data over 1025
  candidates (`pip install opendp`; it is no test dependency), with the ratio
  dpsql / OpenDP (below 1: dpsql is closer);
* with `--tumult-python PY` (a Python with `tmlt-analytics`, in its own virtual
  environment: it pins its own PySpark and pandas, and needs Java), Tumult
  Analytics' quantile at the same epsilon, bounds and row-level neighbours
  (`AddOneRow`, pure DP), run by benchmarks/tumult_worker.py on local Spark, with
  the ratio dpsql / Tumult.

The peers read the data in memory, so past a size they read a systematic sample
of the sorted values: OpenDP at most 1M, Tumult at most `--tumult-rows` (100,000:
its exponential mechanism over the gaps between values runs in Python, on one
core, some seconds per 100,000 values and release). Every release's rank error is
taken against the whole table, as dpsql's. A 1-in-k sample can cost a peer up to
k times its error on the whole table (a release r rows off within the sample is
about r * k rows off in the table): the like-for-like ratios are those at
`--rows 100000`, where all three read the same rows.

Usage: python benchmarks/bench_quantiles.py [--rows 10000000] [--repeat 3] [--releases 30]
           [--tumult-python PY] [--tumult-trials 3] [--tumult-rows 100000]
  e.g. python -m venv /tmp/tumult && /tmp/tumult/bin/pip install tmlt-analytics
       python benchmarks/bench_quantiles.py --tumult-python /tmp/tumult/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

import dpsql

POLICY = {
    "analysts": {"default": {"epsilon": 1e9, "delta": 1e-6}},
    "tables": {"t": {"columns": {"x": {"type": "float", "lower": 0, "upper": 1000}}}},
}
LOWER, UPPER = 0.0, 1000.0  # the policy's bounds, given to the peers too
QUANTILES = (("median", 0.5), ("p90", 0.9))
OPENDP_ROWS = 1_000_000  # the most values OpenDP reads in memory


def _timed(run) -> tuple[float, object]:
    start = time.perf_counter()
    value = run()
    return time.perf_counter() - start, value


def _rank(values: np.ndarray, value: float) -> float:
    return float(np.searchsorted(values, value, side="right"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs (the best counts)")
    parser.add_argument(
        "--releases", type=int, default=30, help="dpsql releases whose rank error is averaged"
    )
    parser.add_argument("--tumult-python", help="a Python with tmlt-analytics (its own venv)")
    parser.add_argument("--tumult-trials", type=int, default=3, help="Tumult releases each")
    parser.add_argument(
        "--tumult-rows", type=int, default=100_000, help="the most rows Tumult reads"
    )
    args = parser.parse_args()
    database = duckdb.connect()
    threads = database.execute("SELECT current_setting('threads')").fetchone()[0]
    database.execute("SET threads = 1; SELECT setseed(0.25)")  # the same data each run
    database.execute(f"CREATE TABLE t AS SELECT 1000 * random() ** 2 AS x FROM range({args.rows})")
    database.execute(f"SET threads = {threads}")
    ordered = np.sort(database.execute("SELECT x FROM t").fetchnumpy()["x"])
    step = _step(len(ordered), args.tumult_rows)
    tumult = _tumult(database, step, args.tumult_python, args.tumult_trials)
    connection = dpsql.connect(database, policy=POLICY, epsilon=1.0, ledger=":memory:")
    peers = tumult if isinstance(tumult, list) else [None] * len(QUANTILES)
    for (name, q), peer_releases in zip(QUANTILES, peers, strict=True):
        raw = min(
            _timed(lambda q=q: database.execute(f"SELECT quantile_cont(x, {q}) FROM t").fetchall())[
                0
            ]
            for _ in range(args.repeat)
        )
        runs = []
        for i in range(max(args.repeat, args.releases)):  # a new text each: no release cache
            elapsed, rows = _timed(
                lambda q=q, i=i: connection.execute(
                    f"SELECT quantile_cont(x, {q}) FROM t WHERE x >= -{i + 1}"
                ).fetchall()
            )
            runs.append((elapsed, rows[0][0]))
        dp = min(elapsed for elapsed, _ in runs[: args.repeat])
        errors = _rank_errors(ordered, [v for _, v in runs[: args.releases]], q)
        error = float(np.mean(errors))
        print(
            f"{name}: DP {dp:.3f}s / raw {raw:.3f}s = {dp / raw:.2f}x (target <= 1.5x); "
            f"dpsql rank error at epsilon 1: {error:.2f} +- {_sem(errors):.2f} of "
            f"{len(ordered)} (mean of {args.releases} releases +- its standard error)"
        )
        closed = _continuous_error(ordered, q, 1.0)
        print(
            f"  the continuous exponential mechanism (Tumult's algorithm: gaps between "
            f"values, Delta = max(q, 1 - q)) in closed form on the whole table: "
            f"expected rank error {closed:.2f}; dpsql / it = {error / closed:.2f}"
        )
        peer, text = _opendp(ordered, q, args.releases)
        ratio = f"; dpsql / OpenDP = {error / peer:.2f}" if peer else ""
        print(f"  OpenDP: {text}{ratio}")
        if isinstance(tumult, str):
            print(f"  Tumult Analytics: {tumult}")
            continue
        peer = _rank_error(ordered, peer_releases["releases"], q)
        print(
            f"  Tumult Analytics {tumult_version(args.tumult_python)}: rank error {peer:.1f} "
            f"(mean of {len(peer_releases['releases'])} releases, AddOneRow, PureDP epsilon 1, "
            f"{_read(step)}; {peer_releases['seconds']:.0f}s on local Spark)"
            + (f"; dpsql / Tumult = {error / peer:.2f}" if peer else "; Tumult's releases exact")
        )


def _step(rows: int, most: int) -> int:
    """The stride of the systematic sample a peer reads: at most `most` values."""
    return max(1, -(-rows // most))


def _read(step: int) -> str:
    """What a peer read, for its line."""
    return "the whole table" if step == 1 else f"a 1-in-{step} sample of the sorted table"


def _rank_errors(ordered: np.ndarray, releases: list[float], q: float) -> np.ndarray:
    """Each release's distance, in rows of the whole sorted table, from its rank to q's."""
    return np.array([abs(_rank(ordered, v) - q * len(ordered)) for v in releases])


def _rank_error(ordered: np.ndarray, releases: list[float], q: float) -> float:
    """Mean distance, in rows of the whole sorted table, from each release's rank to q's."""
    return float(np.mean(_rank_errors(ordered, releases, q)))


def _sem(values: np.ndarray) -> float:
    return float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0


def _continuous_error(ordered: np.ndarray, q: float, epsilon: float) -> float:
    """The expected rank error of the exponential mechanism over the gaps between the
    sorted values and the bounds (gap i, i values below it, weighed by its width times
    e^(-epsilon |i - q n| / (2 max(q, 1 - q)))), a value uniform within the gap chosen:
    Tumult Analytics' quantile, exactly, without sampling it."""
    edges = np.concatenate([[LOWER], ordered, [UPPER]])
    distance = np.abs(np.arange(len(ordered) + 1) - q * len(ordered))
    with np.errstate(divide="ignore"):
        log_weights = np.log(np.diff(edges)) - epsilon * distance / (2 * max(q, 1 - q))
    weights = np.exp(log_weights - log_weights.max())
    return float(np.sum(weights * distance) / np.sum(weights))


def _tumult(database, step: int, python: str | None, trials: int) -> list[dict] | str:
    """Tumult's releases per quantile from tumult_worker.py under `python`, or why not run."""
    if python is None:
        return "not run (give --tumult-python PY: a Python with tmlt-analytics)"
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "sample.parquet"
        # the same values as ordered[::step], the sample OpenDP reads
        database.execute(
            "COPY (SELECT x FROM (SELECT x, row_number() OVER (ORDER BY x) - 1 AS i FROM t) "
            f"WHERE i % {step} = 0) TO '{data}' (FORMAT parquet)"
        )
        return run_tumult(
            python,
            {
                "task": "quantiles",
                "parquet": str(data),
                "column": "x",
                "lower": LOWER,
                "upper": UPPER,
                "quantiles": [q for _, q in QUANTILES],
                "epsilon": 1.0,
                "trials": trials,
            },
        )


def run_tumult(python: str, request: dict) -> list | dict | str:
    """The answer of benchmarks/tumult_worker.py under `python` to `request`, or why it
    has none (its last line of error output, else its exit code)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "request.json"
        path.write_text(json.dumps(request))
        worker = Path(__file__).parent / "tumult_worker.py"
        done = subprocess.run(
            [python, str(worker), str(path)], capture_output=True, text=True, cwd=folder
        )
    if done.returncode:  # report the peer's failure, do not hide it
        return f"not run (tumult_worker.py: {worker_failure(done.returncode, done.stderr)})"
    return json.loads(done.stdout)


def worker_failure(code: int, stderr: str) -> str:
    """What a failed worker said: its last line of error output, else its exit code (a
    worker killed by a signal, or one that wrote nothing, has no line)."""
    lines = stderr.strip().splitlines()
    return lines[-1][:160] if lines else f"exit code {code}, no error output"


def tumult_version(python: str) -> str:
    """The tmlt.analytics version installed for `python`."""
    code = "import importlib.metadata as m; print(m.version('tmlt.analytics'))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip()


def _opendp(ordered: np.ndarray, q: float, repeat: int) -> tuple[float | None, str]:
    """OpenDP's mean rank error at epsilon 1 (None when it did not run), and the text."""
    try:
        import opendp.prelude as dp
    except ImportError as exc:
        return None, f"not run ({exc})"
    dp.enable_features("contrib")
    candidates = [float(c) for c in np.linspace(LOWER, UPPER, 1025)]
    space = dp.vector_domain(dp.atom_domain(bounds=(LOWER, UPPER), nan=False))

    def make(scale: float):
        return dp.m.make_private_quantile(
            space, dp.symmetric_distance(), dp.max_divergence(), candidates, q, scale
        )

    try:  # the scale whose privacy map gives epsilon 1 for one added or removed value
        measurement = make(dp.binary_search_param(make, d_in=1, d_out=1.0))
    except Exception as exc:  # report any failure of the peer, do not hide it
        return None, f"not run ({type(exc).__name__}: {str(exc).strip()[:120]})"
    step = _step(len(ordered), OPENDP_ROWS)
    sample = ordered[::step]
    releases = []
    for _ in range(repeat):
        value = measurement(sample.tolist())
        releases.append(candidates[value] if isinstance(value, int) else value)
    error = _rank_error(ordered, releases, q)
    return error, f"rank error {error:.1f} ({_read(step)})"


if __name__ == "__main__":
    main()
