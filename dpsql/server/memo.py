"""The wire server's in-memory view of the ledger's release cache.

A repeated statement is answered by the Session from the release cache: it
parses the statement, fingerprints it, reads the ledger and decodes the
stored release, in a worker thread, because the ledger read may wait behind
another thread's durable write (a SQLite ledger takes one lock for both) or
cross the network (a PostgreSQL ledger). The event loop must not wait on
either, so it keeps its own view: the releases the cache already holds,
under what fixes their fingerprint on this server, and answers repeats from
it without the parse, the ledger or the trip to a worker.

What fixes a fingerprint here: the analyst, the session's options, and the
statement's text with its parameter values. The dialect, the policy and its
data version are the server's for its whole life. So an entry is exactly
the release the Session would read from the cache, which is only ever
handed back to the analyst it was released to, free; a statement spelled
differently misses here and is answered by the Session as before. Only the
Session's `CachedRelease` (read from or stored in the cache) is kept: a
stream's release, a SET or a SHOW never is. The view only grows from this
server's own answers, so a release cleared from the ledger by another
process is still answered here until the server restarts: it was already
released to the analyst, and answering it again costs no privacy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from pg_mimic import ResultColumn

from dpsql.lru import WeightedLru
from dpsql.results import Release
from dpsql.session import CachedRelease, Session

# Sizes in approximate bytes, as tracemalloc found them for one- to six-value
# answers (1.9-2.6 kB each): an entry's objects (release, accuracy, column
# types, key, order links), then each value (a tuple slot, a boxed number or
# short string) and each character of the key and of the notices.
MEMO_BYTES = 16 * 1024 * 1024
ENTRY_BYTES = 1500
VALUE_BYTES = 100

Key = tuple[str, Any, str, str]


class Answer(NamedTuple):
    """A statement's release with what the wire sends beside its rows, made once: the
    columns' PostgreSQL types and the encoded NoticeResponses."""

    release: Release
    columns: list[ResultColumn] | None
    notices: bytes


def memo_key(session: Session, sql: str, parameters: Sequence[Any]) -> Key:
    """What fixes the release of `sql` with `parameters` for this session on this server.

    The parameters enter by repr: equal values of different types (1, 1.0,
    True) bind as different literals, so they must not share an entry.
    """
    return session.analyst, session.options, sql, repr(list(parameters))


class ReleaseMemo(WeightedLru):
    """Answers of cached releases by `memo_key`, in at most `limit` approximate bytes; an
    answer over a sixteenth of that is not kept."""

    def __init__(self, limit: int = MEMO_BYTES):
        super().__init__(limit, largest=limit // 16)

    def keep(self, key: Key, answer: Answer) -> None:
        """Remember `answer` if its release is one the release cache keeps and it fits."""
        release = answer.release
        if isinstance(release, CachedRelease):
            values = len(release.columns) * len(release.rows) + len(release.accuracy)
            values += sum(2 * len(a.intervals or ()) for a in release.accuracy.values())
            size = ENTRY_BYTES + len(key[2]) + len(key[3]) + len(answer.notices)
            self.put(key, answer, size + VALUE_BYTES * values)
