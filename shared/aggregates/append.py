"""Load, decide, append on the condition that the history read has not moved; again on a race.

Every aggregate (a run, a job, an environment) decides from its own events and appends its
decision expecting the stream sequence it read: of two deciders racing, one appends and the
other reads again and decides again, so a decision is made once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.js import JetStreamContext

from rollout.shared.bus.publisher import ConcurrencyConflict, EventPublisher
from rollout.shared.contracts.envelope import EventEnvelope

State = TypeVar("State")
Decision = TypeVar("Decision")
# How often a decision is made again after another append got in first.
CONFLICT_RETRIES = 8


async def decide_and_append(
    load: Callable[[], Awaitable[State]],
    decide: Callable[[State], Decision | None],
    append: Callable[[State, Decision], Awaitable[object]],
    *,
    what: str,
    retries: int = CONFLICT_RETRIES,
) -> tuple[State, Decision | None]:
    """(the state decided from, the decision appended, or None when there was none to append).

    `append` raises ConcurrencyConflict when the history moved since `load` read it. After
    `retries` races this raises ConcurrencyConflict (a RetrySignal) naming `what`.
    """
    for _ in range(retries):
        state = await load()
        decision = decide(state)
        if decision is None:
            return state, None
        try:
            await append(state, decision)
        except ConcurrencyConflict:
            continue  # something landed after the read: decide again from a fresh one
        return state, decision
    raise ConcurrencyConflict(f"{what} kept changing while a decision was being recorded")


async def append_unless(js: JetStreamContext, envelope: EventEnvelope, subject: str) -> None:
    """Append `envelope` only while `subject` holds no message; ConcurrencyConflict otherwise.

    Also a conflict when an event with `envelope`'s id is on the log already (JetStream drops
    it as a duplicate): another decision of the same kind got in first. For a decision that
    only one other can contradict (a cancel, a completion), where expecting the aggregate's
    whole history would lose every race to the events a busy aggregate keeps appending.
    """
    result = await EventPublisher(js).publish(
        envelope, expected_last_subject_seq=0, expected_subject=subject
    )
    if result.duplicate:
        raise ConcurrencyConflict(f"{envelope.type} {envelope.id} is on the log already")
