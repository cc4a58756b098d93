"""`tool_call_order`: the tools were called in this order (a subsequence, or `exact`).

Only calls that succeeded count by default: a call that errored or was malformed did nothing,
so "lookup then refund" is not met by a refund with garbage arguments that the tool refused.
`successfulOnly: false` checks the order of every attempt.
"""

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
    successful_only: bool = Field(
        default=True,
        description="Only calls that succeeded (no error) count; false checks every attempt.",
    )


@register("tool_call_order", ToolCallOrderParams, tool_fields=("tools",))
def tool_call_order(p: ToolCallOrderParams, ctx: ScoreContext) -> Outcome:
    """The tools were called in this order (as a subsequence, or exactly with `exact`)."""
    calls = ctx.trajectory.tool_calls
    names = [c.name for c in calls if not (p.successful_only and c.error)]
    if p.exact:
        ok = names == p.tools
    else:
        it = iter(names)
        ok = all(any(n == want for n in it) for want in p.tools)
    how = "exactly" if p.exact else "in order"
    failed = len(calls) - len(names)
    left_out = f" ({failed} failed call(s) not counted)" if failed else ""
    return binary(
        ok, f"{p.tools} {'called' if ok else 'not called'} {how}; calls: {names}{left_out}"
    )
