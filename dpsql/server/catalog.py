"""The catalog `dpsql serve` answers pg_catalog and information_schema queries from:
a private PostgreSQL cluster holding empty copies of the policy's tables.

Why a real PostgreSQL, not an emulation. pg-mimic's emulated catalog, evaluated
with psql, pgJDBC, SQLAlchemy and pgcli, answered what it could not evaluate
(`LEFT JOIN pg_description`, `= ANY (ARRAY[...])`, pg_settings, pg_proc, json
functions, `attstorage`, ...) with zero rows, so tools saw no tables. Each
client's catalog SQL is thousands of lines of PostgreSQL; only PostgreSQL
answers it as PostgreSQL does, errors included. Why not the backend's own
catalog: the backend may be DuckDB or Spark, and a PostgreSQL backend's catalog
holds other tables, statistics (pg_statistic, reltuples) and roles that are
not the analysts' to see. So each server process starts, on the first catalog
query, a throwaway cluster of the machine's PostgreSQL binaries (initdb in a
temporary directory, no TCP port, a Unix socket in a 0700 directory, autovacuum
off) whose template database holds the policy's tables with their columns,
types, keys (a unique unit as PRIMARY KEY, a `via` reference as FOREIGN KEY to
its target, made UNIQUE) and comments (what the policy says of each table and
column), and nothing else.

What keeps it away from the data: the cluster never sees a row of any table;
dpsql only ever runs the DDL built from the policy in it. Every statistic is
therefore that of an empty, never analysed table (reltuples -1, relpages 0,
no pg_statistic rows), the same for every database; the statistics views
(pg_stats, pg_statistic, ...) are refused outright so that no tool mistakes
them for facts. Queries are forwarded as an unprivileged role named after the
analyst, in a read-only transaction with a statement timeout, so that no
analyst reads another's secrets (there are none: no role has a password) or
changes the catalog. Catalog queries are not charged: their answers are the
same whatever the private data holds.

Without PostgreSQL binaries on the machine (no `initdb` on PATH, in
`pg_config --bindir` or /usr/lib/postgresql/*/bin) catalog queries are refused
(0A000) saying so, rather than answered wrongly.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pg_mimic import PgError, ResultColumn
from pg_mimic.types import encode_value_binary

from dpsql.server.sqlstate import FEATURE_NOT_SUPPORTED, INSUFFICIENT_PRIVILEGE

if TYPE_CHECKING:
    from dpsql.policy import Policy, Table

_TYPES = {
    "int": "bigint", "float": "double precision", "string": "text", "bool": "boolean",
    "date": "date", "timestamp": "timestamp",
}  # fmt: skip

# Statistics are data: refused, even though the cluster's are empty.
STATISTICS = re.compile(
    r"\bpg_(stats|statistic|stats_ext|statistic_ext_data|stats_ext_exprs)\b", re.I
)
TIMEOUT_MS = 10_000
SUPERUSER = "postgres"  # the cluster's bootstrap role, which owns the tables
PORT = 5432  # of its Unix socket, in the cluster's own folder: no TCP port is opened
FOLDER_PREFIX = "dpsql-catalog-"
MAX_DATABASES = 16  # the client names its database; more names are refused


@dataclass(frozen=True)
class Keys:
    """The keys the database keeps on the policy's tables (schema, not data): columns it
    keeps unique and single-column foreign keys, by policy key, lower case."""

    unique: Mapping[str, set[str]] = field(default_factory=dict)
    foreign: Mapping[str, Mapping[str, tuple[str, str]]] = field(default_factory=dict)


def database_keys(policy: Policy, adapter: Any) -> Keys:
    """The keys `adapter`'s database keeps on the policy's stored tables."""
    unique, foreign = {}, {}
    for key, table in policy.tables.items():
        if table.source is None and table.relation is None and table.local is None:
            unique[key] = adapter.unique_columns(table.name)
            foreign[key] = adapter.foreign_keys(table.name)
    return Keys(unique, foreign)


def create_statements(policy: Policy, keys: Keys | None = None) -> list[str]:
    """The DDL of the policy's tables: columns, types, keys and comments, no rows. A
    table's privacy unit, when kept unique, is its PRIMARY KEY (else its first unique
    column); other unique columns and every column a `via` references are UNIQUE; a
    `via` and the database's foreign keys between policy columns are FOREIGN KEYs."""
    keys = keys or Keys()
    unique = {k: {c.lower() for c in v} for k, v in keys.unique.items()}
    links = {k: dict(v) for k, v in keys.foreign.items()}
    for key, table in policy.tables.items():
        if table.via is not None:
            unique.setdefault(table.via.table, set()).add(table.via.target.lower())
            links.setdefault(key, {})[table.via.column] = (table.via.table, table.via.target)
    statements, references = [], []
    for key, table in policy.tables.items():
        name = _qualified(table.name)
        schema = name.rpartition(".")[0]
        if schema != '"public"':
            statements.append(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            statements.append(f"GRANT USAGE ON SCHEMA {schema} TO PUBLIC")
        columns = [f"{_ident(c.name)} {_TYPES.get(c.type, 'text')}" for c in table.columns.values()]
        kept = sorted(c for c in unique.get(key, set()) if table.column(c) is not None)
        unit = (table.privacy_unit or "").lower()
        primary = unit if unit in kept else (kept[0] if kept else None)
        columns += [
            f"{'PRIMARY KEY' if c == primary else 'UNIQUE'} ({_ident(table.column(c).name)})"
            for c in kept
        ]
        statements.append(f"CREATE TABLE {name} ({', '.join(columns)})")
        # REFERENCES too: information_schema shows a table's constraints only to a role
        # holding a privilege on it other than SELECT
        statements.append(f"GRANT SELECT, REFERENCES ON {name} TO PUBLIC")
        statements.append(f"COMMENT ON TABLE {name} IS {_literal(_table_comment(table))}")
        for column in table.columns.values():
            comment = _column_comment(column)
            if comment:
                statements.append(
                    f"COMMENT ON COLUMN {name}.{_ident(column.name)} IS {_literal(comment)}"
                )
        references += _foreign_keys(policy, table, links.get(key, {}), unique)
    return statements + references


def _foreign_keys(
    policy: Policy, table: Table, links: Mapping[str, tuple[str, str]],
    unique: Mapping[str, set[str]],
) -> list[str]:  # fmt: skip
    """ALTER TABLE ... FOREIGN KEY for each link between columns of the policy whose
    target is kept unique (PostgreSQL requires it); links to other tables are not shown."""
    statements = []
    for column, (target_name, target_column) in sorted(links.items()):
        target_key = policy.spellings.get(target_name.lower(), target_name.lower())
        target = policy.tables.get(target_key)
        if (
            target is None or table.column(column) is None
            or target.column(target_column) is None
            or target_column.lower() not in unique.get(target_key, set())
        ):  # fmt: skip
            continue
        statements.append(
            f"ALTER TABLE {_qualified(table.name)} ADD FOREIGN KEY "
            f"({_ident(table.column(column).name)}) REFERENCES {_qualified(target.name)} "
            f"({_ident(target.column(target_column).name)})"
        )
    return statements


def _table_comment(table: Table) -> str:
    if table.public:
        return "public: no person's data, answered exactly"
    if table.local is not None:
        return "local differential privacy reports"
    if table.via is not None:
        unit = f"that of {table.via.table} referenced by {table.via.column}"
    else:
        unit = table.privacy_unit or "each row"
    return f"private, unit {unit}: answers are noisy aggregates"


def _column_comment(column: Any) -> str:
    if column.values is not None:
        return "public keys: " + ", ".join(map(str, column.values))
    if column.bounded:
        return f"bounded to [{column.lower}, {column.upper}]" + (
            " (public keys)" if column.public else ""
        )
    return ""


def _qualified(name: str) -> str:
    schema, _, table = name.rpartition(".")
    schema = "public" if schema in ("", "main") else schema.rpartition(".")[2]
    return f"{_ident(schema)}.{_ident(table)}"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# Text values of these types read into Python, for a Bind asking binary for some
# columns and text for others (pgJDBC does, once a statement is prepared): libpq
# fetches a result in one format, so the binary columns are converted.
_READERS = {
    16: lambda t: t == "t", 20: int, 21: int, 23: int, 26: int, 700: float, 701: float,
    18: str, 19: str, 25: str, 1042: str, 1043: str,
}  # fmt: skip


def mixed_formats(rows: list[tuple], oids: list[int], binary: list[bool]) -> list[tuple]:
    """Text rows with the columns marked `binary` converted to PostgreSQL's binary form."""
    for oid, wanted in zip(oids, binary, strict=True):
        if wanted and oid not in _READERS:
            raise PgError(
                FEATURE_NOT_SUPPORTED,
                f"a catalog column of type oid {oid} in binary next to text columns; "
                "ask for every column in one format",
            )
    return [
        tuple(
            encode_value_binary(oid, _READERS[oid](raw.decode())) if wanted and raw is not None
            else raw
            for raw, oid, wanted in zip(row, oids, binary, strict=True)
        )
        for row in rows
    ]  # fmt: skip


_PRISTINE: dict[Path, Path] = {}  # the binaries' folder: a data folder initdb wrote
_PRISTINE_LOCK = threading.Lock()


def _pristine(prefix: list[str], found: Path) -> Path:
    """A data folder fresh from initdb, written once per process and copied for each
    cluster: initdb takes seconds, a copy a fraction of one (a test run starts many)."""
    with _PRISTINE_LOCK:
        data = _PRISTINE.get(found)
        if data is None or not data.exists():
            folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
            (folder / "owner").write_text(str(os.getpid()))
            if prefix:
                shutil.chown(folder, SUPERUSER, SUPERUSER)
            data = folder / "data"
            subprocess.run([*prefix, str(found / "initdb"), "-D", str(data), "-U", SUPERUSER,
                            "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"],
                           check=True, capture_output=True, timeout=120)  # fmt: skip
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            _PRISTINE[found] = data
        return data


def _stop_command(prefix: list[str], found: Path, folder: Path) -> list[str]:
    return [*prefix, str(found / "pg_ctl"), "-D", str(folder / "data"), "-m", "immediate", "stop"]


def _stop_orphans() -> None:
    """Stop and remove the clusters of dpsql processes that died without stopping theirs
    (a SIGKILL): pg_ctl's postmaster outlives the process that started it."""
    found = binaries()
    for owner in Path(tempfile.gettempdir()).glob(FOLDER_PREFIX + "*/owner"):
        try:
            os.kill(int(owner.read_text()), 0)
            continue  # its process is alive
        except ProcessLookupError:
            pass
        except (OSError, ValueError):
            continue
        prefix = ["runuser", "-u", SUPERUSER, "--"] if os.geteuid() == 0 else []
        if found is not None:
            subprocess.run(
                _stop_command(prefix, found, owner.parent), capture_output=True, timeout=60
            )
        shutil.rmtree(owner.parent, ignore_errors=True)


def binaries() -> Path | None:
    """The folder of the machine's PostgreSQL server binaries, if it has them."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    try:
        folder = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        if (Path(folder) / "initdb").exists():
            return Path(folder)
    except (OSError, subprocess.SubprocessError):
        pass
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: p.parts)
    return versions[-1].parent if versions else None


class Catalog:
    """A throwaway PostgreSQL cluster with the policy's tables, started on first use
    and stopped at exit; `query` answers one catalog statement in it."""

    def __init__(self, policy: Policy, keys: Any = None):
        """`keys`: a function giving the database's Keys, called once, when the cluster
        starts (it reads the database's constraints, not its rows)."""
        self.policy = policy
        self.keys = keys
        self._lock = threading.Lock()
        self._folder: Path | None = None
        self._stop_command: list[str] = []
        self._roles: set[str] = set()
        self._databases: set[str] = {"postgres", "template1"}
        self._connections: dict[tuple[str, str], Any] = {}

    def query(
        self, sql: str, params: list[Any], role: str, database: str, binary: bool = False
    ) -> tuple[list[ResultColumn], list[tuple]]:
        """Run `sql` (with `$n` parameters given as text) as `role` in `database`; its
        columns (name, type oid) and rows, each value as PostgreSQL sent it (text, or
        binary when `binary`). PostgreSQL's errors become the client's."""
        from psycopg import pq

        if STATISTICS.search(sql):
            raise PgError(
                INSUFFICIENT_PRIVILEGE,
                "refused a query of the planner's statistics (pg_stats, pg_statistic): they "
                "are computed from the private data. dpsql's catalog describes the policy's "
                "tables, not their contents; ask for a noisy COUNT or a histogram instead",
            )
        with self._lock:
            connection = self._connection(role, database)
            encoded = [None if p is None else str(p).encode() for p in params]
            # in a transaction rolled back after it, so that nothing a query does (a
            # set_config, a large object) outlives it or reaches another analyst
            connection.pgconn.exec_(b"BEGIN TRANSACTION READ ONLY")
            # cancelled from here rather than by statement_timeout, which a client's
            # current_setting('statement_timeout') would read
            timer = threading.Timer(TIMEOUT_MS / 1000, connection.cancel_safe)
            timer.start()
            try:
                result = connection.pgconn.exec_params(
                    sql.encode(), encoded, result_format=1 if binary else 0
                )
            finally:
                timer.cancel()
            connection.pgconn.exec_(b"ROLLBACK")
        if result.status == pq.ExecStatus.FATAL_ERROR:
            if connection.closed or connection.pgconn.status != pq.ConnStatus.OK:
                self._connections.pop((role, database), None)
            state = result.error_field(pq.DiagnosticField.SQLSTATE) or b"XX000"
            message = result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) or b"catalog error"
            raise PgError(state.decode(), message.decode())
        if result.status != pq.ExecStatus.TUPLES_OK:
            return [], []
        oids = [result.ftype(i) for i in range(result.nfields)]
        columns = [ResultColumn(result.fname(i).decode(), oid) for i, oid in enumerate(oids)]
        rows = [
            tuple(result.get_value(r, i) for i in range(result.nfields))
            for r in range(result.ntuples)
        ]
        return columns, rows

    def _connection(self, role: str, database: str) -> Any:
        key = role, database
        connection = self._connections.get(key)
        if connection is not None and not connection.closed:
            return connection
        self._start()
        self._prepare(role, database)
        connection = self._connect(role, database)
        self._connections[key] = connection
        return connection

    def _connect(self, role: str, database: str) -> Any:
        import psycopg

        return psycopg.connect(
            host=str(self._folder), port=PORT, user=role, dbname=database, autocommit=True
        )

    def _prepare(self, role: str, database: str) -> None:
        """The analyst's role and the database the client named, each created once."""
        if role in self._roles and database in self._databases:
            return
        with self._connect(SUPERUSER, "postgres") as admin:
            if role not in self._roles:
                found = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
                if found.fetchone() is None:
                    admin.execute(f"CREATE ROLE {_ident(role)} LOGIN NOSUPERUSER NOCREATEDB")
                self._roles.add(role)
            if database not in self._databases:
                if len(self._databases) >= MAX_DATABASES:
                    raise PgError("3D000", f'database "{database}" does not exist')
                admin.execute(f"CREATE DATABASE {_ident(database)} TEMPLATE template1")
                self._databases.add(database)

    def _start(self) -> None:
        if self._folder is not None:
            return
        found = binaries()
        if found is None:
            raise PgError(
                FEATURE_NOT_SUPPORTED,
                "dpsql answers catalog queries (pg_catalog, information_schema) from a "
                "PostgreSQL cluster of its own, and this machine has no PostgreSQL server "
                "binaries (initdb, pg_ctl); install PostgreSQL (e.g. apt-get install "
                "postgresql) where dpsql serve runs",
            )
        _stop_orphans()
        folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
        (folder / "owner").write_text(str(os.getpid()))
        # initdb and postgres refuse to run as root: the cluster runs as postgres then
        prefix = ["runuser", "-u", SUPERUSER, "--"] if os.geteuid() == 0 else []
        options = (f"-k {folder} -p {PORT} -c listen_addresses='' -c fsync=off "
                   "-c autovacuum=off -c max_connections=40 -c shared_buffers=16MB")  # fmt: skip
        try:
            if prefix:
                shutil.chown(folder, SUPERUSER, SUPERUSER)
            subprocess.run([*prefix, "cp", "-a", str(_pristine(prefix, found)),
                            str(folder / "data")], check=True, capture_output=True)  # fmt: skip
            subprocess.run([*prefix, str(found / "pg_ctl"), "-D", str(folder / "data"), "-l",
                            str(folder / "log"), "-o", options, "-w", "-t", "60", "start"],
                           check=True, capture_output=True, timeout=120)  # fmt: skip
        except (subprocess.SubprocessError, OSError, LookupError) as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise PgError(
                FEATURE_NOT_SUPPORTED,
                f"dpsql could not start the PostgreSQL cluster of its catalog ({exc}); "
                "catalog queries are unavailable until it can",
            ) from None
        self._folder, self._stop_command = folder, _stop_command(prefix, found, folder)
        atexit.register(self.stop)
        ddl = create_statements(self.policy, self.keys() if self.keys else None)
        for database in ("template1", "postgres"):  # new databases are copies of template1
            with self._connect(SUPERUSER, database) as admin:
                for statement in ddl:
                    admin.execute(statement)

    def stop(self) -> None:
        """End the connections and the cluster, and remove its folder."""
        with self._lock:
            for connection in self._connections.values():
                connection.close()
            self._connections.clear()
            if self._folder is None:
                return
            folder, self._folder = self._folder, None
            subprocess.run(self._stop_command, capture_output=True, timeout=60)
            shutil.rmtree(folder, ignore_errors=True)
