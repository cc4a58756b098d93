"""Live updates: one follower of the events stream fans events out to server-sent-event clients."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import asyncpg
import nats.errors
from nats.js import JetStreamContext

from rollout.shared import subjects
from rollout.shared.bus.cancels import raise_if_cancelled
from rollout.shared.bus.reader import last_sequence, read_events
from rollout.shared.observability import get_logger

log = get_logger(__name__)

# The tracker records how far its read models have applied the stream under this name.
TRACKER_VIEW = "tracker"


@dataclass(frozen=True)
class Change:
    """An event the viewer heard of: where it sits in the stream and what it is about."""

    seq: int
    aggregate: str
    aggregate_id: str
    name: str


class EventHub:
    """Follows the events stream from its end; every subscriber gets the changes it asked for."""

    def __init__(self, js: JetStreamContext, pool: asyncpg.Pool) -> None:
        self.js = js
        self.pool = pool
        self._queues: dict[asyncio.Queue[Change | None], frozenset[str]] = {}

    @contextlib.contextmanager
    def subscribe(self, topics: set[str]) -> Iterator[asyncio.Queue[Change | None]]:
        """A queue of changes to `topics` (`run`, `run:<id>`, `job`, `job:<id>`), while held."""
        queue: asyncio.Queue[Change | None] = asyncio.Queue(maxsize=10_000)
        self._queues[queue] = frozenset(topics)
        try:
            yield queue
        finally:
            self._queues.pop(queue, None)

    def close(self) -> None:
        """End every subscription (a None in its queue): open streams finish, so a shutdown
        does not wait on them."""
        for queue in self._queues:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)

    def publish(self, change: Change) -> None:
        """Hand `change` to every subscriber of its aggregate or its instance."""
        keys = {change.aggregate, f"{change.aggregate}:{change.aggregate_id}"}
        for queue, topics in self._queues.items():
            if topics & keys and not queue.full():
                queue.put_nowait(change)

    async def follow(self, retry_s: float = 1.0) -> None:
        """Read new events forever (until cancelled), waiting out a missing or lost stream."""
        start: int | None = None
        while True:
            # A cancel a request swallowed (3.11's wait_for) would leave this loop running
            # for ever, and the viewer's shutdown waiting on it.
            raise_if_cancelled()
            try:
                if start is None:
                    start = await last_sequence(self.js) + 1
                async for msg in read_events(
                    self.js, subjects.ALL_EVENTS, start_seq=start, follow=True
                ):
                    start = msg.metadata.sequence.stream + 1
                    try:
                        aggregate, agg_id, name = subjects.parse_event_subject(msg.subject)
                    except subjects.SubjectError:
                        continue
                    self.publish(Change(start - 1, aggregate, agg_id, name))
            except nats.errors.Error as exc:  # a missing stream is a NotFoundError
                # Before `rollout up` made the stream, or while NATS restarts: pages still
                # answer from the database; live updates resume where they stopped.
                raise_if_cancelled()  # the error may be a reply the cancel came with
                log.warning("events stream unavailable; retrying", error=str(exc))
                await asyncio.sleep(retry_s)

    async def caught_up(self, seq: int, limit_s: float = 5.0) -> bool:
        """Wait until the tracker's read models have applied stream position `seq`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while True:
            async with self.pool.acquire() as conn:
                position = await conn.fetchval(
                    "select position from projection_tracking where name = $1", TRACKER_VIEW
                )
            if position is not None and position >= seq:
                return True
            if loop.time() > deadline:
                log.warning("read models lag the events stream", want=seq, have=position)
                return False
            # The tracker's projection commits within milliseconds of the event; this waits on
            # the server side so the browser never polls.
            await asyncio.sleep(0.05)


async def drain(
    queue: asyncio.Queue[Change | None], first: Change, window_s: float = 0.2
) -> list[Change] | None:
    """`first` plus whatever else arrives within `window_s` (one page update per burst); None
    when the hub closed meanwhile."""
    changes = [first]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + window_s
    while (left := deadline - loop.time()) > 0:
        try:
            more = await asyncio.wait_for(queue.get(), left)
        except TimeoutError:
            break
        if more is None:
            return None
        changes.append(more)
    return changes
