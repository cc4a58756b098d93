"""`no_tool_errors`: no tool call returned an error."""

from __future__ import annotations

from rollout.shared.contracts.envspec import CamelModel, TaskSpec
from rollout.shared.contracts.trajectory import Trajectory
from rollout.shared.envs.verifiers.registry import (
    Compiled,
    register_compiled,
)


class NoToolErrorsParams(CamelModel):
    """`no_tool_errors`: no tool call (or none of `tools`) returned an error."""

    tools: list[str] | None = None


@register_compiled("no_tool_errors", NoToolErrorsParams, tool_fields=("tools",))
def no_tool_errors(p: NoToolErrorsParams) -> Compiled:
    """No tool call returned an error."""
    tools = p.tools

    def run(trajectory: Trajectory, task: TaskSpec) -> tuple[float, bool, str]:
        calls = trajectory.tool_calls
        errors = [c for c in calls if c.error and (tools is None or c.name in tools)]
        if not errors:
            return 1.0, True, f"{len(calls)} call(s), no errors"
        first = errors[0]
        why = f"{len(errors)} tool error(s); first: {first.name}: {(first.error or '')[:160]}"
        return 0.0, False, why

    return run
