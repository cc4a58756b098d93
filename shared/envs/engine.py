"""Public engine entry points: build a runtime for (spec, task) (runtimes.py); score a trajectory."""

from __future__ import annotations

from typing import Any

from rollout.shared.contracts.trajectory import Trajectory, VerifierResult
from rollout.shared.envs.coerce import as_spec, as_task
from rollout.shared.envs.runtimes import (
    build_runtime,
    run_tool_script,
    start_runtime,
    start_runtimes,
)
from rollout.shared.envs.verifiers.engine import score_now, score_spec

# The runtime entry points are re-exported: callers build and score through one module.
__all__ = ["build_runtime", "run_tool_script", "score", "start_runtime", "start_runtimes"]


async def score(spec: Any, task: Any, trajectory: Trajectory) -> VerifierResult:
    """Score a trajectory (async: `tests_pass` runs the tests in the sandbox)."""
    env = as_spec(spec)
    t = as_task(env, task)
    # All-sync verifiers (compiled primitives) are scored without awaiting another coroutine.
    done = score_now(env, t, trajectory)
    return done if done is not None else await score_spec(env, t, trajectory)
