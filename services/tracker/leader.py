"""The tracker's leader: one replica at a time runs the projection, the fan-out and the deadlines.

Replicas elect a leader through a lease in the leases bucket (shared/bus/lease.py). The
leader alone runs the projection (one durable consumer read in stream order: two readers
would only refuse each other's gaps), the fan-out and the deadline checks, so each decision
is made in one place; a standby takes over within about one lease TTL of the leader's last
renewal, plus the projection's AckWait for the events the dead leader held. Those decisions
stay safe while two replicas briefly both think they lead: each is appended with the run's
expected sequence, so a deposed leader's late write is refused, and the projection records
its position in the same transaction as its rows.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from contextlib import suppress

import asyncpg
import nats.errors
import pydantic
from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from rollout.services.tracker import runs
from rollout.services.tracker.projections import ReadModels
from rollout.shared.bus.broker import jetstream, make_broker
from rollout.shared.bus.cancels import raise_if_cancelled
from rollout.shared.bus.deadletter import describe, record_dead_letter
from rollout.shared.bus.lease import DEFAULT_TTL_S, Lease, bucket_ttl, lead, lease_bucket
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.errors import RetrySignal, RolloutError
from rollout.shared.observability import get_logger
from rollout.shared.service import durables
from rollout.shared.service.bootstrap import ServiceRuntime, started
from rollout.shared.service.projection_consumer import subscribe_projection
from rollout.shared.settings import Settings, env_number
from rollout.shared.store.projection import ProjectionRunner

# Only the leader consumes these.
LEADER_CONSUMERS = (durables.TRACKER_READ_MODELS, durables.TRACKER_FANOUT)
GAP_RETRY_S = 0.25
DEADLINE_CHECK_S = 2.0
# The leader lease: one key of the leases bucket; its TTL bounds how long a dead leader's
# duties wait for a standby (tests and the benchmark shorten it).
LEASE_NAME = "tracker"
LEASE_TTL_ENV = "ROLLOUT_TRACKER_LEASE_TTL_S"
# Events after which a run may have just become complete.
_COMPLETION_TRIGGERS = ("rollout.scored", "run.started")
_ENDINGS = ("run.completed", "run.failed")

log = get_logger(__name__)


async def _complete_finished_runs(
    js: JetStreamContext,
    pool: asyncpg.Pool,
    msgs: list[Msg],
    items: list[tuple[EventEnvelope | None, int]],
    states: runs.RunStates,
) -> None:
    """Fold a settled batch into the runs' states; end every run it may have just completed,
    and queue the next work items of the windowed runs it scored rollouts of."""
    states.fold(
        (msg.subject, event, position) for msg, (event, position) in zip(msgs, items, strict=True)
    )
    # Checked on redelivery too: a crash between commit and publish must not strand a run.
    runs_to_check = {
        e.run_id for e, _ in items if e is not None and e.run_id and e.type in _COMPLETION_TRIGGERS
    }
    for run_id in sorted(runs_to_check):
        if not await states.complete_if_done(js, pool, run_id):
            await states.release_due(js, pool, run_id)
    if any(e is not None and e.type in _ENDINGS for e, _ in items):
        # A run ended: one of its owner's waiting runs may start now.
        await states.release_all_due(js, pool)


def register_leader_handlers(
    broker: NatsBroker,
    runner: ProjectionRunner,
    pool: asyncpg.Pool | None = None,
    states: runs.RunStates | None = None,
) -> None:
    """The leader's consumers: the read models in stream order, and the runs' fan-out."""
    # This tenure's run aggregates, folded as they are projected.
    states = states if states is not None else runs.RunStates()

    async def dead_letter(msg: Msg, exc: pydantic.ValidationError) -> None:
        # Recorded with its reason; the position moves past it.
        await record_dead_letter(jetstream(broker), msg, describe(exc))

    async def completed(msgs: list[Msg], items: list[tuple[EventEnvelope | None, int]]) -> None:
        await _complete_finished_runs(jetstream(broker), pool, msgs, items, states)  # type: ignore[arg-type]

    # A gap (an earlier event awaits redelivery) closes within the consumer's AckWait.
    subscribe_projection(
        broker,
        durables.TRACKER_READ_MODELS,
        runner,
        on_invalid=dead_letter,
        after_batch=completed,
        gap_retry_s=GAP_RETRY_S,
    )
    runs.register_fan_out(broker, states)


async def _watch_deadlines(
    js: JetStreamContext, pool: asyncpg.Pool, states: runs.RunStates
) -> None:
    while True:
        try:
            await runs.fail_overdue(js, pool)
            await states.release_all_due(js, pool)
        except (
            asyncpg.PostgresError,
            OSError,
            nats.errors.Error,
            RolloutError,
            RetrySignal,
        ) as exc:
            # The next check decides again from the runs' events: nothing is lost by waiting.
            log.warning("deadline check failed", error=describe(exc))
        raise_if_cancelled()  # a cancel one of the checks' requests swallowed (bus/cancels.py)
        await asyncio.sleep(DEADLINE_CHECK_S)


def lease_ttl_s() -> float:
    """The leader lease's TTL in seconds (ROLLOUT_TRACKER_LEASE_TTL_S, else 3)."""
    return env_number(LEASE_TTL_ENV, DEFAULT_TTL_S, unit="seconds", low=0.5, high=60)


def replica_holder() -> str:
    """This replica's name in the lease: host, pid and a nonce (two in one process differ)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


async def lead_when_elected(settings: Settings, runtime: ServiceRuntime) -> None:
    """Take part in the election; lead (projection, fan-out, deadlines) while holding the lease."""
    pool = runtime.database()
    runner = ProjectionRunner(pool, ReadModels(), contiguous=True)
    js = jetstream(runtime.brokers[0])
    kv = await lease_bucket(js, lease_ttl_s(), settings.stream_replicas)
    lease = Lease(kv, LEASE_NAME, replica_holder(), await bucket_ttl(kv))
    if abs(lease.ttl_s - lease_ttl_s()) > 1e-3:
        # The bucket keeps the TTL it was made with: every replica must agree on it.
        log.warning("lease TTL is the bucket's", ttl_s=lease.ttl_s, asked=lease_ttl_s())
    log.info("tracker started", holder=lease.holder, lease_ttl_s=lease.ttl_s)

    async def duty() -> None:
        await _lead(settings, runner, pool, js)

    await lead(lease, duty)


async def _lead(
    settings: Settings, runner: ProjectionRunner, pool: asyncpg.Pool, js: JetStreamContext
) -> None:
    """The leader's part, until cancelled: the projection, the fan-out, the deadlines."""
    broker = make_broker(settings)
    states = runs.RunStates()
    register_leader_handlers(broker, runner, pool, states)
    async with started(broker):
        watcher = asyncio.create_task(_watch_deadlines(js, pool, states))
        log.info("tracker leading", position=await runner.position())
        try:
            await asyncio.Event().wait()
        finally:
            watcher.cancel()
            with suppress(asyncio.CancelledError):
                await watcher
