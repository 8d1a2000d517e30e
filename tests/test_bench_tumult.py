"""The benchmarks' Tumult worker runner reports a failed worker instead of crashing.

A worker killed by a signal or failing before it writes anything leaves no error
output; taking its last line raised IndexError and ended the whole benchmark.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from bench_quantiles import run_tumult, worker_failure


def test_a_silent_failure_reports_its_exit_code() -> None:
    assert worker_failure(-9, "") == "exit code -9, no error output"
    assert worker_failure(1, "\n  \n") == "exit code 1, no error output"


def test_a_failure_reports_its_last_line() -> None:
    assert worker_failure(1, "Traceback ...\nValueError: bad\n") == "ValueError: bad"


@pytest.mark.skipif(shutil.which("false") is None, reason="no false(1) on this system")
def test_a_worker_that_exits_silently_does_not_crash_the_benchmark() -> None:
    answer = run_tumult(shutil.which("false"), {"task": "mix"})
    assert answer == "not run (tumult_worker.py: exit code 1, no error output)"
