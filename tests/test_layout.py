"""The layout of DESIGN section 2, read off dpsql/'s own source with `ast`.

Dependencies point one way: front ends (dbapi, server, shell, cli) -> session
(and results) -> sql, ledger, adapters, mechanisms, ldp -> policy, accounting,
errors. Every import counts: at the top of a module or inside a function. An
import under `if TYPE_CHECKING:` names a type for annotations only (nothing
is loaded); it still may not point upward, and a front end may name in one
only the types of the values the Session hands it (its policy, a cost).

The exceptions, each as narrow as its reason:
- `dpsql.lru` (a weighted LRU container that imports nothing of dpsql) may be
  used anywhere: a data structure, not a layer.
- The root package (`dpsql/__init__`: connect() and the exception names) is
  imported by nothing inside dpsql but its `__version__` (the wire server
  reports it); `dpsql/__main__` runs the cli.
- `server/auth.py` reads the policy's rule for analyst names: the users file
  it writes for `dpsql passwd` holds one analyst per line, named as the policy
  names them.
- The cli is the top: it starts the other front ends (server, shell) and may
  write the demo (`dpsql.demo`, which imports nothing of dpsql). Three of its
  subcommands administer what lies past one Session and may read the policy:
  `serve` (read once before it forks: the analysts whose connections every
  process counts, where the ledger would be), `cache` (every analyst's
  stored releases) and `passwd` (whether the policy names the analyst a
  password is for; no database is opened). `dpsql ldp` is the client side of local DP, over
  dpsql/ldp/ with no Session (no database, policy or budget).
- `dpsql.draft` (`dpsql policy init`) drafts a policy before there is one: it
  reads the schema through the adapters (no Session opens without a policy),
  then opens a Session on its draft to charge its DP estimates to the owner's
  budget. It sits beside the Session; only `dpsql policy` imports it, and that
  module reads the policy's epsilon range for its options.
- `dpsql.audit` (`python -m dpsql.audit`) audits the internals by design: it is
  not checked, and nothing imports it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dpsql"

FRONT_ENDS = {"dbapi", "server", "shell", "cli"}
BOTTOM = {"policy", "accounting", "errors"}
MIDDLE = {"sql", "ledger", "adapters", "mechanisms", "ldp"}

# What each part's runtime imports may reach (besides itself and `lru`).
ALLOWED = {
    "errors": set(),
    "accounting": {"errors"},
    "policy": {"accounting", "errors"},
    "results": BOTTOM,
    "lru": set(),
    "demo": set(),
    "mechanisms": {"accounting", "errors"},  # nothing of sql/, the ledger or adapters
    "ldp": {"mechanisms"} | BOTTOM,
    "adapters": BOTTOM,
    "ledger": BOTTOM,
    "sql": {"mechanisms", "ldp", "results"} | BOTTOM,  # nothing of adapters/ or the ledger
    "session": MIDDLE | {"results"} | BOTTOM,
    "draft": {"session", "results"} | MIDDLE | BOTTOM,  # beside the Session: see above
    "dbapi": {"session", "results", "errors"},
    "server": {"session", "results", "errors"},
    "shell": {"session", "results", "errors"},
    "cli": {"session", "results", "errors", "server", "shell", "demo"},
    "dpsql": {"dbapi", "errors"},
    "__main__": {"cli"},
}
# What a front end may name under TYPE_CHECKING besides what it may import.
FRONT_END_TYPES = {"policy", "accounting"}
# Modules (or packages) that may import one part more, and why (the docstring above).
EXTRA = {
    "dpsql.server.auth": {"policy"},  # the analyst-name rule of the users file
    "dpsql.cli.serve": {"policy"},  # read once before --processes forks
    "dpsql.cli.cache": {"policy"},  # every analyst's stored releases
    "dpsql.cli.passwd": {"policy"},  # whether the policy names the analyst
    "dpsql.cli.ldp": {"ldp"},  # client-side local DP: no Session
    "dpsql.cli.policy": {"draft", "policy"},  # drafting a policy: none to open a Session with
}
UNCHECKED = {"audit"}
CLI_HELPERS = {"__init__", "__main__", "common"}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the dpsql module (or package) imported
    names: tuple[str, ...]  # for `from X import a, b`: a, b
    type_only: bool
    line: int


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    relative = Path(*name.split("."))
    return (PACKAGE.parent / relative).with_suffix(".py").is_file() or (
        PACKAGE.parent / relative / "__init__.py"
    ).is_file()


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path) -> list[Import]:
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def record(target: str, names: tuple[str, ...], type_only: bool, line: int) -> None:
        if target == "dpsql" or target.startswith("dpsql."):
            found.append(Import(module, target, names, type_only, line))

    def read(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                record(alias.name, (), type_only, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                if _is_module(whole):  # from dpsql import demo: the module dpsql.demo
                    record(whole, (), type_only, node.lineno)
                else:
                    record(base, (alias.name,), type_only, node.lineno)
        elif isinstance(node, ast.If) and _type_checking(node):
            for statement in node.body:
                read(statement, True)
            for statement in node.orelse:
                read(statement, type_only)
        else:
            for child in ast.iter_child_nodes(node):
                read(child, type_only)

    read(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def _part(module: str) -> str:
    """The part of the layout a dpsql module belongs to: 'sql' for dpsql.sql.plan, ..."""
    return module.split(".")[1] if "." in module else "dpsql"


MODULES = sorted(PACKAGE.rglob("*.py"))
IMPORTS = [i for path in MODULES for i in _imports(path)]


def _problem(i: Import) -> str | None:
    source, target = _part(i.module), _part(i.target)
    if target in UNCHECKED and source not in UNCHECKED:
        return "nothing in dpsql imports the auditor"
    if source in UNCHECKED or source == target or target == "lru":
        return None
    if target == "dpsql":
        if source in ("dpsql", "__main__") or i.names == ("__version__",):
            return None
        return "the root package is the public facade (it imports dbapi): import the module"
    allowed = set(ALLOWED[source])
    for module, extra in EXTRA.items():
        if i.module == module or i.module.startswith(f"{module}."):
            allowed |= extra
    if i.type_only and source in FRONT_ENDS:
        allowed |= FRONT_END_TYPES
    if target in allowed:
        return None
    return f"{source} may import only {', '.join(sorted(allowed)) or 'nothing of dpsql'}"


def test_the_import_reader_sees_every_kind_of_import() -> None:
    """The reader itself: function-local imports, TYPE_CHECKING blocks, modules named in
    `from package import module`, and names imported from a module."""
    by_module: dict[str, list[Import]] = {}
    for i in IMPORTS:
        by_module.setdefault(i.module, []).append(i)
    targets = {i.target for i in by_module["dpsql.cli.serve"]}
    assert {"dpsql.server.runner", "dpsql.demo", "dpsql.policy"} <= targets  # in functions
    assert any(i.type_only and i.target == "dpsql.policy" for i in by_module["dpsql.server.values"])
    assert not any(i.type_only for i in by_module["dpsql.session"] if i.target == "dpsql.sql")
    (version,) = [i for i in by_module["dpsql.server.introspection"] if i.target == "dpsql"]
    assert version.names == ("__version__",)
    assert set(ALLOWED) >= {_part(_module_name(path)) for path in MODULES} - UNCHECKED


@pytest.mark.parametrize("module", sorted({i.module for i in IMPORTS}))
def test_dependencies_point_one_way(module: str) -> None:
    wrong = [
        f"{module}:{i.line} imports {i.target}"
        + (f" ({', '.join(i.names)})" if i.names else "")
        + f": {problem}"
        for i in IMPORTS
        if i.module == module and (problem := _problem(i))
    ]
    assert not wrong, "\n".join(wrong)


def test_front_ends_import_neither_adapters_nor_the_ledger_nor_sql() -> None:
    """The issue's own words, checked on their own: a front end gets its Session from
    session.open_session and reads results, whatever else the rules above allow."""
    reached = {
        (i.module, i.target)
        for i in IMPORTS
        if _part(i.module) in FRONT_ENDS and _part(i.target) in {"adapters", "ledger", "sql"}
    }
    assert not reached


def test_every_module_says_its_job() -> None:
    missing = [
        str(path.relative_to(PACKAGE.parent))
        for path in MODULES
        if not (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").strip()
    ]
    assert not missing


def test_the_cli_has_one_module_per_subcommand_and_help_lists_them() -> None:
    """`dpsql --help` and dpsql/cli/ list the same subcommands, in SUBCOMMANDS' order."""
    import argparse

    from dpsql.cli import SUBCOMMANDS, _parser

    modules = {path.stem for path in (PACKAGE / "cli").glob("*.py")} - CLI_HELPERS
    assert modules == set(SUBCOMMANDS)
    (commands,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert tuple(commands.choices) == SUBCOMMANDS


def test_the_policy_names_every_local_mechanism_the_ldp_package_builds() -> None:
    from dpsql import ldp
    from dpsql.policy import LOCAL_MECHANISMS

    assert tuple(ldp._FACTORIES) == LOCAL_MECHANISMS == ldp.MECHANISMS


def test_the_documented_names_still_import() -> None:
    """`import dpsql; dpsql.connect(...)` and the names README and docs/ use."""
    import dpsql
    from dpsql.cli import main
    from dpsql.ledger import Ledger, open_ledger
    from dpsql.results import MAX_GROUPS, Accuracy, Release
    from dpsql.session import Session, open_session
    from dpsql.sql.plan import Release as PlanRelease

    assert callable(dpsql.connect) and dpsql.__version__
    assert PlanRelease is Release and Accuracy and MAX_GROUPS
    assert callable(open_ledger) and Ledger and Session and callable(open_session)
    assert callable(main)  # the console script's entry point (pyproject.toml)
