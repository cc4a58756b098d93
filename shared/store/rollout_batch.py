"""Projection batching: a fetched batch of events applied with one statement per rollout type.

The tracker's read models and the buffer's store both see runs of `rollout.generated` and
`rollout.scored` events between a few others. `apply_events` applies them in stream order
with every consecutive run of rollout events gathered into a `RolloutBatch`, which the
projection flushes as one insert (generated) and one update (scored). The first occurrence of
a rollout (and of a verdict per rollout, run and judged trajectory) wins, as applying events one
by one would.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import asyncpg

from rollout.shared.contracts import events as ev
from rollout.shared.contracts.envelope import EventEnvelope, Payload

ROLLOUT_EVENTS = ("rollout.generated", "rollout.scored")
# One event outside the batch: (conn, envelope, payload, stream position).
Handler = Callable[[asyncpg.Connection, EventEnvelope, Payload, int], Awaitable[None]]
# Apply a batch of rollout events (and leave it for the next).
Flush = Callable[[asyncpg.Connection, "RolloutBatch"], Awaitable[None]]
# One row from one rollout of an event: (envelope, payload, rollout, position) -> columns.
Row = Callable[[EventEnvelope, Any, Any, int], tuple]


class RolloutBatch:
    """Consecutive generated and scored events, applied together.

    Generated rows go in before verdicts; that equals stream order unless a verdict of the
    batch names a rollout a later generated event brings, so such an event starts a new batch.
    """

    def __init__(self) -> None:
        self.generated: list[tuple[EventEnvelope, ev.RolloutsGenerated, int]] = []
        self.scored: list[tuple[EventEnvelope, ev.RolloutsScored, int]] = []
        self._scored_ids: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.generated or self.scored)

    def blocks(self, p: Payload) -> bool:
        """True when `p` must wait for this batch to be applied first."""
        return isinstance(p, ev.RolloutsGenerated) and any(
            r.rollout_id in self._scored_ids for r in p.rollouts
        )

    def add(self, e: EventEnvelope, p: Payload, position: int) -> None:
        """Add one generated or scored event at stream `position`."""
        if isinstance(p, ev.RolloutsGenerated):
            self.generated.append((e, p, position))
        elif isinstance(p, ev.RolloutsScored):
            self.scored.append((e, p, position))
            self._scored_ids.update(r.rollout_id for r in p.rollouts)

    def generated_rows(self, row: Row) -> list[tuple]:
        """One row per rollout generated in the batch (its first occurrence)."""
        rows: dict[str, tuple] = {}
        for e, p, position in self.generated:
            for r in p.rollouts:
                if r.rollout_id not in rows:
                    rows[r.rollout_id] = row(e, p, r, position)
        return list(rows.values())

    def scored_rows(self, row: Row) -> list[tuple]:
        """One row per verdict of the batch (the first per rollout, run and judged trajectory:
        of a rollout generated twice, only the verdict of the stored trajectory applies)."""
        rows: dict[tuple[str, str, int | None], tuple] = {}
        for e, p, position in self.scored:
            for r in p.rollouts:
                key = (r.rollout_id, p.run_id, p.generated_seq)
                rows.setdefault(key, row(e, p, r, position))
        return list(rows.values())

    def clear(self) -> None:
        """Empty the batch."""
        self.generated.clear()
        self.scored.clear()
        self._scored_ids.clear()


async def apply_events(
    conn: asyncpg.Connection,
    items: Iterable[tuple[EventEnvelope, int]],
    *,
    handlers: dict[str, Handler],
    flush: Flush,
) -> None:
    """Apply events in stream order: rollout events batched, others by their handler.

    Event types with neither a handler nor a batch are skipped (they have no read model here).
    """
    batch = RolloutBatch()
    for event, position in items:
        grouped = event.type in ROLLOUT_EVENTS
        handler = handlers.get(event.type)
        if not grouped and handler is None:
            continue
        body = event.body()
        if grouped:
            if batch.blocks(body):
                await _flush(conn, batch, flush)
            batch.add(event, body, position)
            continue
        await _flush(conn, batch, flush)
        await handler(conn, event, body, position)  # type: ignore[misc]
    await _flush(conn, batch, flush)


async def _flush(conn: asyncpg.Connection, batch: RolloutBatch, flush: Flush) -> None:
    if batch:
        await flush(conn, batch)
        batch.clear()


def columns(rows: Iterable[tuple], width: int) -> list[list]:
    """Rows as `width` column arrays, the shape `unnest` takes."""
    cols: list[list] = [[] for _ in range(width)]
    for row in rows:
        for col, value in zip(cols, row, strict=True):
            col.append(value)
    return cols
