"""A generated stand-in for the PUMS sample: the same four CSV files, columns and types.

The real sample (1,000 Californians) is not part of the repository; a fresh clone
writes this one instead, so the suite runs whole. It has the real sample's shape:
1,000 people with ids 1..1000; `PUMS_dup.csv` repeats each person's row 1 to 4
times (about 1,950 rows); `PUMS_null.csv` is `PUMS_dup.csv` with about 5% of the
values missing and some ids missing; incomes are written as floats in the first two
files and as integers in the last two, as in the real files (DuckDB reads them as
DOUBLE and BIGINT). Values come from a seeded generator: every process (each xdist
worker) writes the same files.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

COLUMNS = ["age", "sex", "educ", "race", "income", "married"]
PEOPLE = 1000
# how many rows each person has in PUMS_dup.csv, and how often (the real sample's shares)
_COPIES, _COPY_SHARES = [1, 2, 3, 4], [0.418, 0.309, 0.180, 0.093]
_NULL_SHARE, _NULL_ID_SHARE = 0.05, 0.045


def _people(rng: np.random.Generator) -> list[list[int]]:
    age = rng.integers(18, 94, PEOPLE)
    sex = rng.integers(0, 2, PEOPLE)
    educ = rng.integers(1, 17, PEOPLE)
    race = rng.choice([1, 2, 3, 4, 5, 6], PEOPLE, p=[0.6, 0.07, 0.03, 0.2, 0.02, 0.08])
    # a third earn nothing; the rest a log-normal income in hundreds, capped as in the sample
    earned = np.minimum(np.round(rng.lognormal(5.6, 1.0, PEOPLE)) * 100, 420_500)
    income = np.where(rng.random(PEOPLE) < 0.33, 0, earned).astype(int)
    married = rng.integers(0, 2, PEOPLE)
    return [list(map(int, row)) for row in zip(age, sex, educ, race, income, married, strict=True)]


def _write(path: Path, header: list[str], rows: list[list]) -> None:
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(header)
        writer.writerows(rows)


def write_sample(folder: Path, seed: int = 2020) -> Path:
    """Write PUMS.csv, PUMS_pid.csv, PUMS_dup.csv and PUMS_null.csv into `folder`."""
    rng = np.random.default_rng(seed)
    people = _people(rng)
    floats = [[*row[:4], float(row[4]), row[5]] for row in people]
    _write(folder / "PUMS.csv", COLUMNS, floats)
    _write(folder / "PUMS_pid.csv", [*COLUMNS, "pid"], [[*r, i + 1] for i, r in enumerate(floats)])
    copies = rng.choice(_COPIES, PEOPLE, p=_COPY_SHARES)
    # every person once in id order, then the repeats, as the real file has them
    dup = [[*row, pid + 1] for pid, row in enumerate(people)]
    dup += [[*people[pid], pid + 1] for pid in range(PEOPLE) for _ in range(copies[pid] - 1)]
    _write(folder / "PUMS_dup.csv", [*COLUMNS, "pid"], dup)
    missing = rng.random((len(dup), len(COLUMNS))) < _NULL_SHARE
    missing_id = rng.random(len(dup)) < _NULL_ID_SHARE
    null = [
        [None if gone else value for value, gone in zip(row[:-1], holes, strict=True)]
        + [None if no_id else row[-1]]
        for row, holes, no_id in zip(dup, missing, missing_id, strict=True)
    ]
    _write(folder / "PUMS_null.csv", [*COLUMNS, "pid"], null)
    return folder
