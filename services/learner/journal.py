"""A job's events: appending them with derived ids, and reading a job's history back."""

from __future__ import annotations

import math
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import pydantic
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rollout.shared import subjects
from rollout.shared.aggregates.append import decide_and_append
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import (
    CheckpointSaved,
    JobCompleted,
    JobFailed,
    JobProgress,
    JobRequested,
    JobStarted,
    PolicyUpdated,
)
from rollout.shared.models.trained import policy_key
from rollout.shared.objectstore import ObjectRef
from rollout.shared.observability import get_logger

log = get_logger(__name__)


class JobEnded(Exception):
    """The job ended (cancelled) while it was running: its worker stops at the next step."""


@dataclass
class JobHistory:
    """What the log says about a job so far (read again on every delivery)."""

    requested: JobRequested | None = None
    envelope: EventEnvelope | None = None
    checkpoints: list[CheckpointSaved] = field(default_factory=list)
    last_step: int = 0
    completed: JobCompleted | None = None
    failed: JobFailed | None = None
    # Stream sequence of the job's newest event: the guard for conditional appends.
    last_seq: int = 0

    @property
    def finished(self) -> bool:
        """True once the job completed or failed."""
        return self.completed is not None or self.failed is not None

    def last_checkpoint(self) -> CheckpointSaved | None:
        """The newest checkpoint saved, or None."""
        return max(self.checkpoints, key=lambda c: c.step, default=None)


async def job_history(js: JetStreamContext, job_id: str) -> JobHistory:
    """Replay one job's events from the stream."""
    history = JobHistory()
    async for msg in read_events(js, subjects.aggregate_events("job", job_id)):
        history.last_seq = max(history.last_seq, msg.metadata.sequence.stream)
        try:
            event = EventEnvelope.from_bytes(msg.data)
        except pydantic.ValidationError:
            continue  # dead-lettered by the tracker; it is no part of the job's history
        body = event.body()
        if isinstance(body, JobRequested):
            history.requested, history.envelope = body, event
        elif isinstance(body, CheckpointSaved):
            history.checkpoints.append(body)
        elif isinstance(body, JobProgress):
            history.last_step = max(history.last_step, body.step)
        elif isinstance(body, JobCompleted):
            history.completed = body
        elif isinstance(body, JobFailed):
            history.failed = body
    return history


async def _last_job_event(js: JetStreamContext, job_id: str, event_type: str) -> Any:
    subject = subjects.event("job", job_id, subjects.event_name(event_type))
    try:
        raw = await js.get_last_msg(subjects.EVENTS_STREAM, subject)
    except NotFoundError:
        return None
    return EventEnvelope.from_bytes(raw.data)


async def job_owner(js: JetStreamContext, job_id: str) -> str | None:
    """Who created job `job_id` (None: no such job, or one recorded before owners were kept)."""
    requested = await _last_job_event(js, job_id, JobRequested.event_type)
    body = requested.body() if requested is not None else None
    return body.owner if isinstance(body, JobRequested) else None


async def job_head(js: JetStreamContext, job_id: str) -> JobHistory:
    """The job's request, last step and ending, each the last message on its subject.

    No history is read: cheap however many reports the job made, so a decision retried while
    reports keep landing (a cancel) gets in. `last_seq` is read first: an append expecting it
    is refused if anything of the job landed since, an ending included.
    """
    head = JobHistory()
    try:
        newest = await js.get_last_msg(
            subjects.EVENTS_STREAM, subjects.aggregate_events("job", job_id)
        )
    except NotFoundError:
        return head
    head.last_seq = newest.seq
    requested = await _last_job_event(js, job_id, JobRequested.event_type)
    if requested is None:
        return head
    head.requested, head.envelope = requested.body(), requested
    if (progress := await _last_job_event(js, job_id, JobProgress.event_type)) is not None:
        head.last_step = progress.body().step
    if (completed := await _last_job_event(js, job_id, JobCompleted.event_type)) is not None:
        head.completed = completed.body()
    if (failed := await _last_job_event(js, job_id, JobFailed.event_type)) is not None:
        head.failed = failed.body()
    return head


def _finite(value: float | None) -> float | None:
    # NaN/inf cannot go through JSON; a missing number is better than a broken event.
    return value if value is not None and math.isfinite(value) else None


def _finite_values(values: dict[str, float] | None) -> dict[str, float] | None:
    """The finite entries of `values`; None when none is left."""
    clean = {k: v for k, v in (values or {}).items() if _finite(v) is not None}
    return clean or None


class JobJournal:
    """Appends one job's events; every id derives from the job and what the event is about."""

    def __init__(self, js: JetStreamContext, job_id: str, parent: EventEnvelope | None) -> None:
        self.js = js
        self.job_id = job_id
        self.parent = parent
        self.publisher = EventPublisher(js)
        self.last_step = 0

    def _envelope(self, payload: Any, aggregate: str, *id_parts: object) -> EventEnvelope:
        return EventEnvelope.new(
            payload, aggregate_id=aggregate, id_parts=(self.job_id, *id_parts), parent=self.parent
        )

    async def started(self, attempt: int) -> None:
        """Say the job is being worked on: listings show it running, not queued, from now."""
        payload = JobStarted(job_id=self.job_id, attempt=attempt)
        await self.publisher.publish(self._envelope(payload, self.job_id, "started", attempt))

    async def progress(
        self,
        step: int,
        total_steps: int,
        *,
        loss: float | None = None,
        reward: float | None = None,
        tokens_per_s: float | None = None,
        eta_s: float | None = None,
        kl: float | None = None,
        off_policy: dict[str, float] | None = None,
    ) -> bool:
        """Report a step; a step at or below one already reported is not reported again."""
        if step <= self.last_step:
            return False
        # Each report is a step's end: where a job cancelled meanwhile stops.
        await self.check_running()
        self.last_step = step
        payload = JobProgress(
            job_id=self.job_id,
            step=step,
            total_steps=max(total_steps, step),
            loss=_finite(loss),
            reward=_finite(reward),
            tokens_per_s=_finite(tokens_per_s),
            eta_s=_finite(eta_s),
            kl=_finite(kl),
            off_policy=_finite_values(off_policy),
        )
        await self.publisher.publish(self._envelope(payload, self.job_id, step))
        return True

    async def check_running(self) -> None:
        """JobEnded when the job has an ending already (it was cancelled): two reads."""
        for name in (JobCompleted.event_type, JobFailed.event_type):
            if await _last_job_event(self.js, self.job_id, name) is not None:
                raise JobEnded(f"job {self.job_id} ended while running ({name})")

    async def wait_ended(self) -> None:
        """Return once the job has an ending on the log (it was cancelled), following it."""
        filters = [
            subjects.event("job", self.job_id, subjects.event_name(t))
            for t in (JobCompleted.event_type, JobFailed.event_type)
        ]
        reader = read_events(self.js, filters, follow=True)
        async with aclosing(reader) as endings:
            async for _ in endings:
                return

    async def checkpoint(self, step: int, uri: str, sha256: str, size: int) -> None:
        """Record a checkpoint that is already in the object store."""
        payload = CheckpointSaved(job_id=self.job_id, step=step, uri=uri, sha256=sha256,
                                  size_bytes=size)  # fmt: skip
        await self.publisher.publish(self._envelope(payload, self.job_id, step, sha256))

    async def policy(
        self,
        model: str,
        version: int,
        uri: str,
        sha256: str,
        off_policy: dict[str, float] | None = None,
        signals: ObjectRef | None = None,
        trained_rollouts: list[str] | None = None,
        weights_sha256: str | None = None,
    ) -> None:
        """Announce a new policy version (its record is already in the object store)."""
        payload = PolicyUpdated(
            model=model, version=version, checkpoint_uri=uri, sha256=sha256, job_id=self.job_id,
            off_policy=_finite_values(off_policy),
            signals_uri=signals.uri if signals else None,
            signals_sha256=signals.sha256 if signals else None,
            trained_rollouts=list(trained_rollouts or []) if signals else [],
            weights_sha256=weights_sha256,
        )  # fmt: skip
        await self.publisher.publish(self._envelope(payload, policy_key(model), model, version))

    async def completed(
        self, model_id: str, checkpoint_uri: str | None, metrics: dict[str, float]
    ) -> bool:
        """The job produced `model_id`; False when the job had already ended (kept as it was)."""
        clean = {k: v for k, v in metrics.items() if _finite(v) is not None}
        payload = JobCompleted(job_id=self.job_id, model_id=model_id,
                               checkpoint_uri=checkpoint_uri, metrics=clean)  # fmt: skip
        return await end_job(self.js, payload)

    async def failed(self, reason: str) -> bool:
        """The job stopped for `reason`; False when the job had already ended."""
        return await end_job(self.js, JobFailed(job_id=self.job_id, reason=reason))


async def append_ending(
    js: JetStreamContext, history: JobHistory, decision: JobCompleted | JobFailed
) -> None:
    """Append the job's ending expecting its history to end where `history` was read."""
    job_id = decision.job_id
    envelope = EventEnvelope.new(
        decision, aggregate_id=job_id, id_parts=(job_id,), parent=history.envelope
    )
    await EventPublisher(js).publish(
        envelope,
        expected_last_subject_seq=history.last_seq,
        expected_subject=subjects.aggregate_events("job", job_id),
    )


async def end_job(js: JetStreamContext, ending: JobCompleted | JobFailed) -> bool:
    """Append a job's one ending unless it is unknown or already ended; True when appended.

    Decided from the job's own history and appended on the condition that the history has not
    moved since it was read, so whichever ending gets in first is the only one.
    """
    job_id = ending.job_id

    def decide(history: JobHistory) -> JobCompleted | JobFailed | None:
        if history.requested is None or history.finished:
            if history.finished:
                log.info("job already ended; ending not recorded", job_id=job_id,
                         kept="completed" if history.completed else "failed",
                         dropped=ending.event_type)  # fmt: skip
            return None
        return ending

    # Progress or another ending may arrive meanwhile: decided again from a fresh read.
    _, appended = await decide_and_append(
        lambda: job_history(js, job_id),
        decide,
        lambda history, decision: append_ending(js, history, decision),
        what=f"job {job_id}",
    )
    return appended is not None


async def fail_unless_finished(js: JetStreamContext, job_id: str, reason: str) -> bool:
    """Append job.failed unless the job is unknown or already ended; True when appended."""
    return await end_job(js, JobFailed(job_id=job_id, reason=reason))
