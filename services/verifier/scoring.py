"""Scoring one generated batch: a raising verifier marks its rollout errored, never the batch."""

from __future__ import annotations

from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.contracts.events import GeneratedRollout, PrimitiveScore, ScoredRollout
from rollout.shared.contracts.trajectory import Trajectory
from rollout.shared.envs.engine import score
from rollout.shared.objectstore import ObjectStore
from rollout.shared.store.trajectories import load_trajectory


async def score_rollout(
    spec: EnvironmentSpec, rollout: GeneratedRollout, store: ObjectStore | None = None
) -> ScoredRollout:
    """The verdict on one rollout (its trajectory fetched from `store` when claim-checked)."""
    base = {
        "rollout_id": rollout.rollout_id,
        "task_index": rollout.task_index,
        "sample_index": rollout.sample_index,
    }
    if rollout.error and rollout.trajectory is None and rollout.trajectory_uri is None:
        return ScoredRollout(**base, score=0.0, passed=False, error=rollout.error)
    try:
        raw = rollout.trajectory
        if raw is None and rollout.trajectory_uri and store is not None:
            raw = await load_trajectory(
                store, None, rollout.trajectory_uri, rollout.trajectory_sha256
            )
        trajectory = Trajectory.model_validate(raw or {})
        result = await score(spec, rollout.task_index, trajectory)
    except Exception as exc:  # noqa: BLE001 (a user's verifier may raise anything: record it)
        return ScoredRollout(
            **base, score=0.0, passed=False, error=f"verifier raised {type(exc).__name__}: {exc}"
        )
    return ScoredRollout(
        **base,
        score=result.score,
        passed=result.passed,
        primitives=[PrimitiveScore(**p.model_dump()) for p in result.primitives],
        error=result.error or rollout.error,
    )
