"""The run aggregate: its state rebuilt from the run's own events, how it decides, and how a
decision is appended.

The read models answer queries; they never decide. Whether a run starts, completes or times out
is decided here from the run's history, and the decision is appended on the condition that the
history has not moved since (`decide_and_append`), so a run ends exactly once. The tracker,
the verifier, the learner and the CLI read runs through this module: the whole history
(`load_run`), its head alone, cheaply (`recorded_request`, `load_run_head`), or live until it
ends (`follow_run`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pydantic
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rollout.shared import subjects
from rollout.shared.aggregates import append
from rollout.shared.aggregates.append import CONFLICT_RETRIES
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope, Payload, deterministic_id
from rollout.shared.contracts.events import (
    RolloutsScored,
    RunCompleted,
    RunFailed,
    RunRequested,
    RunStarted,
    ScoredRollout,
    WorkReleased,
)
from rollout.shared.errors import RolloutError
from rollout.shared.stats import mean_score, score_sum

# The event types the run's state is made of (its trajectories are not needed to decide).
STATE_EVENTS = (
    "run.requested",
    "run.started",
    "run.work_released",
    "rollout.scored",
    "run.completed",
    "run.failed",
)
ENDINGS = ("run.completed", "run.failed")

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
    # The stream position of the trajectory each verdict judged (when the verdict names it).
    judged: dict[str, int] = field(default_factory=dict)
    ended: Ending | None = None
    # A windowed run's work items, its window and how many of them are queued (None: all
    # of them were queued at the start).
    work_items: int = 0
    window: int | None = None
    released: int | None = None
    # A run started waiting for its owner's earlier runs (window 0): its deadline counts
    # from its first release (`began`, that event's time), not from its request.
    waited: bool = False
    began: datetime | None = None
    # Stream sequence of the event that ended the run (0 while it runs): a reader of the run's
    # verdicts (the buffer) must have applied the stream up to it to hold every one.
    ended_seq: int = 0
    # Stream sequence of the newest event of the run (any type): the guard for appends.
    version: int = 0

    @property
    def status(self) -> str:
        """`running`, `completed` or `failed`."""
        if self.ended is None:
            return "running"
        return "completed" if isinstance(self.ended, RunCompleted) else "failed"

    @property
    def reason(self) -> str | None:
        """Why the run failed (None otherwise)."""
        return self.ended.reason if isinstance(self.ended, RunFailed) else None

    def apply(self, event: EventEnvelope, seq: int = 0) -> None:
        """Fold one event of the run (at stream sequence `seq`, when known) into the state."""
        body = event.body()
        if isinstance(body, RunRequested) and self.requested is None:
            self.requested, self.requested_event = body, event
            self.planned = frozenset(
                rollout_id(body.run_id, t, s) for t in body.task_indices for s in range(body.n)
            )
        elif isinstance(body, RunStarted) and self.total is None:
            self.start(body)
        elif isinstance(body, WorkReleased) and self.released is not None:
            self.released = max(self.released, min(body.released, self.work_items))
            if self.waited and self.began is None:
                self.began = event.time
        elif isinstance(body, RolloutsScored):
            # One verdict per planned rollout, as in the read model: the first, unless the
            # rollout was generated twice and this one judged the earlier trajectory (the one
            # the read models keep): then it replaces the twin's.
            judged = body.generated_seq
            for r in body.rollouts:
                if r.rollout_id not in self.planned:
                    continue
                kept = self.judged.get(r.rollout_id)
                if r.rollout_id not in self.verdicts or (
                    judged is not None and kept is not None and judged < kept
                ):
                    self.verdicts[r.rollout_id] = r
                    if judged is not None:
                        self.judged[r.rollout_id] = judged
        elif isinstance(body, RunCompleted | RunFailed) and self.ended is None:
            self.ended, self.ended_seq = body, seq

    @property
    def waiting(self) -> bool:
        """True while the run waits for its owner's earlier runs: started, nothing queued."""
        return self.released == 0 and self.ended is None

    @property
    def deadline(self) -> datetime | None:
        """When the run times out: its deadline after its request, or after its first release
        for a run that waited for its owner's earlier runs (None while it waits)."""
        if self.requested is None or self.requested_event is None:
            return None
        since = self.began if self.waited else self.requested_event.time
        if since is None:
            return None
        return since + timedelta(seconds=self.requested.deadline_s)

    def decide(self, now: datetime) -> Ending | None:
        """How the run ends now: completed once all is scored (failed when no rollout got a
        verdict), failed past its deadline."""
        if self.requested is None or self.ended is not None:
            return None
        scored = len(self.verdicts)
        if self.total is not None and scored >= self.total:
            return self._all_errored() or self._completed()
        deadline = self.deadline
        if deadline is not None and now >= deadline:
            total = self.total if self.total is not None else len(self.planned)
            return RunFailed(
                run_id=self.run_id,
                reason=(
                    f"deadline of {self.requested.deadline_s:.0f}s passed with {scored}/{total}"
                    " rollouts scored (are actors and verifiers running? see `rollout status`)"
                ),
                cause="deadline",
            )
        return None

    def start(self, started: RunStarted) -> None:
        """Fold the run's start: its size, and its window when it has one."""
        self.total, self.work_items = started.total_rollouts, started.work_items
        if started.window is not None and started.window < started.work_items:
            self.window = self.released = started.window
            self.waited = started.window == 0

    def to_release(self, window: int | None = None) -> int | None:
        """How many work items should be queued now, when more than are: the window (the
        recorded one, or `window` items, the run's share now) plus one per item's worth of
        rollouts scored (so about `window` are queued or generating)."""
        if self.released is None or self.window is None or self.requested is None:
            return None
        if self.ended is not None:
            return None  # a cancelled or failed run's unqueued work is never generated
        window = self.window if window is None else window
        done = len(self.verdicts) // self.requested.batch_size
        due = min(self.work_items, window + done)
        # A quarter of the window at a time (the last items whatever their number): fewer
        # events and publishes, while at least 3/4 of the window stays queued or generating.
        step = max(1, window // 4)
        if due > self.released and (due - self.released >= step or due == self.work_items):
            return due
        return None

    def cancel(self, reason: str | None, scored: int) -> RunFailed | None:
        """The run's ending when a user cancels it now (`scored` of it so far, as the read
        model counts): None if it is unknown or has ended."""
        if self.requested is None or self.ended is not None:
            return None
        total = self.total
        if total is None:
            total = len(self.requested.task_indices) * self.requested.n
        why = f": {reason.strip()}" if reason and reason.strip() else ""
        return RunFailed(
            run_id=self.run_id,
            reason=f"cancelled{why} ({scored}/{total} rollouts scored)",
            cause="cancelled",
        )

    def _all_errored(self) -> RunFailed | None:
        """The run's failure when every rollout is scored and none has a verdict: its pass
        rate would measure the error (a model server that is down), so it measured nothing."""
        verdicts = sorted(self.verdicts.values(), key=lambda v: (v.task_index, v.sample_index))
        if not verdicts or any(v.outcome != "errored" for v in verdicts):
            return None
        first = verdicts[0]
        kind = f" ({first.error_kind} error)" if first.error_kind else ""
        lines = (first.error or "").strip().splitlines() or ["no error message was recorded"]
        return RunFailed(
            run_id=self.run_id,
            reason=(
                f"every rollout errored ({len(verdicts)} of {len(verdicts)}), so nothing was"
                f" measured; the first: task {first.task_index}{kind}: {lines[0][:300]}"
            ),
            cause="errored",
        )

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
            mean_score=mean_score(
                score_sum(v.score for v in verdicts if v.outcome != "errored"), judged
            ),
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
    async with aclosing(read_events(js, filters)) as messages:
        async for msg in messages:
            if msg.metadata.sequence.stream > state.version:
                break  # the state is as of `version`: what came later is decided next time
            try:
                event = EventEnvelope.from_bytes(msg.data)
            except pydantic.ValidationError:
                continue  # the projection dead-letters it; it is no part of the run's state
            state.apply(event, msg.metadata.sequence.stream)
    return state


async def append_to_run(js: JetStreamContext, state: RunState, payload: Payload) -> None:
    """Append an event the run's state decided, only if no event of the run came since."""
    envelope = EventEnvelope.new(
        payload,
        aggregate_id=state.run_id,
        id_parts=(state.run_id,),
        parent=state.requested_event,
    )
    await EventPublisher(js).publish(
        envelope,
        expected_last_subject_seq=state.version,
        expected_subject=subjects.run_events(state.run_id),
    )


async def decide_and_append(
    js: JetStreamContext,
    run_id: str,
    decide: Callable[[RunState], Payload | None],
    *,
    retries: int = CONFLICT_RETRIES,
) -> tuple[RunState, Payload | None]:
    """Load the run, decide, append the decision expecting the history read; again on a race."""
    return await append.decide_and_append(
        lambda: load_run(js, run_id),
        decide,
        lambda state, decision: append_to_run(js, state, decision),
        what=f"run {run_id}",
        retries=retries,
    )


async def _last_event(
    js: JetStreamContext, run_id: str, event_type: str
) -> tuple[EventEnvelope, int] | None:
    subject = subjects.event("run", run_id, subjects.event_name(event_type))
    try:
        raw = await js.get_last_msg(subjects.EVENTS_STREAM, subject)
    except NotFoundError:
        return None
    return EventEnvelope.from_bytes(raw.data), raw.seq


async def _last_of(js: JetStreamContext, run_id: str, event_type: str) -> tuple[object, int] | None:
    found = await _last_event(js, run_id, event_type)
    return None if found is None else (found[0].body(), found[1])


async def recorded_request(js: JetStreamContext, run_id: str) -> RunRequested | None:
    """The run.requested on the log for `run_id` (one read), or None."""
    found = await _last_of(js, run_id, RunRequested.event_type)
    if found is None or not isinstance(found[0], RunRequested):
        return None
    return found[0]


async def _first_ending(js: JetStreamContext, run_id: str) -> tuple[Ending, int] | None:
    """The run's ending and its stream sequence (two reads; the earlier, should both be)."""
    endings = [
        (body, seq)
        for t in ENDINGS
        if (found := await _last_of(js, run_id, t)) is not None
        for body, seq in [found]
        if isinstance(body, RunCompleted | RunFailed)
    ]
    return min(endings, key=lambda e: e[1], default=None)


async def ending_of(js: JetStreamContext, run_id: str) -> Ending | None:
    """How the run ended (two reads, no history), or None while it runs or if it is unknown."""
    first = await _first_ending(js, run_id)
    return first[0] if first is not None else None


async def load_run_head(js: JetStreamContext, run_id: str) -> RunState | None:
    """The run's request, start and ending, each the last message on its subject (no verdicts).

    None when there is no such run. Cheap on runs of any size: what the learner checks before
    it trains on a run, and what a cancel decides from. Its `version` is read first, so an
    append expecting it is refused if anything of the run landed since, the ending included.
    """
    try:
        newest = await js.get_last_msg(subjects.EVENTS_STREAM, subjects.run_events(run_id))
    except NotFoundError:
        return None
    found = await _last_event(js, run_id, RunRequested.event_type)
    if found is None or not isinstance(found[0].body(), RunRequested):
        return None
    state = RunState(run_id, requested=found[0].body(), requested_event=found[0])
    state.version = newest.seq
    started = await _last_of(js, run_id, RunStarted.event_type)
    if started is not None and isinstance(started[0], RunStarted):
        state.start(started[0])
    if (first := await _first_ending(js, run_id)) is not None:
        state.ended, state.ended_seq = first
    return state


async def follow_run(
    js: JetStreamContext,
    run_id: str,
    *,
    timeout_s: float | None = None,
    on_event: Callable[[EventEnvelope, RunState], Awaitable[None] | None] | None = None,
) -> RunState:
    """Follow the run's events live until it ends; its state then (RolloutError on timeout).

    `on_event` sees each event after it is folded in (a progress bar, say). Only lifecycle
    events are decoded unless `on_event` is given: rollout batches are large.
    """

    loop = asyncio.get_running_loop()
    state = RunState(run_id)
    began: list[float] = []  # when a run that waited for its owner's earlier runs started

    async def follow() -> RunState:
        reader = read_events(js, subjects.run_events(run_id), follow=True)
        async with aclosing(reader) as events:
            async for msg in events:
                _, _, name = subjects.parse_event_subject(msg.subject)
                if on_event is None and name not in _LIFECYCLE:
                    continue
                event = EventEnvelope.from_bytes(msg.data)
                was_waiting = state.waiting
                state.apply(event, msg.metadata.sequence.stream)
                if was_waiting and not state.waiting:
                    began.append(loop.time())
                if on_event is not None:
                    done = on_event(event, state)
                    if done is not None:
                        await done
                if state.ended is not None:
                    return state
        raise RolloutError(f"run {run_id}: its events ended before it did")

    if timeout_s is None:
        return await follow()
    # The timeout counts from the run's start: not while it waits for its owner's earlier runs.
    until = loop.time() + timeout_s
    task = asyncio.ensure_future(follow())
    try:
        while not (await asyncio.wait({task}, timeout=max(0.0, until - loop.time())))[0]:
            if state.waiting:
                until = loop.time() + timeout_s
            elif began and began[0] + timeout_s > loop.time():
                until = began[0] + timeout_s
            else:
                raise RolloutError(f"run {run_id} did not finish within {timeout_s:.0f}s")
        return task.result()
    finally:
        task.cancel()


_LIFECYCLE = {
    subjects.event_name(t) for t in ("run.requested", "run.started", "run.work_released", *ENDINGS)
}
