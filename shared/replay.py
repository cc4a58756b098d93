"""Rebuild a run from its events alone, and re-score its trajectories with today's verifier."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nats.js import JetStreamContext

from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts import events as ev
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.envspec import TaskSpec
from rollout.shared.contracts.trajectory import Trajectory
from rollout.shared.envs.engine import score
from rollout.shared.errors import RolloutError
from rollout.shared.objectstore import ObjectStore
from rollout.shared.stats import design_effect, mean_score, score_sum, wilson_interval
from rollout.shared.store import env_versions
from rollout.shared.store.spec_cache import SpecCache
from rollout.shared.store.trajectories import load_trajectory


@dataclass
class ReplayedRun:
    """A run as its events tell it."""

    request: ev.RunRequested
    status: str = "queued"
    total: int = 0
    reason: str | None = None
    events: int = 0
    generated: dict[str, ev.GeneratedRollout] = field(default_factory=dict)
    scored: dict[str, ev.ScoredRollout] = field(default_factory=dict)
    # Where each kept trajectory is on the stream: a verdict applies to the one it judged only.
    generated_seq: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Counts as the read model would show them."""
        verdicts = list(self.scored.values())
        passed = sum(v.outcome == "passed" for v in verdicts)
        # Errored rollouts have no verdict: rates are over the judged ones, like the read model.
        judged = [v for v in verdicts if v.outcome != "errored"]
        # Samples of one task are not independent trials: the interval counts them as
        # `rollout show` does (shared.stats.design_effect over the tasks' verdicts).
        per_task: dict[int, list[int]] = {}
        for v in judged:
            counts = per_task.setdefault(v.task_index, [0, 0])
            counts[0] += v.outcome == "passed"
            counts[1] += 1
        effect = design_effect([(p, n) for p, n in per_task.values()])
        interval = wilson_interval(passed / effect, len(judged) / effect) if judged else None
        return {
            "runId": self.request.run_id,
            "envSlug": self.request.env_slug,
            "envVersion": self.request.env_version,
            "model": self.request.model,
            "status": self.status,
            "reason": self.reason,
            "events": self.events,
            "total": self.total,
            "generated": len(self.generated),
            "scored": len(verdicts),
            "passed": passed,
            "errored": len(verdicts) - len(judged),
            "failed": len(judged) - passed,
            "passRate": passed / len(judged) if judged else 0.0,
            "passRateInterval": list(interval) if interval else None,
            "designEffect": effect,
            "meanScore": mean_score(score_sum(v.score for v in judged), len(judged)),
        }


async def replay_run(js: JetStreamContext, run_id: str) -> ReplayedRun:
    """Fold the run's events; first-seen wins, exactly like the read model."""
    subjects.token(run_id, "run id")
    run: ReplayedRun | None = None
    async for msg in read_events(js, subjects.run_events(run_id)):
        event = EventEnvelope.from_bytes(msg.data)
        body = event.body()
        if isinstance(body, ev.RunRequested):
            run = ReplayedRun(request=body)
        if run is None:
            continue
        run.events += 1
        if isinstance(body, ev.RunStarted):
            run.status, run.total = "running", body.total_rollouts
        elif isinstance(body, ev.RolloutsGenerated):
            for r in body.rollouts:
                if r.rollout_id not in run.generated:
                    run.generated[r.rollout_id] = r
                    run.generated_seq[r.rollout_id] = msg.seq
        elif isinstance(body, ev.RolloutsScored):
            for s in body.rollouts:
                judged = body.generated_seq
                kept = run.generated_seq.get(s.rollout_id)
                if kept is not None and (judged is None or judged == kept):
                    run.scored.setdefault(s.rollout_id, s)
        elif isinstance(body, ev.RunCompleted):
            run.status = "completed"
        elif isinstance(body, ev.RunFailed):
            run.status, run.reason = "failed", body.reason
    if run is None:
        raise RolloutError(f"no run {run_id!r} in the event log (see `rollout runs`)")
    return run


async def reverify(
    js: JetStreamContext,
    run: ReplayedRun,
    *,
    env_version: int | None = None,
    store: ObjectStore | None = None,
) -> tuple[int, list[dict[str, Any]]]:
    """Score every recorded trajectory with the verifier of `env_version` (default: the newest
    registered version, i.e. today's verifier); return that version and one row per rollout."""
    if env_version is None:
        newest, _ = await env_versions.latest(js, run.request.env_slug)
        if newest is None:
            raise RolloutError(f"environment {run.request.env_slug!r} is not registered")
        env_version = newest.version
    cache = SpecCache(js)
    spec = await cache.get(run.request.env_slug, env_version)
    own = spec
    if env_version != run.request.env_version:
        own = await cache.get(run.request.env_slug, run.request.env_version)
    used = sorted({g.task_index for g in run.generated.values()})
    where = task_map(own.tasks, spec.tasks, used)
    missing = [i for i in used if i not in where]
    if missing:
        first = own.tasks[missing[0]] if missing[0] < len(own.tasks) else None
        said = f" ({short_instruction(first.instruction)!r})" if first is not None else ""
        raise RolloutError(
            f"environment {spec.slug!r} v{env_version} lacks {len(missing)} task(s) the run "
            f"used, first task {missing[0]} of v{run.request.env_version}{said}: re-verify "
            f"against its own version with --env-version {run.request.env_version}"
        )
    rows = []
    for rollout_id, generated in sorted(
        run.generated.items(), key=lambda kv: (kv[1].task_index, kv[1].sample_index)
    ):
        recorded = run.scored.get(rollout_id)
        raw = generated.trajectory
        if raw is None and generated.trajectory_uri:
            if store is None:
                # Never a silent skip: the caller forgot the store, the rollouts did exist.
                raise RolloutError(
                    f"rollout {rollout_id}'s trajectory is at {generated.trajectory_uri}: "
                    "re-verifying needs the object store"
                )
            raw = await load_trajectory(
                store, None, generated.trajectory_uri, generated.trajectory_sha256
            )
        if raw is None:
            continue  # nothing was generated (the rollout errored before the model ran)
        # The same task in today's version, wherever it now stands.
        result = await score(spec, where[generated.task_index], Trajectory(**raw))
        before = None if recorded is None else recorded.score
        rows.append(
            {
                "rolloutId": rollout_id,
                "taskIndex": generated.task_index,
                "sampleIndex": generated.sample_index,
                "recordedScore": before,
                "recordedPassed": None if recorded is None else recorded.passed,
                "score": result.score,
                "passed": result.passed,
                "changed": before is None or abs(before - result.score) > 1e-9,
                "reasons": [p.reason for p in result.primitives if not p.passed],
            }
        )
    return env_version, rows


def task_map(old: list[TaskSpec], new: list[TaskSpec], used: list[int]) -> dict[int, int]:
    """Where each used task of a run's version stands in another version (absent: gone).

    By index, a version whose tasks were reordered, inserted or removed scored a trajectory
    against another task's ground truth. A task with an id is the task of that id; one
    without, the task the model was shown the same (instruction, input, earlier turns): its
    ground truth and verifier are what today's version may have changed. At its own index
    when it is still there.
    """

    def key(task: TaskSpec) -> Any:
        if task.id is not None:
            return ("id", task.id)
        return ("shown", task.instruction, task.input, task.messages)

    places: dict[Any, list[int]] = {}
    for j, task in enumerate(new):
        places.setdefault(key(task), []).append(j)
    out = {}
    for i in used:
        if i >= len(old):
            continue
        found = places.get(key(old[i]), [])
        if found:
            out[i] = i if i in found else found[0]
    return out


def short_instruction(text: str, limit: int = 60) -> str:
    """An instruction cut to one short line, for an error message."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
