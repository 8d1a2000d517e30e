"""`dpsql serve`: answer PostgreSQL clients with private results (the wire server, dpsql/server/).

It opens the Session the server runs on (`open_session`): one database
connection, policy and ledger for every client, each client then getting a
Session of its own beside it. With `--processes N` only the policy is read
before the fork, so this subcommand may read the policy (`dpsql.policy`) itself:
its analysts, for the connection counts every process shares, and where the
ledger would be, to refuse one kept in memory.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from dpsql.cli.common import number_in
from dpsql.errors import Error
from dpsql.server.cancels import MAX_PROCESSES
from dpsql.server.limits import Limits
from dpsql.session import Session, ledger_in_memory, ledger_location, open_session

if TYPE_CHECKING:
    import ssl

    from dpsql.policy import Policy
    from dpsql.server.dispatch import Inbox

SERVE_EPILOG = """examples:
  dpsql serve --demo --trust                  # then: psql -h 127.0.0.1 -p 5433 -U default
  dpsql passwd alice --users users.txt        # give analyst alice a password
  dpsql serve --database pums.duckdb --policy policy.yaml --users users.txt \\
      --host 0.0.0.0 --tls-cert server.crt --tls-key server.key

Every connection authenticates as an analyst of the policy (the PostgreSQL user
name) and is charged to that analyst's budget. After each noisy result the
server sends a NOTICE 'dpsql accuracy' with the noise of each column as JSON."""


def register(commands: argparse._SubParsersAction) -> None:
    """Add `serve` to the `dpsql` parser."""
    serve = commands.add_parser(
        "serve", help="answer PostgreSQL clients (psql, psycopg, SQLAlchemy) with private results",
        description="Speak the PostgreSQL wire protocol so existing tools change only their "
        "connection string. Analysts log in with SCRAM-SHA-256 passwords from the policy "
        "('analysts.<name>.password') or a --users file written by 'dpsql passwd'.",
        epilog=SERVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    source = serve.add_argument_group("what to serve")
    source.add_argument("--demo", action="store_true",
                        help="serve the built-in synthetic census table ('census')")  # fmt: skip
    source.add_argument(
        "--database",
        help="a DuckDB file, or a URL: postgresql://..., any SQLAlchemy URL, spark://local[2], "
        "sc://host:15002",
    )
    source.add_argument("--policy", help="privacy policy YAML file")
    source.add_argument("--ledger", help="budget ledger (default: from the policy)")
    network = serve.add_argument_group("network and security")
    network.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    network.add_argument("--port", type=number_in(int, 0, 65535), default=5433,
                         help="port; 0 picks a free one (default: %(default)s)")  # fmt: skip
    network.add_argument("--users", help="users file of 'analyst:SCRAM-SHA-256$...' lines")
    network.add_argument("--tls-cert", help="PEM certificate: clients may then use sslmode=require")
    network.add_argument("--tls-key", help="PEM private key of --tls-cert")
    network.add_argument("--trust", action="store_true",
                         help="no passwords (any analyst of the policy may connect); only "
                         "allowed on a loopback --host")  # fmt: skip
    network.add_argument("--workers", type=number_in(int, 1), default=8,
                         help="threads running queries, in each process (default: "
                         "%(default)s)")  # fmt: skip
    network.add_argument("--processes", type=number_in(int, 1, MAX_PROCESSES), default=1,
                         help="server processes sharing the port; about one per core "
                         "(default: %(default)s)")  # fmt: skip
    network.add_argument("--require-tls", action="store_true",
                         help="refuse clients that do not use TLS (needs --tls-cert)")  # fmt: skip
    limits = serve.add_argument_group("limits")
    defaults = Limits()
    limits.add_argument(
        "--query-timeout",
        type=number_in(float, 0),
        default=defaults.query_timeout,
        help="seconds a statement may run before it is stopped in the database; 0: no "
        "limit (default: %(default)s)",
    )
    limits.add_argument(
        "--max-groups",
        type=number_in(int, 1),
        default=defaults.max_groups,
        help="groups one query may release; a larger release is refused after its charge "
        "(default: %(default)s)",
    )
    limits.add_argument(
        "--auth-timeout",
        type=number_in(float, 0.001),
        default=defaults.auth_timeout,
        help="seconds a client has to log in (default: %(default)s)",
    )
    limits.add_argument(
        "--max-connections-per-analyst",
        type=number_in(int, 1),
        default=defaults.connections_per_analyst,
        help="connections one analyst may hold at once, in each server process (default: "
        "%(default)s)",
    )
    serve.set_defaults(run=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    import ssl

    from dpsql.server.auth import read_users
    from dpsql.server.protocol import tls_context
    from dpsql.server.runner import build, serve_forever

    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("dpsql serve: give both --tls-cert and --tls-key, or neither")
    try:
        tls = tls_context(args.tls_cert, args.tls_key) if args.tls_cert else None
    except (OSError, ssl.SSLError) as exc:
        raise SystemExit(
            f"dpsql serve: cannot use --tls-cert {args.tls_cert} with --tls-key {args.tls_key}: "
            f"{exc.strerror or exc}; give a PEM certificate and its private key"
        ) from None
    users = read_users(args.users) if args.users else None
    limits = Limits(
        auth_timeout=args.auth_timeout,
        query_timeout=args.query_timeout,
        max_groups=args.max_groups,
        connections_per_analyst=args.max_connections_per_analyst,
        require_tls=args.require_tls,
    )
    if args.processes > 1:
        return _serve_processes(args, tls, users, limits)
    connection = _open(*_source(args))
    try:
        server = build(connection, host=args.host, users=users, trust=args.trust, tls=tls,
                       workers=args.workers, limits=limits)  # fmt: skip
    except Exception:
        connection.close()
        raise
    try:
        serve_forever(server, args.host, args.port, ready=lambda line: print(line, flush=True))
    except OSError as exc:
        raise _cannot_listen(args, exc) from None
    return 0


def _serve_processes(
    args: argparse.Namespace,
    tls: ssl.SSLContext | None,
    users: Mapping[str, str] | None,
    limits: Limits,
) -> int:
    """`--processes N`: bind here, then serve in N forked processes (processes.py), to
    which this process hands the connections it accepts.

    Only the policy is read before the fork: each process opens its own database
    connection and ledger, which must never cross fork().
    """
    from dpsql.server.cancels import CancelRoutes
    from dpsql.server.limits import SharedAnalystConnections, SharedBackoff
    from dpsql.server.processes import supervise
    from dpsql.server.runner import bind, build, serve_handed

    policy, database, ledger = _source(args)
    _refuse_unshared(args.processes, policy, database, ledger)
    try:
        sockets = bind(args.host, args.port)
    except OSError as exc:
        raise _cannot_listen(args, exc) from None
    routes = CancelRoutes(args.processes)
    # one count of each analyst's connections, and of each address's failed logins, for
    # all processes: their limits are the server's
    connections = SharedAnalystConnections(policy.analysts)
    backoff = SharedBackoff(limits.backoff_base, limits.backoff_max)

    def serve(index: int, inbox: Inbox, ready: Callable[[], None]) -> int:
        try:
            connection = _open(policy, database, ledger)
            try:
                server = build(connection, host=args.host, users=users, trust=args.trust,
                               tls=tls, workers=args.workers, limits=limits,
                               connections=connections, backoff=backoff)  # fmt: skip
            except Exception:
                connection.close()
                raise
        except Error as exc:  # as `dpsql` reports it (dpsql.cli.main), from this process
            from rich.console import Console

            Console(stderr=True).print(f"[bold red]{type(exc).__name__}:[/] {exc}", highlight=False)
            return 1
        serve_handed(server, inbox, routes.take(index), ready)
        return 0

    port = sockets[0].getsockname()[1]
    return supervise(
        args.processes, serve, listening=sockets, shared=routes.sockets,
        announce=lambda: print(f"dpsql serve: listening on {args.host}:{port}", flush=True),
    )  # fmt: skip


def _cannot_listen(args: argparse.Namespace, exc: OSError) -> SystemExit:
    # the address: in use, not this machine's, or not a name at all
    return SystemExit(
        f"dpsql serve: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; "
        "pick another --port, or a --host this machine has (127.0.0.1, 0.0.0.0)"
    )


def _refuse_unshared(
    processes: int, policy: Policy, database: str | None, ledger: str | None
) -> None:
    """Refuse what several processes cannot share: a ledger in memory (each process would
    keep a budget of its own, and together they could overspend it) and a Spark driver."""
    if isinstance(database, str) and database.split("://", 1)[0].lower() == "spark":
        raise SystemExit(
            f"dpsql serve: --processes {processes} would start a Spark driver in every process "
            f"for {database}; serve it through Spark Connect (--database sc://host:15002, each "
            "process a client), or use --processes 1"
        )
    location = ledger_location(ledger, policy, database or ":memory:")
    if ledger_in_memory(location):
        raise SystemExit(
            f"dpsql serve: --processes {processes} needs a ledger every process shares, but "
            f"{location!r} is in memory, so each process would keep a budget of its own and "
            "together they could overspend it; give --ledger budget.sqlite (or a "
            "postgresql:// ledger), or --processes 1"
        )


def _source(args: argparse.Namespace) -> tuple[Policy, str | None, str | None]:
    """(policy, database, ledger) to serve; database None: the demo's, built where served."""
    from dpsql.policy import load_policy  # read once, before any fork

    if args.demo:
        from dpsql import demo

        return load_policy(demo.DEMO_POLICY), None, args.ledger or str(demo.demo_ledger_path())
    if args.database and args.policy:
        return load_policy(args.policy), args.database, args.ledger
    raise SystemExit("dpsql serve: give --database and --policy, or --demo for the built-in data")


def _open(policy: Policy, database: str | None, ledger: str | None) -> Session:
    if database is None:
        from dpsql import demo

        database = demo.demo_connection()
    # the session's own analyst only opens it; each client logs in as its own
    return open_session(database, policy, next(iter(policy.analysts)), ledger=ledger)
