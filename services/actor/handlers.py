"""The actor's handlers: generate a work item's rollouts, and reload a policy's new version."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Annotated, Any

from faststream import Context
from faststream.nats import NatsRoute

from rollout.services.actor import redelivery
from rollout.services.actor.generate import (
    dumped_batch,
    failed_batch,
    generate_batch,
    without_trajectory,
)
from rollout.shared import subjects
from rollout.shared.aggregates.run import ending_of
from rollout.shared.bus.attempts import Delivery, abandoned
from rollout.shared.bus.broker import current_message, jetstream
from rollout.shared.bus.deadletter import capped, describe
from rollout.shared.bus.keepalive import working_on
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import (
    ErrorKind,
    GeneratedRollout,
    PolicyUpdated,
    RolloutsGenerated,
    RunFailed,
)
from rollout.shared.contracts.requests import CheckModel, Reply
from rollout.shared.contracts.work import RolloutWork
from rollout.shared.errors import RolloutError
from rollout.shared.models.base import ModelBackend, backend_problem, close_backend
from rollout.shared.models.catalog import resolve_backend
from rollout.shared.models.openai_compat import MissingApiKey
from rollout.shared.models.trained import FollowsPolicy, apply_update, refresh_policy
from rollout.shared.objectstore import to_json_bytes
from rollout.shared.objectstore.errors import ObjectStoreError
from rollout.shared.observability import get_logger
from rollout.shared.service.replica import ReplicaState
from rollout.shared.service.routes import CurrentBroker, request_route
from rollout.shared.store.trajectories import inline_limit, offload

log = get_logger(__name__)

# How long a model check waits on a backend's build (a first load) before it refuses nothing.
CHECK_BUILD_WAIT_S = 5.0


class Backends:
    """Model backends by name, loaded once per replica (weights stay in memory)."""

    def __init__(self) -> None:
        self._backends: dict[str, ModelBackend] = {}
        self._building: dict[str, asyncio.Future[ModelBackend]] = {}

    async def get(self, model: str) -> ModelBackend:
        """The backend for `model`, built on first use.

        Built in a thread: loading weights must not stall the replica's keepalives and
        requests. A model's first uses at once (a check and a work item) share one build.
        """
        if (backend := self._backends.get(model)) is not None:
            return backend
        building = self._building.get(model)
        if building is None:
            building = asyncio.ensure_future(asyncio.to_thread(resolve_backend, model))
            self._building[model] = building
            building.add_done_callback(lambda done: self._built(model, done))
        # Shielded: one waiter cancelled (its run ended) leaves the build to the others.
        return await asyncio.shield(building)

    def _built(self, model: str, done: asyncio.Future[ModelBackend]) -> None:
        # Kept as it completes, waited for or not: a load is never thrown away and redone.
        if not done.cancelled() and done.exception() is None:
            self._backends[model] = done.result()
        self._building.pop(model, None)

    def building(self, model: str) -> asyncio.Future[ModelBackend] | None:
        """The build of `model` under way, if any."""
        return self._building.get(model)

    async def drop(self, model: str) -> None:
        """Forget `model`'s backend and release what it holds (connections, weights)."""
        backend = self._backends.pop(model, None)
        if backend is not None:
            await close_backend(backend)

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


# Runs remembered as ended by one replica (the newest): enough for every run it works on.
ENDED_RUNS_KEPT = 10_000


@dataclass
class RunStops:
    """The generations under way per run, stopped when their run ends (cancel, deadline)."""

    running: dict[str, set[asyncio.Task[Any]]] = field(default_factory=dict)
    ended: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def start(self, run_id: str, task: asyncio.Task[Any]) -> None:
        """Track `task` as generating for `run_id` (stopped at once if the run has ended)."""
        self.running.setdefault(run_id, set()).add(task)
        if run_id in self.ended:
            task.cancel()

    def finish(self, run_id: str, task: asyncio.Task[Any]) -> None:
        """`task` is over."""
        tasks = self.running.get(run_id, set())
        tasks.discard(task)
        if not tasks:
            self.running.pop(run_id, None)

    def end(self, run_id: str) -> int:
        """The run ended: stop its generations; how many were stopped."""
        self.ended[run_id] = None
        self.ended.move_to_end(run_id)
        while len(self.ended) > ENDED_RUNS_KEPT:
            self.ended.popitem(last=False)
        tasks = self.running.get(run_id, set())
        for task in tasks:
            task.cancel()
        return len(tasks)

    def stopped(self, run_id: str, task: asyncio.Task[Any]) -> bool:
        """True when `task` was cancelled because its run ended."""
        return task.cancelled() and run_id in self.ended


@dataclass(kw_only=True)
class ActorState(ReplicaState):
    """What one replica keeps between work items: loaded models besides the kit's caches."""

    actor_id: str
    backends: Backends = field(default_factory=lambda: Backends())
    stops: RunStops = field(default_factory=lambda: RunStops())


State = Annotated[ActorState, Context("actor")]


async def generate(work: RolloutWork, broker: CurrentBroker, actor: State) -> None:
    """Run the agent loop on every rollout of a work item; ack after the event is stored."""
    message = current_message(broker)
    js = jetstream(broker)
    cache = actor.specs(js)
    raw = message.raw_message
    delivery = Delivery.of(raw)
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
            rollouts = await offload(actor.store(), rollouts)
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
            actor=actor.actor_id,
        )

    async def finished(rollouts: list[GeneratedRollout]) -> None:
        # Each task's rollouts go out as soon as they are done, while the batch goes on.
        await publish(rollouts, last=delivery.last)

    ended = await ending_of(js, work.run_id)
    if ended is not None:
        # Cancelled, or past its deadline: generating for it would only spend the model.
        log.info("run ended; work item skipped", run_id=work.run_id,
                 work_item_id=work.work_item_id, ended=ended.event_type)  # fmt: skip
        return
    todo = work
    if delivery.number > 1 or work.requeued:
        # An earlier delivery (of this message, or of the item queued before) may have
        # published part of it before its replica died.
        done = await redelivery.already_generated(js, work)
        published.update(done)
        todo = redelivery.remaining(work, done)
        if done:
            log.info("work item redelivered; generating only the rest", run_id=work.run_id,
                     work_item_id=work.work_item_id, on_the_log=len(done),
                     rest=len(todo.items))  # fmt: skip
        if not todo.items:
            return
    if delivery.number > delivery.limit:
        # Every earlier delivery ended without an answer: the item kills its replicas.
        reason = abandoned(delivery.number, "actor")
        log.error("work item abandoned", run_id=work.run_id,
                  work_item_id=work.work_item_id, reason=reason)  # fmt: skip
        await publish(
            failed_batch(todo, reason, actor_id=actor.actor_id,
                         delivery_attempt=delivery.number, kind="infra"),
            last=True,
        )  # fmt: skip
        return
    async with working_on(raw, every_s=actor.keepalive_s):
        stage: ErrorKind = "env"
        try:
            spec = await cache.get(work.env_slug, work.env_version, work.env_hash)
            stage = "model"
            backend = await actor.backends.get(work.model)
            # A trained policy catches up with its newest version before generating (in a
            # thread: it may download weights); no other backend pays for the thread hop.
            if isinstance(backend, FollowsPolicy):
                await asyncio.to_thread(refresh_policy, backend)
            # The version that produces them, not the run's.
            version = getattr(backend, "policy_version", None)
            task = asyncio.ensure_future(
                generate_batch(
                    todo,
                    spec,
                    backend,
                    actor_id=actor.actor_id,
                    delivery_attempt=delivery.number,
                    policy_version=version,
                    on_rollouts=finished,
                )
            )
            # Its run ending meanwhile stops it at once (a local model's turn under way ends
            # first): what finished is on the log; nothing else of an ended run is wanted.
            actor.stops.start(work.run_id, task)
            try:
                rollouts = await task
            except asyncio.CancelledError:
                if not actor.stops.stopped(work.run_id, task):
                    raise
                log.info("run ended; work item stopped", run_id=work.run_id,
                         work_item_id=work.work_item_id, published=len(published))  # fmt: skip
                return
            finally:
                actor.stops.finish(work.run_id, task)
        except Exception as exc:  # noqa: BLE001 - whatever fails an item ends on its rollouts
            # Retry a few times (a flaky endpoint); then record the failure on each rollout
            # not yet on the log so the run still finishes and says why. An error nothing
            # expects (a bug) too: raised past the last delivery, the item was dead-lettered
            # with its rollouts never recorded, and its run waited for its deadline.
            delivery.retry(exc)
            kind: ErrorKind = "infra" if isinstance(exc, OSError | ObjectStoreError) else stage
            rollouts = failed_batch(
                todo,
                delivery.gave_up(f"generation failed: {describe(exc)}"),
                actor_id=actor.actor_id,
                delivery_attempt=delivery.number,
                kind=kind,
            )
        rest = [r for r in rollouts if r.rollout_id not in published]
        if rest:
            await publish(rest, last=True)


async def policy_updated(event: EventEnvelope, actor: State) -> None:
    """Reload the weights of a loaded backend whose model has a new version."""
    body = event.body()
    backend = actor.backends.loaded(body.model) if isinstance(body, PolicyUpdated) else None
    if backend is not None and await asyncio.to_thread(apply_update, backend, body):
        log.info("policy reloaded", model=body.model, version=body.version, actor=actor.actor_id)


async def check_model(cmd: CheckModel, actor: State) -> Reply:
    """Whether this replica can generate with `cmd.model`: its backend built (a local model's
    weights loaded, kept for the run) and asked for its endpoint (at most one token generated,
    by a server with no working model list: `OpenAICompatBackend.check`).

    A build still under way after CHECK_BUILD_WAIT_S refuses nothing (a large model loading:
    the run will wait for it). A backend that cannot serve is dropped, its connections closed:
    its run is refused, so nothing else would use it.
    """
    known = actor.backends.loaded(cmd.model) is not None
    try:
        backend = await asyncio.wait_for(actor.backends.get(cmd.model), CHECK_BUILD_WAIT_S)
        problem = await backend_problem(backend)
    except TimeoutError:
        return Reply(data={"model": cmd.model, "actor": actor.actor_id, "problem": None,
                           "loading": True})  # fmt: skip
    except MissingApiKey as exc:
        # Read from the actors' environment, not the caller's shell: a key set there after
        # `rollout up` reaches no actor, and would be refused again in the same words.
        problem = capped(
            f"{exc.message}; the actors read {exc.variable} from their own environment (on the"
            " local stack: set it, then `rollout down` and `rollout up`)"
        )
    except RolloutError as exc:
        problem = capped(str(exc))  # said for the user already: no exception class in front
    except Exception as exc:  # noqa: BLE001 - whatever stops the build is the model's problem
        problem = describe(exc)
    if problem is not None and not known:
        await actor.backends.drop(cmd.model)
    return Reply(data={"model": cmd.model, "actor": actor.actor_id, "problem": problem})


async def run_failed(event: EventEnvelope, actor: State) -> None:
    """Stop this replica's generations for a run that failed (cancelled, or past its deadline)."""
    body = event.body()
    if isinstance(body, RunFailed) and (stopped := actor.stops.end(body.run_id)):
        log.info("run ended; its work items stopped", run_id=body.run_id, work_items=stopped,
                 actor=actor.actor_id)  # fmt: skip


# Policy updates reach every replica (no queue group); the event's reply subject is the
# learner's wait for JetStream's publish ack: an (empty) answer from here could reach it first
# and break that publish.
POLICY_ROUTE = NatsRoute(
    policy_updated,
    subjects.event_filter("policy", "policy.updated"),
    no_reply=True,
    title="actor/policy-updated",
    description="Loads a new version of a policy this replica serves, without a restart.",
)

# Every replica hears every run's failure (no queue group, no reply: as for policy updates).
RUN_FAILED_ROUTE = NatsRoute(
    run_failed,
    subjects.event_filter("run", "run.failed"),
    no_reply=True,
    title="actor/run-failed",
    description="Stops the generations under way for a run that was cancelled or timed out.",
)

# One replica answers (a queue group): the replicas of a pool are configured alike. Several
# at once: one model's slow build or endpoint must not hold the checks of the others.
CHECK_MODEL_ROUTE = request_route(
    check_model, "actor", "check_model", queue="actors",
    title="actor/check-model", max_workers=8,
)  # fmt: skip
