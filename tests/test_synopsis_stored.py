"""A stored synopsis is decoded once per process, and never answered from once it is gone.

Every answer must be post-processing of the synopsis the ledger holds for the
analyst now: after a drop, a cleared cache, a rebuild by another connection,
for another analyst, under a changed policy or data_version.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_synopsis import visits_db, visits_policy  # noqa: F401 (a fixture)

import dpsql
from dpsql.lru import WeightedLru
from dpsql.mechanisms.tree import HierarchicalHistogram
from dpsql.sql import synopsis

RANGES = [(0, 18), (18, 65), (65, 101), (10, 41), (0, 101), (30, 31), (50, 90), (7, 99)]


@pytest.fixture(autouse=True)
def _fresh_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty cache of decoded synopses, so no other test's trees are in it."""
    monkeypatch.setattr(synopsis, "_loaded", WeightedLru(synopsis._LOADED_BYTES))


def _policy(**changes: object) -> dict:
    policy = visits_policy()
    policy["analysts"]["other"] = {"epsilon": 10.0, "delta": 1e-6}
    policy.update(changes)
    return policy


def _connect(db: Path, ledger: Path, seed: int, analyst: str = "default", **changes: object):
    return dpsql.connect(str(db), policy=_policy(**changes), ledger=ledger, analyst=analyst,
                         seed=seed)  # fmt: skip


def _answers(con) -> list[int]:
    return [
        con.execute(
            f"SELECT COUNT(*) FROM synopsis_visits WHERE age >= {a} AND age < {e}"
        ).fetchall()[0][0]
        for a, e in RANGES
    ]


def _from_ledger(con) -> list[int]:
    """The answers of the synopsis on age that the ledger holds for this analyst now."""
    session = con.session
    (status,) = [s for s in session.synopses() if s.name == "synopsis_visits.age"]
    payload = session.ledger.cached_release(session.analyst, status.key)
    tree = HierarchicalHistogram.from_json(json.loads(payload)["tree"])
    values, _, _ = tree.answers(*np.array(RANGES).T)
    return [int(v) for v in np.rint(values)]


def test_a_stored_synopsis_is_decoded_once_per_process(
    visits_db: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded = []
    from_json = HierarchicalHistogram.from_json
    monkeypatch.setattr(HierarchicalHistogram, "from_json",
                        lambda data: decoded.append(1) or from_json(data))  # fmt: skip
    with _connect(visits_db, tmp_path / "l.sqlite", seed=1) as con:
        first = _answers(con)  # the first builds, the others answer from the stored tree
        assert _answers(con) == first
        assert con.budget().epsilon_spent == 0.5
    with _connect(visits_db, tmp_path / "l.sqlite", seed=2) as con:  # a new connection
        assert _answers(con) == first
    assert len(decoded) == 1
    assert first == [int(v) for v in np.rint(first)]


def _drop(db: Path, ledger: Path, con) -> object:
    con.session.drop_synopsis("synopsis_visits", "age")
    return con


def _clear(db: Path, ledger: Path, con) -> object:
    con.session.ledger.clear_cache()
    return con


def _rebuilt_elsewhere(db: Path, ledger: Path, con) -> object:
    """Another connection (another process, say) drops the synopsis and builds its own."""
    with _connect(db, ledger, seed=5) as other:
        other.session.drop_synopsis("synopsis_visits", "age")
        other.session.build_synopsis("synopsis_visits", "age")
    return con


def _other_analyst(db: Path, ledger: Path, con) -> object:
    return _connect(db, ledger, seed=6, analyst="other")


def _other_policy(db: Path, ledger: Path, con) -> object:
    policy = _policy()
    policy["tables"]["synopsis_visits"]["columns"]["age"]["synopsis"]["branching"] = 4
    return dpsql.connect(str(db), policy=policy, ledger=ledger, seed=7)


def _other_data(db: Path, ledger: Path, con) -> object:
    return _connect(db, ledger, seed=8, data_version="2")


@pytest.mark.parametrize(
    "change", [_drop, _clear, _rebuilt_elsewhere, _other_analyst, _other_policy, _other_data]
)
def test_answers_come_from_the_synopsis_stored_now(
    visits_db: Path,  # noqa: F811
    tmp_path: Path,
    change: Callable,
) -> None:
    ledger = tmp_path / "l.sqlite"
    with _connect(visits_db, ledger, seed=1) as con:
        _answers(con)  # builds
        before = _answers(con)  # answered from the stored tree, now decoded in memory
        assert before == _from_ledger(con)
        after = change(visits_db, ledger, con)
        answers = _answers(after)
        assert answers == _from_ledger(after)
        assert answers != before  # another synopsis, with other noise
        if after is not con:  # the first analyst, policy and data still have theirs
            assert _answers(con) == before
            after.close()


def test_a_kept_tree_is_used_only_for_the_very_payload_it_was_decoded_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # one sampled character: payloads of one length share a lookup key, so the
    # equality of the whole payload is all that tells them apart
    monkeypatch.setattr(synopsis, "_SAMPLED_CHARACTERS", 1)
    rng = np.random.default_rng(0)
    payloads = [
        json.dumps({"built": "2024-01-01T00:00:00+00:00",
                    "tree": HierarchicalHistogram.build(np.arange(50), 4, 1.0, rng).to_json()})
        for _ in range(2)
    ]  # fmt: skip
    assert len(payloads[0]) == len(payloads[1]) and payloads[0] != payloads[1]
    trees = [synopsis.load("synopsis:t.c:0", payload)[1] for payload in payloads]
    assert not np.array_equal(trees[0].prefix, trees[1].prefix)
    for payload, tree in zip(payloads, trees, strict=True):
        again = synopsis.load("synopsis:t.c:0", payload)[1]
        assert np.array_equal(again.prefix, tree.prefix)
    with pytest.raises(ValueError, match="read-only"):
        trees[1].prefix[0] = 1.0  # shared between sessions: nobody may change it
