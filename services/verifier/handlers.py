"""The verifier's handler: score every rollout of a generated batch, publish one scored batch."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Annotated

from faststream import Context
from nats.js import JetStreamContext

from rollout.services.verifier.scoring import (
    ScoringUnavailable,
    errored_verdict,
    failure_kind,
    prefetched,
    score_rollout,
    score_task_group,
    scoring_units,
    unscored,
)
from rollout.shared.aggregates.run import recorded_request
from rollout.shared.bus.attempts import Delivery, abandoned
from rollout.shared.bus.broker import current_message, jetstream
from rollout.shared.bus.deadletter import describe
from rollout.shared.bus.keepalive import working_on
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.sequence import stream_sequence
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import (
    RolloutsGenerated,
    RolloutsScored,
    RunRequested,
    ScoredRollout,
)
from rollout.shared.envs.verifiers.ruler import judged_in_groups
from rollout.shared.errors import RetrySignal
from rollout.shared.observability import event_context, get_logger
from rollout.shared.service.replica import ReplicaState
from rollout.shared.service.routes import CurrentBroker

# Run requests kept per replica: a request never changes, so each run is read once, not once
# per generated batch (a round trip per work item otherwise).
RUN_CACHE_SIZE = 1024

log = get_logger(__name__)


@dataclass(kw_only=True)
class VerifierState(ReplicaState):
    """What one replica keeps between batches: run requests besides the kit's caches."""

    requests: OrderedDict[str, RunRequested] = field(default_factory=OrderedDict)


State = Annotated[VerifierState, Context("verifier")]


async def run_of(
    js: JetStreamContext, run_id: str, cache: OrderedDict[str, RunRequested] | None = None
) -> RunRequested:
    """The run request (for its env version), read from the run's first event (cached)."""
    if cache is not None and (hit := cache.get(run_id)) is not None:
        cache.move_to_end(run_id)
        return hit
    run = await recorded_request(js, run_id)
    if run is None:
        # Not yet visible to this replica's read, or never requested: retried, then errored.
        raise RetrySignal(f"run {run_id}: no run.requested on the log")
    if cache is not None:
        cache[run_id] = run
        if len(cache) > RUN_CACHE_SIZE:
            cache.popitem(last=False)
    return run


async def score_batch(event: EventEnvelope, broker: CurrentBroker, verifier: State) -> None:
    """Score every rollout of the batch; ack after the scored event is stored."""
    message = current_message(broker)
    js = jetstream(broker)
    generated = event.body()
    assert isinstance(generated, RolloutsGenerated)
    raw = message.raw_message
    delivery = Delivery.of(raw)
    # Which trajectories these verdicts judge, should the rollouts be on the log twice.
    position = stream_sequence(raw)
    with event_context(event):
        async with working_on(raw, every_s=verifier.keepalive_s):
            if delivery.number > delivery.limit:
                # Every earlier delivery ended without an answer: the batch kills its replicas
                # (JetStream would have dropped it, the run then waiting for its deadline).
                cause = abandoned(delivery.number, "verifier")
                log.error("batch abandoned", run_id=generated.run_id, cause=cause)
                scored = [unscored(r, cause, "infra") for r in generated.rollouts]
            else:
                verdicts = await _verdicts(generated, js, verifier, delivery)
                if verdicts is None:
                    return  # an imported run's verdicts came with it (tracker/imports.py)
                scored = verdicts

            def part(items: list[ScoredRollout], start: int, end: int) -> EventEnvelope:
                whole = start == 0 and end == len(scored)
                return EventEnvelope.new(
                    RolloutsScored(
                        run_id=generated.run_id,
                        work_item_id=generated.work_item_id,
                        rollouts=items,
                        generated_seq=position,
                    ),
                    aggregate_id=generated.run_id,
                    # With the position: two copies of a generated event (a replica presumed
                    # dead, later than JetStream's dedup window) each keep their verdicts.
                    id_parts=(event.id, position) if whole else (event.id, position, start, end),
                    parent=event,
                )

            await EventPublisher(js).publish_fitted(scored, part, shrink=_too_large)
        log.info(
            "rollouts scored",
            count=len(scored),
            passed=sum(s.outcome == "passed" for s in scored),
            errored=sum(s.outcome == "errored" for s in scored),
        )


async def _verdicts(
    generated: RolloutsGenerated,
    js: JetStreamContext,
    verifier: VerifierState,
    delivery: Delivery,
) -> list[ScoredRollout] | None:
    """The batch's verdicts in its order (errored where scoring failed on its last delivery);
    None for an imported run, whose verdicts came with it. Raises to be retried otherwise."""
    try:
        run = await run_of(js, generated.run_id, verifier.requests)
        if run.source is not None:
            log.info("imported rollouts not rescored", run_id=run.run_id)
            return None
        spec = await verifier.specs(js).get(run.env_slug, run.env_version, run.env_hash)
    except Exception as exc:  # noqa: BLE001 (retried, then on every rollout)
        # Retried with backoff; on the last attempt every rollout of the batch is errored
        # with the cause, so the run completes instead of waiting for its deadline on a
        # dead-lettered batch.
        delivery.retry(exc)
        cause = delivery.gave_up(f"no environment to score with: {describe(exc)}")
        kind = failure_kind(exc)
        log.warning("batch errored", run_id=generated.run_id, kind=kind, cause=cause)
        return [unscored(r, cause, kind) for r in generated.rollouts]
    scored: list[ScoredRollout] = []
    rollouts = await prefetched(generated.rollouts, verifier.store())
    for unit in scoring_units(spec, rollouts):
        try:
            if len(unit) == 1 and not judged_in_groups(spec):
                scored.append(await score_rollout(spec, unit[0], verifier.store()))
            else:
                scored.extend(await score_task_group(spec, unit, verifier.store()))
        except Exception as exc:  # noqa: BLE001 (retried, then recorded)
            # Retried (the whole batch: scoring is idempotent); on the last attempt the
            # rollouts are errored with the cause.
            delivery.retry(exc)
            detail = str(exc) if isinstance(exc, ScoringUnavailable) else None
            cause = delivery.gave_up(detail or describe(exc))
            for rollout in unit:
                log.warning("rollout errored", rollout_id=rollout.rollout_id, cause=cause)
                # score_rollout itself errors what the env's own verifier raises.
                scored.append(errored_verdict(rollout, cause, "infra"))
    # Verdicts in the batch's order, whatever order the groups were judged in.
    order = {r.rollout_id: i for i, r in enumerate(generated.rollouts)}
    scored.sort(key=lambda v: order[v.rollout_id])
    return scored


def _too_large(verdict: ScoredRollout, size: int, budget: int) -> ScoredRollout:
    """A verdict too large for one message (huge reasons) becomes errored, saying so."""
    cause = f"its verdict is {size} bytes encoded, over the {budget} bytes a message may carry"
    return errored_verdict(verdict, cause, "infra")
