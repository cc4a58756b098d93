"""The run aggregate: its state rebuilt from the run's own events, and how it decides to end.

The read models answer queries; they never decide. Whether a run completes or times out is
decided here from the run's history, and the ending is appended on the condition that the
history has not moved since (see runs.settle), so a run ends exactly once.
"""

from __future__ import annotations

from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pydantic
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope, deterministic_id
from rollout.shared.contracts.events import (
    RolloutsScored,
    RunCompleted,
    RunFailed,
    RunRequested,
    RunStarted,
    ScoredRollout,
)

# The event types the run's state is made of (its trajectories are not needed to decide).
STATE_EVENTS = ("run.requested", "run.started", "rollout.scored", "run.completed", "run.failed")

Ending = RunCompleted | RunFailed


def rollout_id(run_id: str, task_index: int, sample_index: int) -> str:
    """Stable id of one rollout of a run."""
    return deterministic_id("rollout", run_id, task_index, sample_index)[:24]


@dataclass
class RunState:
    """One run as its events tell it, as of stream sequence `version`."""

    run_id: str
    requested: RunRequested | None = None
    requested_event: EventEnvelope | None = None
    total: int | None = None
    planned: frozenset[str] = frozenset()
    verdicts: dict[str, ScoredRollout] = field(default_factory=dict)
    ended: Ending | None = None
    # Stream sequence of the newest event of the run (any type): the guard for appends.
    version: int = 0

    def apply(self, event: EventEnvelope) -> None:
        """Fold one event of the run into the state."""
        body = event.body()
        if isinstance(body, RunRequested) and self.requested is None:
            self.requested, self.requested_event = body, event
            self.planned = frozenset(
                rollout_id(body.run_id, t, s) for t in body.task_indices for s in range(body.n)
            )
        elif isinstance(body, RunStarted) and self.total is None:
            self.total = body.total_rollouts
        elif isinstance(body, RolloutsScored):
            # Only the first verdict per planned rollout counts, as in the read model.
            for r in body.rollouts:
                if r.rollout_id in self.planned:
                    self.verdicts.setdefault(r.rollout_id, r)
        elif isinstance(body, RunCompleted | RunFailed) and self.ended is None:
            self.ended = body

    @property
    def deadline(self) -> datetime | None:
        """When the run times out (its request's time plus its deadline)."""
        if self.requested is None or self.requested_event is None:
            return None
        return self.requested_event.time + timedelta(seconds=self.requested.deadline_s)

    def decide(self, now: datetime) -> Ending | None:
        """How the run ends now: completed once all is scored, failed past its deadline."""
        if self.requested is None or self.ended is not None:
            return None
        scored = len(self.verdicts)
        if self.total is not None and scored >= self.total:
            return self._completed()
        deadline = self.deadline
        if deadline is not None and now >= deadline:
            total = self.total if self.total is not None else len(self.planned)
            return RunFailed(
                run_id=self.run_id,
                reason=(
                    f"deadline of {self.requested.deadline_s:.0f}s passed with {scored}/{total}"
                    " rollouts scored (are actors and verifiers running? see `rollout status`)"
                ),
            )
        return None

    def _completed(self) -> RunCompleted:
        total = self.total or 0
        verdicts = self.verdicts.values()
        passed = sum(1 for v in verdicts if v.outcome == "passed")
        errored = sum(1 for v in verdicts if v.outcome == "errored")
        # An errored rollout has no verdict: rates are over passed + failed, as in get_run.
        judged = total - errored
        return RunCompleted(
            run_id=self.run_id,
            total=total,
            passed=passed,
            errored=errored,
            pass_rate=passed / judged if judged else 0.0,
            mean_score=sum(v.score for v in verdicts if v.outcome != "errored") / judged
            if judged
            else 0.0,
        )


async def load_run(js: JetStreamContext, run_id: str) -> RunState:
    """Rebuild a run's state from its events, up to the newest one when this was called."""
    state = RunState(run_id)
    try:
        newest = await js.get_last_msg(subjects.EVENTS_STREAM, subjects.run_events(run_id))
    except NotFoundError:
        return state
    state.version = newest.seq
    filters = [subjects.event("run", run_id, subjects.event_name(t)) for t in STATE_EVENTS]
    async with aclosing(read_events(js, filters, delete_consumer=True)) as messages:
        async for msg in messages:
            if msg.metadata.sequence.stream > state.version:
                break  # the state is as of `version`: what came later is decided next time
            try:
                event = EventEnvelope.from_bytes(msg.data)
            except pydantic.ValidationError:
                continue  # the projection dead-letters it; it is no part of the run's state
            state.apply(event)
    return state
