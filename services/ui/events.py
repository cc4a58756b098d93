"""What the viewer reads from the events stream itself: replays, training curves, provenance."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from nats.js import JetStreamContext

from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope

PAGE = 100
PREVIEW_CHARS = 4000
MAX_CURVE_POINTS = 500


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
        return f"{body.get('total_rollouts')} rollouts in {body.get('work_items')} work items"
    if event_type == "run.completed":
        return f"{body.get('passed')}/{body.get('total')} passed"
    if event_type == "run.failed":
        return str(body.get("reason"))
    return ""


async def run_events(js: JetStreamContext, run_id: str, *, after: int = 0) -> dict[str, Any]:
    """A page of a run's events in stream order, from after stream position `after`."""
    found: list[dict[str, Any]] = []
    more = False
    stream = read_events(js, subjects.run_events(subjects.token(run_id, "run id")),
                         start_seq=after + 1)  # fmt: skip
    async with contextlib.aclosing(stream) as msgs:
        async for msg in msgs:
            if len(found) == PAGE:
                more = True
                break
            event = EventEnvelope.from_bytes(msg.data)
            text = json.dumps(event.payload, indent=1)
            found.append(
                {
                    "seq": msg.metadata.sequence.stream,
                    "time": event.time,
                    "type": event.type,
                    "id": event.id,
                    "causation": event.causation_id,
                    "summary": describe(event.payload, event.type),
                    "payload": text[:PREVIEW_CHARS]
                    + ("\n… (truncated)" if len(text) > PREVIEW_CHARS else ""),
                }
            )
    return {"events": found, "more": more, "next": found[-1]["seq"] if found else after}


async def job_curves(js: JetStreamContext, job_id: str) -> dict[str, Any]:
    """Per-step loss, reward, KL and tokens/s from the job's progress events, and final metrics."""
    series: dict[str, list[tuple[float, float]]] = {
        "loss": [], "reward": [], "kl": [], "tokens_per_s": [],
    }  # fmt: skip
    metrics: dict[str, float] = {}
    job = subjects.token(job_id, "job id")
    async with contextlib.aclosing(read_events(js, subjects.aggregate_events("job", job))) as msgs:
        async for msg in msgs:
            event = EventEnvelope.from_bytes(msg.data)
            body = event.payload
            if event.type == "job.progress":
                for key, points in series.items():
                    value = body.get(key)
                    if isinstance(value, int | float):
                        points.append((float(body["step"]), float(value)))
            elif event.type == "job.completed":
                metrics = dict(body.get("metrics") or {})
    for key, points in series.items():
        if len(points) > MAX_CURVE_POINTS:
            stride = len(points) / MAX_CURVE_POINTS
            series[key] = [points[int(i * stride)] for i in range(MAX_CURVE_POINTS)] + [points[-1]]
    return {"series": series, "metrics": metrics}


async def provenance(js: JetStreamContext, run_id: str, rollout_id: str) -> dict[str, Any] | None:
    """Actor, delivery attempt, env hash and sampling of one rollout, from its generated event."""
    name = subjects.event_name("rollout.generated")
    subject = subjects.event("run", subjects.token(run_id, "run id"), name)
    async with contextlib.aclosing(read_events(js, subject)) as msgs:
        async for msg in msgs:
            event = EventEnvelope.from_bytes(msg.data)
            for r in event.payload.get("rollouts", []):
                if r.get("rollout_id") == rollout_id:
                    return {
                        "actor_id": r.get("actor_id"),
                        "delivery_attempt": r.get("delivery_attempt"),
                        "env_hash": r.get("env_hash"),
                        "duration_s": r.get("duration_s"),
                        "sampling": r.get("sampling"),
                        "work_item_id": event.payload.get("work_item_id"),
                        "seq": msg.metadata.sequence.stream,
                    }
    return None
