"""The `verifiers_rubric` primitive: a verifiers task's own rewards score the final reply.

The taskset's code runs only in a plugin host (a sandboxed worker), never in this process:
the primitive sends the task's data (its hidden ground truth) and the reply there. A host
that cannot run the taskset is an infrastructure error (no verdict), not a score.
"""

from __future__ import annotations

import math

from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel
from rollout.shared.envs.templates.verifiers_taskset import VerifiersConfig
from rollout.shared.envs.verifiers.registry import InfraError, Outcome, ScoreContext, register
from rollout.shared.errors import RolloutError
from rollout.shared.interop.verifiers_host import ahost_call


class VerifiersRubricParams(CamelModel):
    """`verifiers_rubric`: the verifiers task's own rewards score the final reply (run in a
    plugin host); the weighted reward, clipped to [0, 1], passes at `passAt`."""

    pass_at: float = Field(default=1.0, ge=0, le=1)


@register("verifiers_rubric", VerifiersRubricParams, templates=("verifiers",))
async def verifiers_rubric(p: VerifiersRubricParams, ctx: ScoreContext) -> Outcome:
    """The weighted reward of the task's `@vf.reward` functions, clipped to [0, 1]."""
    if not isinstance(ctx.config, VerifiersConfig):
        raise InfraError("verifiers_rubric needs the verifiers template's config")
    data = ctx.ground_truth if isinstance(ctx.ground_truth, dict) else {}
    try:
        result = await ahost_call(
            ctx.config, "score", {"data": data, "reply": ctx.trajectory.final_output or ""}
        )
    except RolloutError as exc:
        raise InfraError(exc.message) from None
    reward = (result or {}).get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise InfraError(f"the taskset's reward is not a number: {reward!r}")
    parts = ", ".join(
        f"{name}={r['score']:g}" if isinstance(r, dict) else f"{name}=unscored"
        for name, r in sorted(((result or {}).get("rewards") or {}).items())
    )
    return Outcome(
        min(1.0, max(0.0, float(reward))),
        float(reward) >= p.pass_at,
        f"verifiers reward {float(reward):g} ({parts or 'no reward functions'})",
    )
