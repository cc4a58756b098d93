"""The `workflow` template: lookup tools read fixtures, actions append to state, mocks answer."""

from __future__ import annotations

import copy
import re
from typing import Any

from rollout.shared.contracts.envspec import EnvironmentSpec, TaskSpec, WorkflowConfig, WorkflowTool
from rollout.shared.envs.compare import short, values_equal
from rollout.shared.envs.interpolate import arg_names, interpolate, interpolate_string
from rollout.shared.envs.params import to_json_schema
from rollout.shared.envs.paths import PathError, resolve_path, set_path
from rollout.shared.envs.templates.base import BaseRuntime, ToolError


def tool_arg_names(tool: WorkflowTool) -> list[str]:
    """Arguments a tool needs when it has no paramsSchema: its placeholders (and matchField)."""
    names = arg_names([tool.fixture_path, tool.value, tool.response])
    if tool.from_array and tool.match_field:
        key = tool.match_arg or tool.match_field
        if key not in names:
            names.insert(0, key)
    return names


def tool_parameters(tool: WorkflowTool) -> dict[str, Any]:
    """JSON Schema of a workflow tool's arguments."""
    if tool.params_schema is None and tool.kind == "action" and tool.value is None:
        # The appended value is the arguments themselves: accept any object.
        return {"type": "object", "properties": {}, "additionalProperties": True}
    return to_json_schema(tool.params_schema, tool_arg_names(tool))


def _describe(tool: WorkflowTool) -> str:
    if tool.description:
        return tool.description
    if tool.kind == "lookup":
        if tool.fixture_path:
            return "Look up " + re.sub(r"\$\{args\.([^}]*)\}", r"<\1>", tool.fixture_path) + "."
        by = f" by {tool.match_arg or tool.match_field}" if tool.match_field else ""
        return f"Look up {tool.from_array}{by}."
    if tool.kind == "action":
        return f"Record an action in {tool.target}."
    return f"{tool.name} (mock)."


def find_match(items: Any, field: str, wanted: Any) -> Any:
    """First element whose `field` equals `wanted` (by value, or by text: 1 matches "1")."""
    pool = items.values() if isinstance(items, dict) else items
    for item in pool:
        if isinstance(item, dict) and field in item:
            have = item[field]
            if type(have) is type(wanted):  # the usual case: no coercion needed
                if have == wanted:
                    return item
            elif values_equal(have, wanted) or str(have) == str(wanted):
                return item
    return None


class WorkflowRuntime(BaseRuntime):
    """One episode of a workflow environment."""

    template = "workflow"

    def __init__(self, spec: EnvironmentSpec, task: TaskSpec, config: WorkflowConfig) -> None:
        super().__init__(spec, task)
        self.config = config
        self.fixtures = config.fixtures  # read-only: outputs are deep copies
        self.state: dict[str, Any] = copy.deepcopy(config.initial_mutable_state)
        for tool in config.tools:
            self.add_tool(tool.name, _describe(tool), tool_parameters(tool), self._handler(tool))

    def _handler(self, tool: WorkflowTool):
        if tool.kind == "lookup":
            return lambda args: self._lookup(tool, args)
        if tool.kind == "action":
            return lambda args: self._action(tool, args)
        return lambda args: self._mock(tool, args)

    def _lookup(self, tool: WorkflowTool, args: dict[str, Any]) -> Any:
        ctx = self.context(args, self.state)
        if tool.fixture_path:
            path = interpolate_string(tool.fixture_path, ctx)
            if not isinstance(path, str):
                path = str(path)
            try:
                return copy.deepcopy(resolve_path(self.fixtures, path))
            except PathError as exc:
                raise ToolError(f"not found: {path} ({exc})") from None
        source = self._array(tool.from_array or "")
        if not tool.match_field:
            return copy.deepcopy(source)
        key = tool.match_arg or tool.match_field
        if key not in args:
            raise ToolError(f"missing required argument {key!r}")
        found = find_match(source, tool.match_field, args[key])
        if found is None:
            raise ToolError(
                f"no {tool.from_array} entry with {tool.match_field} = {short(args[key])}"
            )
        return copy.deepcopy(found)

    def _array(self, name: str) -> Any:
        # Fixtures first (read-only data), then mutable state (so agents can read what they did).
        for root in (self.fixtures, self.state):
            try:
                return resolve_path(root, name)
            except PathError:
                continue
        raise ToolError(f"no fixture {name!r}")

    def _action(self, tool: WorkflowTool, args: dict[str, Any]) -> Any:
        ctx = self.context(args, self.state)
        value = copy.deepcopy(args) if tool.value is None else interpolate(tool.value, ctx)
        try:
            set_path(self.state, f"{tool.target}[]", value)
        except PathError as exc:
            raise ToolError(f"cannot append to {tool.target}: {exc}") from None
        if tool.response is not None:
            return interpolate(tool.response, self.context(args, self.state))
        return {"ok": True, "recorded": value}

    def _mock(self, tool: WorkflowTool, args: dict[str, Any]) -> Any:
        if tool.response is None:
            return {"ok": True}
        return interpolate(tool.response, self.context(args, self.state))

    def final_state(self) -> dict[str, Any]:
        """The mutable state after the episode."""
        return copy.deepcopy(self.state)
