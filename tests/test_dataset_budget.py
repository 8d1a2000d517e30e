"""The dataset-wide budget (policy key `budget`): all analysts draw on it together.

It is charged in the same ledger transaction as the analyst's own budget, on
both stores (SQLite, PostgreSQL), so analysts racing in separate processes
never spend more of it than it holds together, and a refusal says which of
the two budgets ran out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from conftest import pums_policy
from test_ledger import STORES, assert_log_consistent, fresh_location

import dpsql
from dpsql.accounting import Cost
from dpsql.errors import BudgetExhausted, DatasetBudgetExhausted, PolicyError
from dpsql.ledger import DATASET_ACCOUNT, Ledger
from dpsql.policy import load_policy

TENTH = Cost(Fraction(1, 10))
ONE = Cost.of(1.0)
TEN = Cost.of(10.0)

# A worker process: waits for a line on stdin, then charges `n` tenths as its
# analyst against a generous own budget and a shared dataset budget of 1.
_WORKER = """
import json, sys
from fractions import Fraction
from dpsql.accounting import Cost
from dpsql.errors import BudgetExhausted, DatasetBudgetExhausted
from dpsql.ledger import Ledger
job = json.loads(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
counts = {"ok": 0, "dataset": 0, "analyst": 0}
with Ledger(job["path"]) as ledger:
    for i in range(job["n"]):
        try:
            ledger.charge(job["analyst"], Cost(Fraction(1, 10)), Cost.of(10.0), f"q{i}",
                          dataset_budget=Cost.of(1.0))
            counts["ok"] += 1
        except DatasetBudgetExhausted:
            counts["dataset"] += 1
        except BudgetExhausted:
            counts["analyst"] += 1
print(json.dumps(counts), flush=True)
"""


@pytest.fixture(params=STORES)
def location(request: pytest.FixtureRequest, tmp_path: Path):
    with fresh_location(request.param, tmp_path) as where:
        yield where


def test_analysts_share_the_dataset_budget_and_the_refusal_names_it(location: str) -> None:
    with Ledger(location) as ledger:
        for i in range(10):
            ledger.charge(("alice", "bob")[i % 2], TENTH, TEN, f"q{i}", dataset_budget=ONE)
        with pytest.raises(DatasetBudgetExhausted) as raised:
            ledger.charge("carol", TENTH, TEN, "q10", dataset_budget=ONE)
        message = str(raised.value)
        assert "dataset-wide privacy budget, shared by all analysts" in message
        assert "analyst 'carol'" in message and "'budget' in the policy" in message
        assert raised.value.remaining == Cost()
        # the refused charge wrote nothing, in neither account
        assert ledger.spent("carol") == Cost()
        assert ledger.spent(DATASET_ACCOUNT) == ONE
        assert ledger.spent("alice") == ledger.spent("bob") == Cost(Fraction(1, 2))
        shared = ledger.charges(DATASET_ACCOUNT)
        assert [c.fingerprint for c in shared[:2]] == ["alice:q0", "bob:q1"]
    assert assert_log_consistent(location) == 20


def test_the_refusal_does_not_tell_what_the_others_spent(location: str) -> None:
    """A refused charge writes nothing, so a left-over amount in the message would let
    an analyst watch what the others spend, for free (found by an audit)."""
    with Ledger(location) as ledger:
        ledger.charge("alice", Cost.of(0.35), TEN, "q0", dataset_budget=ONE)
        with pytest.raises(DatasetBudgetExhausted) as raised:
            ledger.charge("bob", Cost.of(0.7), TEN, "q1", dataset_budget=ONE)
    message = str(raised.value)
    assert "0.65" not in message and "0.35" not in message and "remains" not in message
    assert "is not shown" in message


def test_the_analysts_own_budget_is_still_checked_first(location: str) -> None:
    with Ledger(location) as ledger:
        ledger.charge("alice", Cost.of(0.5), ONE, "q0", dataset_budget=TEN)
        with pytest.raises(BudgetExhausted) as raised:
            ledger.charge("alice", Cost.of(0.6), ONE, "q1", dataset_budget=TEN)
        assert not isinstance(raised.value, DatasetBudgetExhausted)
        assert "for analyst 'alice'" in str(raised.value)
        assert ledger.spent(DATASET_ACCOUNT) == Cost.of(0.5)
        # without a dataset budget, the shared account is left alone
        ledger.charge("alice", Cost.of(0.5), ONE, "q2")
        assert ledger.spent(DATASET_ACCOUNT) == Cost.of(0.5)
        with pytest.raises(ValueError, match="shared dataset account"):
            ledger.charge(DATASET_ACCOUNT, TENTH, TEN, "q3")


def test_analysts_racing_in_processes_never_exceed_the_dataset_budget(location: str) -> None:
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, json.dumps({"path": location, "analyst": a, "n": 8})],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for a in ("alice", "bob", "carol")
    ]
    for worker in workers:
        assert worker.stdout.readline().strip() == "ready"
    for worker in workers:  # all at once, so the charges interleave
        worker.stdin.write("go\n")
        worker.stdin.flush()
    results = [json.loads(worker.communicate(timeout=120)[0]) for worker in workers]
    # 24 attempts against room for exactly 10: every refusal is the shared budget's
    assert sum(r["ok"] for r in results) == 10
    assert sum(r["dataset"] for r in results) == 14
    assert all(r["analyst"] == 0 for r in results)
    with Ledger(location) as ledger:
        assert ledger.spent(DATASET_ACCOUNT) == ONE
        for analyst, result in zip(("alice", "bob", "carol"), results, strict=True):
            assert ledger.spent(analyst) == Cost(TENTH.epsilon * result["ok"])
    assert assert_log_consistent(location) == 20


def test_sessions_of_two_analysts_draw_on_the_policy_budget(pums_db: Path, tmp_path: Path) -> None:
    policy = pums_policy(
        analysts={"alice": {"epsilon": 5.0}, "bob": {"epsilon": 5.0}},
        budget={"epsilon": 3.0},
    )
    ledger = tmp_path / "ledger.sqlite"
    alice = dpsql.connect(pums_db, policy=policy, ledger=ledger, analyst="alice", seed=1)
    bob = dpsql.connect(pums_db, policy=policy, ledger=ledger, analyst="bob", seed=2)
    with alice, bob:
        alice.execute("SELECT COUNT(*) FROM pums")
        bob.execute("SELECT COUNT(*) FROM pums")  # another analyst's repeat: charged again
        alice.execute("SELECT COUNT(*) FROM pums")  # alice's repeat: from her cache, free
        bob.execute("SELECT SUM(age) FROM pums")
        with pytest.raises(DatasetBudgetExhausted, match="dataset-wide"):
            alice.execute("SELECT SUM(income) FROM pums")
        assert alice.budget().epsilon_spent == pytest.approx(1.0)  # her own budget is fine
        assert bob.budget().epsilon_spent == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("document", "error"),
    [
        ({"budget": {"epsilon": 1.0, "rho": 1}}, r"key 'budget.rho'.*allowed here: delta, epsilon"),
        ({"budget": {"delta": 1e-6}}, r"key 'budget'.*missing 'epsilon'"),
        ({"budget": {"epsilon": -1}}, r"key 'budget.epsilon'.*positive"),
        ({"budget": 5}, r"key 'budget'.*must be a mapping"),
        ({"analysts": {"*dataset*": {"epsilon": 1.0}}}, r"'\*' are reserved"),
    ],
)
def test_policy_budget_key_is_validated(document: dict, error: str) -> None:
    with pytest.raises(PolicyError, match=error):
        load_policy(pums_policy(**document))


def test_policy_without_budget_has_no_dataset_limit() -> None:
    assert load_policy(pums_policy()).dataset_budget is None
    loaded = load_policy(pums_policy(budget={"epsilon": 2.0, "delta": 1e-6}))
    assert loaded.dataset_budget == Cost.of(2.0, 1e-6)
