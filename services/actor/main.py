"""Actor service: one pull consumer shared by every replica (this is the work stealing)."""

from __future__ import annotations

import asyncio

import httpx
from faststream.nats import NatsBroker

from rollout.services.actor.generate import (
    dumped_batch,
    failed_batch,
    generate_batch,
    without_trajectory,
)
from rollout.shared import subjects
from rollout.shared.bus.broker import current_message, jetstream, make_broker
from rollout.shared.bus.deadletter import DEFAULT_MAX_DELIVER, describe
from rollout.shared.bus.keepalive import working_on
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import (
    ErrorKind,
    GeneratedRollout,
    PolicyUpdated,
    RolloutsGenerated,
)
from rollout.shared.contracts.work import RolloutWork
from rollout.shared.errors import RetrySignal, RolloutError
from rollout.shared.models.base import ModelBackend
from rollout.shared.models.catalog import resolve_backend
from rollout.shared.models.trained import TrainedBackend, apply_update, refresh_policy
from rollout.shared.objectstore import ObjectStore, to_json_bytes
from rollout.shared.objectstore.errors import ObjectStoreError
from rollout.shared.observability import get_logger
from rollout.shared.service import durables
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.service.consumer import Consumer
from rollout.shared.settings import Settings, env_number
from rollout.shared.stack.health import default_replica_id
from rollout.shared.store.spec_cache import SpecCache
from rollout.shared.store.trajectories import inline_limit, object_store, offload

DURABLE = durables.ACTORS.name
# How long a silent replica holds a work item before another one gets it (in-progress acks
# keep a working replica's items); tests shorten it to see a dead replica's work move quickly.
# Read when the service starts (not at import), like the verifier's.
ACK_WAIT_ENV = "ROLLOUT_ACTOR_ACK_WAIT_S"
DEFAULT_ACK_WAIT_S = 30.0


def ack_wait_s() -> float:
    """The actors consumer's AckWait in seconds (ROLLOUT_ACTOR_ACK_WAIT_S, else 30)."""
    return env_number(ACK_WAIT_ENV, DEFAULT_ACK_WAIT_S, unit="seconds", above=0)


# How many work items one replica takes per fetch and generates at once. Each has its own
# in-progress acks; while one waits on the broker, the model or the object store, the others
# run, so a replica is not idle between round trips. Few enough that a queue split across
# replicas stays shared out (a fetched item is held until it is done).
CONCURRENCY_ENV = "ROLLOUT_ACTOR_CONCURRENCY"
DEFAULT_CONCURRENCY = 4


def concurrency() -> int:
    """Work items a replica generates at once (ROLLOUT_ACTOR_CONCURRENCY, else 4)."""
    return int(env_number(CONCURRENCY_ENV, DEFAULT_CONCURRENCY, whole=True, low=1))


log = get_logger(__name__)


def consumer() -> Consumer:
    """The actors' work consumer with this replica's AckWait and fetch size (its concurrency)."""
    return durables.ACTORS.tuned(ack_wait_s=ack_wait_s(), batch_size=concurrency())


class Backends:
    """Model backends by name, loaded once per replica (weights stay in memory)."""

    def __init__(self) -> None:
        self._backends: dict[str, ModelBackend] = {}

    def get(self, model: str) -> ModelBackend:
        """The backend for `model`, built on first use."""
        if model not in self._backends:
            self._backends[model] = resolve_backend(model)
        return self._backends[model]

    def loaded(self, model: str) -> ModelBackend | None:
        """The backend for `model` if this replica has loaded it."""
        return self._backends.get(model)


def _unstored(rollouts: list[GeneratedRollout], cause: str) -> list[GeneratedRollout]:
    """After the last attempt to claim-check: rollouts too large to ride inline are errored."""
    limit = inline_limit()
    return [
        without_trajectory(r, cause)
        if r.trajectory is not None and len(to_json_bytes(r.trajectory)) > limit
        else r
        for r in rollouts
    ]


def _too_large(rollout: GeneratedRollout, size: int, budget: int) -> GeneratedRollout:
    """A rollout that alone exceeds a message, even claim-checked, is errored (never retried)."""
    return without_trajectory(
        rollout,
        f"rollout is {size} bytes encoded after the claim check, over the {budget} bytes a "
        "message may carry on this server (raise the server's max_payload or lower "
        "ROLLOUT_INLINE_TRAJECTORY_BYTES)",
    )


def build_broker(settings: Settings, *, actor_id: str | None = None) -> NatsBroker:
    """The actor's broker and its handler."""
    broker = make_broker(settings)
    keepalive_s = min(10.0, ack_wait_s() / 3)
    backends = Backends()
    caches: dict[str, SpecCache] = {}
    stores: dict[str, ObjectStore] = {}

    def store() -> ObjectStore:
        if "store" not in stores:
            stores["store"] = object_store(settings)
        return stores["store"]

    me = actor_id or default_replica_id()

    @consumer().subscriber(broker)
    async def generate(work: RolloutWork) -> None:
        """Run the agent loop on every rollout of a work item; ack after the event is stored."""
        message = current_message(broker)
        js = jetstream(broker)
        cache = caches.setdefault("specs", SpecCache(js))
        raw = message.raw_message
        attempt = raw.metadata.num_delivered
        publisher = EventPublisher(js)
        # Each rollout's position in the work item, and the ids of those already on the log.
        positions = {item.rollout_id: k for k, item in enumerate(work.items)}
        published: set[str] = set()

        def part(items: list[GeneratedRollout], start: int, end: int) -> EventEnvelope:
            # One event for the whole item when it fits; else parts named by the positions of
            # the rollouts they hold, so a redelivery that splits or finishes differently never
            # collides with a part it did not send (and one that repeats it is deduplicated).
            first, last = positions[items[0].rollout_id], positions[items[-1].rollout_id]
            whole = len(items) == len(work.items)
            payload = RolloutsGenerated(
                run_id=work.run_id, work_item_id=work.work_item_id, rollouts=items
            )
            return EventEnvelope.new(
                payload,
                aggregate_id=work.run_id,
                id_parts=(work.work_item_id,) if whole else (work.work_item_id, first, last + 1),
                run_id=work.run_id,
                trace_id=work.trace_id,
                correlation_id=work.correlation_id,
                causation_id=work.causation_id,
                dumped=dumped_batch(payload),
            )

        async def publish(rollouts: list[GeneratedRollout], *, last: bool) -> None:
            try:
                rollouts = await offload(store(), rollouts)
            except (ObjectStoreError, OSError) as exc:
                if not last:
                    raise
                rollouts = _unstored(rollouts, f"object store failed: {describe(exc)}")
            # Split (if at all) between tasks: a `ruler` verifier judges a task's samples in
            # one call, and it sees only the samples of one event together.
            sent = await publisher.publish_fitted(
                rollouts,
                part,
                shrink=_too_large,
                group_by=lambda r: r.task_index,
            )
            published.update(r.rollout_id for r in rollouts)
            log.info(
                "rollouts generated",
                run_id=work.run_id,
                count=len(rollouts),
                events=len(sent),
                actor=me,
            )

        async def finished(rollouts: list[GeneratedRollout]) -> None:
            # Each task's rollouts go out as soon as they are done, while the batch goes on.
            await publish(rollouts, last=attempt >= DEFAULT_MAX_DELIVER)

        async with working_on(raw, every_s=keepalive_s):
            stage: ErrorKind = "env"
            try:
                spec = await cache.get(work.env_slug, work.env_version, work.env_hash)
                stage = "model"
                backend = backends.get(work.model)
                # A trained policy catches up with its newest version before generating (in a
                # thread: it may download weights); no other backend pays for the thread hop.
                if isinstance(backend, TrainedBackend):
                    await asyncio.to_thread(refresh_policy, backend)
                # The version that produces them, not the run's.
                version = getattr(backend, "policy_version", None)
                rollouts = await generate_batch(
                    work,
                    spec,
                    backend,
                    actor_id=me,
                    delivery_attempt=attempt,
                    policy_version=version,
                    on_rollouts=finished,
                )
            except (RolloutError, RetrySignal, httpx.HTTPError, OSError, ObjectStoreError) as exc:
                # Retry a few times (a flaky endpoint); then record the failure on each rollout
                # not yet on the log so the run still finishes and says why.
                if attempt < DEFAULT_MAX_DELIVER:
                    raise
                kind: ErrorKind = "infra" if isinstance(exc, OSError | ObjectStoreError) else stage
                rollouts = failed_batch(
                    work,
                    f"generation failed: {describe(exc)}",
                    actor_id=me,
                    delivery_attempt=attempt,
                    kind=kind,
                )
            rest = [r for r in rollouts if r.rollout_id not in published]
            if rest:
                await publish(rest, last=True)

    @broker.subscriber(
        subjects.event_filter("policy", "policy.updated"),
        # The event's reply subject is the learner's wait for JetStream's publish ack: an
        # (empty) answer from here could reach it first and break that publish.
        no_reply=True,
        title="actor/policy-updated",
        description="Loads a new version of a policy this replica serves, without a restart.",
    )
    async def policy_updated(event: EventEnvelope) -> None:
        """Reload the weights of a loaded backend whose model has a new version."""
        body = event.body()
        backend = backends.loaded(body.model) if isinstance(body, PolicyUpdated) else None
        if backend is not None and await asyncio.to_thread(apply_update, backend, body):
            log.info("policy reloaded", model=body.model, version=body.version, actor=me)

    return broker


async def serve(settings: Settings) -> None:
    """Run one actor replica until cancelled."""
    declared = consumer()  # a bad setting stops the replica before it connects

    async def build(runtime: ServiceRuntime) -> NatsBroker:
        return build_broker(settings)

    await serve_service("actor", settings, build, consumers=[declared])
