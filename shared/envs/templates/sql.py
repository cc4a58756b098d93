"""The `sql` template: an in-memory SQLite database per rollout, built from `schema` + `seed`.

Schema, seed, the agent's queries and the verifier's reference queries all run under one
authorizer (no ATTACH or VACUUM INTO, no file-touching pragma, no extension loading) with a
time limit; queries run in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel, EnvironmentSpec, TaskSpec
from rollout.shared.envs.templates.base import BaseRuntime, ToolError, json_safe
from rollout.shared.envs.templates.protocol import STATE_MATCH, Plan, Template
from rollout.shared.errors import RolloutError

# The config of its specs: a contract (schemas/templates/<name>.json is generated from it).


class SqlConfig(CamelModel):
    """Config of the `sql` template: DDL plus optional INSERTs, one SQLite db per rollout."""

    schema_: str = Field(alias="schema", min_length=1)
    seed: str = ""
    max_rows: int = Field(default=200, ge=1, le=100_000)
    query_timeout_seconds: float = Field(default=2.0, gt=0, le=60)


# Tables dumped into the final state are capped so trajectories stay small; counts are exact.
STATE_ROWS_PER_TABLE = 500
SUBMIT_ROW_CAP = 10_000


# Pragmas that only read or set per-connection behaviour; anything else (e.g. one naming a file
# or directory, or changing how data is written to disk) is refused.
_ALLOWED_PRAGMAS = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_list",
        "index_info",
        "index_xinfo",
        "foreign_key_list",
        "foreign_key_check",
        "foreign_keys",
        "recursive_triggers",
        "case_sensitive_like",
        "defer_foreign_keys",
        "integrity_check",
        "quick_check",
        "collation_list",
        "function_list",
        "user_version",
    }
)
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
# A single string or blob this large means a runaway expression (zeroblob(1e9)), not data.
MAX_VALUE_BYTES = 10_000_000


class SqlConfigError(RolloutError):
    """The config's `schema` or `seed` failed or was refused; `where` names which."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.detail = message


def quote_ident(name: str) -> str:
    """An SQLite identifier quoted so any name (`a"b`, `drop table`) is taken literally."""
    return '"' + name.replace('"', '""') + '"'


def _authorizer(denied: list[str]) -> Any:
    """The one authorizer for schema, seed, queries and references: no files, no extensions."""

    def check(action: int, arg1: str | None, arg2: str | None, *_: Any) -> int:
        # ATTACH (and VACUUM INTO, which SQLite authorizes as ATTACH) would create or read
        # files on the host; nothing else an in-memory database does touches disk.
        if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            denied.append("ATTACH/DETACH (and VACUUM INTO) are not allowed: no file access")
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() not in _ALLOWED_PRAGMAS:
            denied.append(f"PRAGMA {arg1} is not allowed")
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
            denied.append(f"{arg2}() is not allowed: no extensions or file access")
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    return check


class GuardedConnection(sqlite3.Connection):
    """A connection that remembers what its authorizer refused, to name it in the error."""

    denied: list[str]


def _explain(exc: Exception, denied: list[str]) -> str:
    """The error as a person can act on it: what the authorizer refused, when it did."""
    if denied and ("not authorized" in str(exc) or "authorization denied" in str(exc)):
        return f"not authorized: {denied[-1]}"
    return str(exc)


def _lenient_text(data: bytes) -> str:
    """TEXT as str, whatever bytes the agent stored (`CAST(x'ff' AS TEXT)`)."""
    return data.decode("utf-8", "replace")


def _with_deadline(conn: sqlite3.Connection, timeout_s: float, every: int = 1000) -> None:
    """Stop what `conn` runs after `timeout_s`, checked every `every` VM instructions."""
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), every)


def open_database(config: SqlConfig) -> GuardedConnection:
    """A fresh in-memory db from the config's DDL and seed, run under the query authorizer.

    Raises SqlConfigError naming `config.schema` or `config.seed` when either fails, is refused
    (ATTACH, a file-touching pragma, load_extension) or runs past its time limit.
    """
    conn = sqlite3.connect(":memory:", check_same_thread=False, factory=GuardedConnection)
    denied = conn.denied = []
    conn.set_authorizer(_authorizer(denied))
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    limit = config.query_timeout_seconds * 5
    for where, script in (("config.schema", config.schema_), ("config.seed", config.seed)):
        if not script.strip():
            continue
        denied.clear()
        _with_deadline(conn, limit)
        try:
            conn.executescript(script)
            problem = None
        except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as exc:
            if "interrupted" in str(exc):
                problem = f"took longer than {limit:g}s and was stopped"
            else:
                problem = _explain(exc, denied)
        conn.set_progress_handler(None, 0)
        if problem is not None:
            conn.close()
            raise SqlConfigError(where, problem)
    conn.commit()
    return conn


def run_query(
    conn: sqlite3.Connection, query: str, timeout_s: float, max_rows: int
) -> tuple[list[str], list[list[Any]], bool]:
    """Run one statement under a time limit; return (columns, rows, truncated).

    Blocking (the progress handler stops it at the deadline): call it from a worker thread,
    e.g. `asyncio.to_thread`, never on the event loop.
    """
    denied: list[str] = getattr(conn, "denied", [])
    denied.clear()
    _with_deadline(conn, timeout_s)
    try:
        cur = conn.execute(query)
        columns = [d[0] for d in cur.description or []]
        rows = [list(r) for r in cur.fetchmany(max_rows + 1)] if cur.description else []
        conn.commit()
    except sqlite3.OperationalError as exc:
        if "interrupted" in str(exc):
            raise ToolError(f"query took longer than {timeout_s:g}s and was stopped") from None
        raise ToolError(f"sql error: {_explain(exc, denied)}") from None
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as exc:
        raise ToolError(f"sql error: {_explain(exc, denied)}") from None
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
            for c in conn.execute(f"PRAGMA table_info({quote_ident(name)})")
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
        self._lock = asyncio.Lock()
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

    async def _query(self, query: str, max_rows: int) -> tuple[list[str], list[list[Any]], bool]:
        # Off the event loop: a slow query holds only a worker thread until its deadline, and
        # one statement at a time per connection.
        async with self._lock:
            return await asyncio.to_thread(
                run_query, self.conn, query, self.config.query_timeout_seconds, max_rows
            )

    async def _run_sql(self, args: dict[str, Any]) -> dict[str, Any]:
        cols, rows, truncated = await self._query(args["query"], self.config.max_rows)
        return {"columns": cols, "rows": rows, "rowCount": len(rows), "truncated": truncated}

    async def _submit(self, args: dict[str, Any]) -> dict[str, Any]:
        if "query" not in args and "answer" not in args:
            raise ToolError("submit_answer needs `query` or `answer`")
        submission: dict[str, Any] = {}
        if "query" in args:
            if not isinstance(args["query"], str):
                raise ToolError("argument 'query' must be string")
            cols, rows, truncated = await self._query(args["query"], SUBMIT_ROW_CAP)
            submission.update(query=args["query"], columns=cols, rows=rows, truncated=truncated)
        if "answer" in args:
            submission["answer"] = args["answer"]
        self.submission = submission
        return {"submitted": True, "rowCount": len(submission.get("rows", []))}

    def final_state(self) -> dict[str, Any]:
        """The submission plus a capped dump of every table and exact row counts.

        Whatever the agent put in the database, this returns plain JSON data within the query
        time limit, never an error: text that is not UTF-8 is decoded with replacement
        characters, blobs are shown as text, and a table that cannot be read in time (an
        expensive generated column) is listed in `unreadableTables` instead. A broken dump
        would make the rollout errored, which is no verdict: a failing agent could escape
        its failure that way.
        """
        tables: dict[str, list[dict[str, Any]]] = {}
        counts: dict[str, int] = {}
        unreadable: dict[str, str] = {}
        limit = self.config.query_timeout_seconds
        self.conn.text_factory = _lenient_text
        # Checked often: one instruction may be a function over a 10 MB value (tens of ms),
        # and a generated column runs one for every row read.
        _with_deadline(self.conn, limit, every=20)
        try:
            names = [
                r[0]
                for r in self.conn.execute(
                    "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
                )
            ]
            for name in names:
                table = quote_ident(name)
                try:
                    cur = self.conn.execute(f"SELECT * FROM {table} LIMIT {STATE_ROWS_PER_TABLE}")
                    cols = [d[0] for d in cur.description]
                    rows = [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
                    counts[name] = self.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                except (sqlite3.Error, ValueError, OverflowError) as exc:
                    why = f"took longer than {limit:g}s" if "interrupted" in str(exc) else str(exc)
                    unreadable[name] = why
                    continue
                tables[name] = json_safe(rows)
        finally:
            self.conn.set_progress_handler(None, 0)
            self.conn.text_factory = str
        state = {"submission": json_safe(self.submission), "tables": tables, "rowCounts": counts}
        if unreadable:
            state["unreadableTables"] = unreadable
        return state

    async def close(self) -> None:
        """Drop the in-memory database."""
        self.conn.close()


def _check_reference_query(config: SqlConfig, query: Any, where: str, out: list[str]) -> None:
    if not isinstance(query, str) or not query.strip():
        out.append(f"{where}: must be a non-empty SQL string")
        return
    try:
        conn = open_database(config)
    except SqlConfigError:
        try:  # a broken seed is reported on its own; the query can still be checked
            conn = open_database(config.model_copy(update={"seed": ""}))
        except SqlConfigError:
            return  # reported under config.schema
    try:
        run_query(conn, query, config.query_timeout_seconds * 5, 1)
    except ToolError as exc:
        out.append(f"{where}: {exc}")
    finally:
        conn.close()


class SqlTemplate(Template):
    """The `sql` template."""

    name = "sql"
    config_model = SqlConfig
    runtime = SqlRuntime
    fixed_tools = ("describe_schema", "run_sql", "submit_answer")

    def check_config(self, config: SqlConfig, out: list[str]) -> None:
        """The schema and seed run under the runtime's authorizer and time limit."""
        # A schema or seed that ATTACHes a file or loads an extension is refused here.
        try:
            open_database(config).close()
        except SqlConfigError as exc:
            out.append(str(exc))

    def state_roots(self, config: SqlConfig | None) -> set[str]:
        """The final state's keys (see SqlRuntime.final_state)."""
        return {"submission", "tables", "rowCounts"}

    def ground_truth_keys(self) -> set[str]:
        """sql_result_match reads a reference query or rows, and whether their order matters."""
        return {"query", "rows", "orderMatters"}

    def check_task(self, config: SqlConfig, task: TaskSpec, where: str, out: list[str]) -> None:
        """A ground truth's reference query must run on the database."""
        gt = task.hidden_ground_truth
        if isinstance(gt, dict) and gt.get("query") is not None:
            _check_reference_query(config, gt["query"], f"{where}.hiddenGroundTruth.query", out)

    def default_primitives(self, task: TaskSpec) -> list[dict[str, Any]]:
        """sql_result_match when the ground truth is a query or rows, else state_match."""
        gt = task.hidden_ground_truth
        if isinstance(gt, dict) and ("query" in gt or "rows" in gt):
            return [{"name": "result", "type": "sql_result_match"}]
        return [dict(STATE_MATCH)]

    def plan(self, spec: EnvironmentSpec, task: TaskSpec, runtime: Any) -> Plan | None:
        """Submit the ground truth's reference query."""
        truth = task.hidden_ground_truth
        if isinstance(truth, dict) and isinstance(truth.get("query"), str):
            return [("submit_answer", {"query": truth["query"]})]
        return None


TEMPLATE = SqlTemplate()
