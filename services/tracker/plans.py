"""Experiment plans' histories: the tracker appends a plan's events for the CLI that drives it.

`rollout run --config` runs the plan's stages from the CLI process (a client-side process
manager) through the ordinary requests; keys may not append events themselves, so each step
is recorded here. An append names the newest event of the plan its caller decided from and
lands only if the plan's history has not moved since, so two drivers of one plan cannot both
start a stage: the second is told the plan moved on.
"""

from __future__ import annotations

import hashlib

import pydantic
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rollout.shared import subjects
from rollout.shared.auth.ownership import check_may_change, owner_for
from rollout.shared.bus.publisher import ConcurrencyConflict, EventPublisher
from rollout.shared.contracts.envelope import EventEnvelope, payload_types
from rollout.shared.contracts.events import PlanStarted
from rollout.shared.contracts.requests import RecordPlanEvent
from rollout.shared.errors import RolloutError
from rollout.shared.observability import get_logger

QUEUE = "tracker"
# The plan event types a driver may record (the `plan` aggregate's, and only those).
PLAN_EVENTS = tuple(
    sorted(name for name, model in payload_types().items() if model.aggregate == "plan")
)

log = get_logger(__name__)


def plan_event(cmd: RecordPlanEvent, caller: str = subjects.ANONYMOUS) -> EventEnvelope:
    """The event `cmd` asks to append; RolloutError naming what is wrong with it.

    A plan's first event records its driver (`caller`, or whom a service drives it for).
    """
    subjects.token(cmd.plan_id, "plan id")
    model = payload_types().get(cmd.type)
    if model is None or model.aggregate != "plan":
        raise RolloutError(f"type: {cmd.type!r} is not a plan event ({', '.join(PLAN_EVENTS)})")
    if cmd.payload.get("plan_id", cmd.plan_id) != cmd.plan_id:
        raise RolloutError(f"payload.plan_id: must be {cmd.plan_id!r}")
    try:
        body = model.model_validate({**cmd.payload, "plan_id": cmd.plan_id})
    except pydantic.ValidationError as exc:
        problems = [f"payload.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise RolloutError(f"invalid {cmd.type} event", problems=problems) from None
    if isinstance(body, PlanStarted):
        body = body.model_copy(update={"owner": owner_for(caller, body.owner, "a plan")})
    # A retried request (same position, same content) is the same event; another driver's
    # different event at that position is not, and meets the expected-sequence check.
    content = hashlib.sha256(body.model_dump_json().encode()).hexdigest()
    return EventEnvelope.new(
        body, aggregate_id=cmd.plan_id, id_parts=(cmd.plan_id, cmd.expected_version, content)
    )


async def _newest(js: JetStreamContext, plan_id: str) -> tuple[int, EventEnvelope] | None:
    """(stream sequence, event) of the plan's newest event, or None."""
    try:
        msg = await js.get_last_msg(
            subjects.EVENTS_STREAM, subjects.aggregate_events("plan", plan_id)
        )
    except NotFoundError:
        return None
    return msg.seq, EventEnvelope.from_bytes(msg.data)


async def _owner(js: JetStreamContext, plan_id: str) -> str | None:
    """Who drives the plan (its `plan.started` owner); None before it started or before owners."""
    started = subjects.event("plan", plan_id, subjects.event_name(PlanStarted.event_type))
    try:
        msg = await js.get_last_msg(subjects.EVENTS_STREAM, started)
    except NotFoundError:
        return None
    try:
        return EventEnvelope.from_bytes(msg.data).payload.get("owner")
    except pydantic.ValidationError:
        return None


async def record_plan_event(
    js: JetStreamContext, cmd: RecordPlanEvent, caller: str = subjects.ANONYMOUS
) -> dict:
    """Append one plan event, conditional on the plan's history being as the caller saw.

    Only the plan's driver (the user whose request started it), the admin and the services
    may append to a started plan: a colleague's key cannot fail or steer it.
    """
    event = plan_event(cmd, caller)
    if not isinstance(event.body(), PlanStarted):
        check_may_change(
            caller, await _owner(js, cmd.plan_id), f"plan {cmd.plan_id}", "drive",
            "; to run the same plan yourself, give it another name",
        )  # fmt: skip
    try:
        result = await EventPublisher(js).publish(
            event,
            expected_last_subject_seq=cmd.expected_version,
            expected_subject=subjects.aggregate_events("plan", cmd.plan_id),
        )
    except ConcurrencyConflict:
        # JetStream checks the expected sequence before its duplicate window: a resend of
        # an append that landed is answered from the plan's newest event, if it is that one.
        landed = await _newest(js, cmd.plan_id)
        if landed is not None and landed[1].id == event.id:
            return {"seq": landed[0], "duplicate": True, "id": event.id}
        raise RolloutError(
            f"plan {cmd.plan_id} moved on since it was read (is another `rollout run "
            "--config` driving it?); run it again to resume from its events"
        ) from None
    log.info("plan event recorded", plan_id=cmd.plan_id, type=cmd.type, seq=result.seq)
    return {"seq": result.seq, "duplicate": result.duplicate, "id": event.id}
