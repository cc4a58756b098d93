"""The read models' lag, read for the tracker's query answers (`readModels`).

One consumer-info call (rollout.shared.stack.projections) cached for a moment serves every
query meanwhile; a slow or absent NATS never fails a query: its answer says nothing of the lag.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import nats.errors
from nats.js import JetStreamContext

from rollout.shared.service.consumer import Consumer
from rollout.shared.stack.projections import Lag, projection_lag
from rollout.shared.stale import lag_report

# How long one consumer-info answer serves the queries after it.
CACHE_S = 1.5
# A query waits at most this long for it; past it the answer goes without (`readModels` None).
PROBE_S = 0.5


class LagProbe:
    """One projection's lag, read at most once per CACHE_S whatever the queries asking."""

    def __init__(self, consumer: Consumer, *, cache_s: float = CACHE_S) -> None:
        self._consumer = consumer
        self._cache_s = cache_s
        self._read_at = -float("inf")
        # Whose answer the cache holds: a process may serve several stacks (tests).
        self._source = 0
        self._last: Lag | None = None
        self._pending: asyncio.Task[Lag | None] | None = None

    async def lag(self, js: JetStreamContext) -> Lag | None:
        """The projection's lag (cached), or None when NATS did not say in time."""
        fresh = time.monotonic() - self._read_at < self._cache_s
        if fresh and self._source == id(js):
            return self._last
        pending = self._pending
        if (
            pending is None
            or pending.done()
            or self._source != id(js)
            or pending.get_loop() is not asyncio.get_running_loop()
        ):
            self._source = id(js)
            self._pending = asyncio.create_task(self._read(js))
        try:
            # Shielded: a query that stops waiting leaves the read to the next one.
            return await asyncio.wait_for(asyncio.shield(self._pending), PROBE_S * 2)
        except TimeoutError:
            return None

    async def report(self, js: JetStreamContext) -> dict[str, Any] | None:
        """`readModels` for an answer (see `lag_report`); None when unknown."""
        return lag_report(await self.lag(js))

    async def _read(self, js: JetStreamContext) -> Lag | None:
        try:
            lag = await projection_lag(js, self._consumer, PROBE_S)
        except (nats.errors.Error, TimeoutError, OSError):
            # Unknown this time, and not asked again for a moment: the queries are answered
            # all the same, without waiting on a slow NATS each.
            lag = None
        if self._source == id(js):  # not another stack's read, finished late
            self._last, self._read_at = lag, time.monotonic()
        return lag


async def beat_lag(js: JetStreamContext, consumer: Consumer) -> dict[str, float] | None:
    """The lag a heartbeat carries (`behind`, `stalledS`); None when NATS did not say."""
    try:
        lag = await projection_lag(js, consumer, PROBE_S)
    except (nats.errors.Error, TimeoutError, OSError):
        return None
    if lag is None:
        return None
    return {"behind": lag.behind, "stalledS": round(lag.stalled_s, 1)}
