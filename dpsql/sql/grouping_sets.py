"""GROUPING SETS, ROLLUP and CUBE as one measured GROUP BY query per grouping set.

`SELECT a, b, COUNT(*) FROM t GROUP BY ROLLUP (a, b)` is the grouping sets
(a, b), (a) and (): three ordinary queries, `... GROUP BY a, b`, `SELECT a,
CAST(NULL AS BIGINT) AS b, COUNT(*) ... GROUP BY a` and `SELECT CAST(NULL AS
BIGINT) AS a, CAST(NULL AS BIGINT) AS b, COUNT(*) FROM t`. Each is planned as
any GROUP BY query is (public domains or partition selection, the same
contribution bounding and clamps), with an equal share of the query's epsilon
and delta: every unit may add to every set, so the sets compose sequentially,
and their summed cost is charged once, before the database runs. A key absent
from a set reads as a typed NULL outside the aggregates, and `GROUPING(...)`
as the constant bit mask PostgreSQL gives it, so it reads no data.

The releases are concatenated in the order of the sets (PostgreSQL's order
of the expansion, the first item varying slowest); a set written twice is
measured once and its rows repeated. HAVING is applied per set (it filters
rows one by one); ORDER BY, LIMIT and OFFSET to the concatenation, as
post-processing of the noisy values: each ORDER BY item is computed per set
as a hidden output and dropped after sorting.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpsql.accounting import Cost
from dpsql.errors import QueryRefused
from dpsql.policy import Policy
from dpsql.results import Accuracy, Release
from dpsql.sql.check import ORDER_STATISTICS
from dpsql.sql.describe import column_types
from dpsql.sql.plan import Plan, check_groups
from dpsql.sql.resolve import output_name, select_position

#: The most grouping sets one query may expand to (CUBE of 6 columns): each set's share
#: of epsilon is 1/sets of the query's, so more would leave each set mostly noise.
MAX_SETS = 64

_SET_FORMS = (exp.GroupingSets, exp.Rollup, exp.Cube)
# The SQL type of a typed NULL standing for an absent key of each policy type.
_NULL_TYPES = {"int": "BIGINT", "float": "DOUBLE", "string": "TEXT", "bool": "BOOLEAN",
               "date": "DATE", "timestamp": "TIMESTAMP"}  # fmt: skip


def has_grouping_sets(select: exp.Select) -> bool:
    """Whether `select`'s GROUP BY holds GROUPING SETS, ROLLUP or CUBE."""
    group = select.args.get("group")
    return group is not None and any(isinstance(e, _SET_FORMS) for e in group.expressions)


@dataclass(frozen=True)
class Fixed:
    """An output that one grouping set fixes without reading data: an absent key's NULL,
    a GROUPING(...) value."""

    value: int | None


#: Where each output of one set comes from: a column of its part's release, or fixed.
Layout = list["int | Fixed"]


@dataclass
class GroupingSetsPlan:
    """One plan per distinct grouping set; released set by set, then concatenated.

    `parts` are the distinct sets' plans and `layouts` where each output (the select
    list's, then one per ORDER BY item) of each comes from; `order` names, for each
    set as written, its part; `texts` shows each distinct set; `names` are the
    released columns; `sort` is the ORDER BY, `limit` and `offset` as written."""

    parts: list[Plan]
    layouts: list[Layout]
    order: list[int]
    texts: list[str]
    names: list[str]
    sort: list[exp.Ordered]
    limit: int | None
    offset: int | None
    sql: str | None = None  # nothing runs as one statement: the Session runs each set

    @property
    def cost(self) -> Cost:
        return sum((part.cost for part in self.parts), Cost())

    @property
    def known_groups(self) -> int | None:
        counts = [getattr(self.parts[index], "known_groups", None) for index in self.order]
        return None if None in counts else sum(counts)

    def release(self, columns: list[str], rows: list[tuple], rng: object) -> Release:
        raise TypeError("a grouping-sets plan is released set by set (Session._release)")

    def combine(self, releases: Sequence[Release], max_groups: int | None = None) -> Release:
        """The query's release from each distinct set's release (in `parts` order)."""
        sources = [(part, row) for part in self.order for row in range(len(releases[part].rows))]
        rows = [
            tuple(
                slot.value if isinstance(slot, Fixed) else releases[part].rows[row][slot]
                for slot in self.layouts[part]
            )
            for part, row in sources
        ]
        width = len(self.names)
        kept = _sorted(rows, width, self.sort)
        start = self.offset or 0
        kept = kept[start : None if self.limit is None else start + self.limit]
        check_groups(len(kept), max_groups)
        accuracy = {}
        for name in self.names:
            combined = _accuracy(name, releases, [sources[i] for i in kept])
            if combined is not None:
                accuracy[name] = combined
        notes = [
            f"GROUPING SETS: {len(self.order)} grouping sets, {len(self.parts)} measured, each "
            f"with 1/{len(self.parts)} of the query's epsilon and delta"
        ]
        for release in releases:
            notes.extend(note for note in release.notes if note not in notes)
        return Release(self.names, [rows[i][:width] for i in kept], accuracy, notes)

    def explain(self) -> list[tuple[str, str]]:
        lines: list[tuple[str, str]] = []
        for number, (text, part) in enumerate(zip(self.texts, self.parts, strict=True), start=1):
            lines.append((f"grouping set {number}", text))
            lines.extend((f"  {item}", detail) for item, detail in part.explain())
        if len(self.order) > len(self.parts):
            lines.append(
                ("repeated sets", "a set written twice is measured once, its rows repeated")
            )
        lines.append((
            "budget",
            f"the query's epsilon and delta split evenly over the {len(self.parts)} grouping "
            f"sets (each unit may add to every set); total {self.cost}, charged once",
        ))  # fmt: skip
        if self.sort or self.limit is not None or self.offset:
            lines.append(("ORDER BY / LIMIT", "applied to the released rows of all sets"))
        return lines


def plan_grouping_sets(
    select: exp.Select,
    policy: Policy,
    plan: Callable[[exp.Select, int, int], Plan],
) -> GroupingSetsPlan:
    """The plan of a query with GROUPING SETS, ROLLUP or CUBE (`has_grouping_sets`).

    `plan(query, index, shares)` plans set `index`'s ordinary GROUP BY query with one
    of `shares` equal shares of the query's budget."""
    _refuse_unsupported(select)
    resolve = _resolver(select, policy)
    sets = expand(select, resolve)
    keys = _distinct(key for grouping in sets for key in grouping)
    identities = [frozenset(map(_text, grouping)) for grouping in sets]
    distinct = list(dict.fromkeys(identities))
    firsts = {identity: sets[identities.index(identity)] for identity in distinct}
    items = [_named(item) for item in select.selects]
    if not any(_aggregates(item.this) for item in items):
        raise QueryRefused(
            f"GROUP BY {_short(select.args['group'])} without an aggregate",
            "grouping sets are released as measurements, one per set",
            "select an aggregate: SELECT a, b, COUNT(*) FROM ... GROUP BY ROLLUP (a, b)",
        )
    order = select.args.get("order")
    sort = [] if order is None else list(order.expressions)
    targets = [_order_target(ordered.this, items) for ordered in sort]
    parts, layouts = [], []
    for index, identity in enumerate(distinct):
        query, layout = _set_query(select, items, targets, firsts[identity], keys, resolve, policy)
        try:
            parts.append(plan(query, index, len(distinct)))
        except QueryRefused as refused:
            raise QueryRefused(
                f"{refused.construct}, in the grouping set {_shown(firsts[identity])}",
                refused.reason,
                refused.hint,
            ) from None
        layouts.append(layout)
    return GroupingSetsPlan(
        parts,
        layouts,
        [distinct.index(identity) for identity in identities],
        [_shown(firsts[identity]) for identity in distinct],
        [item.alias for item in items],
        sort,
        _number(select, "limit"),
        _number(select, "offset"),
    )


def expand(
    select: exp.Select, resolve: Callable[[exp.Expression], exp.Expression]
) -> list[list[exp.Expression]]:
    """The grouping sets of `select`'s GROUP BY in PostgreSQL's order: the product of its
    items' sets, the first item varying slowest; each key as `resolve` reads it (a
    position or an output alias as its select item). Refuses more than MAX_SETS before
    building them."""
    group = select.args["group"]
    choices = [_item_sets(element, resolve) for element in group.expressions]
    count = math.prod(len(choice) for choice in choices)
    if count > MAX_SETS:
        raise QueryRefused(
            f"GROUP BY {_short(group)}",
            f"it expands to {count:,} grouping sets, more than the {MAX_SETS} dpsql measures in "
            "one query (each set gets an equal share of the query's epsilon, so each would be "
            "mostly noise)",
            "ask for the sets you need with GROUPING SETS ((a, b), (a), ()), or split the "
            "query into several",
        )
    return [[key for part in product for key in part] for product in itertools.product(*choices)]


def _item_sets(
    element: exp.Expression, resolve: Callable[[exp.Expression], exp.Expression]
) -> list[list[exp.Expression]]:
    """The grouping sets one GROUP BY item stands for, each a list of keys."""
    if isinstance(element, exp.Rollup | exp.Cube):
        parts = [_keys(e, resolve) for e in element.expressions]
        if isinstance(element, exp.Rollup):
            picks = [[n < cut for n in range(len(parts))] for cut in range(len(parts), -1, -1)]
        else:
            picks = [list(pick) for pick in itertools.product([True, False], repeat=len(parts))]
        return [
            [key for part, keep in zip(parts, pick, strict=True) if keep for key in part]
            for pick in picks
        ]
    if isinstance(element, exp.GroupingSets):
        found = []
        for inner in element.expressions:
            if isinstance(inner, _SET_FORMS):  # nested: its sets, in place
                found.extend(_item_sets(inner, resolve))
            else:
                found.append(_keys(inner, resolve))
        return found
    return [_keys(element, resolve)]


def _keys(
    element: exp.Expression, resolve: Callable[[exp.Expression], exp.Expression]
) -> list[exp.Expression]:
    """The keys of one set element: a parenthesised list or one expression."""
    if isinstance(element, exp.Tuple):
        return [key for inner in element.expressions for key in _keys(inner, resolve)]
    if isinstance(element, exp.Paren):
        return _keys(element.this, resolve)
    return [resolve(element)]


def _resolver(select: exp.Select, policy: Policy) -> Callable[[exp.Expression], exp.Expression]:
    """How a key in GROUP BY (or GROUPING's argument) reads: a position as its select
    item, an output alias that names no column of the policy's tables as its item
    (PostgreSQL prefers the input column), anything else as written."""
    items = [_unaliased(item) for item in select.selects]
    aliases = {
        item.alias.lower(): item.this for item in select.selects if isinstance(item, exp.Alias)
    }
    columns = {name.lower() for table in policy.tables.values() for name in table.columns}

    def resolve(key: exp.Expression) -> exp.Expression:
        item = _item_at(key, items, "GROUP BY")
        if item is not None:
            return item
        if isinstance(key, exp.Column) and not key.table:
            name = key.name.lower()
            if name in aliases and name not in columns:
                return aliases[name].copy()
        return key.copy()

    return resolve


def _refuse_unsupported(select: exp.Select) -> None:
    """Refuse, before anything runs, the grouping-sets queries dpsql cannot protect."""
    if select.find(exp.Window) is not None:
        raise QueryRefused(
            "a window function (a running total) with GROUPING SETS, ROLLUP or CUBE",
            "a running total is a continual release of one grouping; dpsql does not run one "
            "over several grouping sets",
            "run the running total as its own query over one GROUP BY, and the grouping "
            "sets without the window",
        )
    if select.args.get("distinct") is not None:
        raise QueryRefused(
            "SELECT DISTINCT with GROUPING SETS, ROLLUP or CUBE",
            "each grouping set is released on its own, so rows are not compared across sets",
            "drop DISTINCT: the rows of one set are distinct already",
        )
    group = select.args["group"]
    if group.args.get("all") or group.args.get("totals"):
        raise QueryRefused(
            f"GROUP BY {_short(group)}",
            "GROUP BY ALL or WITH TOTALS together with grouping sets has no one meaning",
            "list the grouping sets: GROUP BY GROUPING SETS ((a, b), (a), ())",
        )


def _set_query(
    select: exp.Select,
    items: list[exp.Alias],
    targets: list[exp.Expression],
    grouping: list[exp.Expression],
    keys: list[exp.Expression],
    resolve: Callable[[exp.Expression], exp.Expression],
    policy: Policy,
) -> tuple[exp.Select, Layout]:
    """The ordinary GROUP BY query of one grouping set, and where each output comes from.

    An output that is an absent key or GROUPING(...) is fixed, not selected (a quantile
    query stays a plain projection); inside other outputs and HAVING, absent keys read
    as typed NULLs and GROUPING(...) as its constant, outside the aggregates. Each
    ORDER BY item not in the select list is a hidden output; ORDER BY and LIMIT apply
    to all sets' rows."""
    present = {_text(key) for key in grouping}
    nulls = {_text(key): _typed_null(key, policy) for key in keys if _text(key) not in present}
    known = {_text(key) for key in keys}

    def per_set(node: exp.Expression) -> exp.Expression:
        return _substituted(
            node.copy(), nulls, lambda call: _grouping_value(call, resolve, known, present)
        )

    selected: list[exp.Expression] = []
    layout: Layout = []
    written = [_text(item.this) for item in items]
    outputs = [(item.this, item.args["alias"].copy()) for item in items]
    outputs += [(t, exp.to_identifier(_hidden_name(n, items))) for n, t in enumerate(targets)]
    for number, (expression, alias) in enumerate(outputs):
        if number >= len(items) and _text(expression) in written:  # ORDER BY a selected item
            layout.append(layout[written.index(_text(expression))])
            continue
        value = per_set(expression)
        if _text(expression) in nulls:
            layout.append(Fixed(None))
        elif isinstance(expression, exp.Grouping):
            layout.append(Fixed(int(value.this)))
        else:
            layout.append(len(selected))
            selected.append(exp.alias_(value, alias))
    query = select.copy()
    for arg in ("order", "limit", "offset"):
        query.set(arg, None)
    query.set("expressions", selected)
    having = select.args.get("having")
    if having is not None:
        query.set("having", exp.Having(this=per_set(having.this)))
    grouped = _distinct(grouping)
    query.set("group", exp.Group(expressions=grouped) if grouped else None)
    return query, layout


def _substituted(
    node: exp.Expression,
    nulls: dict[str, exp.Expression],
    grouping: Callable[[exp.Grouping], int],
) -> exp.Expression:
    """`node` with GROUPING(...) as its constant and the absent keys as typed NULLs, outside
    aggregates (an aggregate reads the set's rows, keys and all)."""
    if isinstance(node, exp.Grouping):
        return exp.Literal.number(grouping(node))
    if _is_aggregate(node):
        return node
    null = nulls.get(_text(node))
    if null is not None:
        return null.copy()
    for name, value in list(node.args.items()):
        if isinstance(value, exp.Expression):
            node.set(name, _substituted(value, nulls, grouping))
        elif isinstance(value, list):
            node.set(name, [
                _substituted(v, nulls, grouping) if isinstance(v, exp.Expression) else v
                for v in value
            ])  # fmt: skip
    return node


def _grouping_value(
    call: exp.Grouping,
    resolve: Callable[[exp.Expression], exp.Expression],
    known: set[str],
    present: set[str],
) -> int:
    """GROUPING(a, b, ...) in one set: a bit per argument, the first the highest, 1 where
    the argument is not in the set (PostgreSQL's and DuckDB's definition)."""
    value = 0
    for argument in call.expressions:
        text = _text(resolve(argument))
        if text not in known:
            raise QueryRefused(
                f"GROUPING({argument.sql()})",
                f"{argument.sql()} is not one of the query's grouping keys",
                "pass GROUPING only expressions written in GROUP BY",
            )
        value = value * 2 + (text not in present)
    return value


def _order_target(target: exp.Expression, items: list[exp.Alias]) -> exp.Expression:
    """An ORDER BY item's expression, an output alias or position read as its item."""
    item = _item_at(target, [item.this for item in items], "ORDER BY")
    if item is not None:
        return item
    if isinstance(target, exp.Column) and not target.table:
        for item in items:
            if item.alias.lower() == target.name.lower():
                return item.this.copy()
    return target.copy()


def _item_at(
    node: exp.Expression, items: list[exp.Expression], clause: str
) -> exp.Expression | None:
    """The select item a position names (`GROUP BY ROLLUP (1, 2)`, `ORDER BY 3`); None for
    anything but a number."""
    position = select_position(node, len(items), clause)
    return None if position is None else items[position - 1].copy()


def _sorted(rows: list[tuple], width: int, sort: list[exp.Ordered]) -> list[int]:
    """The rows' order under ORDER BY on the hidden outputs (stable: sets stay in order)."""
    order = list(range(len(rows)))
    for number, ordered in reversed(list(enumerate(sort))):
        column = width + number
        present = [i for i in order if rows[i][column] is not None]
        missing = [i for i in order if rows[i][column] is None]
        try:
            present.sort(key=lambda i: rows[i][column], reverse=bool(ordered.args.get("desc")))
        except TypeError:
            raise QueryRefused(
                "ORDER BY over grouping sets",
                "its values do not compare with each other",
                "order by one column of one type",
            ) from None
        order = missing + present if ordered.args.get("nulls_first") else present + missing
    return order


def _accuracy(
    name: str, releases: Sequence[Release], sources: list[tuple[int, int]]
) -> Accuracy | None:
    """One column's accuracy over the concatenated rows: the sets' own when they agree,
    else one 95% interval per row from the set the row comes from."""
    found = [release.accuracy.get(name) for release in releases]
    if all(accuracy is None for accuracy in found):
        return None
    if all(accuracy == found[0] for accuracy in found) and found[0].intervals is None:
        return found[0]
    widest = max((a for a in found if a is not None), key=lambda a: a.scale)
    intervals = []
    for part, row in sources:
        accuracy = found[part]
        value = releases[part].rows[row][releases[part].columns.index(name)]
        interval = accuracy.interval(row, value) if accuracy is not None else None
        if interval is None:
            return Accuracy(widest.mechanism, widest.scale, None, widest.sensitivity,
                            "varies per grouping set; EXPLAIN shows each set's noise")  # fmt: skip
        intervals.append(interval)
    return Accuracy(
        widest.mechanism, widest.scale, None, widest.sensitivity,
        "per grouping set: each row's 95% interval is its own set's", tuple(intervals),
    )  # fmt: skip


def _is_aggregate(node: exp.Expression) -> bool:
    """Whether `node` is an aggregate that reads the rows (GROUPING reads none)."""
    return isinstance(node, (exp.AggFunc, *ORDER_STATISTICS)) and not isinstance(node, exp.Grouping)


def _aggregates(node: exp.Expression) -> bool:
    """Whether `node` holds an aggregate that reads the rows."""
    return any(_is_aggregate(inner) for inner in node.walk())


def _typed_null(key: exp.Expression, policy: Policy) -> exp.Expression:
    kind = (column_types(exp.select(key.copy()), policy) or [""])[0]
    return exp.cast(exp.null(), _NULL_TYPES[kind]) if kind in _NULL_TYPES else exp.null()


def _named(item: exp.Expression) -> exp.Alias:
    """A select item with the name it is released under as its alias, the same in every
    set (an absent key, replaced by NULL, keeps its name)."""
    if isinstance(item, exp.Alias):
        return item
    return exp.alias_(item.copy(), output_name(item), quoted=True)


def _unaliased(item: exp.Expression) -> exp.Expression:
    return item.this if isinstance(item, exp.Alias) else item


def _hidden_name(number: int, items: list[exp.Alias]) -> str:
    taken = {item.alias.lower() for item in items}
    name = f"dpsql_order_{number}"
    while name in taken:
        name = f"_{name}"
    return name


def _text(node: exp.Expression) -> str:
    return node.sql().lower()


def _shown(grouping: list[exp.Expression]) -> str:
    return f"({', '.join(key.sql() for key in _distinct(grouping))})"


def _short(group: exp.Group) -> str:
    return group.sql().removeprefix("GROUP BY ")[:80]


def _distinct(keys: Iterable[exp.Expression]) -> list[exp.Expression]:
    """The keys without repeats, in first order."""
    seen: dict[str, exp.Expression] = {}
    for key in keys:
        seen.setdefault(_text(key), key)
    return list(seen.values())


def _number(select: exp.Select, arg: str) -> int | None:
    node = select.args.get(arg)
    if node is None:
        return None
    value = node.expression if isinstance(node, exp.Limit | exp.Offset) else node
    if isinstance(value, exp.Literal) and not value.is_string:
        return int(value.this)
    raise QueryRefused(
        f"{arg.upper()} {value.sql()}",
        f"with grouping sets, {arg.upper()} must be a whole number",
        f"write {arg.upper()} 10",
    )
