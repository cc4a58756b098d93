"""`tool_call_order`: the tools were called in this order (a subsequence, or `exact`)."""

from __future__ import annotations

from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel
from rollout.shared.envs.verifiers.primitives.common import binary
from rollout.shared.envs.verifiers.registry import (
    Outcome,
    ScoreContext,
    register,
)


class ToolCallOrderParams(CamelModel):
    """`tool_call_order`: the tools were called in this order (subsequence, or exactly)."""

    tools: list[str] = Field(min_length=1)
    exact: bool = False


@register("tool_call_order", ToolCallOrderParams, tool_fields=("tools",))
def tool_call_order(p: ToolCallOrderParams, ctx: ScoreContext) -> Outcome:
    """The tools were called in this order (as a subsequence, or exactly with `exact`)."""
    names = [c.name for c in ctx.trajectory.tool_calls]
    if p.exact:
        ok = names == p.tools
    else:
        it = iter(names)
        ok = all(any(n == want for n in it) for want in p.tools)
    how = "exactly" if p.exact else "in order"
    return binary(ok, f"{p.tools} {'called' if ok else 'not called'} {how}; calls: {names}")
