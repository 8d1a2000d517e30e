"""What the benchmarks print about the machine, so figures from different runs compare.

The development VMs differ by 2x or more in plain Python speed from one day to
the next, and other work on them slows every figure: each benchmark prints
the cores, the load average and a fixed probe of Python's own speed beside
its results. Ratios measured in one run (dpsql against the raw query) are
far steadier than the absolute times, which should be read against the probe.
"""

from __future__ import annotations

import os
import timeit


def python_probe_us() -> float:
    """Best of 5 timings of sum(range(10_000)), in microseconds: a fixed piece of plain
    Python whose time tells how fast this machine runs interpreted code now."""
    runs = timeit.repeat("sum(range(10_000))", number=200, repeat=5)
    return min(runs) / 200 * 1e6


def describe() -> str:
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return (
        f"{os.cpu_count()} cores, load average {load}; Python probe: sum(range(10_000)) in "
        f"{python_probe_us():.0f} us (lower is a faster machine; others' work slows every figure)"
    )
