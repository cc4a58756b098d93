"""Turning one work item into a batch of trajectories with their provenance."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from rollout.shared.agent.loop import Episode, SamplingParams, run_episodes
from rollout.shared.contracts.budgets import resolve_budgets
from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.contracts.events import ErrorKind, GeneratedRollout, RolloutsGenerated
from rollout.shared.contracts.events import SamplingParams as RolloutSampling
from rollout.shared.contracts.trajectory import Trajectory
from rollout.shared.contracts.work import RolloutWork
from rollout.shared.envs.engine import start_runtimes
from rollout.shared.models.base import ModelBackend

# Awaited with the rollouts of each task as soon as all of its samples in the batch are done.
OnRollouts = Callable[[list[GeneratedRollout]], Awaitable[None]]


async def generate_batch(
    work: RolloutWork,
    spec: EnvironmentSpec,
    backend: ModelBackend,
    *,
    actor_id: str,
    delivery_attempt: int = 1,
    policy_version: int | None = None,
    on_rollouts: OnRollouts | None = None,
) -> list[GeneratedRollout]:
    """Run every rollout of `work` together (one batched model call per turn).

    Each task's rollouts go to `on_rollouts` as soon as all of its samples are done (a run's
    progress moves with its first finished rollouts, not its slowest); all of them, in order,
    are returned. `policy_version` (the backend's, when it has one) is stamped on each.
    """
    started = time.perf_counter()
    budgets = resolve_budgets(spec.budgets, work.budgets)
    # Off the event loop: cold plugin hosts start in threads, and in parallel.
    runtimes = await start_runtimes(spec, [item.task_index for item in work.items])
    # Validated from the run's settings plus the item's seed: a third of model_copy's cost.
    sampling = work.sampling.model_dump()
    done: list[GeneratedRollout | None] = [None] * len(work.items)
    waiting = Counter(item.task_index for item in work.items)

    def built(index: int, trajectory: Trajectory) -> GeneratedRollout:
        item = work.items[index]
        return GeneratedRollout(
            rollout_id=item.rollout_id,
            task_index=item.task_index,
            sample_index=item.sample_index,
            trajectory=trajectory.model_dump(mode="json"),
            model=work.model,
            policy_version=work.policy_version if policy_version is None else policy_version,
            sampling=RolloutSampling(**{**sampling, "seed": item.seed}),
            env_hash=work.env_hash,
            seed=item.seed,
            actor_id=actor_id,
            duration_s=time.perf_counter() - started,
            error=trajectory.error,
            error_kind=trajectory.error_kind if trajectory.error else None,
            delivery_attempt=delivery_attempt,
            ended_by=trajectory.ended_by,
            turns=trajectory.turns,
            completion_tokens=trajectory.completion_tokens,
        )

    async def finished(index: int, trajectory: Trajectory) -> None:
        done[index] = built(index, trajectory)
        task = work.items[index].task_index
        waiting[task] -= 1
        if waiting[task] == 0 and on_rollouts is not None:
            # A task's samples travel together: a `ruler` verifier judges them in one call.
            await on_rollouts(
                [r for r, it in zip(done, work.items, strict=True) if r and it.task_index == task]
            )

    try:
        episodes = [
            Episode(
                runtime=rt,
                instruction=spec.tasks[item.task_index].instruction,
                history=spec.tasks[item.task_index].messages,
                sampling=SamplingParams(
                    temperature=work.sampling.temperature,
                    top_p=work.sampling.top_p,
                    max_tokens=work.sampling.max_tokens,
                    seed=item.seed,
                ),
            )
            for rt, item in zip(runtimes, work.items, strict=True)
        ]
        await run_episodes(
            episodes,
            backend,
            max_tool_calls=work.max_tool_calls,
            budgets=budgets,
            on_finished=finished,
        )
    finally:
        for rt in runtimes:
            await rt.close()
    return [r for r in done if r is not None]


def failed_batch(
    work: RolloutWork,
    reason: str,
    *,
    actor_id: str,
    delivery_attempt: int = 1,
    kind: ErrorKind = "model",
) -> list[GeneratedRollout]:
    """Rollouts that could not be generated at all, each carrying the reason."""
    return [
        GeneratedRollout(
            rollout_id=item.rollout_id,
            task_index=item.task_index,
            sample_index=item.sample_index,
            model=work.model,
            policy_version=work.policy_version,
            sampling=work.sampling,
            env_hash=work.env_hash,
            seed=item.seed,
            actor_id=actor_id,
            error=reason,
            error_kind=kind,
            delivery_attempt=delivery_attempt,
        )
        for item in work.items
    ]


def without_trajectory(rollout: GeneratedRollout, cause: str) -> GeneratedRollout:
    """The rollout errored (kind infra) because its trajectory could not travel: why is kept."""
    return rollout.model_copy(
        update={
            "trajectory": None,
            "trajectory_uri": None,
            "trajectory_sha256": None,
            "error": cause,
            "error_kind": "infra",
        }
    )


def _in_order(fields: tuple[str, ...], rest: dict[str, Any], name: str, value: Any) -> dict:
    # In field order, as model_dump writes them (the event's bytes stay the same).
    return {f: value if f == name else rest[f] for f in fields if f == name or f in rest}


_ROLLOUT = GeneratedRollout.__pydantic_serializer__
_ROLLOUT_FIELDS = tuple(GeneratedRollout.model_fields)
_BATCH_FIELDS = tuple(RolloutsGenerated.model_fields)


def dumped_rollout(rollout: GeneratedRollout) -> dict[str, Any]:
    """`rollout.model_dump(mode="json")` without walking the trajectory a second time.

    The trajectory of every rollout this actor builds is already a JSON-mode dump (or None):
    dumping it again would copy it unchanged, at most of the cost of building the event.
    """
    rest = _ROLLOUT.to_python(rollout, mode="json", exclude={"trajectory"})
    return _in_order(_ROLLOUT_FIELDS, rest, "trajectory", rollout.trajectory)


def dumped_batch(batch: RolloutsGenerated) -> dict[str, Any]:
    """`batch.model_dump(mode="json")` for a batch of this actor's rollouts (dumped_rollout)."""
    rest = batch.model_dump(mode="json", exclude={"rollouts"})
    return _in_order(_BATCH_FIELDS, rest, "rollouts", [dumped_rollout(r) for r in batch.rollouts])
