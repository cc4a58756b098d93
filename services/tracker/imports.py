"""Imported runs: scored rollouts made elsewhere (ART trajectories) recorded as a run.

An import is checked whole (the environment, every rollout's task, trajectory and score)
before anything is appended; then the run's history is written as an actor-generated run's
would be: run.requested (with its `source`, so nothing fans it out or scores it again),
run.started, the rollouts as rollout.generated and their verdicts as rollout.scored. The
tracker completes it from those events like any other run, the buffer stores its rollouts,
and the learner trains on it by run id.

Exactly once: the run id derives from the environment and the rollouts' content, and every
event id from the run id, so the same import sent twice (a retry, a second `rollout art
import` of the same file) names the same run and appends nothing new.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pydantic
from nats.js import JetStreamContext

from rollout.shared import subjects
from rollout.shared.aggregates import quota
from rollout.shared.aggregates.run import load_run, rollout_id
from rollout.shared.aggregates.run_options import MAX_N
from rollout.shared.bus.publisher import ConcurrencyConflict, EventPublisher, payload_budget
from rollout.shared.contracts.envelope import EventEnvelope, deterministic_id
from rollout.shared.contracts.events import (
    GeneratedRollout,
    PrimitiveScore,
    RolloutsGenerated,
    RolloutsScored,
    RunRequested,
    RunStarted,
    ScoredRollout,
)
from rollout.shared.contracts.requests import ImportRun
from rollout.shared.contracts.trajectory import Trajectory
from rollout.shared.errors import RolloutError
from rollout.shared.objectstore import ObjectStore
from rollout.shared.observability import get_logger
from rollout.shared.store import env_versions
from rollout.shared.store.trajectories import offload

_LISTED = 10
# What an event's envelope and a rollout's other fields take besides its trajectory.
_ENVELOPE_ROOM = 4096
# The tracker plans a run's rollout slots as n x tasks (one id each, held in memory while it
# decides): a sparse import (a few high sample indices) must not plan millions of them.
MAX_PLANNED = 10 * MAX_N

log = get_logger(__name__)


def import_run_id(cmd: ImportRun, env_slug: str, env_version: int) -> str:
    """The imported run's id: the same environment and rollouts always name the same run."""
    body = cmd.model_dump_json(include={"source", "model", "name", "rollouts"})
    digest = hashlib.sha256(body.encode()).hexdigest()
    return deterministic_id("import", env_slug, env_version, digest)[:16]


async def plan_import(
    js: JetStreamContext, cmd: ImportRun
) -> tuple[RunRequested, list[dict[str, Any]]]:
    """The run.requested of an import and its checked trajectories; RolloutError if not."""
    try:
        subjects.token(cmd.env_slug, "environment slug")
    except subjects.SubjectError as exc:
        raise RolloutError("invalid import", problems=[f"env_slug: {exc}"]) from None
    if cmd.env_version is None:
        env, _ = await env_versions.latest(js, cmd.env_slug)
    else:
        env = await env_versions.version(js, cmd.env_slug, cmd.env_version)
    if env is None:
        what = f"version {cmd.env_version} of " if cmd.env_version is not None else ""
        raise RolloutError(
            "invalid import",
            problems=[
                f"env_slug: no {what}environment {cmd.env_slug!r} (push it with `rollout push`)"
            ],
        )
    tasks = len(env.spec.get("tasks", []))
    # Each rollout travels inline in a rollout.generated event: one too large for a message
    # is refused here, before anything is appended, not half-way through the history.
    room = payload_budget(js) - _ENVELOPE_ROOM
    problems: list[str] = []
    seen: set[tuple[int, int]] = set()
    trajectories: list[dict[str, Any]] = []
    for i, r in enumerate(cmd.rollouts):
        where = f"rollouts[{i}]"
        if r.task_index >= tasks:
            problems.append(
                f"{where}.task_index: {r.task_index} is not a task of {env.slug!r} (it has {tasks})"
            )
        if (r.task_index, r.sample_index) in seen:
            problems.append(f"{where}: task {r.task_index} sample {r.sample_index} repeats")
        seen.add((r.task_index, r.sample_index))
        try:
            # What is stored is the checked Trajectory, not the sender's dict: keys it does not
            # know never reach the buffer or the learner.
            trajectory = Trajectory.model_validate(r.trajectory).model_dump(mode="json")
        except pydantic.ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err["loc"])
            problems.append(f"{where}.trajectory.{loc}: {err['msg']}")
            trajectory = r.trajectory
        trajectories.append(trajectory)
        size = len(json.dumps(trajectory).encode())
        if size > room:
            problems.append(
                f"{where}.trajectory: {size} bytes, over the {room} bytes one event may carry"
            )
        for field in ("reason", "model"):
            value = getattr(r, field)
            if isinstance(value, str) and "\x00" in value:
                problems.append(f"{where}.{field}: must not contain NUL characters")
        if len(problems) >= _LISTED:
            break
    for field in ("model", "name"):
        value = getattr(cmd, field)
        if isinstance(value, str) and "\x00" in value:
            problems.append(f"{field}: must not contain NUL characters")
    n = 1 + max(r.sample_index for r in cmd.rollouts)
    task_indices = sorted({r.task_index for r in cmd.rollouts})
    if not problems and n * len(task_indices) > MAX_PLANNED:
        problems.append(
            f"rollouts: sample_index up to {n - 1} over {len(task_indices)} task(s) plans"
            f" {n * len(task_indices)} rollouts, over the {MAX_PLANNED} one run may plan"
            " (number each task's samples from 0)"
        )
    if problems:
        raise RolloutError("invalid import", problems=problems)
    run_id = import_run_id(cmd, env.slug, env.version)
    run = RunRequested(
        run_id=run_id,
        env_slug=env.slug,
        env_version=env.version,
        env_hash=env.spec_hash,
        model=cmd.model,
        n=n,
        name=cmd.name,
        task_indices=task_indices,
        batch_size=len(cmd.rollouts),
        source=cmd.source,
    )
    return run, trajectories


def _histories(
    cmd: ImportRun, run: RunRequested, trajectories: list[dict[str, Any]]
) -> tuple[RunStarted, list, list]:
    generated, scored = [], []
    for r, trajectory in zip(cmd.rollouts, trajectories, strict=True):
        rid = rollout_id(run.run_id, r.task_index, r.sample_index)
        generated.append(
            GeneratedRollout(
                rollout_id=rid,
                task_index=r.task_index,
                sample_index=r.sample_index,
                trajectory=trajectory,
                model=r.model or run.model,
                env_hash=run.env_hash,
                actor_id=f"import:{run.source}",
            )
        )
        scored.append(
            ScoredRollout(
                rollout_id=rid,
                task_index=r.task_index,
                sample_index=r.sample_index,
                score=r.score,
                passed=r.passed,
                outcome="passed" if r.passed else "failed",
                primitives=[
                    PrimitiveScore(
                        name=f"{run.source}_reward",
                        type="imported",
                        weight=1.0,
                        score=r.score,
                        passed=r.passed,
                        reason=r.reason or f"reward {r.score:g} recorded by {run.source}",
                    )
                ],
            )
        )
    started = RunStarted(run_id=run.run_id, work_items=1, total_rollouts=len(cmd.rollouts))
    return started, generated, scored


async def import_run(
    js: JetStreamContext, cmd: ImportRun, store: ObjectStore, caller: str = subjects.ANONYMOUS
) -> tuple[RunRequested, bool]:
    """Record the import as a run; (its run.requested, True when it was already recorded).

    Its trajectories are claim-checked into `store` like an actor's: stored once. The run is
    its first importer's (`caller`); a repeat import, by anyone, is the same run.
    """
    run, trajectories = await plan_import(js, cmd)
    run = run.model_copy(update={"owner": caller})
    state = await load_run(js, run.run_id)
    if state.ended is not None:
        return run, True
    already = state.requested is not None
    publisher = EventPublisher(js)
    requested = EventEnvelope.new(
        run, aggregate_id=run.run_id, id_parts=(run.run_id,), run_id=run.run_id
    )
    if not already:
        # Its rollouts count in the importing key's rollouts a day (shared/aggregates/quota.py),
        # once per run id: a repeat of the same import pays nothing.
        await quota.charge(js, caller, "rollouts", len(cmd.rollouts), run.run_id)
        try:
            await publisher.publish(requested, expected_last_subject_seq=0)
        except ConcurrencyConflict:
            already = True  # another attempt of the same import got in first: same events
    # Every later event's id derives from the run id: a resend (a crash half-way, a racing
    # retry) is dropped by the stream, and the projections keep the first of each anyway.
    started, generated, scored = _histories(cmd, run, trajectories)
    generated = await offload(store, generated)
    work_item_id = deterministic_id("import-work", run.run_id)[:24]
    await publisher.publish(
        EventEnvelope.new(
            started, aggregate_id=run.run_id, id_parts=(run.run_id,), parent=requested
        )
    )

    def batch(kind: type[RolloutsGenerated] | type[RolloutsScored], items: list):
        def part(chunk: list, start: int, end: int) -> EventEnvelope:
            body = kind(run_id=run.run_id, work_item_id=work_item_id, rollouts=chunk)
            return EventEnvelope.new(
                body, aggregate_id=run.run_id, id_parts=(run.run_id, start, end), parent=requested
            )

        return publisher.publish_fitted(items, part)

    await batch(RolloutsGenerated, generated)
    await batch(RolloutsScored, scored)
    log.info(
        "run imported",
        run_id=run.run_id,
        source=run.source,
        env=run.env_slug,
        rollouts=len(cmd.rollouts),
        resumed=already,
    )
    return run, already
