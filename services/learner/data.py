"""A run's lifecycle from the log: was it asked for, has it ended, and where on the stream.

The training data itself comes from the buffer (training_sets.py); from the events stream the
learner reads only a run's lifecycle events, each the last message on its own subject, so
checking a run does not replay its rollouts. The stream sequence of the event that ended the
run is what the buffer must have applied before its answer holds every verdict of the run.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import RunCompleted, RunFailed, RunRequested
from rollout.shared.errors import RolloutError

_ENDINGS = {subjects.event_name(t.event_type): t for t in (RunCompleted, RunFailed)}


@dataclass
class RunInfo:
    """One run's request and how it stands; `seq` is where its ending event sits (0: running)."""

    request: RunRequested
    status: str = "running"
    reason: str | None = None
    seq: int = 0

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.request.run_id

    def end(self, body: object, seq: int) -> None:
        """Apply the event that ended the run (the first one counts)."""
        if self.status != "running":
            return
        if isinstance(body, RunCompleted):
            self.status, self.seq = "completed", seq
        elif isinstance(body, RunFailed):
            self.status, self.reason, self.seq = "failed", body.reason, seq


async def _last(js: JetStreamContext, run_id: str, event_type: str) -> tuple[object, int] | None:
    subject = subjects.event("run", run_id, subjects.event_name(event_type))
    try:
        raw = await js.get_last_msg(subjects.EVENTS_STREAM, subject)
    except NotFoundError:
        return None
    return EventEnvelope.from_bytes(raw.data).body(), raw.seq


async def run_info(js: JetStreamContext, run_id: str) -> RunInfo | None:
    """The run's request and status (None when there is no such run)."""
    found = await _last(js, run_id, RunRequested.event_type)
    if found is None or not isinstance(found[0], RunRequested):
        return None
    info = RunInfo(request=found[0])
    endings = [await _last(js, run_id, t.event_type) for t in _ENDINGS.values()]
    for body, seq in sorted((e for e in endings if e is not None), key=lambda e: e[1]):
        info.end(body, seq)
    return info


async def wait_for_run_end(js: JetStreamContext, run_id: str, *, timeout_s: float) -> RunInfo:
    """Follow a run until it completes or fails; RolloutError when it takes too long."""

    async def follow() -> RunInfo:
        info: RunInfo | None = None
        # Closed at once and its consumer deleted: a job follows one run per round.
        reader = read_events(js, subjects.run_events(run_id), follow=True, delete_consumer=True)
        async with contextlib.aclosing(reader) as events:
            async for msg in events:
                _, _, name = subjects.parse_event_subject(msg.subject)
                # Only lifecycle events are decoded: rollout batches are the buffer's business.
                if name == subjects.event_name(RunRequested.event_type):
                    body = EventEnvelope.from_bytes(msg.data).body()
                    assert isinstance(body, RunRequested)
                    info = RunInfo(request=body)
                elif name in _ENDINGS and info is not None:
                    info.end(
                        EventEnvelope.from_bytes(msg.data).body(), msg.metadata.sequence.stream
                    )
                    return info
        raise RolloutError(f"run {run_id}: its events ended before it did")

    try:
        return await asyncio.wait_for(follow(), timeout=timeout_s)
    except TimeoutError:
        raise RolloutError(f"run {run_id} did not finish within {timeout_s:.0f}s") from None
