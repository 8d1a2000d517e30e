"""`dpsql serve`: a PostgreSQL wire-protocol front end, so psql, psycopg, asyncpg,
SQLAlchemy and pandas get private answers by changing only the connection string.

protocol.py speaks the protocol (on pg-mimic), auth.py decides who gets in,
statements.py runs each statement through the analyst's Session, memo.py
answers repeats from memory, values.py maps values to PostgreSQL types,
introspection.py answers what clients ask about the server and sends catalog
queries to catalog.py (a private PostgreSQL of empty copies of the policy's
tables), sqlstate.py maps
errors, runner.py starts it, processes.py supervises `--processes N` server
processes, dispatch.py hands them the connections the parent accepts, and
cancels.py routes cancel requests between them. The server runs over one
Session (session.open_session), each client on a Session of its own beside it;
the `dpsql serve` command that starts it is dpsql/cli/serve.py.
"""

from dpsql.server.runner import BackgroundServer, build, serve_forever

__all__ = ["BackgroundServer", "build", "serve_forever"]
