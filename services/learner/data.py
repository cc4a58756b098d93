"""Training data from the log: a run's rollouts with trajectories, verdicts and tools."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from nats.js import JetStreamContext

from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import (
    RolloutsGenerated,
    RolloutsScored,
    RunCompleted,
    RunFailed,
    RunRequested,
)
from rollout.shared.envs.engine import build_runtime
from rollout.shared.objectstore import ObjectStore, get_json
from rollout.shared.store.spec_cache import SpecCache


@dataclass
class RunData:
    """One run as training data: its request, status and every rollout it produced."""

    request: RunRequested
    status: str = "running"
    reason: str | None = None
    rollouts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def selected(self, rollout_ids: list[str] | None) -> list[dict[str, Any]]:
        """The rollouts named (all when None), in task/sample order."""
        chosen = (
            self.rollouts.values()
            if rollout_ids is None
            else [self.rollouts[i] for i in rollout_ids if i in self.rollouts]
        )
        return sorted(chosen, key=lambda r: (r["task_index"], r["sample_index"]))

    def passing(self, rollout_ids: list[str] | None = None) -> list[dict[str, Any]]:
        """Scored rollouts that passed their verifier (among `rollout_ids` when given)."""
        return [r for r in self.selected(rollout_ids) if r.get("passed")]


def _apply(data: RunData, body: Any) -> None:
    if isinstance(body, RolloutsGenerated):
        for r in body.rollouts:
            entry = data.rollouts.setdefault(r.rollout_id, {"rollout_id": r.rollout_id})
            entry.update(
                task_index=r.task_index,
                sample_index=r.sample_index,
                trajectory=r.trajectory,
                trajectory_uri=r.trajectory_uri,
                trajectory_sha256=r.trajectory_sha256,
                policy_version=r.policy_version,
                error=r.error,
            )
    elif isinstance(body, RolloutsScored):
        for s in body.rollouts:
            entry = data.rollouts.get(s.rollout_id)
            # Only the first verdict counts (as in the read models).
            if entry is not None and "score" not in entry:
                entry.update(score=s.score, passed=s.passed, error=entry.get("error") or s.error)
    elif isinstance(body, RunCompleted):
        data.status = "completed"
    elif isinstance(body, RunFailed):
        data.status, data.reason = "failed", body.reason


async def load_run(
    js: JetStreamContext, run_id: str, *, follow: bool = False, timeout_s: float = 600.0
) -> RunData | None:
    """Replay a run's events (None when there is no such run); `follow` waits for its end."""
    data: RunData | None = None

    async def replay() -> None:
        nonlocal data
        async for msg in read_events(js, subjects.run_events(run_id), follow=follow):
            body = EventEnvelope.from_bytes(msg.data).body()
            if isinstance(body, RunRequested):
                data = RunData(request=body)
            elif data is not None:
                _apply(data, body)
                if follow and data.status != "running":
                    return

    try:
        await asyncio.wait_for(replay(), timeout=timeout_s if follow else None)
    except TimeoutError:
        raise RolloutError(f"run {run_id} did not finish within {timeout_s:.0f}s") from None
    return data


async def with_trajectories(
    store: ObjectStore, rollouts: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Fetch claim-checked trajectories (verified by sha256) into the rollouts."""
    for r in rollouts:
        if r.get("trajectory") is None and r.get("trajectory_uri"):
            r["trajectory"] = await get_json(
                store, r["trajectory_uri"], sha256=r.get("trajectory_sha256")
            )
    return rollouts


class ToolCatalog:
    """The tools each task of an environment version shows the model (as the actor does)."""

    def __init__(self, js: JetStreamContext) -> None:
        self.specs = SpecCache(js)
        self._tools: dict[tuple[str, int, int], list[dict[str, Any]]] = {}

    async def tools(self, run: RunRequested, task_index: int) -> list[dict[str, Any]]:
        """OpenAI-shaped tool definitions of one task."""
        key = (run.env_slug, run.env_version, task_index)
        if key not in self._tools:
            spec = await self.specs.get(run.env_slug, run.env_version, run.env_hash)
            runtime = build_runtime(spec, task_index)
            try:
                self._tools[key] = [s.to_openai() for s in runtime.tool_specs()]
            finally:
                await runtime.close()
        return self._tools[key]

    async def attach(self, run: RunRequested, rollouts: list[dict[str, Any]]) -> None:
        """Add each rollout's `tools`."""
        for r in rollouts:
            r["tools"] = await self.tools(run, r["task_index"])


def by_task(rollouts: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Scored rollouts grouped by task (the groups DPO pairs and GRPO advantages use)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rollouts:
        if r.get("score") is not None and r.get("trajectory") is not None:
            groups.setdefault(str(r["task_index"]), []).append(r)
    return groups
