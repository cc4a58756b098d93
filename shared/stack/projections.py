"""How far each read-model projector is behind the events stream, for `rollout status`.

A projector whose Postgres writes fail (a full disk, a revoked privilege, a crash loop) keeps
beating while its read models go stale: `rollout show` and the viewer then serve old numbers.
Its JetStream consumer says how many events it has not applied (pending plus delivered but
unacked) and when it last acked one; its beats say its last error. It reads unhealthy only
when it is behind and has not advanced for longer than ROLLOUT_PROJECTION_STALL_S: a projector
working through a backlog is healthy.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext

from rollout.shared.service.consumer import Consumer
from rollout.shared.settings import env_number
from rollout.shared.stack.health import Beat

STALL_ENV = "ROLLOUT_PROJECTION_STALL_S"
# Above the projection's longest retry backoff (30 s): one failed attempt is not a stall.
DEFAULT_STALL_S = 60.0


def stall_limit_s() -> float:
    """ROLLOUT_PROJECTION_STALL_S (default 60): how long a projector may sit behind without
    applying an event before `status` calls it unhealthy."""
    return env_number(STALL_ENV, DEFAULT_STALL_S, unit="seconds", above=0)


@dataclass(frozen=True)
class Lag:
    """One projector's position against the events stream."""

    # Events of its filter it has not applied yet (pending, and delivered but unacked).
    behind: int
    # The stream sequence up to which every event is applied.
    applied: int
    # Seconds it has been behind without applying anything: since its last ack, or since the
    # oldest event it has not applied arrived, whichever is later (0 when caught up).
    stalled_s: float
    # Seconds since it last applied (acked) an event; None when it never has.
    last_applied_s: float | None = None


async def projection_lag(js: JetStreamContext, consumer: Consumer, probe_s: float) -> Lag | None:
    """`consumer`'s lag, or None when it does not exist yet (its service never started)."""
    try:
        info = await asyncio.wait_for(js.consumer_info(consumer.stream, consumer.name), probe_s)
    except nats.js.errors.NotFoundError:
        return None
    behind = (info.num_pending or 0) + (info.num_ack_pending or 0)
    applied = info.ack_floor.stream_seq if info.ack_floor else 0
    last_active = info.ack_floor.last_active if info.ack_floor else None
    if last_active is not None and last_active.year < 2000:
        last_active = None  # the server's zero time: never acked
    last_applied_s = _age(last_active) if last_active is not None else None
    if behind == 0:
        return Lag(0, applied, 0.0, last_applied_s)
    since = _aware(last_active or info.created)
    try:
        # The oldest event not applied: a projector idle for hours that just received one is
        # behind by a moment, not by hours.
        oldest = await asyncio.wait_for(
            js.get_msg(consumer.stream, applied + 1, subject=consumer.filter, next=True), probe_s
        )
        if oldest.time is not None:
            since = max(since, _aware(oldest.time))
    except (nats.js.errors.NotFoundError, nats.errors.Error, TimeoutError):
        pass  # gone (limits) or not readable: the last ack alone says how long
    return Lag(behind, applied, _age(since), last_applied_s)


def last_failure(beats: list[Beat], consumer: Consumer) -> tuple[str, float] | None:
    """The newest error a live replica's beat reports for `consumer`, and its age in seconds."""
    reported = [b.failures[consumer.name] for b in beats if b.live and consumer.name in b.failures]
    if not reported:
        return None
    newest = max(reported, key=lambda f: f["at"])
    age = max(0.0, datetime.now(UTC).timestamp() - newest["at"])
    return str(newest["error"]), age


def _age(moment: datetime) -> float:
    return max(0.0, (datetime.now(UTC) - _aware(moment)).total_seconds())


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
