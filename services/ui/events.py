"""What the viewer reads from the events stream itself: replays, training curves, provenance."""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rollout.shared import subjects
from rollout.shared.bus.reader import StoredEvent, read_events

PAGE = 50
PREVIEW_CHARS = 1500
MAX_CURVE_POINTS = 500
CACHED = 64  # jobs' curves and runs' provenance indexes kept in memory, least recent dropped


async def last_of(js: JetStreamContext, filter_subject: str) -> int:
    """The stream position of the newest event matching `filter_subject` (0: none)."""
    try:
        return (await js.get_last_msg(subjects.EVENTS_STREAM, filter_subject)).seq
    except NotFoundError:
        return 0


async def read_range(
    js: JetStreamContext, filter_subject: str, *, after: int = 0, batch: int = 256
) -> AsyncIterator[StoredEvent]:
    """The events matching `filter_subject` after position `after`, up to the newest one now.

    Knowing where to stop up front, a read never waits out an idle timeout for an event that
    is not coming (the stream's own end may be far past this filter's last event).
    """
    until = await last_of(js, filter_subject)
    if until <= after:
        return
    async with contextlib.aclosing(
        read_events(js, filter_subject, start_seq=after + 1, batch=batch)
    ) as msgs:
        async for msg in msgs:
            yield msg
            if msg.metadata.sequence.stream >= until:
                return


class _Lru(OrderedDict):
    def touch(self, key: str, make: Any) -> Any:
        if key not in self:
            self[key] = make()
            while len(self) > CACHED:
                self.popitem(last=False)
        self.move_to_end(key)
        return self[key]


# The off-policy signals the training page plots per step, in its order.
OFF_POLICY_CURVES = ("mismatch_kl", "clip_fraction", "dynamic_sampling_dropped", "staleness")


@dataclass
class _Curves:
    seq: int = 0
    series: dict[str, list[tuple[float, float]]] = field(
        default_factory=lambda: {
            "loss": [], "reward": [], "kl": [], "tokens_per_s": [],
            # The online methods' per-step off-policy signals (job.progress `off_policy`).
            **{f"off_policy.{k}": [] for k in OFF_POLICY_CURVES},
        }
    )  # fmt: skip
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class _Provenance:
    seq: int = 0
    rollouts: dict[str, dict[str, Any]] = field(default_factory=dict)


_curves: _Lru = _Lru()
_provenance: _Lru = _Lru()


def _envelope(data: bytes) -> dict[str, Any]:
    """An event as plain JSON: the viewer only shows events, so it skips model validation
    (which costs more than the page budget on a big run)."""
    try:
        event = json.loads(data)
    except json.JSONDecodeError:
        return {"type": "unreadable", "payload": {"raw": data[:200].decode(errors="replace")}}
    if not isinstance(event, dict) or not isinstance(event.get("payload"), dict):
        return {"type": "unreadable", "payload": {"raw": str(event)[:200]}}
    return event


def _time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def describe(body: dict[str, Any], event_type: str) -> str:
    """One line saying what an event did."""
    if event_type == "rollout.generated":
        rs = body.get("rollouts", [])
        errors = sum(1 for r in rs if r.get("error"))
        return f"{len(rs)} rollouts generated" + (f", {errors} errored" if errors else "")
    if event_type == "rollout.scored":
        rs = body.get("rollouts", [])
        return f"{len(rs)} scored, {sum(1 for r in rs if r.get('passed'))} passed"
    if event_type == "run.requested":
        return f"{body.get('env_slug')} v{body.get('env_version')} × {body.get('model')}, n={body.get('n')}"
    if event_type == "run.started":
        window = body.get("window")
        queued = f", {window} queued at a time" if window else ""
        if window == 0:
            queued = ", waiting for its owner's earlier runs"
        return (
            f"{body.get('total_rollouts')} rollouts in {body.get('work_items')} work items{queued}"
        )
    if event_type == "run.work_released":
        return f"work items queued up to {body.get('released')}"
    if event_type == "run.completed":
        return f"{body.get('passed')}/{body.get('total')} passed"
    if event_type == "run.failed":
        return str(body.get("reason"))
    return ""


async def run_events(js: JetStreamContext, run_id: str, *, after: int = 0) -> dict[str, Any]:
    """A page of a run's events in stream order, from after stream position `after`."""
    found: list[dict[str, Any]] = []
    more = False
    run = subjects.run_events(subjects.token(run_id, "run id"))
    # Fetch no more than a page: generated batches carry whole trajectories.
    async with contextlib.aclosing(read_range(js, run, after=after, batch=PAGE + 1)) as msgs:
        async for msg in msgs:
            if len(found) == PAGE:
                more = True
                break
            event = _envelope(msg.data)
            found.append(
                {
                    "seq": msg.metadata.sequence.stream,
                    "time": _time(event.get("time")),
                    "type": event.get("type", "?"),
                    "id": event.get("id", ""),
                    "causation": event.get("causation_id"),
                    "summary": describe(event["payload"], event.get("type", "")),
                    "payload": _preview(msg.data, event["payload"]),
                }
            )
    return {"events": found, "more": more, "next": found[-1]["seq"] if found else after}


def _preview(data: bytes, payload: dict[str, Any]) -> str:
    # Pretty-printing takes json's slow pure-Python path: only small events get it; a big one
    # shows the start of its stored bytes as they are.
    if len(data) <= PREVIEW_CHARS:
        return json.dumps(payload, indent=1, default=str)
    return data[:PREVIEW_CHARS].decode(errors="replace") + f"\n… ({len(data):,} bytes in all)"


async def job_curves(js: JetStreamContext, job_id: str) -> dict[str, Any]:
    """Per-step loss, reward, KL and tokens/s from the job's progress events, and final metrics.

    Kept per job and extended with the events since the last look, so a long job's history is
    read from the stream once per viewer process.
    """
    job = subjects.token(job_id, "job id")
    cached: _Curves = _curves.touch(job, _Curves)
    async with contextlib.aclosing(
        read_range(js, subjects.aggregate_events("job", job), after=cached.seq)
    ) as msgs:
        async for msg in msgs:
            cached.seq = msg.metadata.sequence.stream
            event = _envelope(msg.data)
            body = event["payload"]
            if event.get("type") == "job.progress" and isinstance(body.get("step"), int):
                off_policy = body.get("off_policy") or {}
                for key, points in cached.series.items():
                    name = key.removeprefix("off_policy.")
                    value = body.get(key) if name == key else off_policy.get(name)
                    if isinstance(value, int | float):
                        points.append((float(body["step"]), float(value)))
            elif event.get("type") == "job.completed":
                cached.metrics = dict(body.get("metrics") or {})
    series = {}
    for key, points in cached.series.items():
        if len(points) > MAX_CURVE_POINTS:
            stride = len(points) / MAX_CURVE_POINTS
            points = [points[int(i * stride)] for i in range(MAX_CURVE_POINTS)] + [points[-1]]
        series[key] = points
    return {"series": series, "metrics": cached.metrics}


async def provenance(js: JetStreamContext, run_id: str, rollout_id: str) -> dict[str, Any] | None:
    """Actor, delivery attempt, env hash and sampling of one rollout, from its generated event.

    Every generated event read on the way is indexed for the run, so each event of a run is
    parsed at most once per viewer process.
    """
    run = subjects.token(run_id, "run id")
    index: _Provenance = _provenance.touch(run, _Provenance)
    if rollout_id in index.rollouts:
        return index.rollouts[rollout_id]
    subject = subjects.event("run", run, subjects.event_name("rollout.generated"))
    async with contextlib.aclosing(read_range(js, subject, after=index.seq, batch=16)) as msgs:
        async for msg in msgs:
            index.seq = msg.metadata.sequence.stream
            event = _envelope(msg.data)
            for r in event["payload"].get("rollouts", []):
                # First seen wins, as in the read model: a redelivered batch is not the source.
                index.rollouts.setdefault(r.get("rollout_id"), {
                    "actor_id": r.get("actor_id"),
                    "delivery_attempt": r.get("delivery_attempt"),
                    "env_hash": r.get("env_hash"),
                    "duration_s": r.get("duration_s"),
                    "sampling": r.get("sampling"),
                    "work_item_id": event["payload"].get("work_item_id"),
                    "seq": index.seq,
                })  # fmt: skip
            if rollout_id in index.rollouts:
                break
    return index.rollouts.get(rollout_id)
