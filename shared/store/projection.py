"""Exactly-once projections: apply an event and record its position in one transaction."""

from __future__ import annotations

from typing import Protocol

import asyncpg
import pydantic
from nats.js import JetStreamContext

from rollout.shared import subjects
from rollout.shared.bus.reader import last_sequence, read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.observability import get_logger

log = get_logger(__name__)
# A data error no retry can cure: the event holds a value its row cannot (asyncpg raises it
# for an argument out of a column's range too).
UNHOLDABLE = (asyncpg.exceptions.DataError,)
# Events a rebuild applies under one savepoint (a bad one costs its chunk a second pass).
REBUILD_CHUNK = 500


class Projection(Protocol):
    """A read model fed by events."""

    name: str
    tables: tuple[str, ...]

    async def apply(self, conn: asyncpg.Connection, event: EventEnvelope, position: int) -> None:
        """Apply one event inside the caller's transaction."""
        ...


class BatchProjection(Projection, Protocol):
    """A read model that applies a whole fetched batch in a few statements, not one per event."""

    async def apply_batch(
        self, conn: asyncpg.Connection, items: list[tuple[EventEnvelope, int]]
    ) -> None:
        """Apply events in stream order inside the caller's transaction, as `apply` would."""
        ...


# Creates the row on first use and locks it, in one round trip (a no-op update takes the lock).
_CLAIM_TRACKING = (
    "insert into projection_tracking(name, position) values ($1, 0) on conflict (name)"
    " do update set position = projection_tracking.position returning position"
)
_LOCK_TRACKING = "select position from projection_tracking where name = $1 for update"
_SET_TRACKING = "update projection_tracking set position = $2 where name = $1"
_ENSURE_TRACKING = (
    "insert into projection_tracking(name, position) values ($1, 0) on conflict (name) do nothing"
)


class OutOfOrder(RuntimeError):
    """An event arrived before the one right after the tracked position (retry later)."""


class ProjectionRunner:
    """Runs one projection with its tracking position; redelivery is a no-op.

    With `contiguous` (the projection reads the whole events stream, whose sequences have no
    gaps) an event that skips ahead is refused, so a retried earlier event is never lost.
    """

    def __init__(self, pool: asyncpg.Pool, projection: Projection, *, contiguous: bool = False):
        self.pool = pool
        self.projection = projection
        self.contiguous = contiguous

    async def position(self) -> int:
        """The stream sequence of the last applied event (0: none)."""
        async with self.pool.acquire() as conn:
            value = await conn.fetchval(
                "select position from projection_tracking where name = $1", self.projection.name
            )
        return int(value or 0)

    async def handle(self, event: EventEnvelope | None, position: int) -> bool:
        """Apply `event` at stream `position` unless already applied; True when applied."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(_ENSURE_TRACKING, self.projection.name)
            last = await conn.fetchval(_LOCK_TRACKING, self.projection.name)
            if position <= last:
                return False
            if self.contiguous and position != last + 1:
                raise OutOfOrder(f"{self.projection.name}: got {position}, expected {last + 1}")
            if event is not None:
                await self.projection.apply(conn, event, position)
            await conn.execute(_SET_TRACKING, self.projection.name, position)
        return True

    async def handle_batch(self, items: list[tuple[EventEnvelope | None, int]]) -> int:
        """Apply events in order in ONE transaction; return how many items were settled.

        Items at or below the tracked position are settled without effect (redelivery). With
        `contiguous`, a gap stops the batch there: the caller retries the rest later. An item
        whose event is None (dead-lettered) only advances the position.
        """
        settled = 0
        async with self.pool.acquire() as conn, conn.transaction():
            last = await conn.fetchval(_CLAIM_TRACKING, self.projection.name)
            start = last
            todo: list[tuple[EventEnvelope, int]] = []
            for event, position in items:
                if position <= last:
                    settled += 1
                    continue
                if self.contiguous and position != last + 1:
                    break
                if event is not None:
                    todo.append((event, position))
                last = position
                settled += 1
            apply_batch = getattr(self.projection, "apply_batch", None)
            if apply_batch is not None:
                if todo:
                    await apply_batch(conn, todo)
            else:
                for event, position in todo:
                    await self.projection.apply(conn, event, position)
            if last != start:
                await conn.execute(_SET_TRACKING, self.projection.name, last)
        return settled

    async def handle_each(self, items: list[tuple[EventEnvelope | None, int]]) -> int:
        """`handle_batch` one item at a time, skipping an event the read models cannot hold.

        For a batch that failed with a data error (a value out of a column's range, text
        Postgres refuses): the events before and after the bad one are applied in order, and
        the bad one only advances the position, logged, so one event cannot stall every read
        model behind it forever. Returns how many items were settled.
        """
        settled = 0
        for event, position in items:
            try:
                done = await self.handle_batch([(event, position)])
            except UNHOLDABLE as exc:
                log.error(
                    "event skipped: the read model cannot hold it",
                    projection=self.projection.name,
                    seq=position,
                    type=event.type if event is not None else None,
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )
                done = await self.handle_batch([(None, position)])
            if not done:
                break  # a gap: the rest comes back later
            settled += done
        return settled

    async def skip(self, position: int) -> bool:
        """Advance past an event that cannot be applied (it was dead-lettered)."""
        return await self.handle(None, position)

    async def rebuild(self, js: JetStreamContext) -> int:
        """Drop the read model and replay the whole events stream, atomically; return events applied."""
        applied = 0
        chunk: list[tuple[EventEnvelope, int]] = []
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(_ENSURE_TRACKING, self.projection.name)
            # Holding the tracking row makes live handlers wait, then find their event applied.
            await conn.fetchval(_LOCK_TRACKING, self.projection.name)
            await conn.execute(f"truncate {', '.join(self.projection.tables)}")
            until = await last_sequence(js)
            if until:
                async for msg in read_events(js, subjects.ALL_EVENTS):
                    position = msg.metadata.sequence.stream
                    if position > until:
                        break
                    try:
                        event = EventEnvelope.from_bytes(msg.data)
                    except pydantic.ValidationError:
                        # The live consumer dead-letters these; the rebuild skips them the same way.
                        log.warning("skipping invalid event during rebuild", seq=position)
                        continue
                    chunk.append((event, position))
                    if len(chunk) >= REBUILD_CHUNK:
                        applied += await self._rebuild_chunk(conn, chunk)
                        chunk = []
                applied += await self._rebuild_chunk(conn, chunk)
            await conn.execute(_SET_TRACKING, self.projection.name, until)
        log.info("read model rebuilt", projection=self.projection.name, events=applied)
        return applied

    async def _rebuild_chunk(
        self, conn: asyncpg.Connection, chunk: list[tuple[EventEnvelope, int]]
    ) -> int:
        """Apply a rebuild's events under one savepoint; return how many were applied.

        An event the read models cannot hold is skipped alone, logged, as the live projection
        skips it (`handle_each`): the chunk is then applied again, one savepoint per event.
        """
        try:
            async with conn.transaction():
                for event, position in chunk:
                    await self.projection.apply(conn, event, position)
            return len(chunk)
        except UNHOLDABLE:
            pass
        applied = 0
        for event, position in chunk:
            try:
                async with conn.transaction():
                    await self.projection.apply(conn, event, position)
                applied += 1
            except UNHOLDABLE as exc:
                log.error(
                    "event skipped: the read model cannot hold it",
                    projection=self.projection.name,
                    seq=position,
                    type=event.type,
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )
        return applied
