"""The `verifiers_rubric` primitive: a verifiers task's own rewards score the final reply.

The taskset's code runs only in a plugin host (a sandboxed worker), never in this process:
the primitive sends the task's data (its hidden ground truth) and the reply there. A host
that cannot run the taskset is an infrastructure error (no verdict), not a score.

A reward whose own code raises on the reply (`int(reply)` on "five", a reply of 5,000 digits),
or that crashes or hangs its host on it, is the reply's doing when the same task scores a control reply (the task's `answer`, "0", "")
at the same moment: the reply fails with 0. As an error it would be left out of pass rates and
GRPO's groups, so a model unsure of its answer could write one the reward cannot parse and
escape every failing verdict. When no control is scored either, the taskset cannot score the
task at all: no verdict.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel
from rollout.shared.envs.templates.verifiers_taskset import VerifiersConfig
from rollout.shared.envs.verifiers.registry import InfraError, Outcome, ScoreContext, register
from rollout.shared.errors import RolloutError
from rollout.shared.interop.verifiers_host import OperationStopped, ahost_call


class VerifiersRubricParams(CamelModel):
    """`verifiers_rubric`: the verifiers task's own rewards score the final reply (run in a
    plugin host); the weighted reward, clipped to [0, 1], passes at `passAt`."""

    pass_at: float = Field(default=1.0, ge=0, le=1)


def _controls(data: dict[str, Any]) -> list[str]:
    """Replies no policy wrote, tried when the rewards raise on a reply: the task's own answer
    (a reply its rewards must read), then a zero and nothing."""
    answer = data.get("answer")
    first = [str(answer)] if isinstance(answer, str | int | float) else []
    return list(dict.fromkeys([*first, "0", ""]))


async def _call(config: VerifiersConfig, data: dict[str, Any], reply: str) -> dict[str, Any]:
    try:
        result = await ahost_call(config, "score", {"data": data, "reply": reply})
    except OperationStopped as exc:
        # Its host died or hung scoring this reply (a reward's regex that never ends on it):
        # as much the reply's doing as a raise, when the controls are scored.
        return {"raised": exc.message, "codeError": True}
    except RolloutError as exc:
        raise InfraError(exc.message) from None
    return result if isinstance(result, dict) else {}


async def _raised_on_reply(
    config: VerifiersConfig, data: dict[str, Any], raised: str, code_error: bool
) -> Outcome:
    """The verdict when the rewards raised on the reply: 0 when a control is scored."""
    if not code_error:  # a timeout, a connection, a judge's provider: no verdict
        raise InfraError(f"the taskset's rewards failed: {raised}")
    for control in _controls(data):
        if "raised" not in await _call(config, data, control):
            return Outcome(
                0.0,
                False,
                f"the taskset's rewards raised on this reply ({raised}), and scored the "
                f"control reply {control!r}: the reply is at fault",
            )
    raise InfraError(f"the taskset's rewards raise on every reply, controls too: {raised}")


@register("verifiers_rubric", VerifiersRubricParams, templates=("verifiers",))
async def verifiers_rubric(p: VerifiersRubricParams, ctx: ScoreContext) -> Outcome:
    """The weighted reward of the task's `@vf.reward` functions, clipped to [0, 1]."""
    if not isinstance(ctx.config, VerifiersConfig):
        raise InfraError("verifiers_rubric needs the verifiers template's config")
    data = ctx.ground_truth if isinstance(ctx.ground_truth, dict) else {}
    result = await _call(ctx.config, data, ctx.trajectory.final_output or "")
    if "raised" in result:
        return await _raised_on_reply(
            ctx.config, data, str(result["raised"]), result.get("codeError") is True
        )
    reward = result.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise InfraError(f"the taskset's reward is not a number: {reward!r}")
    parts = ", ".join(
        f"{name}={r['score']:g}" if isinstance(r, dict) else f"{name}=unscored"
        for name, r in sorted((result.get("rewards") or {}).items())
    )
    return Outcome(
        min(1.0, max(0.0, float(reward))),
        float(reward) >= p.pass_at,
        f"verifiers reward {float(reward):g} ({parts or 'no reward functions'})",
    )
