"""`tool_was_called`: the tool was called (with matching args) minCount..maxCount times.

Only calls that succeeded count towards `minCount` by default: a call that errored (bad
arguments, the tool refused it, the plugin crashed) or was malformed did not do the thing, and
counting it let a model satisfy "refund was called" with a refund that failed. `maxCount` still
counts every attempt, failed ones included: `maxCount: 0` forbids even trying, and a model
cannot spray failing calls past a limit. `successfulOnly: false` counts every attempt for both.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel, TaskSpec
from rollout.shared.contracts.trajectory import Trajectory
from rollout.shared.envs.compare import short, values_equal
from rollout.shared.envs.verifiers.registry import (
    Compiled,
    register_compiled,
)


class ToolWasCalledParams(CamelModel):
    """`tool_was_called`: a tool was called, optionally with these args, between count bounds."""

    tool: str = Field(min_length=1)
    args: dict[str, Any] | None = None
    min_count: int = Field(default=1, ge=0)
    max_count: int | None = Field(default=None, ge=0)
    successful_only: bool = Field(
        default=True,
        description=(
            "Only calls that succeeded (no error) count towards minCount (maxCount counts "
            "every attempt); false counts every attempt for both."
        ),
    )


@register_compiled("tool_was_called", ToolWasCalledParams, tool_fields=("tool",))
def tool_was_called(p: ToolWasCalledParams) -> Compiled:
    """The tool was called (with matching args) between minCount and maxCount times."""
    tool, args, successful_only = p.tool, p.args, p.successful_only
    low, high = p.min_count, p.max_count
    what = tool + (f" with {short(args)}" if args else "")
    bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
    # The reason is f"{what} called {count} time(s), needed {bounds}", plus how many failed
    # calls were left out, so a reader sees why an attempt did not count.
    head, tail = f"{what} called ", f" time(s), needed {bounds}"

    def run(trajectory: Trajectory, task: TaskSpec) -> tuple[float, bool, str]:
        count = failed = 0
        for call in trajectory.tool_calls:
            if call.name != tool:
                continue
            if args is not None and not all(
                k in call.arguments
                and (values_equal(v, call.arguments[k]) or str(v) == str(call.arguments[k]))
                for k, v in args.items()
            ):
                continue
            if successful_only and call.error:
                failed += 1
                continue
            count += 1
        # The upper bound counts attempts: a failed call was still an attempt.
        ok = count >= low and (high is None or count + failed <= high)
        if high is not None and count + failed > high and failed:
            left_out = f" ({failed} more that failed count against the maximum)"
        else:
            left_out = f" ({failed} failed call(s) not counted)" if failed else ""
        return (1.0 if ok else 0.0), ok, f"{head}{count}{tail}{left_out}"

    return run
