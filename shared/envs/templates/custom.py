"""The `custom` template: templated responses plus state mutations (dot path set or `name[]`)."""

from __future__ import annotations

import copy
from typing import Any

from rollout.shared.contracts.envspec import CustomConfig, CustomTool, EnvironmentSpec, TaskSpec
from rollout.shared.envs.interpolate import arg_names, interpolate, interpolate_string
from rollout.shared.envs.params import to_json_schema
from rollout.shared.envs.paths import PathError, set_path
from rollout.shared.envs.templates.base import BaseRuntime, ToolError


def custom_tool_parameters(tool: CustomTool) -> dict[str, Any]:
    """JSON Schema of a custom tool's arguments."""
    refs = arg_names([tool.response, [m.model_dump() for m in tool.mutates]])
    if tool.params_schema is None and any(m.value is None for m in tool.mutates):
        props = {name: {"description": f"value for {name}"} for name in refs}
        return {"type": "object", "properties": props, "additionalProperties": True}
    return to_json_schema(tool.params_schema, refs)


class CustomRuntime(BaseRuntime):
    """One episode of a custom environment."""

    template = "custom"

    def __init__(self, spec: EnvironmentSpec, task: TaskSpec, config: CustomConfig) -> None:
        super().__init__(spec, task)
        self.state: dict[str, Any] = copy.deepcopy(config.initial_mutable_state)
        for tool in config.tools:
            desc = tool.description or f"{tool.name}."
            self.add_tool(tool.name, desc, custom_tool_parameters(tool), self._handler(tool))

    def _handler(self, tool: CustomTool):
        return lambda args: self._run(tool, args)

    def _run(self, tool: CustomTool, args: dict[str, Any]) -> Any:
        # Render every mutation before applying any, so a bad one leaves the state untouched.
        planned = []
        for m in tool.mutates:
            ctx = self.context(args, self.state)
            path = interpolate_string(m.path, ctx)
            value = copy.deepcopy(args) if m.value is None else interpolate(m.value, ctx)
            planned.append((str(path), value))
        trial = copy.deepcopy(self.state)
        for path, value in planned:
            try:
                set_path(trial, path, value)
            except PathError as exc:
                raise ToolError(f"{tool.name}: cannot update state at {path}: {exc}") from None
        self.state = trial
        if tool.response is None:
            return {"ok": True}
        return interpolate(tool.response, self.context(args, self.state))

    def final_state(self) -> dict[str, Any]:
        """The mutable state after the episode."""
        return copy.deepcopy(self.state)
