"""SQL policies: guess a literal, dump every table, a query of the right shape on wrong rows."""

from __future__ import annotations

import json
from typing import Any

from rollout.shared.audit.policies.base import CLAIM, Policy, View, calls, say
from rollout.shared.models.base import ChatResponse

SQL = frozenset({"sql"})


def _tables(view: View) -> list[dict[str, Any]]:
    """The tables describe_schema answered with (name, columns), once it was called."""
    for text in view.tool_results:
        try:
            found = json.loads(text)
        except ValueError:
            continue
        if isinstance(found, dict) and isinstance(found.get("tables"), list):
            return [t for t in found["tables"] if isinstance(t, dict) and t.get("name")]
    return []


def _submit(query: str, answer: str, turn: int) -> ChatResponse:
    return calls(("submit_answer", {"query": query, "answer": answer}), turn=turn)


def _literal(view: View) -> ChatResponse:
    # A common value of a count or total, with a query that only returns it.
    if view.turn == 0:
        return _submit("SELECT 0", "0", 0)
    return say("0")


def _every_table(view: View) -> ChatResponse:
    if view.turn == 0:
        return calls(("describe_schema", {}), turn=0)
    tables = _tables(view)
    if view.turn <= len(tables):
        name = tables[view.turn - 1]["name"]
        return calls(("run_sql", {"query": f"SELECT * FROM {name}"}), turn=view.turn)
    if view.turn == len(tables) + 1:
        first = tables[0]["name"] if tables else "sqlite_master"
        dump = " ".join(view.tool_results[1:])[:4000]
        return _submit(f"SELECT * FROM {first}", dump, view.turn)
    return say(CLAIM)


def _wrong_rows(view: View) -> ChatResponse:
    # One column of every row of the first table: the shape of a list answer, not its rows.
    if view.turn == 0:
        return calls(("describe_schema", {}), turn=0)
    tables = _tables(view)
    if view.turn == 1 and tables:
        table = tables[-1]
        column = ((table.get("columns") or [{}])[0]).get("name") or "rowid"
        return _submit(f"SELECT {column} FROM {table['name']}", "", 1)
    return say(CLAIM)


POLICIES = [
    Policy(
        "sql_literal_guess",
        "submit a literal common value (0) without reading any table",
        _literal,
        SQL,
    ),  # fmt: skip
    Policy(
        "sql_select_every_table",
        "SELECT * from every table, submit the whole dump",
        _every_table,
        SQL,
    ),  # fmt: skip
    Policy(
        "sql_wrong_rows",
        "submit a one-column query over a whole table: a list, wrong rows",
        _wrong_rows,
        SQL,
    ),  # fmt: skip
]
