"""The Ledger over one store: its one job is to never let an analyst spend more than their budget.

It is an append-only log of charges, plus the cache of noisy releases that
makes repeated queries free and identical, kept in one of two stores behind
this one interface: an SQLite file (the default; ``dpsql.ledger.sqlite``) or a
PostgreSQL schema that several proxies share (``postgresql://...``;
``dpsql.ledger.postgres``). Each store says how it makes a charge atomic and
durable; ``dpsql.ledger.store`` holds the queries they share.

Guarantees, in every store:

* **Atomic check-and-append.** Reading what the analyst has spent, checking
  the new charge fits, and appending it are one transaction that no other
  charge for that analyst can interleave with (threads, processes, proxies).
  A refused charge writes nothing.
* **Derived from the log.** Each log row carries the analyst's running totals
  after it; the database refuses a row that does not continue them, so the
  amount spent (the last row's totals) cannot disagree with the log, even
  after a crash, and finding it is one index lookup however long the log.
* **Durable before return, or before release.** A charge is on disk before
  ``charge()`` returns. With ``charge(..., sync=False)`` it is committed
  (every other charge sees it, a killed process keeps it) but may still be on
  its way to the disk, which `durable()` waits for: a caller runs the query
  meanwhile and calls `durable()` before releasing anything the charge paid
  for, so power lost in between loses a charge whose answer nobody saw
  (budget, never privacy). The SQLite store syncs in the background; the
  PostgreSQL store is durable at commit either way.
  A cached release may be stored without waiting for the disk
  (``store_release(..., durable=False)``): losing it only means the next
  identical query is charged and answered afresh.
* **Never underestimates.** Costs are exact Fractions (``dpsql.accounting``);
  the log stores them as integers rounded **up** to a fixed quantum (epsilon
  and rho in units of 1e-12, delta in units of 1e-18). The budget is rounded
  **down** to the same quantum for the check. Decimal costs with at most 12
  (epsilon, rho) / 18 (delta) decimal places are stored without rounding.
* **zCDP composes by adding rho.** A charge fits when the analyst's total
  (epsilon, delta, rho) after it satisfies ``Cost.fits_within(budget)``: rho
  is converted to epsilon as a whole, with the delta not otherwise spent, so
  the check is not per component (the conversion is not linear).
* **Shared budgets are atomic too.** A charge against a dataset-wide budget
  is appended to the analyst's account and to the shared ``*dataset*``
  account in one transaction, under both accounts' locks: it fits both or
  is refused by the one that it does not fit, and writes nothing then.
* **Append-only.** Triggers refuse UPDATE and DELETE on the charges;
  ``clear_cache`` drops stored releases only, never charges.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from types import TracebackType

from dpsql.accounting import Cost, zcdp_epsilon
from dpsql.errors import BudgetExhausted, DatasetBudgetExhausted, NotSupportedError
from dpsql.ledger.store import Store, Units

SCHEMA_VERSION = 2

#: Units per 1.0 of epsilon, delta and rho in the stored integers.
EPSILON_QUANTUM = 10**12
DELTA_QUANTUM = 10**18
RHO_QUANTUM = 10**12
_QUANTA = Units(EPSILON_QUANTUM, DELTA_QUANTUM, RHO_QUANTUM)

# Stored integers are signed 64-bit in both stores: no single charge and no
# total may exceed this.
_MAX_UNITS = 2**63 - 1

DEFAULT_TIMEOUT = 60.0

#: The account of the dataset-wide budget (policy key ``budget``) that all
#: analysts draw on together; policy analyst names cannot start with "*".
DATASET_ACCOUNT = "*dataset*"

_META = {
    "schema_version": str(SCHEMA_VERSION),
    "epsilon_quantum": str(EPSILON_QUANTUM),
    "delta_quantum": str(DELTA_QUANTUM),
    "rho_quantum": str(RHO_QUANTUM),
}


@dataclass(frozen=True)
class Charge:
    """One entry of the log. `cost` is the amount logged: rounded up to the quantum."""

    id: int
    analyst: str
    time: datetime
    fingerprint: str
    cost: Cost


def _exact(value: object, name: str) -> Fraction:
    # Cost(...) built directly (not via Cost.of) skips validation, so check here.
    if isinstance(value, bool) or not isinstance(value, int | float | Fraction):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    exact = Fraction(value)
    if exact < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    return exact


def _ceil_units(value: Fraction, quantum: int) -> int:
    return -(-(value.numerator * quantum) // value.denominator)


def _floor_units(value: Fraction, quantum: int) -> int:
    return (value.numerator * quantum) // value.denominator


def _cost_units(cost: Cost) -> Units:
    """A charge in stored units, rounded up so the log never understates it."""
    if not isinstance(cost, Cost):
        raise TypeError(f"cost must be a dpsql.accounting.Cost, got {type(cost).__name__}")
    units = Units(
        _ceil_units(_exact(cost.epsilon, "epsilon"), EPSILON_QUANTUM),
        _ceil_units(_exact(cost.delta, "delta"), DELTA_QUANTUM),
        _ceil_units(_exact(cost.rho, "rho"), RHO_QUANTUM),
    )
    if max(units) > _MAX_UNITS:
        raise ValueError(f"cost ({cost}) is too large for the ledger")
    return units


@functools.lru_cache(maxsize=64)  # exact arithmetic; a session passes the same budget every time
def _budget_cost(budget: Cost) -> Cost:
    """A budget rounded down to the quantum, so it is never overstated.

    Capped at the largest storable total: a budget beyond ~9.2e6 epsilon
    offers no privacy anyway, and the cap keeps the stored totals in range.
    A budget is (epsilon, delta); rho spent is converted against it.
    """
    if not isinstance(budget, Cost):
        raise TypeError(f"budget must be a dpsql.accounting.Cost, got {type(budget).__name__}")
    if _exact(budget.rho, "budget rho"):
        raise ValueError("a budget is (epsilon, delta); give rho budgets as their epsilon")
    eps = _floor_units(_exact(budget.epsilon, "budget epsilon"), EPSILON_QUANTUM)
    delta = _floor_units(_exact(budget.delta, "budget delta"), DELTA_QUANTUM)
    return _as_cost(Units(min(eps, _MAX_UNITS), min(delta, _MAX_UNITS)))


def _as_cost(units: Units) -> Cost:
    return Cost(*(Fraction(n, quantum) for n, quantum in zip(units, _QUANTA, strict=True)))


def _left(spent: Units, budget: Cost) -> Cost:
    """What `remaining` reports (see there), for what an account spent, in stored units,
    under a budget rounded down to the quantum: never more than a charge could use."""
    if not spent.rho:  # whole quanta on both sides: integers, exact and without Fractions
        epsilon, delta, _ = spent
        return _as_cost(
            Units(
                max(0, _floor_units(budget.epsilon, EPSILON_QUANTUM) - epsilon),
                max(0, _floor_units(budget.delta, DELTA_QUANTUM) - delta),
            )
        )
    exact = _as_cost(spent)
    delta_left = budget.delta - exact.delta
    if delta_left <= 0:
        return Cost()
    epsilon_used = exact.epsilon + zcdp_epsilon(exact.rho, delta_left)
    epsilon_left = _floor_units(max(Fraction(0), budget.epsilon - epsilon_used), EPSILON_QUANTUM)
    return Cost(Fraction(epsilon_left, EPSILON_QUANTUM), delta_left)


def _admit(
    analyst: str,
    cost: Cost,
    units: Units,
    budget: Cost,
    refusal: type[BudgetExhausted] = BudgetExhausted,
) -> Callable[[Units], None]:
    """The check run inside the charge's transaction, on what the account spent before it."""

    # The budget is a whole number of quanta, so without rho the check is exact in
    # integers (rationals cost tens of microseconds on every charge).
    limit = Units(
        _floor_units(budget.epsilon, EPSILON_QUANTUM), _floor_units(budget.delta, DELTA_QUANTUM)
    )

    def admit(spent: Units) -> None:
        total = spent.plus(units)
        if total.rho:
            fits = _as_cost(total).fits_within(budget)
        else:
            fits = total.epsilon <= limit.epsilon and total.delta <= limit.delta
        if max(total) > _MAX_UNITS or not fits:
            raise refusal(analyst, cost, _left(spent, budget))

    return admit


def _check_text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    return value


def _release_selection(
    analyst: str | None, prefix: str, excluding: Sequence[str]
) -> tuple[str | None, str, tuple[str, ...]]:
    if analyst is not None:
        _check_text(analyst, "analyst")
    return (
        analyst,
        _check_text(prefix, "prefix"),
        tuple(_check_text(e, "excluding") for e in excluding),
    )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class Ledger:
    """The persistent, append-only privacy-budget log at one location.

    `location` is an SQLite file path, ``":memory:"``, ``sqlite:///path``, or
    ``postgresql://user@host/db`` (with ``?schema=name``, default ``dpsql``).
    One object serves every thread of a process; several objects, processes
    and proxies may share one location.
    """

    def __init__(self, location: str | os.PathLike[str], *, timeout: float = DEFAULT_TIMEOUT):
        self._store = _open_store(os.fspath(location), timeout)
        self._claims = self._store.claims()

    @property
    def location(self) -> str:
        """Where the ledger lives (a PostgreSQL password is masked)."""
        return self._store.location

    # -- budget -----------------------------------------------------------------

    def spent(self, analyst: str) -> Cost:
        """Everything `analyst` has been charged, as logged (rounded up)."""
        return _as_cost(self._store.spent(_check_text(analyst, "analyst")))

    def remaining(self, analyst: str, budget: Cost) -> Cost:
        """What `analyst` can still be charged under `budget` (never overstated).

        Without rho spent: the budget rounded down to the quantum minus the
        logged spend, per component. With rho spent: the epsilon a charge that
        spends no more rho and no more delta could still use (the budget's
        epsilon minus the spent epsilon and the spent rho converted with the
        unspent delta), and the unspent delta, which that conversion is
        using: spending any of it raises the converted epsilon. Zero, not
        negative, if a budget was lowered below what was spent.
        """
        return _left(self._store.spent(_check_text(analyst, "analyst")), _budget_cost(budget))

    def charge(
        self,
        analyst: str,
        cost: Cost,
        budget: Cost,
        fingerprint: str,
        *,
        dataset_budget: Cost | None = None,
        sync: bool = True,
    ) -> Cost:
        """Append a charge if it fits in `budget`; return what remains of it after.

        With a `dataset_budget`, the same cost is also charged, in the same
        transaction, to the account `DATASET_ACCOUNT` that every analyst draws
        on (its log rows carry the fingerprint ``<analyst>:<fingerprint>``),
        and the charge must fit both. Raises BudgetExhausted, or
        DatasetBudgetExhausted when the shared budget is what does not fit,
        and writes nothing. The charge is committed and durable before this
        returns; with `sync=False` only committed, and `durable()` must be
        called before anything it paid for is released.
        """
        _check_text(analyst, "analyst")
        _check_text(fingerprint, "fingerprint")
        if analyst == DATASET_ACCOUNT:
            raise ValueError(f"{DATASET_ACCOUNT} is the shared dataset account, not an analyst")
        units = _cost_units(cost)
        rounded = _budget_cost(budget)
        accounts = [(analyst, fingerprint, _admit(analyst, cost, units, rounded))]
        if dataset_budget is not None:
            shared = _admit(
                analyst, cost, units, _budget_cost(dataset_budget), DatasetBudgetExhausted
            )
            accounts.append((DATASET_ACCOUNT, f"{analyst}:{fingerprint}", shared))
        totals = self._store.append(accounts, _now(), units, sync=sync)
        return _left(totals[0], rounded)

    def exclusive(self, key: str) -> AbstractContextManager[None]:
        """Hold `key` (a statement and whose it is, say) until the block ends, waiting while
        anyone else sharing this ledger holds it: any thread, process or proxy.

        For answering identical statements one at a time, so that the second finds
        the first's release in the cache instead of being charged again. Distinct
        keys rarely wait for each other (one chance in 65,536 per pair).
        """
        return self._claims.hold(key)

    def durable(self) -> None:
        """Wait until every charge made with `sync=False` is on disk."""
        self._store.wait_durable()

    def charges(self, analyst: str | None = None) -> list[Charge]:
        """The log, oldest first; only `analyst`'s charges if given."""
        if analyst is not None:
            _check_text(analyst, "analyst")
        return [
            Charge(
                row[0], row[1], datetime.fromisoformat(row[2]), row[3], _as_cost(Units(*row[4:]))
            )
            for row in self._store.charges(analyst)
        ]

    # -- cached releases --------------------------------------------------------

    def cached_release(self, analyst: str, fingerprint: str) -> str | None:
        """The stored release payload for this query, or None."""
        return self._store.cached_release(
            _check_text(analyst, "analyst"), _check_text(fingerprint, "fingerprint")
        )

    def store_release(
        self, analyst: str, fingerprint: str, payload: str, *, durable: bool = True
    ) -> str:
        """Store `payload` unless a release is already stored; return the stored one.

        The first writer wins, so concurrent identical queries and every later
        repeat all see one identical noisy answer. `durable=False` (for a
        cached answer, never for state a later release depends on, such as
        noise already drawn for a stream) does not wait for the disk: a crash
        of the machine may lose it, which only makes the next identical query
        be charged and answered afresh.
        """
        return self._store.store_release(
            _check_text(analyst, "analyst"),
            _check_text(fingerprint, "fingerprint"),
            _check_text(payload, "payload"),
            _now(),
            durable,
        )

    def stored_releases(self, analyst: str, prefix: str, *, after: str = "") -> dict[str, str]:
        """Every stored payload of `analyst` whose fingerprint starts with `prefix`
        (and, if given, sorts after `after`: what was stored since that one).

        Plans that keep state (a range synopsis, a running stream) store it under
        fingerprints of their own, e.g. ``synopsis:<table>.<column>:...``.
        """
        return self._store.stored_releases(
            _check_text(analyst, "analyst"), _check_text(prefix, "prefix"), after
        )

    def forget_release(self, analyst: str, fingerprint: str) -> bool:
        """Drop one stored payload (`dpsql synopsis drop`); charges stay. True if it existed."""
        return self._store.forget_release(
            _check_text(analyst, "analyst"), _check_text(fingerprint, "fingerprint")
        )

    def release_counts(
        self, analyst: str | None = None, *, prefix: str = "", excluding: Sequence[str] = ()
    ) -> list[tuple[str, int, str]]:
        """Per analyst (only `analyst`, if given), how many stored payloads have a
        fingerprint that starts with `prefix` and with none of `excluding`, and when the
        newest was stored: (analyst, count, ISO time), by analyst."""
        return self._store.release_counts(*_release_selection(analyst, prefix, excluding))

    def clear_cache(
        self, analyst: str | None = None, *, prefix: str = "", excluding: Sequence[str] = ()
    ) -> int:
        """Drop stored releases (the data changed); return how many. Charges stay.

        Without arguments every analyst's cached answers and stored state go; `analyst`,
        `prefix` and `excluding` narrow that as in `release_counts`.
        """
        return self._store.clear_cache(*_release_selection(analyst, prefix, excluding))

    # -- lifecycle --------------------------------------------------------------

    def close(self) -> None:
        self._claims.close()
        self._store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({self.location!r})"


def _open_store(location: str, timeout: float) -> Store:
    if not location.strip():
        # SQLite would open a temporary database, deleted on close: a budget that
        # silently resets whenever the process restarts.
        raise NotSupportedError(
            "the ledger location is empty, which SQLite takes as a temporary database that "
            "is deleted on close, so the budget would reset with every restart; give a file "
            "path (budget.sqlite), sqlite:///path or postgresql://user@host/db (':memory:' "
            "for a budget that is meant to last only as long as the process)"
        )
    scheme = location.split("://", 1)[0].lower() if "://" in location else ""
    if scheme in ("postgresql", "postgres"):
        # Imported here: psycopg costs ~0.1 s to import, and SQLite users never need it.
        from dpsql.ledger.postgres import PostgresStore

        return PostgresStore(location, _META, timeout)
    if scheme == "sqlite":
        location = location[len("sqlite:///") :] if location.startswith("sqlite:///") else ""
        if not location:
            raise NotSupportedError("an SQLite ledger URL is sqlite:///path/to/ledger.sqlite")
    elif scheme:
        raise NotSupportedError(
            f"ledger location {scheme}://... is not supported; use an SQLite file path, "
            "sqlite:///path or postgresql://user@host/db"
        )
    from dpsql.ledger.sqlite import SQLiteStore

    return SQLiteStore(location, _META, timeout)


def open_ledger(location: str | os.PathLike[str]) -> Ledger:
    """The ledger at `location`: a file path, ``sqlite:///path``, ``":memory:"`` or
    ``postgresql://user@host/db[?schema=name]``."""
    return Ledger(location)
