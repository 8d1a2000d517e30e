"""Claims on a ledger (Ledger.exclusive): identical statements are answered one at a time
across threads, ledger objects and processes sharing a ledger, on an SQLite file and on
PostgreSQL (DPSQL_TEST_POSTGRES_URL, else a server of the test process's own).

Another process holds a claim in a real child process: while it holds it, the same
key waits and a key of another slot does not; the claim passes on when the holder
lets go, and when it is killed with SIGKILL. In one process, a second ledger object
on the same file waits for the first's claim, and closing a third one does not
drop it (an OFD lock belongs to its file descriptor, a POSIX lock to the process).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_ledger import STORES, fresh_location

from dpsql.ledger import Ledger
from dpsql.ledger.claims import STRIPES, slot_of

KEY = "ann SELECT COUNT(*) FROM census None"
# Waiting this long without the claim shows it is held: a free claim takes
# microseconds (a file lock) or one round trip (PostgreSQL).
HELD = 0.5
PASSED_ON = 20.0  # seconds within which a freed claim must reach its waiter

HOLDER = """
import sys
from dpsql.ledger import Ledger
ledger = Ledger(sys.argv[1])
with ledger.exclusive(sys.argv[2]):
    print("held", flush=True)
    sys.stdin.readline()
print("released", flush=True)
"""


def _other_slot_key() -> str:
    """A key whose slot, and in-process stripe, differ from KEY's."""
    for n in range(1000):
        key = f"{KEY}{n}"
        if slot_of(key) % STRIPES != slot_of(KEY) % STRIPES:
            return key
    raise AssertionError("no key in another slot")


@pytest.fixture(params=STORES)
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_location(request.param, tmp_path) as found:
        Ledger(found).close()  # created before any holder opens it
        yield found


@pytest.fixture
def holder(location: str) -> Iterator[subprocess.Popen]:
    """A child process holding KEY on the ledger until told (a line) or killed."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, location, KEY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline() == "held\n"
        yield child
    finally:
        child.kill()
        child.wait()


class Claimant:
    """A thread claiming a key: `held` is set once it holds it; `let_go()` ends its claim."""

    def __init__(self, ledger: Ledger, key: str):
        self.held, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._claim, args=(ledger, key), daemon=True)
        self._thread.start()

    def _claim(self, ledger: Ledger, key: str) -> None:
        with ledger.exclusive(key):
            self.held.set()
            self._release.wait(60)

    def let_go(self) -> None:
        self._release.set()
        self._thread.join(PASSED_ON)
        assert not self._thread.is_alive()


def test_a_claim_waits_for_another_process_until_it_lets_go(location: str, holder) -> None:
    with Ledger(location) as ledger:
        waiting = Claimant(ledger, KEY)
        assert not waiting.held.wait(HELD), "claimed while another process held the key"
        other = Claimant(ledger, _other_slot_key())
        assert other.held.wait(PASSED_ON), "a key of another slot waited for this one"
        other.let_go()
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "released\n"
        assert waiting.held.wait(PASSED_ON), "the claim was not passed on once its holder let go"
        waiting.let_go()


def test_a_killed_holder_leaves_no_claim_behind(location: str, holder) -> None:
    with Ledger(location) as ledger:
        waiting = Claimant(ledger, KEY)
        assert not waiting.held.wait(HELD)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert waiting.held.wait(PASSED_ON), "a process killed holding a claim kept it"
        waiting.let_go()


def test_ledger_objects_of_one_process_exclude_each_other(location: str) -> None:
    with Ledger(location) as first, Ledger(location) as second:
        holding = Claimant(first, KEY)
        assert holding.held.wait(PASSED_ON)
        with Ledger(location) as third, third.exclusive(_other_slot_key()):
            pass  # a POSIX lock would be dropped as this closes its descriptor
        waiting = Claimant(second, KEY)
        assert not waiting.held.wait(HELD), "a second ledger object claimed a held key"
        holding.let_go()
        assert waiting.held.wait(PASSED_ON)
        waiting.let_go()


def test_threads_sharing_a_ledger_in_memory_exclude_each_other() -> None:
    with Ledger(":memory:") as ledger:
        holding = Claimant(ledger, KEY)
        assert holding.held.wait(PASSED_ON)
        waiting = Claimant(ledger, KEY)
        assert not waiting.held.wait(HELD)
        holding.let_go()
        assert waiting.held.wait(PASSED_ON)
        waiting.let_go()


def test_the_claims_file_has_the_ledger_s_permissions(tmp_path: Path) -> None:
    """Every account that may write the ledger may claim statements on it: the claims file
    is made with the ledger's permissions, as SQLite makes its -wal and -shm, whatever the
    umask (a 0600 file left a group-writable ledger's other accounts unable to query)."""
    location = tmp_path / "shared.sqlite"
    Ledger(location).close()
    location.chmod(0o660)
    with Ledger(location) as ledger, ledger.exclusive(KEY):
        assert (tmp_path / "shared.sqlite-claims").stat().st_mode & 0o777 == 0o660
