"""dpsql errors as PostgreSQL ErrorResponse SQLSTATEs, with the same message as in Python.

The codes are chosen so that a client library raises the same PEP 249 class
the DB-API raises (psycopg maps SQLSTATE classes to exception classes):

- QueryRefused for malformed SQL: 42601 syntax_error.
- QueryRefused otherwise: 42501 insufficient_privilege. The query is SQL the
  analyst may not run because it would reveal more than the policy allows.
  Not 0A000: that says this server lacks a feature another might have.
- BudgetExhausted: 53000 insufficient_resources. The privacy budget is a
  resource that is used up, and class 53 is an OperationalError in psycopg,
  as BudgetExhausted is in dpsql. Not P0001, which is PL/pgSQL's RAISE.
- PolicyError: F0000 config_file_error (only the policy's owner can fix it).
- InterfaceError: 08P01 protocol_violation (parameters that do not fit).
- NotSupportedError: 0A000 feature_not_supported.
- other ProgrammingError (e.g. a bad SET dpsql.x): 22023 invalid_parameter_value.
- TooManyGroups: 54000 program_limit_exceeded (a release over max_groups).
- BackendError: 58000 system_error (the database behind dpsql failed).
- any other dpsql error: XX000 internal_error.
"""

from __future__ import annotations

from pg_mimic import PgError

from dpsql.errors import (
    BackendError,
    BudgetExhausted,
    Error,
    InterfaceError,
    NotSupportedError,
    PolicyError,
    ProgrammingError,
    QueryRefused,
    TooManyGroups,
)

SYNTAX_ERROR = "42601"
INSUFFICIENT_PRIVILEGE = "42501"
BUDGET_EXHAUSTED = "53000"
CONFIG_FILE_ERROR = "F0000"
PROTOCOL_VIOLATION = "08P01"
FEATURE_NOT_SUPPORTED = "0A000"
INVALID_PARAMETER_VALUE = "22023"
SYSTEM_ERROR = "58000"
INTERNAL_ERROR = "XX000"
QUERY_CANCELED = "57014"
INVALID_AUTHORIZATION = "28000"
TOO_MANY_CONNECTIONS = "53300"
PROGRAM_LIMIT_EXCEEDED = "54000"
TOO_MANY_ARGUMENTS = "54023"
UNDEFINED_PARAMETER = "42P02"

# most specific first: PolicyError and QueryRefused are ProgrammingErrors
_CODES: tuple[tuple[type[Error], str], ...] = (
    (BudgetExhausted, BUDGET_EXHAUSTED),
    (PolicyError, CONFIG_FILE_ERROR),
    (QueryRefused, INSUFFICIENT_PRIVILEGE),
    (InterfaceError, PROTOCOL_VIOLATION),
    (NotSupportedError, FEATURE_NOT_SUPPORTED),
    (TooManyGroups, PROGRAM_LIMIT_EXCEEDED),
    (BackendError, SYSTEM_ERROR),
    (ProgrammingError, INVALID_PARAMETER_VALUE),
)


def sqlstate(error: Error) -> str:
    """The SQLSTATE of a dpsql error."""
    if isinstance(error, QueryRefused) and error.construct == "malformed SQL":
        return SYNTAX_ERROR
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code
    return INTERNAL_ERROR


def pg_error(error: Error) -> PgError:
    """The ErrorResponse for a dpsql error, with the message the DB-API shows."""
    return PgError(sqlstate(error), str(error))
