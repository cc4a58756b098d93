"""The `env_reward` primitive: the reward a remote environment recorded in the final state.

OpenEnv and NeMo Gym servers decide their own reward; their runtimes record it in the final
state (`reward`, `done`). This primitive maps it from [min, max] to [0, 1]; the episode passes
when the reward reaches `passAt` (default: max). Our other primitives can score the same
episode alongside it.
"""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from rollout.shared.contracts.envspec import CamelModel
from rollout.shared.envs.compare import short
from rollout.shared.envs.paths import PathError, resolve_path
from rollout.shared.envs.verifiers.registry import Outcome, ScoreContext, register


class EnvRewardParams(CamelModel):
    """`env_reward`: the reward a remote environment (OpenEnv, NeMo Gym) recorded in the final
    state, mapped from [min, max] to [0, 1]; passed when it reaches `passAt` (default: max)."""

    path: str = Field(default="reward", min_length=1, description="Final-state path of the reward.")
    min: float = 0.0
    max: float = 1.0
    pass_at: float | None = None
    require_done: bool = True

    @model_validator(mode="after")
    def _range(self) -> EnvRewardParams:
        if self.max <= self.min:
            raise ValueError("max must be greater than min")
        return self


@register("env_reward", EnvRewardParams)
def env_reward(p: EnvRewardParams, ctx: ScoreContext) -> Outcome:
    """The environment's own reward, normalised; fails when the episode did not end."""
    state = ctx.state
    if p.require_done and not state.get("done"):
        return Outcome(0.0, False, "the environment's episode did not end (no final reward)")
    try:
        raw = resolve_path(state, p.path)
    except PathError:
        return Outcome(0.0, False, f"no reward at {p.path!r} in the final state")
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        return Outcome(0.0, False, f"the reward at {p.path!r} is not a number: {short(raw)}")
    score = min(1.0, max(0.0, (float(raw) - p.min) / (p.max - p.min)))
    threshold = p.max if p.pass_at is None else p.pass_at
    passed = float(raw) >= threshold
    reason = f"environment reward {raw:g} (pass at {threshold:g})"
    if not p.min <= raw <= p.max:
        # An env rewarding on another scale (0-10) than declared passed every episode silently.
        reason += (
            f"; outside [{p.min:g}, {p.max:g}], scored {score:g}: set this primitive's `min` "
            "and `max` to the environment's range"
        )
    return Outcome(score, passed, reason)
