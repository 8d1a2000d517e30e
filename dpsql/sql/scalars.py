"""Scalar subqueries as separate measurements: each released first, then the query read
with the released values in their place.

`SELECT COUNT(*) FROM orders WHERE o_totalprice > (SELECT AVG(o_totalprice) FROM
orders)` is two releases: the subquery's noisy average, then the outer count with
that value written as a constant. The query's epsilon (and delta) is split evenly
over the subqueries and the outer query, each planned as a query of its own, and
the sum of their costs is charged once, before the database runs. Privacy is
sequential composition: the outer query reads the data only through its own
mechanisms, and the constant put in it is a released value, a post-processing
of the subqueries' releases (adaptive composition allows the outer plan, its
clamps and its sensitivity, to depend on it).

Only uncorrelated subqueries that stand where a value stands (the select list,
WHERE, HAVING, a comparison) are read this way: `IN (SELECT ...)`, `EXISTS`,
`ANY`/`ALL` and subqueries in FROM are relations (sql/relations.py). A subquery
must release one value: one select item, no GROUP BY. The outer query's cost
is fixed before its constants are known (it is planned with a placeholder of
the subquery's type); planned again with the released values, its cost must be
the same, else nothing more is run.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlglot import exp
from sqlglot.optimizer.eliminate_ctes import eliminate_ctes

from dpsql.accounting import Cost
from dpsql.errors import QueryRefused
from dpsql.policy import Policy
from dpsql.results import Release, format_value, noisy_text
from dpsql.sql.bounding import NOTE_START as BOUNDING_NOTE
from dpsql.sql.describe import column_types
from dpsql.sql.plan import NO_TABLE_NOTE, Plan

# Where a subquery is a relation or a set, not a value: read by other passes.
_RELATION_PARENTS = (exp.From, exp.Join, exp.In, exp.Any, exp.All, exp.Exists, exp.Lateral)


def value_subqueries(select: exp.Select) -> list[exp.Subquery]:
    """The subqueries of `select` that stand where a value stands, outermost only (one
    inside another is the inner query's to read)."""
    found: list[exp.Subquery] = []
    for node in select.find_all(exp.Subquery):
        if isinstance(node.parent, _RELATION_PARENTS) or not isinstance(node.this, exp.Select):
            continue
        if not any(_within(node, outer) for outer in found):
            found.append(node)
    return found


def _within(node: exp.Expression, outer: exp.Expression) -> bool:
    parent = node.parent
    while parent is not None:
        if parent is outer:
            return True
        parent = parent.parent
    return False


@dataclass
class StagedPlan:
    """Scalar subqueries released first, then the outer query over their values.

    `parts` are the subqueries' plans, in order; `outer` is the outer query's plan
    with placeholders, which fixes its cost; `finish` plans the outer query again
    with the released values (each a Python value, None for an empty release)."""

    parts: list[Plan]
    outer: Plan
    texts: list[str]
    finish_outer: Callable[[Sequence[Any]], Plan]
    sql: str | None = None  # nothing runs as one statement: the Session runs each stage

    @property
    def cost(self) -> Cost:
        total = self.outer.cost
        for part in self.parts:
            total = total + part.cost
        return total

    @property
    def analysis(self) -> Any:  # what describe() reads of the outer query's outputs
        return getattr(self.outer, "analysis", None)

    @property
    def known_groups(self) -> int | None:
        return getattr(self.outer, "known_groups", None)

    def release_with(self, release: Callable[[Plan], Release], shared: bool = False) -> Release:
        """The release of every stage in order, each by `release` (a stage may itself be
        staged), the last planned over the ones before, combined. `shared`: every stage
        reads one snapshot of the database (a plan may then pass one stage's exact
        result to the next; these stages do not)."""
        parts = [release(part) for part in self.parts]
        return self.combine(parts, release(self.finish(parts)))

    def finish(self, releases: Sequence[Release]) -> Plan:
        """The outer query's plan over the parts' releases; it costs what was charged."""
        values = [
            scalar_value(release, text) for release, text in zip(releases, self.texts, strict=True)
        ]
        final = self.finish_outer(values)
        if final.cost != self.outer.cost:
            # the charge covered the placeholder plan's cost: spend no more than that
            raise RuntimeError(
                f"the outer query's cost changed with its constants ({self.outer.cost} "
                f"charged, {final.cost} planned); nothing more was run"
            )
        return final

    def combine(self, parts: Sequence[Release], outer: Release) -> Release:
        """The outer query's release, with a note of the value each part released."""
        notes = [
            note
            for text, release in zip(self.texts, parts, strict=True)
            for note in [*_scalar_notes(release, text), _value_note(text, release)]
        ]
        outer.notes[:] = [note for note in outer.notes if note != NO_TABLE_NOTE] + notes
        return outer

    def release(self, columns: list[str], rows: list[tuple], rng: Any) -> Release:
        raise TypeError("a staged plan is released stage by stage (Session._release)")

    def explain(self) -> list[tuple[str, str]]:
        rows: list[tuple[str, str]] = []
        for number, (text, part) in enumerate(zip(self.texts, self.parts, strict=True), start=1):
            rows.append((f"scalar subquery {number}", text))
            rows.extend((f"  {item}", detail) for item, detail in part.explain())
        rows.append(("outer query", "planned again with each subquery's released value"))
        rows.extend((f"  {item}", detail) for item, detail in self.outer.explain())
        rows.append(
            (
                "budget",
                "the query's epsilon and delta split evenly over the releases that read "
                f"private tables; total {self.cost}",
            )
        )
        return rows


def plan_staged(
    select: exp.Select,
    policy: Policy,
    plan: Callable[[exp.Select, int, int], Plan],
    charged: Callable[[exp.Select], bool],
) -> StagedPlan | None:
    """The staged plan of a query with scalar subqueries; None for one without.

    `plan(query, index, shares)` plans stage `index` (the outer query last) with one
    of `shares` equal shares of the query's budget, one for each stage `charged`
    says reads private tables (the others are free)."""
    subqueries = value_subqueries(select)
    if not subqueries:
        return None
    texts = [subquery.this.sql() for subquery in subqueries]
    inners = [_standalone(subquery, select) for subquery in subqueries]
    placeholders = [_placeholder((column_types(inner, policy) or [""])[0]) for inner in inners]
    with_placeholders = _with_values(select, placeholders)
    shares = max(1, sum(map(charged, [*inners, with_placeholders])))
    parts = [
        _part_plan(inner, text, plan, index, shares)
        for index, (inner, text) in enumerate(zip(inners, texts, strict=True))
    ]
    last = len(parts)
    outer = plan(with_placeholders, last, shares)

    def finish_outer(values: Sequence[Any]) -> Plan:
        return plan(_with_values(select, [_literal(value) for value in values]), last, shares)

    return StagedPlan(parts, outer, texts, finish_outer)


def _standalone(subquery: exp.Subquery, select: exp.Select) -> exp.Select:
    """The subquery as a query of its own, with the outer query's CTEs it reads."""
    inner = subquery.this.copy()
    with_ = select.args.get("with_")
    if with_ is not None and inner.args.get("with_") is None:
        inner.set("with_", with_.copy())
        inner = eliminate_ctes(inner)
    return inner


def _part_plan(
    inner: exp.Select,
    text: str,
    plan: Callable[[exp.Select, int, int], Plan],
    index: int,
    shares: int,
) -> Plan:
    if len(inner.expressions) != 1:
        raise _refused(text, "it selects more than one value", "select one aggregate in it")
    if inner.expressions[0].find(exp.AggFunc) is None:
        raise _refused(
            text,
            "it does not aggregate, so it may give a value per row",
            "select one aggregate in it: (SELECT AVG(x) FROM ...)",
        )
    if inner.expressions[0].find(exp.Array) is not None:
        raise _refused(
            text,
            "it releases a list (quantiles at several fractions)",
            "ask for one fraction in it: quantile_cont(x, 0.5)",
        )
    if inner.args.get("group") is not None:
        raise _refused(
            text,
            "it groups its rows, so it would give one value per group",
            "drop its GROUP BY (one value for all rows), or join a grouped query in FROM",
        )
    outer_names = _qualifiers_outside(inner)
    if outer_names:
        raise _refused(
            text,
            f"it refers to the outer query's {', '.join(sorted(outer_names))} (a correlated "
            "subquery: one value per outer row)",
            "compute the per-row value by a join: JOIN (SELECT unit, AGG(...) FROM ... "
            "GROUP BY unit) t ON ... in FROM",
        )
    try:
        return plan(inner, index, shares)
    except QueryRefused as refused:
        raise QueryRefused(
            f"{refused.construct}, in the scalar subquery ({text})", refused.reason, refused.hint
        ) from None


def _qualifiers_outside(inner: exp.Select) -> set[str]:
    """Table names or aliases its columns are qualified by that it does not define."""
    defined = {node.alias_or_name.lower() for node in inner.find_all(exp.Table)}
    defined |= {node.name.lower() for node in inner.find_all(exp.Table)}
    defined |= {node.alias.lower() for node in inner.find_all(exp.Subquery) if node.alias}
    defined |= {cte.alias_or_name.lower() for cte in inner.find_all(exp.CTE)}
    return {
        column.table for column in inner.find_all(exp.Column)
        if column.table and column.table.lower() not in defined
    }  # fmt: skip


def _refused(text: str, reason: str, hint: str) -> QueryRefused:
    return QueryRefused(f"the scalar subquery ({text})", reason, hint)


def _with_values(select: exp.Select, values: Sequence[exp.Expression]) -> exp.Select:
    """`select` with its value subqueries replaced, in order, by `values`."""
    replaced = select.copy()
    for subquery, value in zip(value_subqueries(replaced), values, strict=True):
        subquery.replace(value.copy())
    return eliminate_ctes(replaced) if replaced.args.get("with_") is not None else replaced


def _placeholder(kind: str) -> exp.Expression:
    """A constant of the kind a part releases, for planning the outer query before its
    value is known: its cost does not depend on the constant (1, not 0: a divisor stays
    one)."""
    if kind in ("date", "timestamp"):
        return exp.cast(exp.Literal.string("2000-01-01"), kind.upper())
    if kind == "string":
        return exp.Literal.string("")
    if kind == "bool":
        return exp.true()
    return exp.Literal.number(1)


def _literal(value: Any) -> exp.Expression:
    """A released value as a SQL constant that reads back as the same value."""
    if value is None:
        return exp.null()
    if isinstance(value, str):  # MIN or MAX of a public table's text
        return exp.Literal.string(value)
    if isinstance(value, bool):
        return exp.true() if value else exp.false()
    if isinstance(value, dt.datetime):
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), "TIMESTAMP")
    if isinstance(value, dt.date):
        return exp.cast(exp.Literal.string(value.isoformat()), "DATE")
    if isinstance(value, int | float | Decimal):
        number = exp.Literal.number(repr(abs(value)) if isinstance(value, float) else abs(value))
        return exp.paren(exp.Neg(this=number)) if value < 0 else number
    raise QueryRefused(
        "a scalar subquery's value",
        f"it released a {type(value).__name__}, which cannot stand as a constant",
        "make the subquery release one number, date or text",
    )


def scalar_value(release: Release, text: str) -> Any:
    """The one value a scalar subquery's release holds (None: it released no row)."""
    if not release.rows:
        return None
    if len(release.rows) > 1 or len(release.rows[0]) != 1:
        raise QueryRefused(
            f"the scalar subquery ({text})",
            f"it released {len(release.rows)} rows, where one value stands",
            "make it return one value: one aggregate, no GROUP BY",
        )
    return release.rows[0][0]


def _scalar_notes(release: Release, text: str) -> list[str]:
    """The notes of the values a part's own subqueries released, and the bounding notes of
    the part (`text`) and of its subqueries, each saying which subquery it is about."""
    return [
        f"{_BOUNDING_START}{text}): {note}" if note.startswith(BOUNDING_NOTE) else note
        for note in release.notes
        if note.startswith((_NOTE_START, _BOUNDING_START, BOUNDING_NOTE))
    ]


_NOTE_START = "the scalar subquery ("
_BOUNDING_START = "in the scalar subquery ("


def _value_note(text: str, release: Release) -> str:
    value = scalar_value(release, text)
    accuracy = next(iter(release.accuracy.values()), None) if release.accuracy else None
    shown = noisy_text(value, accuracy, 0) if accuracy is not None else format_value(value)
    how = "its own measurement" if accuracy is not None else "exact (public tables)"
    return f"{_NOTE_START}{text}) was released as {shown}: {how}"
