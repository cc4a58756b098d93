"""What every template runtime shares: tool dispatch, argument checks, errors as results."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from rollout.shared.contracts.envspec import EnvironmentSpec, TaskSpec
from rollout.shared.envs.interpolate import InterpolationError
from rollout.shared.envs.params import argument_checker
from rollout.shared.envs.paths import PathError
from rollout.shared.envs.runtime import ToolResult, ToolSpec

log = structlog.get_logger(__name__)


class ToolError(Exception):
    """Raised inside a tool handler: becomes ToolResult.error, which the model reads."""


@dataclass
class BoundTool:
    """A tool offered to the model plus the handler that runs it."""

    spec: ToolSpec
    handler: Callable[[dict[str, Any]], Any]
    check_args: bool = True
    # The arguments' check, compiled once from spec.parameters (see params.argument_checker).
    check: Callable[[dict[str, Any]], list[str]] | None = None

    def __post_init__(self) -> None:
        if self.check is None:
            self.check = argument_checker(self.spec.parameters)


# ToolResult(output=...) through its validator, minus BaseModel.__init__ (memo.validated).
_tool_result = ToolResult.__pydantic_validator__.validate_python

# Handlers' usual results: exact types, so never awaitable (inspect.isawaitable costs more).
_PLAIN = frozenset({dict, list, str, int, float, bool, type(None)})


def json_safe(value: Any) -> Any:
    """Round-trip through JSON so outputs are plain data (plugins may return anything)."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


class BaseRuntime:
    """A live episode: subclasses register tools in `_tools` and keep their state."""

    template = "base"
    # Outputs of declarative templates are built from JSON config, so they are JSON already;
    # runtimes returning arbitrary Python objects (plugins, sqlite values) set this.
    sanitize_outputs = False
    # True when no tool call ever waits on anything (every handler is a plain function): the
    # agent loop then runs a turn's calls in order, without a task per episode.
    immediate_tools = False

    def __init__(self, spec: EnvironmentSpec, task: TaskSpec) -> None:
        self.spec = spec
        self.task = task
        self._tools: dict[str, BoundTool] = {}

    def add_tool(
        self,
        name: str,
        description: str,
        parameters: dict[str, Any],
        handler: Callable[[dict[str, Any]], Any],
        check_args: bool = True,
        check: Callable[[dict[str, Any]], list[str]] | None = None,
    ) -> None:
        """Register one tool (`check`: argument_checker(parameters), when already built)."""
        spec = ToolSpec(name=name, description=description, parameters=parameters)
        self._tools[name] = BoundTool(spec, handler, check_args, check)

    def tool_specs(self) -> list[ToolSpec]:
        """Tools the model may call."""
        return [t.spec for t in self._tools.values()]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one tool; every failure comes back as ToolResult.error."""
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            return ToolResult(error=f"unknown tool {name!r} (available: {known})")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return ToolResult(
                error=f"arguments must be a JSON object, got {type(arguments).__name__}"
            )
        if tool.check_args:
            problems = tool.check(arguments)  # type: ignore[misc]  # set in __post_init__
            if problems:
                return ToolResult(error=f"{name}: " + "; ".join(problems))
        try:
            output = tool.handler(arguments)
            if type(output) not in _PLAIN and inspect.isawaitable(output):
                output = await output
            if self.sanitize_outputs:
                output = json_safe(output)
            return _tool_result({"output": output})
        except (ToolError, InterpolationError, PathError) as exc:
            return ToolResult(error=str(exc))
        except Exception as exc:  # a broken tool must not end the episode; the model sees why
            log.warning("tool_failed", tool=name, template=self.template, error=repr(exc))
            return ToolResult(error=f"{name} failed: {type(exc).__name__}: {exc}")

    def final_state(self) -> dict[str, Any]:
        """The state the verifier sees."""
        return {}

    async def close(self) -> None:
        """Release resources (nothing by default)."""
        return None

    def context(self, args: dict[str, Any], state: Any) -> dict[str, Any]:
        """Interpolation context for templated tool fields."""
        return {"args": args, "state": state, "input": self.task.input or {}}
