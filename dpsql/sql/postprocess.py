"""Post-processing of a noisy release: the select list, HAVING, ORDER BY and LIMIT.

It only ever sees released (noisy) values and public keys, so it spends no
budget. Plain projections are picked in Python, and so are bare outputs
ordered by released columns with LIMIT and OFFSET (sorting needs no SQL
evaluator, and one DuckDB statement costs about 0.4 ms, more than the rest of
a release); anything with expressions or HAVING is evaluated by a private
in-memory DuckDB over the released arrays, rather than by a hand-written SQL
evaluator.
"""

from __future__ import annotations

import threading

import duckdb
import numpy as np
from sqlglot import exp

from dpsql.errors import DataError
from dpsql.sql.analysis import KEY_PREFIX, VALUE_PREFIX, Analysis

RELEASED = "__dpsql_released"
_OUTPUT_PREFIX = "__dpsql_o"  # the select list's outputs, in order
_POSITION = "__dpsql_position"  # a released row's place in key order
_local = threading.local()


def _connection() -> duckdb.DuckDBPyConnection:
    # one in-memory database per thread: DuckDB connections are not thread-safe
    if not hasattr(_local, "connection"):
        connection = duckdb.connect(":memory:")
        connection.execute("SET enable_external_access = false")
        _local.connection = connection
    return _local.connection


def project(
    analysis: Analysis, keys: list[tuple], values: list[np.ndarray]
) -> tuple[list[str], list[tuple]]:
    """The final columns and rows from released keys and aggregate values."""
    names, rows, _ = project_rows(analysis, keys, values)
    return names, rows


def project_rows(
    analysis: Analysis, keys: list[tuple], values: list[np.ndarray]
) -> tuple[list[str], list[tuple], list[int]]:
    """The final columns and rows, and for each final row the released group it comes
    from (its index in `keys`): what HAVING, ORDER BY and LIMIT kept, in their order, so
    per-group accuracy (AVG's intervals) follows its row."""
    names = [output.name for output in analysis.outputs]
    columns = {f"{KEY_PREFIX}{i}": [key[i] for key in keys] for i in range(len(analysis.keys))}
    columns.update({f"{VALUE_PREFIX}{j}": v for j, v in enumerate(values)})
    if analysis.is_plain_projection:
        picked = [_python_values(columns[out.expression.name]) for out in analysis.outputs]
        rows = list(zip(*picked, strict=True)) if picked else []
        return names, rows, list(range(len(rows)))
    ordered = _sorted_in_python(analysis, columns)
    if ordered is not None:
        return names, *ordered
    evaluated = _evaluate(analysis, columns)
    return names, [row[:-1] for row in evaluated], [row[-1] for row in evaluated]


def _sorted_in_python(
    analysis: Analysis, columns: dict[str, list | np.ndarray]
) -> tuple[list[tuple], list[int]] | None:
    """Bare outputs ordered by released columns, with LIMIT and OFFSET, as DuckDB
    would order them (each item's NULL placement as parsed), and the group of each;
    None when the query needs more (HAVING, expressions) or its values do not compare."""
    if analysis.having is not None or not analysis.outputs:
        return None
    if not all(isinstance(out.expression, exp.Column) for out in analysis.outputs):
        return None
    sort_by = []
    for ordered in analysis.order:
        name = _released_column(_order_item(ordered, analysis).this, analysis)
        if name is None:
            return None
        sort_by.append((_python_values(columns[name]), ordered))
    outputs = [_python_values(columns[out.expression.name]) for out in analysis.outputs]
    order = list(range(len(outputs[0])))
    try:
        for values, ordered in reversed(sort_by):  # stable sorts, last item first
            present = [i for i in order if values[i] is not None]
            missing = [i for i in order if values[i] is None]
            present.sort(key=values.__getitem__, reverse=bool(ordered.args.get("desc")))
            order = missing + present if ordered.args.get("nulls_first") else present + missing
    except TypeError:
        return None
    start = analysis.offset or 0
    end = None if analysis.limit is None else start + analysis.limit
    kept = order[start:end]
    return [tuple(column[i] for column in outputs) for i in kept], kept


def _released_column(target: exp.Expression, analysis: Analysis) -> str | None:
    """The released column an ORDER BY target names, if it is one."""
    if not isinstance(target, exp.Column) or not target.name.startswith("__dpsql"):
        return None
    name = target.name
    if name.startswith(_OUTPUT_PREFIX):
        expression = analysis.outputs[int(name.removeprefix(_OUTPUT_PREFIX))].expression
        return expression.name if isinstance(expression, exp.Column) else None
    return name if name.startswith((KEY_PREFIX, VALUE_PREFIX)) else None


def _python_values(column: list | np.ndarray) -> list:
    return column.tolist() if isinstance(column, np.ndarray) else list(column)


def _evaluate(analysis: Analysis, columns: dict[str, list | np.ndarray]) -> list[tuple]:
    """The final rows, each followed by the position of the released group it comes from."""
    columns[_POSITION] = np.arange(len(next(iter(columns.values()), [])))
    query = exp.select(
        *[
            out.expression.copy().as_(f"{_OUTPUT_PREFIX}{i}")
            for i, out in enumerate(analysis.outputs)
        ],
        exp.column(_POSITION),
    ).from_(RELEASED)
    if analysis.having is not None:
        query = query.where(analysis.having.copy())
    if analysis.order:
        query = query.order_by(*[_order_item(o, analysis) for o in analysis.order])
    elif query.find(exp.Window) is not None:
        # a window reorders rows: keep the release's key order, as without one
        query = query.order_by(exp.column(_POSITION))
    if analysis.limit is not None:
        query = query.limit(analysis.limit)
    if analysis.offset is not None:
        query = query.offset(analysis.offset)
    return query_released(columns, query)


def query_released(columns: dict[str, list | np.ndarray], query: exp.Select) -> list[tuple]:
    """Run `query` (FROM the table RELEASED) over released or public columns."""
    arrays = {
        name: value if isinstance(value, np.ndarray) else np.array(value, dtype=object)
        for name, value in columns.items()
    }
    if not arrays:
        return []
    cursor = _connection().cursor()
    try:
        cursor.register(RELEASED, arrays)
        return cursor.execute(query.sql(dialect="duckdb", copy=False)).fetchall()
    except duckdb.Error as exc:
        # It ran on noisy values only, so its message reveals nothing more than they do.
        raise DataError(
            "the select list, HAVING or ORDER BY failed on the noisy values "
            f"({str(exc).splitlines()[0]}); the query was charged. Instead: write expressions "
            "that hold for any value, e.g. CAST(COUNT(*) AS BIGINT), or compute them yourself "
            "from the released aggregates"
        ) from None
    finally:
        cursor.close()


def _order_item(ordered: exp.Ordered, analysis: Analysis) -> exp.Ordered:
    """ORDER BY an output alias refers to the output column of the same name."""
    target = ordered.this
    if isinstance(target, exp.Column) and not target.name.startswith("__dpsql"):
        names = [out.name.lower() for out in analysis.outputs]
        target = exp.column(f"{_OUTPUT_PREFIX}{names.index(target.name.lower())}")
    elif isinstance(target, exp.Literal):
        target = exp.column(f"{_OUTPUT_PREFIX}{int(target.this) - 1}")
    return exp.Ordered(
        this=target, desc=ordered.args.get("desc"), nulls_first=ordered.args.get("nulls_first")
    )
