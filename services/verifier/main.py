"""Verifier service: scores every rollout.generated batch and emits one rollout.scored batch."""

from __future__ import annotations

import asyncio

from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub

from rollout.services.verifier.scoring import score_rollout
from rollout.shared import subjects
from rollout.shared.bus.broker import jetstream, make_broker
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.streams import ensure_consumer, ensure_streams, pull_consumer_config
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import RolloutsGenerated, RolloutsScored, RunRequested
from rollout.shared.objectstore import ObjectStore
from rollout.shared.observability import event_context, get_logger
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.store.spec_cache import SpecCache
from rollout.shared.store.trajectories import object_store

DURABLE = "verifier"
GENERATED = subjects.event_filter("run", "rollout.generated")

log = get_logger(__name__)


async def run_of(js, run_id: str) -> RunRequested:
    """The run request (for its env version), read from the run's first event."""
    raw = await js.get_last_msg(
        subjects.EVENTS_STREAM, subjects.event("run", run_id, "run_requested")
    )
    return EventEnvelope.from_bytes(raw.data).body()  # type: ignore[return-value]


def build_broker(settings: Settings) -> NatsBroker:
    """The verifier's broker and its handler."""
    broker = make_broker(settings)
    state: dict[str, SpecCache] = {}
    stores: dict[str, ObjectStore] = {}

    def store() -> ObjectStore:
        if "store" not in stores:
            stores["store"] = object_store(settings)
        return stores["store"]

    @broker.subscriber(
        GENERATED,
        stream=JStream(subjects.EVENTS_STREAM, declare=False),
        durable=DURABLE,
        pull_sub=PullSub(batch_size=4, timeout=1.0),
        ack_policy=AckPolicy.NACK_ON_ERROR,
        title="verifier/score",
        description="Scores a generated batch with the environment's verifier.",
    )
    async def score_batch(event: EventEnvelope) -> None:
        """Score every rollout of the batch; ack after the scored event is stored."""
        js = jetstream(broker)
        cache = state.setdefault("specs", SpecCache(js))
        generated = event.body()
        assert isinstance(generated, RolloutsGenerated)
        with event_context(event):
            run = await run_of(js, generated.run_id)
            spec = await cache.get(run.env_slug, run.env_version, run.env_hash)
            scored = [await score_rollout(spec, r, store()) for r in generated.rollouts]
            out = EventEnvelope.new(
                RolloutsScored(
                    run_id=generated.run_id, work_item_id=generated.work_item_id, rollouts=scored
                ),
                aggregate_id=generated.run_id,
                id_parts=(event.id,),
                parent=event,
            )
            await EventPublisher(js).publish(out)
            log.info("rollouts scored", count=len(scored), passed=sum(s.passed for s in scored))

    return broker


async def serve(settings: Settings) -> None:
    """Run one verifier replica until cancelled."""
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        await ensure_consumer(
            js, subjects.EVENTS_STREAM, pull_consumer_config(DURABLE, GENERATED, ack_wait_s=60.0)
        )
    finally:
        await nc.close()
    broker = build_broker(settings)
    await broker.start()
    log.info("verifier started")
    try:
        await asyncio.Event().wait()
    finally:
        await broker.stop()
