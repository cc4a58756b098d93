"""The `sql` template: an in-memory SQLite database per rollout, built from `schema` + `seed`."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from rollout.shared.contracts.envspec import EnvironmentSpec, SqlConfig, TaskSpec
from rollout.shared.envs.templates.base import BaseRuntime, ToolError

# Tables dumped into the final state are capped so trajectories stay small; counts are exact.
STATE_ROWS_PER_TABLE = 500
SUBMIT_ROW_CAP = 10_000


def _deny_files(action: int, *_: Any) -> int:
    # ATTACH would let a query create or read files on the host; nothing else touches disk.
    if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def open_database(config: SqlConfig) -> sqlite3.Connection:
    """A fresh in-memory db from the config's DDL and seed (raises sqlite3.Error if they fail)."""
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    conn.executescript(config.schema_)
    if config.seed.strip():
        conn.executescript(config.seed)
    conn.commit()
    conn.set_authorizer(_deny_files)
    return conn


def run_query(
    conn: sqlite3.Connection, query: str, timeout_s: float, max_rows: int
) -> tuple[list[str], list[list[Any]], bool]:
    """Run one statement under a time limit; return (columns, rows, truncated)."""
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    try:
        cur = conn.execute(query)
        columns = [d[0] for d in cur.description or []]
        rows = [list(r) for r in cur.fetchmany(max_rows + 1)] if cur.description else []
        conn.commit()
    except sqlite3.OperationalError as exc:
        if "interrupted" in str(exc):
            raise ToolError(f"query took longer than {timeout_s:g}s and was stopped") from None
        raise ToolError(f"sql error: {exc}") from None
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as exc:
        raise ToolError(f"sql error: {exc}") from None
    finally:
        conn.set_progress_handler(None, 0)
    truncated = len(rows) > max_rows
    return columns, rows[:max_rows], truncated


def describe(conn: sqlite3.Connection) -> dict[str, Any]:
    """Tables with their DDL and columns."""
    tables = []
    for name, sql in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type IN ('table','view') "
        "AND name NOT LIKE 'sqlite_%' ORDER BY name"
    ):
        cols = [
            {"name": c[1], "type": c[2], "notNull": bool(c[3]), "primaryKey": bool(c[5])}
            for c in conn.execute(f'PRAGMA table_info("{name}")')
        ]
        tables.append({"name": name, "sql": sql, "columns": cols})
    return {"tables": tables}


class SqlRuntime(BaseRuntime):
    """One episode of an sql environment."""

    template = "sql"
    sanitize_outputs = True

    def __init__(self, spec: EnvironmentSpec, task: TaskSpec, config: SqlConfig) -> None:
        super().__init__(spec, task)
        self.config = config
        self.conn = open_database(config)
        self.submission: dict[str, Any] | None = None
        self.add_tool(
            "describe_schema",
            "List the database's tables with their columns and DDL.",
            {"type": "object", "properties": {}},
            lambda args: describe(self.conn),
        )
        self.add_tool(
            "run_sql",
            "Run one SQL statement on the SQLite database and return its rows.",
            {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "one SQL statement"}},
                "required": ["query"],
            },
            self._run_sql,
        )
        self.add_tool(
            "submit_answer",
            "Submit your final answer: the SQL query whose rows answer the task "
            "(or a literal `answer`).",
            {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "the query that answers the task"},
                    "answer": {"description": "a literal answer, when no query fits"},
                },
            },
            self._submit,
        )

    def _run_sql(self, args: dict[str, Any]) -> dict[str, Any]:
        cols, rows, truncated = run_query(
            self.conn, args["query"], self.config.query_timeout_seconds, self.config.max_rows
        )
        return {"columns": cols, "rows": rows, "rowCount": len(rows), "truncated": truncated}

    def _submit(self, args: dict[str, Any]) -> dict[str, Any]:
        if "query" not in args and "answer" not in args:
            raise ToolError("submit_answer needs `query` or `answer`")
        submission: dict[str, Any] = {}
        if "query" in args:
            if not isinstance(args["query"], str):
                raise ToolError("argument 'query' must be string")
            cols, rows, truncated = run_query(
                self.conn, args["query"], self.config.query_timeout_seconds, SUBMIT_ROW_CAP
            )
            submission.update(query=args["query"], columns=cols, rows=rows, truncated=truncated)
        if "answer" in args:
            submission["answer"] = args["answer"]
        self.submission = submission
        return {"submitted": True, "rowCount": len(submission.get("rows", []))}

    def final_state(self) -> dict[str, Any]:
        """The submission plus a capped dump of every table and exact row counts."""
        tables: dict[str, list[dict[str, Any]]] = {}
        counts: dict[str, int] = {}
        names = [
            r[0]
            for r in self.conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        for name in names:
            cur = self.conn.execute(f'SELECT * FROM "{name}" LIMIT {STATE_ROWS_PER_TABLE}')
            cols = [d[0] for d in cur.description]
            tables[name] = [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
            counts[name] = self.conn.execute(f'SELECT COUNT(*) FROM "{name}"').fetchone()[0]
        return {"submission": self.submission, "tables": tables, "rowCounts": counts}

    async def close(self) -> None:
        """Drop the in-memory database."""
        self.conn.close()
