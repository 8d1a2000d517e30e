"""The one exception hierarchy of dpsql, with the PEP 249 names.

Every refusal carries what was refused, why, and what to write instead, so
that each front end (DB-API, shell, wire server) can show the same message.
"""

from __future__ import annotations


class Warning(Exception):
    """PEP 249 warning."""


class Error(Exception):
    """Base class of every dpsql error (PEP 249)."""


class InterfaceError(Error):
    """Misuse of the DB-API interface itself (closed cursor, bad parameters)."""


class DatabaseError(Error):
    """An error related to the database or the privacy layer in front of it."""


class DataError(DatabaseError):
    """A problem with processed data (PEP 249)."""


class OperationalError(DatabaseError):
    """An error in the operation of the database, outside the caller's control."""


class IntegrityError(DatabaseError):
    """Relational integrity is affected (PEP 249; dpsql never modifies data)."""


class InternalError(DatabaseError):
    """dpsql or the database reached an inconsistent internal state."""


class ProgrammingError(DatabaseError):
    """A mistake in the statement or in how it was sent."""


class NotSupportedError(DatabaseError):
    """A method or API that the database does not support."""


class PolicyError(ProgrammingError):
    """The privacy policy is invalid: names the file, the key and what to write."""

    def __init__(self, message: str, *, source: str | None = None, key: str | None = None):
        self.source = source
        self.key = key
        where = ", ".join(part for part in (source, f"key '{key}'" if key else None) if part)
        super().__init__(f"{where}: {message}" if where else message)


class QueryRefused(ProgrammingError):
    """dpsql cannot prove a statement safe, so it never reaches the database."""

    def __init__(self, construct: str, reason: str, hint: str):
        self.construct = construct
        self.reason = reason
        self.hint = hint
        super().__init__(f"refused {construct}: {reason}. Instead: {hint}")


class BudgetExhausted(OperationalError):
    """The analyst's remaining privacy budget does not cover the query's cost."""

    def __init__(self, analyst: str, cost: object, remaining: object):
        self.analyst = analyst
        self.cost = cost
        self.remaining = remaining
        super().__init__(self._message())

    def _message(self, lower: str = "SET dpsql.epsilon = <smaller value>") -> str:
        return (
            f"privacy budget exhausted for analyst '{self.analyst}': the query costs "
            f"{self.cost} but only {self.remaining} remains. Ask the data owner for more "
            f"budget, or {self._cheaper(lower)}"
        )

    def advice(self, lower: str, reset: str | None = None) -> str:
        """The message in a front end's words: `lower` is how it lowers a query's epsilon
        (SQL's SET by default, e.g. `--epsilon <smaller value>` on the command line), and
        `reset` how to start the budget afresh where the analyst may (the demo's ledger)."""
        return self._message(lower) + (f" {reset}" if reset else "")

    def _cheaper(self, lower: str) -> str:
        """What to write instead: zCDP (Gaussian) charges need delta left over to convert."""
        if getattr(self.cost, "rho", 0) and not getattr(self.remaining, "delta", 1):
            return (
                "use noise that needs no delta: SET dpsql.mechanism = 'laplace' (Gaussian "
                "noise is converted with delta, and none is left)."
            )
        return f"lower the cost with {lower} (more noise)."


class DatasetBudgetExhausted(BudgetExhausted):
    """The dataset-wide budget, which every analyst draws on together, does not cover the cost.

    `analyst` is who asked; `remaining` is what is left of the shared budget, for the
    operator: the message leaves it out, since an analyst could read from it, free of
    charge (a refused query writes nothing), what the others spend and when.
    """

    def _message(self, lower: str = "SET dpsql.epsilon = <smaller value>") -> str:
        return (
            "the dataset-wide privacy budget, shared by all analysts, does not cover the "
            f"query of analyst '{self.analyst}', which costs {self.cost} (what is left of it "
            "is not shown: it would tell what other analysts spent). Ask the data owner to "
            f"raise 'budget' in the policy, or {self._cheaper(lower)}"
        )


class TooManyGroups(OperationalError):
    """A release has more groups than the session's `max_groups` allows.

    Keys from public domains are counted from the policy, and refused before
    the charge. Keys from the data are refused after it: their count is known
    only after partition selection, and refusing on the count before it would
    let the data decide whether a query is charged.
    """

    def __init__(self, limit: int, *, charged: bool = True):
        self.limit = limit
        why = (
            "the query was charged, because the number of released groups is only known "
            "after the noisy selection, and nothing was cached, so running it again charges "
            "again"
            if charged
            else "nothing was charged: the policy's public key values fix the groups"
        )
        super().__init__(
            f"refused a release of more than {limit:,} groups (the max_groups limit, which "
            f"keeps one query from exhausting memory): {why}. Instead: group by fewer or "
            "coarser columns, add a WHERE, or raise max_groups (connect(max_groups=...), "
            "dpsql serve --max-groups)"
        )


class BackendError(OperationalError):
    """The database behind dpsql failed while running a rewritten query."""
