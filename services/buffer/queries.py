"""The buffer's queries: select scored rollouts, load their trajectories, build the set, reply.

A reply whose items are larger than the query's `inline_limit` goes to the object store
(content-addressed, so asking twice stores once) and the caller gets its URI and sha256.
No reply exceeds the server's max payload: the threshold is capped by what the connection
allows, and a query with `page_size` gets its items a page at a time (`next_offset`).
The `rollouts` query (an export) pages in SQL: by key after the previous page's last rollout,
at most ROLLOUTS_PAGE_MAX a reply, over what was scored up to the export's `as_of` sequence.
A query with `after_seq` is answered only once the buffer has applied the events stream up to
that sequence: the buffer is a projection that may lag, and a caller that knows a run ended
at sequence N must not get an answer missing that run's last verdicts.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from faststream.nats import NatsBroker

from rollout.services.buffer.tools import TaskTools
from rollout.shared import subjects
from rollout.shared.bus.broker import jetstream
from rollout.shared.bus.publisher import payload_budget
from rollout.shared.contracts.buffer import (
    BEHIND,
    BufferData,
    BufferQuery,
    DpoPairsQuery,
    GrpoGroupsQuery,
    Kind,
    RolloutsQuery,
    SftSetQuery,
)
from rollout.shared.errors import RolloutError
from rollout.shared.jsondepth import loads_bounded
from rollout.shared.learning import datasets
from rollout.shared.objectstore import ObjectStore, content_key, sha256_bytes, to_json_bytes
from rollout.shared.store.projection import ProjectionRunner

EXPORT_PREFIX = "buffer/exports"
_COLUMNS = (
    "rollout_id, run_id, env_slug, env_version, env_hash, task_index, sample_index, model,"
    " policy_version, score, passed, error, trajectory, trajectory_uri, trajectory_sha256"
)
# What an exported row carries besides the training builders' columns.
_EXPORTED = (
    ", seed, primitives, generation_error, scored_at,"
    " (select source from buffer_runs r where r.run_id = buffer_rollouts.run_id) as source"
)
_IMPORTED_RUNS = "select run_id from buffer_runs where source is not null"
_ITEM_KEYS = (
    "rollout_id", "run_id", "env_slug", "env_version", "env_hash", "task_index", "sample_index",
    "model", "policy_version", "seed", "score", "passed", "trajectory", "tools",
)  # fmt: skip
_LISTED = 10
# The rollouts query's order; unique (rollout_id breaks ties), so it can page by key.
_ORDER = "run_id, task_index, sample_index, rollout_id"
# The most rollouts one `rollouts` reply holds (with their trajectories): ask for the next page.
ROLLOUTS_PAGE_MAX = 256
_HINT = "is the buffer service running (`rollout status`) and has it caught up with the run?"
# How long a query with `after_seq` waits for the buffer to catch up before it says so.
CATCH_UP_S = 15.0
_CATCH_UP_POLL_S = 0.05


class BufferQueries:
    """Answers sft_set, dpo_pairs and grpo_groups from the buffer's tables."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        store: ObjectStore,
        tools: TaskTools,
        position: Callable[[], Awaitable[int]] | None = None,
        *,
        catch_up_s: float = CATCH_UP_S,
        reply_budget: Callable[[], int] | None = None,
    ) -> None:
        self.pool = pool
        self.store = store
        self.tools = tools
        # The stream sequence the buffer has applied up to (its projection position).
        self.position = position
        self.catch_up_s = catch_up_s
        # The largest reply the connected server accepts (none known: the query's limit).
        self.reply_budget = reply_budget

    @classmethod
    def on_broker(
        cls,
        pool: asyncpg.Pool,
        store: ObjectStore,
        broker: NatsBroker,
        runner: ProjectionRunner,
        *,
        catch_up_s: float = CATCH_UP_S,
    ) -> BufferQueries:
        """Queries answered on `broker`: caught up with `runner`, replies sized to its server."""
        return cls(
            pool,
            store,
            TaskTools(lambda: jetstream(broker)),
            runner.position,
            catch_up_s=catch_up_s,
            # No reply may exceed what the connected server accepts, whatever inline_limit says.
            reply_budget=lambda: payload_budget(jetstream(broker)),
        )

    async def sft_set(self, query: SftSetQuery) -> BufferData:
        """Passing rollouts of a run (or of the given ids) as chat examples with tools."""
        await self._caught_up(query)
        conditions, args = ["scored_at is not null"], []
        if query.run_id:
            await self._check_runs([query.run_id])
            args.append(query.run_id)
            conditions.append(f"run_id = ${len(args)}")
        if query.rollout_ids:
            await self._check_rollouts(query.rollout_ids, query.run_id)
            args.append(query.rollout_ids)
            conditions.append(f"rollout_id = any(${len(args)}::text[])")
        rows = await self._select(conditions, args)
        items, meta, stats = datasets.sft_set(rows)
        return await self._reply("sft_set", items, meta, stats, query)

    async def dpo_pairs(self, query: DpoPairsQuery) -> BufferData:
        """Best vs worst of each task's group with a score margin of at least `min_margin`."""
        await self._caught_up(query)
        await self._check_runs(query.run_ids)
        conditions, args = ["scored_at is not null", "run_id = any($1::text[])"], [query.run_ids]
        if query.rollout_ids is not None:
            single = query.run_ids[0] if len(query.run_ids) == 1 else None
            await self._check_rollouts(query.rollout_ids, single)
            args.append(query.rollout_ids)
            conditions.append(f"rollout_id = any(${len(args)}::text[])")
        rows = await self._select(conditions, args)
        items, meta, stats = datasets.dpo_pairs(rows, query.min_margin)
        return await self._reply("dpo_pairs", items, meta, stats, query)

    async def grpo_groups(self, query: GrpoGroupsQuery) -> BufferData:
        """Groups by (run, task) with tokens, logprobs and rewards; stale completions dropped."""
        await self._caught_up(query)
        conditions, args = ["scored_at is not null"], []
        if query.run_ids:
            await self._check_runs(query.run_ids)
            args.append(query.run_ids)
            conditions.append(f"run_id = any(${len(args)}::text[])")
        if query.env_slug:
            args.append(subjects.token(query.env_slug, "environment slug"))
            conditions.append(f"env_slug = ${len(args)}")
        if query.policy_versions is not None:
            args.append(query.policy_versions)
            conditions.append(f"policy_version = any(${len(args)}::int[])")
        rows = await self._select(conditions, args)
        items, meta, stats = datasets.grpo_groups(rows, query)
        return await self._reply("grpo_groups", items, meta, stats, query)

    async def rollouts(self, query: RolloutsQuery) -> BufferData:
        """Scored rollouts with their lineage, verdict, trajectory and tools (for export)."""
        await self._caught_up(query)
        conditions, args = ["scored_at is not null"], []
        if query.run_ids:
            await self._check_runs(query.run_ids)
            args.append(query.run_ids)
            conditions.append(f"run_id = any(${len(args)}::text[])")
        if query.env_slug:
            args.append(subjects.token(query.env_slug, "environment slug"))
            conditions.append(f"env_slug = ${len(args)}")
        if query.env_version is not None:
            args.append(query.env_version)
            conditions.append(f"env_version = ${len(args)}")
        if query.policy_versions is not None:
            args.append(query.policy_versions)
            conditions.append(f"policy_version = any(${len(args)}::int[])")
        if query.since is not None:
            args.append(query.since)
            conditions.append(f"scored_at >= ${len(args)}")
        if not query.include_imported and not query.run_ids:
            # Imported rewards were not verified here: a broad selection leaves them out.
            conditions.append(f"run_id not in ({_IMPORTED_RUNS})")
        errored = "(error is not null or generation_error is not null)"
        if not query.include_errored:
            conditions.append(f"not {errored}")
        if query.verdict is not None:
            conditions.append("passed" if query.verdict == "passed" else "not passed")
        if query.as_of is not None:
            args.append(query.as_of)
            conditions.append(f"scored_seq <= ${len(args)}")
        async with self.pool.acquire() as conn:
            total = await conn.fetchval(
                f"select count(*) from buffer_rollouts where {' and '.join(conditions)}", *args
            )
        if query.after_rollout is not None:
            await self._check_rollouts([query.after_rollout], None)
            # Keyset paging: rows scored meanwhile cannot shift this page onto the last one.
            args.append(query.after_rollout)
            conditions.append(
                f"({_ORDER}) > (select {_ORDER} from buffer_rollouts"
                f" where rollout_id = ${len(args)})"
            )
        size = min(query.page_size or ROLLOUTS_PAGE_MAX, ROLLOUTS_PAGE_MAX)
        # One more than the page, to know whether another follows; only this page is loaded.
        tail = f" limit {size + 1}"
        if query.after_rollout is None and query.offset:
            tail += f" offset {query.offset}"
        rows = await self._select(conditions, args, extra=_EXPORTED, tail=tail)
        more, rows = len(rows) > size, rows[:size]
        items = []
        for row in rows:
            error = row["error"] or row["generation_error"]
            outcome = "errored" if error else "passed" if row["passed"] else "failed"
            items.append(
                {
                    **{k: row[k] for k in _ITEM_KEYS},
                    "error": error,
                    "outcome": outcome,
                    "primitives": _decoded(row["primitives"]) or [],
                    "scored_at": row["scored_at"].isoformat(),
                    "source": row["source"],
                }
            )
        stats = {"rollouts": float(total)}
        meta: list[dict[str, Any]] = [{} for _ in items]
        return await self._reply("rollouts", items, meta, stats, query, paged=(total, more))

    # --- helpers ------------------------------------------------------------------------------

    async def _caught_up(self, query: BufferQuery) -> None:
        """Wait (briefly) until the buffer has applied the stream up to `query.after_seq`."""
        if query.after_seq is None or self.position is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.catch_up_s
        while (applied := await self.position()) < query.after_seq:
            if loop.time() >= deadline:
                raise RolloutError(
                    f"{BEHIND}: it has applied events up to sequence {applied}, this request "
                    f"needs {query.after_seq}",
                    problems=[
                        f"it did not get there within {self.catch_up_s:.0f}s; ask again in a "
                        "moment, and check the buffer's health with `rollout status`"
                    ],
                )
            await asyncio.sleep(_CATCH_UP_POLL_S)

    async def _check_runs(self, run_ids: list[str]) -> None:
        for run_id in run_ids:
            subjects.token(run_id, "run id")  # a NUL or a megabyte is refused, not looked up
        async with self.pool.acquire() as conn:
            known = {
                r["run_id"]
                for r in await conn.fetch(
                    "select run_id from buffer_runs where run_id = any($1::text[])", run_ids
                )
            }
        missing = [run_id for run_id in run_ids if run_id not in known]
        if missing:
            raise RolloutError(
                f"the buffer holds no run {', '.join(map(repr, missing[:_LISTED]))}",
                problems=["check the run id (see `rollout runs`)", _HINT],
            )

    async def _check_rollouts(self, rollout_ids: list[str], run_id: str | None) -> None:
        for rollout_id in rollout_ids:
            subjects.token(rollout_id, "rollout id")
        async with self.pool.acquire() as conn:
            found = {
                r["rollout_id"]: r["run_id"]
                for r in await conn.fetch(
                    "select rollout_id, run_id from buffer_rollouts"
                    " where rollout_id = any($1::text[])",
                    rollout_ids,
                )
            }
        if run_id:
            # Within one run the question is simply which ids are not among its rollouts.
            stray = [i for i in rollout_ids if found.get(i) != run_id]
            if stray:
                raise RolloutError(
                    f"rollout_ids: {len(stray)} id(s) are not rollouts of run {run_id}: "
                    + ", ".join(stray[:_LISTED])
                    + (" ..." if len(stray) > _LISTED else ""),
                    problems=[_HINT] if any(i not in found for i in stray) else [],
                )
            return
        unknown = [i for i in rollout_ids if i not in found]
        if unknown:
            raise RolloutError(
                f"rollout_ids: {len(unknown)} unknown to the buffer: "
                + ", ".join(unknown[:_LISTED])
                + (" ..." if len(unknown) > _LISTED else ""),
                problems=[_HINT],
            )

    async def _select(
        self, conditions: list[str], args: list[Any], *, extra: str = "", tail: str = ""
    ) -> list[dict[str, Any]]:
        """Scored rollouts matching `conditions`, trajectories loaded, tools attached."""
        async with self.pool.acquire() as conn:
            records = await conn.fetch(
                f"select {_COLUMNS}{extra} from buffer_rollouts where {' and '.join(conditions)}"
                f" order by {_ORDER}{tail}",
                *args,
            )
        rows = []
        for record in records:
            row = dict(record)
            row["trajectory"] = await self._trajectory(row)
            row["tools"] = await self.tools.get(
                row["env_slug"], row["env_version"], row["task_index"], row["env_hash"]
            )
            rows.append(row)
        return rows

    async def _trajectory(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The trajectory inline, or fetched from the object store and checked by sha256."""
        # Cut at a depth: a tool result nested past what json.loads reads raised
        # RecursionError, which failed every training set and export that held its rollout.
        if row["trajectory"] is not None:
            return loads_bounded(row["trajectory"])
        if row["trajectory_uri"]:
            data = await self.store.get(row["trajectory_uri"], sha256=row["trajectory_sha256"])
            return loads_bounded(data)
        return None

    async def _reply(
        self,
        kind: Kind,
        items: list[dict[str, Any]],
        meta: list[dict[str, Any]],
        stats: dict[str, float],
        query: BufferQuery,
        *,
        paged: tuple[int, bool] | None = None,
    ) -> BufferData:
        """The page of `items` the query asks for (`paged`: they are the page; total, more)."""
        if paged is None:
            total = len(items)
            start = min(query.offset, total)
            end = total if query.page_size is None else min(total, start + query.page_size)
            items, meta = items[start:end], meta[start:end]
            more = end < total
        else:
            (total, more), start = paged, query.offset
            end = start + len(items)
        page = {
            "kind": kind,
            "count": len(items),
            "total": total,
            "offset": start,
            "next_offset": end if more else None,
            "stats": stats,
        }
        limit = query.inline_limit
        if self.reply_budget is not None:
            # Room for the reply's other fields and the Reply wrapper around it.
            limit = min(limit, self.reply_budget() - len(to_json_bytes(page)) - 1024)
        data = to_json_bytes({"items": items, "meta": meta})
        if len(data) <= limit:
            return BufferData(**page, items=items, meta=meta)
        ref = await self.store.put(content_key(EXPORT_PREFIX, sha256_bytes(data)), data)
        return BufferData(**page, ref=ref)


def _decoded(value: Any) -> Any:
    """A jsonb column's value (asyncpg gives jsonb as text unless a codec is set)."""
    return json.loads(value) if isinstance(value, str) else value
