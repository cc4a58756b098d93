"""The `custom` template: templated responses plus state mutations (dot path set or `name[]`)."""

from __future__ import annotations

import copy
import re
from typing import Any

from pydantic import Field, field_validator

from rollout.shared.contracts.envspec import CamelModel, EnvironmentSpec, TaskSpec
from rollout.shared.envs.checks import (
    check_schema,
    declared_params,
    duplicates,
    placeholder_problems,
    quiet,
)
from rollout.shared.envs.interpolate import arg_names, interpolate, interpolate_string
from rollout.shared.envs.params import to_json_schema
from rollout.shared.envs.paths import PathError, parse_cached, parse_path, set_path
from rollout.shared.envs.templates.base import BaseRuntime, ToolError
from rollout.shared.envs.templates.protocol import Plan, Template, required_args, tools_by_name

# The config of its specs: a contract (schemas/templates/<name>.json is generated from it).

# How deep a mutation path may reach once its arguments are in: `tickets.${args.id}.status`
# with an id of 300 dots nested the state too deep for a trajectory to be serialised (its
# whole batch failed, every sibling errored), and of 1200 failed final_state (errored).
MAX_PATH_SEGMENTS = 32


class Mutation(CamelModel):
    """A state change: `path` is a dot path to set, or `name[]` to append; `value` is templated."""

    path: str = Field(min_length=1)
    value: Any = None


class CustomTool(CamelModel):
    """A custom tool: templated response plus optional state mutations."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")
    description: str = ""
    params_schema: dict[str, Any] | None = None
    response: Any = None
    mutates: list[Mutation] = Field(default_factory=list)

    @field_validator("mutates", mode="before")
    @classmethod
    def _normalise_mutates(cls, value: Any) -> Any:
        # Accept "orders[]", {"path": ...} or a list of either: one shape downstream.
        if value is None:
            return []
        if isinstance(value, str | dict):
            value = [value]
        if isinstance(value, list):
            return [{"path": v} if isinstance(v, str) else v for v in value]
        return value


class CustomConfig(CamelModel):
    """Config of the `custom` template."""

    tools: list[CustomTool] = Field(default_factory=list)
    initial_mutable_state: dict[str, Any] = Field(default_factory=dict)


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
                if len(parse_cached(path)) > MAX_PATH_SEGMENTS:
                    raise PathError(f"more than {MAX_PATH_SEGMENTS} segments")
                set_path(trial, path, value)
            except PathError as exc:
                where = path if len(path) <= 120 else path[:120] + "..."
                raise ToolError(f"{tool.name}: cannot update state at {where}: {exc}") from None
        self.state = trial
        if tool.response is None:
            return {"ok": True}
        return interpolate(tool.response, self.context(args, self.state))

    def final_state(self) -> dict[str, Any]:
        """The mutable state after the episode."""
        return copy.deepcopy(self.state)


def _mutated_root(path: str) -> str | None:
    # A templated path's placeholders stand for any segment: parse it with a stand-in.
    first = parse_path(re.sub(r"\$\{[^{}]*\}", "x", path))[0]
    return first if isinstance(first, str) else None


class CustomTemplate(Template):
    """The `custom` template."""

    name = "custom"
    config_model = CustomConfig
    runtime = CustomRuntime

    def tool_names(self, config: CustomConfig) -> list[str]:
        """The configured tools."""
        return [t.name for t in config.tools]

    def check_config(self, config: CustomConfig, out: list[str]) -> None:
        """Duplicate tools, bad schemas, placeholders and mutation paths."""
        names = [t.name for t in config.tools]
        duplicates(names, lambda i: f"config.tools[{i}].name", "tool", out)
        for i, tool in enumerate(config.tools):
            where = f"config.tools[{i}]"
            check_schema(tool.params_schema, where, out)
            params = declared_params(tool.params_schema)
            out.extend(placeholder_problems(tool.response, f"{where}.response", params))
            for j, m in enumerate(tool.mutates):
                mw = f"{where}.mutates[{j}]"
                out.extend(placeholder_problems(m.path, f"{mw}.path", params))
                out.extend(placeholder_problems(m.value, f"{mw}.value", params))
                try:
                    parse_path(re.sub(r"\$\{[^{}]*\}", "x", m.path))
                except PathError as exc:
                    out.append(f"{mw}.path: {exc}")

    def state_roots(self, config: CustomConfig | None) -> set[str] | None:
        """The initial state's keys and every mutation's first segment."""
        if config is None:
            return None
        roots = set(config.initial_mutable_state)
        for tool in config.tools:
            for m in tool.mutates:
                with quiet():
                    first = _mutated_root(m.path)
                    if first is not None:
                        roots.add(first)
        return roots

    def plan(self, spec: EnvironmentSpec, task: TaskSpec, runtime: Any) -> Plan | None:
        """Ground truth paths like `tickets.T-3.status`: act on that id with a tool taking one;
        another argument takes the value a ground-truth path ending in its name expects
        (`closed.0.note` for `note`)."""
        truth = task.hidden_ground_truth
        if not isinstance(truth, dict):
            return None
        tools = tools_by_name(runtime)
        plan: Plan = []
        for path in truth:
            parts = str(path).split(".")
            if len(parts) < 3 or parts[1].isdigit():
                continue  # `closed.0.note`: a value of a list entry, not an item to act on
            item = parts[1]
            for tool in tools.values():
                id_params = [p for p in required_args(tool) if p.endswith("_id")]
                if id_params:
                    named = {str(k).split(".")[-1]: v for k, v in truth.items()}
                    args = {
                        p: item if p in id_params else named.get(p, "Fixed as requested.")
                        for p in required_args(tool)
                    }
                    plan.append((tool.name, args))
                    break
        return plan or None


TEMPLATE = CustomTemplate()
