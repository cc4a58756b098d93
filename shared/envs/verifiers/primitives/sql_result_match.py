"""`sql_result_match`: the submitted query's rows equal the reference rows."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from rollout.shared.contracts.envspec import CamelModel
from rollout.shared.envs.compare import canonical, multiset_equal, normalise, short
from rollout.shared.envs.templates.sql import SUBMIT_ROW_CAP, SqlConfig, open_database, run_query
from rollout.shared.envs.verifiers.primitives.common import binary
from rollout.shared.envs.verifiers.registry import (
    Outcome,
    ScoreContext,
    register,
)


class SqlResultMatchParams(CamelModel):
    """`sql_result_match`: the submitted rows equal a reference query's rows (or given rows)."""

    query: str | None = None
    rows: list[Any] | None = None
    order_matters: bool | None = None


def _rows_as(rows: list[Any], columns: list[str], like: list[Any]) -> list[Any]:
    """Shape actual rows like the expected ones: dicts by column name, or plain lists."""
    if like and isinstance(like[0], dict):
        return [dict(zip(columns, r, strict=False)) if isinstance(r, list) else r for r in rows]
    return rows


def _expected_rows(p: SqlResultMatchParams, ctx: ScoreContext) -> tuple[list[Any], str]:
    """The reference rows (given, or from the reference query: blocking, run it in a thread)."""
    gt = ctx.ground_truth if isinstance(ctx.ground_truth, dict) else {}
    rows = p.rows if p.rows is not None else gt.get("rows")
    query = p.query or (gt.get("query") if rows is None else None)
    if rows is not None:
        return [r if isinstance(r, list | dict) else [r] for r in rows], "expected rows"
    if not query:
        raise ValueError("no reference: give params.query / params.rows or ground truth query/rows")
    if not isinstance(ctx.config, SqlConfig):
        raise ValueError("a reference query needs the sql template's config")

    _, ref = _on_fresh_data(ctx.config, query)
    return ref, "the reference query's rows"


def _on_fresh_data(config: SqlConfig, query: str) -> tuple[list[str], list[Any]]:
    """(columns, rows) of `query` on a fresh copy of the task's data (blocking)."""
    conn = open_database(config)
    try:
        columns, rows, _ = run_query(conn, query, config.query_timeout_seconds * 5, SUBMIT_ROW_CAP)
    finally:
        conn.close()
    return columns, rows


def _submitted_rows(sub: dict[str, Any], ctx: ScoreContext) -> tuple[list[str], list[Any]]:
    """(columns, rows) of the submitted query run again on a fresh copy of the task's data.

    Not the rows it returned in the episode: the model may have changed the data first
    (`DELETE ... WHERE id > 3`, then `SELECT COUNT(*)` gives the expected count), and the
    reference rows come from the data as seeded. Blocking: run it in a thread.
    """
    query = sub.get("query")
    if not isinstance(ctx.config, SqlConfig) or not isinstance(query, str):
        # Rows given without the sql template's data: only the episode's rows are known.
        return sub.get("columns") or [], sub.get("rows") or []
    return _on_fresh_data(ctx.config, query)


def _one_value(rows: list[Any]) -> tuple[bool, Any]:
    """(True, value) when the rows are exactly one row of one column."""
    if len(rows) != 1:
        return False, None
    row = rows[0]
    values = list(row.values()) if isinstance(row, dict) else list(row)
    return (True, values[0]) if len(values) == 1 else (False, None)


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip().replace(",", ""))
        except ValueError:
            return None
    return None


def _literal_matches(answer: Any, expected: Any) -> bool:
    """Numbers by value (`125` == `125.0` == `"125"`), strings trimmed, NULL as null."""
    if expected is None:
        return answer is None or (isinstance(answer, str) and answer.strip().upper() == "NULL")
    if isinstance(expected, int | float) and not isinstance(expected, bool):
        got = _as_number(answer)
        return got is not None and math.isclose(got, float(expected), rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(expected, bytes):
        return False
    text = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
    return text.strip() == str(expected).strip()


def _shape(rows: list[Any]) -> str:
    width = len(rows[0]) if rows and isinstance(rows[0], list | dict) else 0
    return f"{len(rows)} row(s) of {width} column(s)"


@register(
    "sql_result_match",
    SqlResultMatchParams,
    templates=("sql",),
    truth_fields={"query": "query", "rows": "rows", "orderMatters": "order_matters"},
)
async def sql_result_match(p: SqlResultMatchParams, ctx: ScoreContext) -> Outcome:
    """The submitted query's rows equal the reference rows (as a multiset unless order matters).

    A literal `answer` (no query) is compared with the reference when the reference is one
    value: numbers by value (`125` matches `125.0`), strings trimmed.
    """
    sub = ctx.state.get("submission")
    literal = isinstance(sub, dict) and "rows" not in sub and "answer" in sub
    if not isinstance(sub, dict) or ("rows" not in sub and not literal):
        return binary(False, "nothing submitted (submit_answer with `query` or `answer`)")
    try:
        expected, what = await asyncio.to_thread(_expected_rows, p, ctx)
    except Exception as exc:  # a broken reference is the env author's bug: say so
        return binary(False, f"reference failed: {exc}")
    if literal:
        single, value = _one_value(expected)
        answer = sub.get("answer")
        if not single:
            return binary(
                False,
                f"a literal answer can only match a one-value result, but {what} are "
                f"{_shape(expected)}: submit the query instead",
            )
        ok = _literal_matches(answer, value)
        return binary(
            ok, f"answer {short(answer, 80)} {'==' if ok else '!='} {short(value, 80)} ({what})"
        )
    try:
        columns, rows = await asyncio.to_thread(_submitted_rows, sub, ctx)
    except Exception as exc:  # noqa: BLE001 - the model's query: its failure is a verdict
        return binary(False, f"the submitted query fails on the task's data: {exc}")
    actual = _rows_as(rows, columns, expected)
    gt = ctx.ground_truth if isinstance(ctx.ground_truth, dict) else {}
    ordered = p.order_matters if p.order_matters is not None else bool(gt.get("orderMatters"))
    if ordered:
        ok = [canonical(r) for r in expected] == [canonical(r) for r in actual]
    else:
        ok = multiset_equal(expected, actual)
    mode = "in order" if ordered else "as a multiset"
    if ok:
        return binary(True, f"{len(actual)} row(s) equal {what} {mode}")
    return binary(
        False,
        f"rows differ from {what} {mode}: expected {short(normalise(expected))}, "
        f"got {short(normalise(actual))}",
    )
