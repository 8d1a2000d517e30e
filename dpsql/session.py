"""The Session: one analyst's pipeline of compile, charge, execute, release.

Every front end (DB-API, shell, wire server, the `dpsql` command) talks only to
a Session, and gets one from `open_session` (database, policy, analyst,
options): it opens the database through its adapter, checks the policy against
it and opens the ledger, so no front end needs adapters/ or ledger/. The
Session owns the per-session options (epsilon, delta, mechanism, …; CHOICES
names what each takes), answers `SET dpsql.*`, `SHOW dpsql.*` and `EXPLAIN`,
and keeps the release cache: the same query under the same policy and options
returns the stored release without a new charge, also after a restart.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import numpy as np

from dpsql.accounting import Cost, round_down, round_up
from dpsql.adapters import is_url, open_adapter
from dpsql.adapters.base import Adapter, fetch_all
from dpsql.errors import InterfaceError, OperationalError, ProgrammingError, QueryRefused
from dpsql.ldp.postprocess import METHODS as LDP_METHODS
from dpsql.ledger import Charge, Ledger, open_ledger
from dpsql.mechanisms.samplers import secure_generator
from dpsql.policy import (
    CONTINUAL_MECHANISMS,
    MAX_EPSILON,
    MECHANISMS,
    Policy,
    Proven,
    load_policy,
)
from dpsql.results import MAX_GROUPS, Accuracy, Release
from dpsql.sql import GroupingSetsPlan, PlanContext, StagedPlan, plan_query
from dpsql.sql.check import refuse_statement
from dpsql.sql.describe import column_types, described_columns
from dpsql.sql.parse import Statement, parse_statement, repeat_key, setting_name, tokenize
from dpsql.sql.plan import ConstantPlan, Options, Plan, check_known_groups, release_stream
from dpsql.sql.plan_cache import Inputs, PlanCache
from dpsql.sql.proofs import proven_ranges
from dpsql.sql.public import PublicPlan
from dpsql.sql.row_level import row_level
from dpsql.sql.running import STATE_PREFIX as STREAM_PREFIX
from dpsql.sql.running import RunningPlan
from dpsql.sql.synopsis import PREFIX as SYNOPSIS_PREFIX
from dpsql.sql.synopsis import BuildSynopsisPlan, StoredSynopsisPlan, SynopsisStatus
from dpsql.sql.synopsis import count_query as synopsis_count_query
from dpsql.sql.synopsis import declared as declared_synopses

_SETTABLE = (
    "dpsql.epsilon", "dpsql.delta", "dpsql.mechanism", "dpsql.ldp_postprocess", "dpsql.continual",
    "dpsql.max_rows_per_unit", "dpsql.max_groups_per_unit", "dpsql.bounding_note",
    "dpsql.quantile_interval",
)  # fmt: skip
#: The largest contribution bound SET may choose: far past any useful bound (the noise
#: grows with it), and small enough that every backend compares a rank with it exactly.
MAX_BOUND = 1_000_000
#: The names each option that takes a name may be set to (SET dpsql.<option>, connect(),
#: the shell's \set): the policy's mechanisms, the local-DP post-processing methods, and
#: the running-total mechanisms or 'policy' (each column's own choice).
CHOICES: dict[str, tuple[str, ...]] = {
    "mechanism": MECHANISMS,
    "ldp_postprocess": LDP_METHODS,
    "continual": (*CONTINUAL_MECHANISMS, "policy"),
}

#: The longest time between a watch's ticks, in seconds (`dpsql watch --every` too): a
#: year is past any step of a stream, and far below what time.sleep can wait.
MAX_WATCH_INTERVAL = 365 * 86400.0

#: What the ledger stores beside the charges, by kind: noisy answers kept for
#: repeats, range synopses, and the noise already released by running streams.
#: The last two are found by their fingerprints' prefix; answers are the rest.
STORED_KINDS = ("answers", "synopses", "streams")
_KIND_PREFIXES = {"synopses": SYNOPSIS_PREFIX, "streams": STREAM_PREFIX}
# How old (seconds) the sessions' reading of which units the database keeps unique (and the
# other database facts) may be.
UNITS_READ_AGAIN = 1.0
# The unique units, the unique references and the proven value ranges (Session.database_facts).
DatabaseFacts = tuple[frozenset[str], frozenset[str], dict[str, tuple[Proven, ...]]]


class _SharedFacts:
    """One reading of the database facts, shared by the sessions on one database and
    policy, and when it was read (time.monotonic)."""

    def __init__(self) -> None:
        self.read_at = -math.inf
        self.lock = threading.Lock()
        self.current: DatabaseFacts = (frozenset(), frozenset(), {})


# How often a statement is planned again on the state a concurrent session stored first.
_RACES = 5


class _StateTaken(Exception):
    """A concurrent release stored other state (a synopsis, a stream's steps) first."""


@dataclass(frozen=True)
class Stored:
    """How many releases of one kind the ledger keeps for one analyst, and the newest's time."""

    analyst: str
    kind: str
    count: int
    newest: str


@dataclass(frozen=True)
class Budget:
    """An analyst's budget: total, spent and remaining (epsilon, delta)."""

    analyst: str
    epsilon_total: float
    epsilon_spent: float
    epsilon_remaining: float
    delta_total: float
    delta_spent: float
    delta_remaining: float
    rho_spent: float = 0.0  # zCDP charges (Gaussian noise), included above once converted


def sets_options(sql: str) -> bool:
    """Whether `sql` sets, shows or resets the Session's options (SET, SHOW or RESET of a
    dpsql.* option, RESET ALL, DISCARD ALL), however it is written (with comments,
    quotes or spaces around the dot): a front end that answers other settings itself
    must pass these on. Taken for an ordinary setting and ignored, `SET /* x */
    dpsql.epsilon = 0.001` left the client charged 1 per query."""
    keyword, name, _ = setting_name(sql)
    return name.startswith("dpsql.") or (keyword in ("RESET", "DISCARD") and name == "all")


#: What `open_session` takes as a policy (a YAML file, its mapping, or one loaded) and
#: as a ledger (a location, or one open): front ends name these, not policy or ledger.
PolicySource = str | os.PathLike | Mapping | Policy
LedgerSource = str | os.PathLike | Ledger


def open_session(
    database: Any,
    policy: PolicySource,
    analyst: str = "default",
    *,
    ledger: LedgerSource | None = None,
    epsilon: float | None = None,
    mechanism: str | None = None,
    continual: str | None = None,
    settings: Mapping[str, Any] | None = None,
    seed: int | None = None,
    max_groups: int = MAX_GROUPS,
) -> Session:
    """A Session for `analyst` on `database` under `policy`: the one way a front end opens
    one (dpsql.connect, `dpsql serve`, `dpsql shell`, the other `dpsql` commands).

    `database` is what `dpsql.adapters.open_adapter` takes (a DuckDB file path,
    ":memory:", a DuckDB connection, a URL, a SparkSession); `policy` a file, a
    mapping or a loaded Policy, checked against the database's tables here;
    `ledger` a location or an open Ledger, by default `ledger_location`'s. The
    rest are the Session's starting options. Closing the Session closes the
    database connection and the ledger.
    """
    loaded = policy if isinstance(policy, Policy) else load_policy(policy)
    given = isinstance(ledger, Ledger)
    location = None if given else ledger_location(ledger, loaded, database)
    adapter = open_adapter(database, loaded.sources)
    book = None
    try:
        columns = {key: adapter.table_columns(key) for key in loaded.tables}
        loaded = loaded.with_public_columns(columns, adapter.dialect)
        loaded.check_schema(columns, adapter.dialect)
        loaded = loaded.as_stored(columns, adapter.dialect)
        resolve = getattr(adapter, "table_identities", None)
        if resolve is not None:
            loaded.check_one_entry_per_table({key: resolve(key) for key in loaded.tables})
        spell = getattr(adapter, "table_spellings", None)
        if spell is not None:
            loaded = loaded.with_spellings({key: spell(key) for key in loaded.tables})
        book = ledger if given else open_ledger(location)
        return Session(
            adapter, loaded, book, analyst, epsilon=epsilon, mechanism=mechanism, seed=seed,
            continual=continual, settings=settings, max_groups=max_groups,
        )  # fmt: skip
    except Exception:
        adapter.close()
        if book is not None and not given:
            book.close()
        raise


def ledger_location(ledger: str | os.PathLike | None, policy: Policy, database: Any) -> str:
    """Where `open_session` keeps the ledger: `ledger` if given, else the policy's, else a
    file beside a DuckDB database (`dpsql serve` checks that several processes can share
    it, `ledger_in_memory`)."""
    if ledger is not None:
        return os.fspath(ledger)
    if policy.ledger and is_url(policy.ledger):
        return policy.ledger
    if policy.ledger:
        base = Path(policy.source).parent if Path(policy.source).exists() else Path.cwd()
        return str(base / policy.ledger)
    if is_url(database):
        raise InterfaceError(
            "a database named by URL needs a persistent budget ledger, or the budget would "
            "reset with every connection: pass ledger='budget.sqlite' to connect() or write "
            "'ledger: budget.sqlite' in the policy"
        )
    if isinstance(database, str | os.PathLike) and os.fspath(database) != ":memory:":
        return _beside(os.fspath(database))
    return ":memory:"


def _beside(database: str) -> str:
    """The ledger beside a database file, named after the file itself: named as the path
    was written, a symbolic link (or another relative path) to the file had a ledger,
    and a budget, of its own. A ledger already kept under another name is refused, not
    left behind with what it holds."""
    written, resolved = f"{database}.ledger.sqlite", f"{os.path.realpath(database)}.ledger.sqlite"
    if os.path.exists(written) and not (
        os.path.exists(resolved) and os.path.samefile(written, resolved)
    ):
        raise InterfaceError(
            f"the budget ledger of {database!r} is {written!r}, but the database file is "
            f"{os.path.realpath(database)!r}, whose ledger is {resolved!r}: every name of a "
            f"database must share one ledger. Move {written!r} to {resolved!r} (or merge "
            "them), or pass ledger= to connect()"
        )
    return resolved


def ledger_in_memory(location: str) -> bool:
    """Whether an SQLite ledger location is private to the process that opens it: ':memory:',
    '' (SQLite's temporary database) or a `file:` URI with mode=memory."""
    if location.startswith("sqlite:///"):
        location = location[len("sqlite:///") :]
    elif "://" in location:
        return False  # postgresql://: one server, shared
    if location in ("", ":memory:"):
        return True
    if location.startswith("file:"):
        path, _, query = location[len("file:") :].partition("?")
        return path == ":memory:" or "memory" in parse_qs(query).get("mode", [])
    return False


class Session:
    """Runs statements for one analyst against one database under one policy."""

    def __init__(
        self,
        adapter: Adapter,
        policy: Policy,
        ledger: Ledger,
        analyst: str = "default",
        *,
        epsilon: float | None = None,
        mechanism: str | None = None,
        seed: int | None = None,
        continual: str | None = None,
        settings: Mapping[str, Any] | None = None,
        max_groups: int = MAX_GROUPS,
    ):
        """`epsilon`, `mechanism`, `continual` and `settings` (option name, with or
        without `dpsql.`, to value: what a wire client asked for at startup) are the
        connection's starting options, which RESET returns to."""
        self.adapter = adapter
        self.policy = policy
        self.ledger = ledger
        self.analyst = analyst
        self.total = policy.budget(analyst)
        defaults = policy.defaults
        self.options = Options(defaults.epsilon_per_query, defaults.delta, defaults.mechanism)
        chosen = {"epsilon": epsilon, "mechanism": mechanism, "continual": continual}
        for name, value in [*chosen.items(), *(settings or {}).items()]:
            if value is not None:
                self.set_option(name, value)
        self._defaults = self.options  # what RESET goes back to: the connection's start
        self._facts = _SharedFacts()  # shared with the sessions for_analyst opens
        self._rng = secure_generator(seed)
        self._rng_lock = threading.Lock()
        self._seeded = seed is not None
        # Released groups per query: the result is read in batches and only kept
        # groups are held, so this bounds a query's memory (TooManyGroups above).
        self.max_groups = max_groups
        # Plans by statement and all their other inputs (sql/plan_cache.py), shared with
        # the sessions this one opens for other analysts: they plan under this policy.
        self.plans = PlanCache()
        # the plan key's and the fingerprint's parts besides the statement, built again
        # only when what they are built from is replaced (_plan_key, _fingerprint)
        self._plan_inputs: tuple[tuple, Inputs] | None = None
        self._fingerprint_tail: tuple[tuple, str] | None = None

    def for_analyst(
        self,
        analyst: str,
        *,
        settings: Mapping[str, Any] | None = None,
        max_groups: int | None = None,
    ) -> Session:
        """Another analyst's Session on this one's database, policy and ledger (the wire
        server opens one per client connection), with noise of its own. Close this one,
        not those: they share what it opened."""
        session = Session(
            self.adapter, self.policy, self.ledger, analyst, settings=settings,
            max_groups=self.max_groups if max_groups is None else max_groups,
        )  # fmt: skip
        session.plans, session._facts = self.plans, self._facts
        return session

    @property
    def seeded(self) -> bool:
        """Whether the noise comes from a fixed seed (tests only), not from the OS."""
        return self._seeded

    def close(self) -> None:
        """Close the database connection and the ledger this Session was opened with."""
        self.adapter.close()
        self.ledger.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the pipeline -------------------------------------------------------

    def execute(self, sql: str, parameters: Any = None) -> Release:
        """Run one statement and return its (noisy) release."""
        tokens = tokenize(sql, self.adapter.dialect)
        key = fingerprint = None
        if not parameters:
            # A repeat is found by its tokens, before (and instead of) parsing: a
            # query without parameters has the key repeat_key reads off them.
            key = repeat_key(tokens)
            fingerprint = self._fingerprint(key)
            cached = self.ledger.cached_release(self.analyst, fingerprint)
            if cached is not None:
                return _decode(cached)
            # A statement planned before is charged and released without parsing it:
            # only a text that parsed as one query was planned under its tokens' key,
            # and the same tokens parse to the same query.
            plan = self.planned_before(key)
            if plan is not None:
                return self._released(plan, fingerprint)
        statement = parse_statement(sql, self.adapter.dialect, parameters, tokens=tokens, key=key)
        if statement.kind == "set":
            return self._set(statement)
        if statement.kind == "show":
            return self._show(statement.name)
        if statement.kind == "reset":
            return self._reset(statement.name)
        if statement.kind == "other":
            raise refuse_statement(statement.tree)
        if statement.kind == "explain":
            plan = self.plan(statement.tree)
            return Release(["item", "detail"], plan.explain())
        return self._answer(statement, fingerprint=fingerprint)

    def describe(self, sql: str, parameters: Any = None) -> Release:
        """The columns `sql` would release, without running it: nothing is charged or
        stored and no private table is read. A query the execution would refuse is
        refused here with the same error.

        The release has no rows; `types` names each column's type as
        `dpsql.sql.describe.column_types` infers it ("" where only the values would
        tell). A statement that reads no private table (no table, public tables,
        SHOW) is answered exactly and free, so it is run and its rows returned
        instead of types; so is a repeat, from the release cache. SET and RESET
        describe as no columns and change nothing.
        """
        tokens = tokenize(sql, self.adapter.dialect)
        if not parameters:
            cached = self.ledger.cached_release(self.analyst, self._fingerprint(repeat_key(tokens)))
            if cached is not None:
                return _decode(cached)
        statement = parse_statement(sql, self.adapter.dialect, parameters, tokens=tokens)
        if statement.kind in ("set", "reset"):
            return Release([], [])
        if statement.kind == "show":
            return self._show(statement.name)
        if statement.kind == "other":
            raise refuse_statement(statement.tree)
        if statement.kind == "explain":
            self.plan(statement.tree)  # refused as EXPLAIN would refuse it
            return Release(["item", "detail"], [], types=["string", "string"])
        plan = self.plan(statement.tree, statement.key)
        if isinstance(plan, ConstantPlan | PublicPlan):
            return self._release(plan)
        check_known_groups(plan, self.max_groups)
        names = described_columns(statement.tree, plan)
        types = column_types(statement.tree, self.policy) or []
        if len(types) != len(names):  # a shape the select list does not show one to one
            types = [""] * len(names)
        return Release(names, [], types=types)

    def column_types(self, select: Any) -> list[str] | None:
        """The type of each column a parsed SELECT releases, read off its select list
        before it runs (dpsql.sql.describe.column_types); None if it is not a SELECT."""
        return column_types(select, self.policy)

    @property
    def unique_units(self) -> frozenset[str]:
        """Tables (policy keys) whose privacy unit the database keeps unique (database_facts):
        read again once a second old, since a key the owner drops (and the duplicates then
        added) must stop counting as one row per unit."""
        return self.database_facts()[0]

    @property
    def unique_references(self) -> frozenset[str]:
        """Referenced columns ("table.column") the database keeps unique (database_facts):
        a reference leads to one person only through a kept key."""
        return self.database_facts()[1]

    @property
    def proven(self) -> dict[str, tuple[Proven, ...]]:
        """Per table (policy key), the value ranges the database proves (database_facts):
        its CHECK constraints, trusted statistics (sql/proofs.py)."""
        return self.database_facts()[2]

    def database_facts(self) -> DatabaseFacts:
        """The unique units, the unique references and the proven value ranges, read
        together and again when older than UNITS_READ_AGAIN seconds (a dropped key brings
        its bounding back, a dropped constraint its clamps). They are facts of the
        database under the policy, so this Session and the sessions it opens for other
        analysts share one reading: whichever asks first once they are old reads them (some
        ten catalog queries), the others wait for it."""
        shared = self._facts
        if time.monotonic() - shared.read_at > UNITS_READ_AGAIN:
            with shared.lock:
                now = time.monotonic()
                if now - shared.read_at > UNITS_READ_AGAIN:  # not read meanwhile by another
                    shared.current = self._read_facts()
                    shared.read_at = now
        return shared.current

    def _read_facts(self) -> DatabaseFacts:
        units = frozenset(
            key for key, table in self.policy.tables.items()
            if table.privacy_unit
            and table.privacy_unit in self.adapter.unique_columns(key)
        )  # fmt: skip
        references = frozenset(
            f"{via.table}.{via.target}"
            for via in {table.via for table in self.policy.tables.values() if table.via}
            if via.target in self.adapter.unique_columns(via.table)
        ) | frozenset(  # public tables' keys, joined to row-level tables (sql/row_level.py)
            f"{key}.{column.lower()}"
            for key, table in self.policy.tables.items()
            if table.public and any(row_level(t) for t in self.policy.tables.values())
            for column in self.adapter.unique_columns(key)
        )
        return units, references, self._read_proofs()

    def _read_proofs(self) -> dict[str, tuple[Proven, ...]]:
        """The value ranges the database proves of each private table's columns (its
        CHECK constraints, trusted statistics: sql/proofs.py)."""
        proofs = {}
        for key, table in self.policy.tables.items():
            if table.public or table.source is not None or table.relation is not None:
                continue
            facts = self.adapter.value_facts(key, statistics=table.trust_statistics)
            found = proven_ranges(facts.checks, facts.statistics, table, self.adapter.dialect)
            if found:
                proofs[key] = found
        return proofs

    def plan(self, tree: Any, key: str = "") -> Plan:
        """The plan of a parsed SELECT; `key` (its Statement.key) lets it come from the
        plan cache, with a secret of its own."""
        # read once, for both the cache key and the planning
        units, references, proven = self.database_facts()
        cache_key = self._plan_key(key, units, references, proven) if key else None
        if cache_key is not None:
            cached = self.plans.get(cache_key, self._secret)
            if cached is not None:
                return cached
        secret = self._secret()
        public_reads: list[str] = []

        def read_public(sql: str) -> list[tuple]:
            # public tables' key domains (sql/join_domains.py): read afresh per plan, so
            # a plan that read them is not cached (the public table may change)
            public_reads.append(sql)
            return fetch_all(self.adapter, sql)[1]

        context = PlanContext(
            self.policy,
            self.options,
            self.adapter.dialect,
            secret,
            units,
            _AnalystState(self.ledger, self.analyst),
            self.total,
            self.adapter.identity,
            references,
            read_public,
            proven,
        )
        plan = plan_query(tree, context)
        if cache_key is not None and not public_reads:
            self.plans.put(cache_key, plan, secret)
        return plan

    def planned_before(self, key: str) -> Plan | None:
        """The plan kept for the statement of `key` (its Statement.key) under this session's
        inputs as now read, with a secret of its own; None if the plan cache has none."""
        units, references, proven = self.database_facts()
        return self.plans.get(self._plan_key(key, units, references, proven), self._secret)

    def _secret(self) -> int:
        """A fresh secret for the hash that bounds each unit's rows: one per plan."""
        with self._rng_lock:
            return int(self._rng.integers(0, 2**62))

    def _plan_key(
        self,
        key: str,
        units: frozenset[str],
        references: frozenset[str],
        proven: dict[str, tuple[Proven, ...]],
    ) -> tuple[str, Inputs]:
        """Everything planning reads besides the secret and stored state (which the plans
        the cache keeps do not read): the statement with its constants, the policy, the
        options, the backend, the analyst's budget, and the unique keys and proven value
        ranges as just read (a clamp left out on a proof returns when the proof goes)."""
        read = (self.options, self.policy, self.adapter, self.total, units, references, proven)
        kept = self._plan_inputs
        if not _built_from(kept, read):
            inputs = Inputs(
                (
                    self.policy.digest,
                    self.policy.data_version,
                    tuple(vars(self.options).values()),
                    self.adapter.dialect,
                    self.adapter.identity,
                    self.total,
                    units,
                    references,
                    tuple(sorted(proven.items())),
                )
            )
            kept = self._plan_inputs = (read, inputs)
        return key, kept[1]

    def _answer(
        self, statement: Statement, *, stream: bool = False, fingerprint: str | None = None
    ) -> Release:
        # A repeat is answered from the release cache before any planning: the
        # fingerprint needs only the statement's key, the policy and the options.
        # A `stream` (a watch's tick) is never in the cache, and a statement whose
        # `fingerprint` was looked up by its tokens already was not: no lookup.
        looked_up = fingerprint is not None
        if fingerprint is None:
            fingerprint = self._fingerprint(statement.key)
        cached = (
            None if stream or looked_up else self.ledger.cached_release(self.analyst, fingerprint)
        )
        if cached is not None:
            return _decode(cached)
        for _ in range(_RACES):
            try:
                return self._run(statement, fingerprint)
            except _StateTaken:
                # Planned again on the state stored first: its release is the one this
                # session shares. Withheld instead, whether another stream tick had the
                # same exact values told about the rows (each unit's rows are chosen
                # by a fresh secret), without noise.
                continue
        raise OperationalError(
            "concurrent queries kept storing synopsis or stream state first; run it again"
        )

    def _run(self, statement: Statement, fingerprint: str) -> Release:
        """Plan, charge and release one statement (_StateTaken: plan it again)."""
        return self._released(self.plan(statement.tree, statement.key), fingerprint)

    def _released(self, plan: Plan, fingerprint: str) -> Release:
        """Charge and release `plan`, and store its release under `fingerprint`."""
        if not plan.cost.epsilon and not plan.cost.delta and not plan.cost.rho:
            # Free: a statement without a table, or one answered from stored state.
            return self._keep_state(self._release(plan))
        check_known_groups(plan, self.max_groups)
        # The charge is committed before the database runs: a crash after it
        # loses budget, never privacy. Its way to the disk overlaps the query,
        # and the release waits for it.
        self._charge(plan.cost, fingerprint, sync=False)
        release = self._keep_state(self._release(plan))
        self.ledger.durable()
        if not getattr(plan, "cacheable", True):  # a stream: later runs release more steps
            return release
        stored = self.ledger.store_release(
            self.analyst, fingerprint, _encode(release), durable=False
        )
        return _decode(stored)

    def _release(self, plan: Plan) -> Release:
        """Run the plan's SQL and release its result as it streams in (a staged plan:
        each scalar subquery's, then the outer query's over their values, in one snapshot
        of the database where the adapter gives one; a grouping-sets plan: each set's,
        concatenated)."""
        if isinstance(plan, StagedPlan):
            with self.adapter.snapshot() as shared:
                return plan.release_with(self._release, shared)
        if isinstance(plan, GroupingSetsPlan):
            return plan.combine([self._release(part) for part in plan.parts], self.max_groups)
        if not plan.sql:
            with self._rng_lock:
                return release_stream(plan, [], [], self._rng, self.max_groups)
        with self.adapter.stream(plan.sql) as (columns, batches), self._rng_lock:
            return release_stream(plan, columns, batches, self._rng, self.max_groups)

    def _charge(self, cost: Cost, fingerprint: str, *, sync: bool = True) -> None:
        """Charge the analyst's budget and, if the policy sets one, the dataset's, atomically
        (`sync=False`: see Ledger.charge)."""
        self.ledger.charge(
            self.analyst,
            cost,
            self.total,
            fingerprint,
            dataset_budget=self.policy.dataset_budget,
            sync=sync,
        )

    def _keep_state(self, release: Release) -> Release:
        """Persist the state a release built (a synopsis, a stream's steps); first writer
        wins, and a release built on the losing state is withheld (_StateTaken): a
        stream's step is released once only, else two releases with one noise leak."""
        for key, payload in release.state.items():
            if self.ledger.store_release(self.analyst, key, payload) != payload:
                raise _StateTaken(key)
        return release

    def _fingerprint(self, key: str) -> str:
        # The key is read off the tokens (parse.py says what it folds): generating
        # normalised SQL from the tree just to hash it cost more than the hash.
        read = (self.options, self.policy, self.adapter)
        kept = self._fingerprint_tail
        if not _built_from(kept, read):
            rest = [
                self.adapter.identity,  # a ledger two databases share: one release each
                self.policy.digest,
                self.policy.data_version,
                vars(self.options),  # flat: asdict's deep copy costs more than the hash
            ]
            kept = self._fingerprint_tail = (read, json.dumps(rest)[1:])
        # the text of json.dumps([key, *rest]), rest encoded once per options, policy, backend
        text = "[" + json.dumps(key) + ", " + kept[1]
        return hashlib.sha256(text.encode()).hexdigest()

    # -- options and budget -------------------------------------------------

    def set_option(self, name: str, value: Any) -> None:
        """Set a per-session option: epsilon, delta, mechanism, ldp_postprocess, continual,
        max_rows_per_unit or max_groups_per_unit ('policy': each table's own bounds), or
        bounding_note or quantile_interval ('on', 'off')."""
        name = name.lower().removeprefix("dpsql.")
        if name in ("epsilon", "delta"):
            number = _number(value, name)
            # An epsilon above MAX_EPSILON protects nothing and would not fit the ledger.
            upper = MAX_EPSILON if name == "epsilon" else 1.0
            if not 0 < number < upper and not (name == "delta" and number == 0):
                raise ProgrammingError(
                    f"dpsql.{name} must be a positive finite number below "
                    + ("1" if name == "delta" else f"{MAX_EPSILON:g}")
                    + f", got {value!r}"
                )
            self.options = replace(self.options, **{name: number})
        elif name == "mechanism":
            if value not in CHOICES[name]:
                raise ProgrammingError(
                    f"unknown mechanism {value!r}; choose one of: {', '.join(CHOICES[name])}"
                )
            self.options = replace(self.options, mechanism=value)
        elif name == "ldp_postprocess":
            if value not in CHOICES[name]:
                raise ProgrammingError(
                    f"unknown local-DP post-processing {value!r}; choose one of: "
                    f"{', '.join(CHOICES[name])}"
                )
            self.options = replace(self.options, ldp_postprocess=value)
        elif name == "continual":
            choices = CHOICES[name]
            if value not in choices:
                raise ProgrammingError(
                    f"unknown continual mechanism {value!r}; choose one of: {', '.join(choices)} "
                    "(the policy's choice per column)"
                )
            self.options = replace(self.options, continual=value)
        elif name in ("max_rows_per_unit", "max_groups_per_unit"):
            self.options = replace(self.options, **{name: _bound(value, name)})
        elif name in ("bounding_note", "quantile_interval"):
            self.options = replace(self.options, **{name: _switch(value, name)})
        else:
            raise ProgrammingError(f"unknown option dpsql.{name}; settable: {', '.join(_SETTABLE)}")

    def budget(self) -> Budget:
        """Spent and remaining (epsilon, delta); zCDP charges (rho) are converted.

        Once Gaussian noise has been charged, the rho spent is converted with all
        the delta the pure charges left (that is how the ledger checks a charge),
        so the whole delta counts as spent and the epsilon spent includes rho's share.
        """
        spent = self.ledger.spent(self.analyst)
        if spent.rho and self.total.delta <= spent.delta:  # a budget lowered below the spend
            epsilon_spent, epsilon_left = math.inf, 0.0
            delta_spent = self.total.delta
        else:
            exact_spent, delta_spent = spent.approximate(self.total.delta)
            epsilon_spent = round_up(exact_spent)
            epsilon_left = max(0.0, round_down(self.total.epsilon - exact_spent))
        return Budget(
            self.analyst,
            round_down(self.total.epsilon), epsilon_spent, epsilon_left,
            round_down(self.total.delta), round_up(delta_spent),
            max(0.0, round_down(self.total.delta - delta_spent)),
            round_up(spent.rho),
        )  # fmt: skip

    def charges(self) -> list[Charge]:
        """This analyst's charges in the ledger, oldest first (`dpsql synopsis build` counts
        them to say whether it charged)."""
        return self.ledger.charges(self.analyst)

    def _set(self, statement: Statement) -> Release:
        if not statement.name.startswith("dpsql."):
            raise refuse_statement(statement.tree)
        self.set_option(statement.name, statement.value)
        return Release([], [], notes=[f"SET {statement.name}"])

    def _reset(self, name: str) -> Release:
        """RESET dpsql.<option> (or ALL, or DISCARD ALL): back to the connection's start."""
        option = name.removeprefix("dpsql.")
        if name != "all" and name not in _SETTABLE:
            raise QueryRefused(
                f"RESET {name}",
                "only dpsql settings can be reset",
                f"write RESET ALL or RESET one of {', '.join(_SETTABLE)}",
            )
        defaults = self._defaults
        self.options = (
            defaults
            if name == "all"
            else replace(self.options, **{option: getattr(defaults, option)})
        )
        return Release([], [], notes=[f"RESET {name}"])

    def _show(self, name: str) -> Release:
        key = name.lower().replace('"', "")
        if key == "dpsql.budget":
            budget = self.budget()
            return Release(list(asdict(budget)), [tuple(asdict(budget).values())])
        option = key.removeprefix("dpsql.")
        if key in _SETTABLE:
            value = getattr(self.options, option)
            return Release([key], [("policy" if value is None else value,)])
        raise QueryRefused(
            f"SHOW {name}",
            "only dpsql settings can be shown",
            f"write SHOW dpsql.budget or SHOW one of {', '.join(_SETTABLE)}",
        )

    # -- streams --------------------------------------------------------------

    def watch(
        self,
        sql: str,
        every: float,
        ticks: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Iterator[Release]:
        """A standing running-total query: run it now and every `every` seconds.

        Each tick yields the rows of steps that became complete since the last
        tick (the first tick: every released step). The stream is charged once,
        on its first run ever; later ticks, and a watch restarted later, are free.

        `every` is a number of seconds, more than 0 and at most a year; `ticks` is
        None (tick until the caller stops) or a whole number of at least 0 (0: no
        tick, nothing run). The arguments and the query are checked here, at the
        call, before anything runs or is charged: a ProgrammingError says what to pass.
        """
        number = isinstance(every, int | float | np.integer | np.floating)
        if isinstance(every, bool) or not (number and 0 < every <= MAX_WATCH_INTERVAL):
            raise ProgrammingError(
                "watch takes every= an interval of more than 0 and at most "
                f"{MAX_WATCH_INTERVAL:,.0f} seconds (365 days), got {every!r}"
            )
        whole = isinstance(ticks, int | np.integer) and not isinstance(ticks, bool)
        if ticks is not None and not (whole and ticks >= 0):
            raise ProgrammingError(
                "watch takes ticks= a whole number of ticks, at least 0, or None to tick "
                f"until stopped; got {ticks!r}"
            )
        statement = parse_statement(sql, self.adapter.dialect)
        if statement.kind != "query" or not isinstance(self.plan(statement.tree), RunningPlan):
            raise ProgrammingError(
                "watch takes a running-total query, e.g. SELECT day, SUM(COUNT(*)) OVER "
                "(ORDER BY day) AS so_far FROM events GROUP BY day"
            )

        def each_tick() -> Iterator[Release]:
            shown, tick = 0, 0
            while ticks is None or tick < ticks:
                if tick:
                    sleep(every)
                release = self._answer(statement, stream=True)  # parsed once; planned from tree
                yield replace(release, rows=release.rows[shown:], state={})
                shown, tick = max(shown, len(release.rows)), tick + 1

        return each_tick()

    # -- synopses -------------------------------------------------------------

    def synopses(self) -> list[SynopsisStatus]:
        """Each synopsis the policy declares: its shape, cost, and when this analyst built it."""
        return [self._synopsis_plan(t, c).status() for t, c in declared_synopses(self.policy)]

    def build_synopsis(self, table: str, column: str) -> SynopsisStatus:
        """Build the synopsis now, charging its epsilon, unless this analyst has it already."""
        plan = self._synopsis_plan(table, column)
        if isinstance(plan, BuildSynopsisPlan):
            self._charge(plan.cost, plan.status().key)
            columns, rows = self.adapter.execute(plan.sql)
            with self._rng_lock:
                release = plan.release(columns, rows, self._rng)
            with contextlib.suppress(_StateTaken):  # built concurrently: the first is kept
                self._keep_state(release)
            plan = self._synopsis_plan(table, column)
        return plan.status()

    # -- what the ledger stores beside charges --------------------------------

    def stored(self, *, every_analyst: bool = False) -> list[Stored]:
        """What the ledger keeps for this analyst (or every analyst), by kind."""
        analyst = None if every_analyst else self.analyst
        return [
            Stored(name, kind, count, newest)
            for kind in STORED_KINDS
            for name, count, newest in self.ledger.release_counts(analyst, **_selection(kind))
        ]

    def clear_stored(
        self, kinds: Collection[str] = STORED_KINDS, *, every_analyst: bool = False
    ) -> dict[str, int]:
        """Drop what the ledger keeps of `kinds` for this analyst (or every analyst), as
        when the data changed: the next query of each is charged and answered afresh.
        Charges stay. Returns how many were dropped, by kind."""
        unknown = sorted(set(kinds) - set(STORED_KINDS))
        if unknown:
            raise ProgrammingError(
                f"unknown kind of stored release: {', '.join(unknown)}; "
                f"choose from {', '.join(STORED_KINDS)}"
            )
        analyst = None if every_analyst else self.analyst
        return {
            kind: self.ledger.clear_cache(analyst, **_selection(kind))
            for kind in STORED_KINDS
            if kind in kinds
        }

    def drop_synopsis(self, table: str, column: str) -> bool:
        """Forget this analyst's synopsis (its charge stays); True if there was one."""
        key = self._synopsis_plan(table, column).status().key
        return self.ledger.forget_release(self.analyst, key)

    def _synopsis_plan(self, table: str, column: str) -> BuildSynopsisPlan | StoredSynopsisPlan:
        plan = self.plan(synopsis_count_query(self.policy, table, column))
        if not isinstance(plan, BuildSynopsisPlan | StoredSynopsisPlan):
            raise ProgrammingError(
                f"the synopsis on {table}.{column} is unavailable: {'; '.join(plan.notes)}"
            )
        return plan


@dataclass(frozen=True)
class _AnalystState:
    """The analyst's stored state in the ledger, as the planners read it."""

    ledger: Ledger
    analyst: str

    def get(self, key: str) -> str | None:
        return self.ledger.cached_release(self.analyst, key)

    def find(self, prefix: str, after: str = "") -> dict[str, str]:
        return self.ledger.stored_releases(self.analyst, prefix, after=after)

    def keep(self, key: str, payload: str) -> str:
        return self.ledger.store_release(self.analyst, key, payload)

    @property
    def owner(self) -> tuple[str, str]:
        return (self.ledger.location, self.analyst)


def _built_from(kept: tuple[tuple, Any] | None, read: tuple) -> bool:
    """Whether `kept` (what it was built from, and it) was built from the very objects in
    `read`: each is replaced when it changes, never changed in place (options are frozen,
    the database facts are read again into new objects), so the same objects mean the
    same inputs."""
    return kept is not None and all(a is b for a, b in zip(kept[0], read, strict=True))


def _selection(kind: str) -> dict[str, Any]:
    """The ledger's fingerprint selection for one kind of stored release."""
    if kind in _KIND_PREFIXES:
        return {"prefix": _KIND_PREFIXES[kind]}
    return {"excluding": tuple(_KIND_PREFIXES.values())}


def _bound(value: Any, name: str) -> int | None:
    """A contribution bound SET chooses: a whole number from 1 to MAX_BOUND, or 'policy'."""
    if isinstance(value, str) and value.strip().lower() in ("policy", "default"):
        return None
    try:
        number = _number(value, name)
    except ProgrammingError:
        number = math.nan
    if not (1 <= number <= MAX_BOUND and number == int(number)):
        raise ProgrammingError(
            f"dpsql.{name} must be a whole number from 1 to {MAX_BOUND:,} (or 'policy' for "
            f"each table's own bound), got {value!r}"
        )
    return int(number)


def _switch(value: Any, name: str) -> str:
    """An on/off option as PostgreSQL reads a boolean setting: 'on' or 'off'."""
    text = str(value).strip().lower()
    if text in ("on", "true", "1", "yes"):
        return "on"
    if text in ("off", "false", "0", "no"):
        return "off"
    raise ProgrammingError(f"dpsql.{name} must be on or off, got {value!r}")


def _number(value: Any, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ProgrammingError(f"dpsql.{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ProgrammingError(f"dpsql.{name} must be finite, got {value!r}")
    return number


# -- release cache encoding: JSON with tagged dates, times, intervals and decimals -------------


def _encode_value(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, dt.time):
        return {"$time": value.isoformat()}
    if isinstance(value, dt.timedelta):  # an interval key, e.g. DATE_TRUNC of an INTERVAL
        return {"$timedelta": [value.days, value.seconds, value.microseconds]}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": repr(value)}
    raise InterfaceError(f"cannot store a released value of type {type(value).__name__}")


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        kind, text = next(iter(value.items()))
        return {
            "$datetime": dt.datetime.fromisoformat,
            "$date": dt.date.fromisoformat,
            "$time": dt.time.fromisoformat,
            "$timedelta": lambda parts: dt.timedelta(*parts),
            "$decimal": decimal.Decimal,
            "$float": float,
        }[kind](text)
    return value


def _encode(release: Release) -> str:
    rows = [[_plain(v) for v in row] for row in release.rows]
    return json.dumps(
        {
            "columns": release.columns,
            "rows": rows,
            "accuracy": {k: vars(v) for k, v in release.accuracy.items()},  # flat dataclasses
            "notes": release.notes,
        },
        default=_encode_value,
    )


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return _encode_value(value)
    return value.item() if isinstance(value, np.generic) else value


class CachedRelease(Release):
    """A release the release cache keeps: the same statement under the same policy and
    options gets this one again, free (a front end may keep it in memory)."""


def _decode(payload: str) -> CachedRelease:
    data = json.loads(payload)
    return CachedRelease(
        data["columns"],
        [tuple(_decode_value(v) for v in row) for row in data["rows"]],
        {k: Accuracy(**v) for k, v in data["accuracy"].items()},
        data["notes"],
    )


__all__ = [
    "CHOICES",
    "MAX_WATCH_INTERVAL",
    "STORED_KINDS",
    "Budget",
    "CachedRelease",
    "LedgerSource",
    "PolicySource",
    "Session",
    "Stored",
    "ledger_in_memory",
    "ledger_location",
    "open_session",
    "sets_options",
]
