"""The `workflow` template: lookup tools read fixtures, actions append to state, mocks answer."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from rollout.shared.contracts.envspec import CamelModel, EnvironmentSpec, TaskSpec
from rollout.shared.envs.checks import (
    check_schema,
    declared_params,
    duplicates,
    missing_in,
    placeholder_problems,
    quiet,
    static_prefix,
)
from rollout.shared.envs.compare import short, values_equal
from rollout.shared.envs.interpolate import Compiled, arg_names, compile_template
from rollout.shared.envs.memo import per_object
from rollout.shared.envs.params import argument_checker, to_json_schema
from rollout.shared.envs.paths import (
    PathError,
    json_copy,
    parse_path,
    resolve_path,
    set_path,
)
from rollout.shared.envs.templates.base import BaseRuntime, ToolError
from rollout.shared.envs.templates.protocol import Plan, Template, required_args, tools_by_name

# The config of its specs: a contract (schemas/templates/<name>.json is generated from it).


class WorkflowTool(CamelModel):
    """A workflow tool: `lookup` reads fixtures, `action` appends to state, `mock` answers canned."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")
    kind: Literal["lookup", "action", "mock"]
    description: str = ""
    params_schema: dict[str, Any] | None = None
    # lookup, README shape: a templated dot path into the fixtures.
    fixture_path: str | None = None
    # lookup, helper shape: find the element of fixtures[fromArray] whose matchField equals the arg.
    from_array: str | None = None
    match_field: str | None = None
    match_arg: str | None = None
    # action: README shape `appendTo` + templated `value`; helper shape `stateArray`.
    append_to: str | None = None
    state_array: str | None = None
    value: Any = None
    # mock (and optional override for action): templated response.
    response: Any = None

    @model_validator(mode="after")
    def _kind_fields(self) -> WorkflowTool:
        if self.kind == "lookup":
            if not self.fixture_path and not self.from_array:
                raise ValueError("a lookup tool needs fixturePath or fromArray")
            if self.fixture_path and self.from_array:
                raise ValueError("a lookup tool takes fixturePath or fromArray, not both")
        if self.kind == "action":
            if not self.append_to and not self.state_array:
                raise ValueError("an action tool needs appendTo or stateArray")
            if self.append_to and self.state_array:
                raise ValueError("an action tool takes appendTo or stateArray, not both")
        return self

    @property
    def target(self) -> str | None:
        """The state array an action appends to."""
        return self.append_to or self.state_array


class WorkflowConfig(CamelModel):
    """Config of the `workflow` template."""

    tools: list[WorkflowTool] = Field(default_factory=list)
    fixtures: dict[str, Any] = Field(default_factory=dict)
    initial_mutable_state: dict[str, Any] = Field(default_factory=dict)


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
    kind = type(wanted)
    for item in pool:
        if type(item) is dict:  # fixtures are JSON: one lookup, no isinstance
            have = item.get(field, _ABSENT)
            if have is _ABSENT:
                continue
        elif isinstance(item, dict) and field in item:
            have = item[field]
        else:
            continue
        if type(have) is kind:  # the usual case: no coercion needed
            if have == wanted:
                return item
        elif values_equal(have, wanted) or str(have) == str(wanted):
            return item
    return None


_ABSENT = object()


def match_index(items: Any, field: str) -> tuple[type, dict[Any, Any]] | None:
    """(kind, value -> first item) when find_match over `items` is a plain dict lookup.

    That holds when every element is a plain dict and every `field` present is of one exact
    kind, str or int: find_match then compares a wanted value of that kind with == only, and
    returns the first equal element (the index keeps the first). None otherwise.
    """
    pool = items.values() if isinstance(items, dict) else items
    kind: type | None = None
    index: dict[Any, Any] = {}
    for item in pool:
        if type(item) is not dict:
            return None
        have = item.get(field, _ABSENT)
        if have is _ABSENT:
            continue
        if kind is None:
            kind = type(have)
            if kind is not str and kind is not int:
                return None
        elif type(have) is not kind:
            return None
        index.setdefault(have, item)
    return (kind, index) if kind is not None else None


def _no_indexes(config: WorkflowConfig) -> dict[tuple[int, str], Any]:
    return {}


@dataclass(frozen=True)
class _Compiled:
    """A tool's templated fields parsed once (None where the tool has none)."""

    fixture_path: Compiled | None
    value: Compiled | None
    response: Compiled | None
    append_path: str | None
    append_key: str | None  # the target when it is one top-level key (`refunds`)
    description: str
    parameters: dict[str, Any]  # copied for each episode's ToolSpec
    check: Callable[[dict[str, Any]], list[str]]


def _compile(tool: WorkflowTool) -> _Compiled:
    def opt(v: Any) -> Compiled | None:
        return None if v is None else compile_template(v)

    target = tool.target
    key = None
    if target:
        try:
            segments = parse_path(target)
        except PathError:  # reported when the action runs, as before
            segments = []
        if len(segments) == 1 and isinstance(segments[0], str):
            key = segments[0]
    parameters = tool_parameters(tool)
    return _Compiled(
        opt(tool.fixture_path),
        opt(tool.value),
        opt(tool.response),
        target and f"{target}[]",
        key,
        _describe(tool),
        parameters,
        argument_checker(parameters),
    )


def _compile_tools(config: WorkflowConfig) -> dict[int, _Compiled]:
    return {id(tool): _compile(tool) for tool in config.tools}


class WorkflowRuntime(BaseRuntime):
    """One episode of a workflow environment."""

    template = "workflow"
    immediate_tools = True  # lookups, actions and mocks are dict operations

    def __init__(self, spec: EnvironmentSpec, task: TaskSpec, config: WorkflowConfig) -> None:
        super().__init__(spec, task)
        self.config = config
        self.fixtures = config.fixtures  # read-only: outputs are deep copies (json_copy)
        self.state: dict[str, Any] = json_copy(config.initial_mutable_state)
        # Paths resolved into the fixtures, which never change: found once per episode.
        self._fixture_arrays: dict[str, Any] = {}
        # find_match over a fixture array as a dict lookup (match_index), built once per config:
        # (id(array), field) -> the index or None; the config keeps the arrays alive.
        self._indexes = per_object(config, _no_indexes)
        # The config's tools are the spec's (immutable): their templates are parsed once.
        compiled = per_object(config, _compile_tools)
        for tool in config.tools:
            done = compiled.get(id(tool)) or _compile(tool)
            handler = self._handler(tool, done)
            params = json_copy(done.parameters)
            self.add_tool(tool.name, done.description, params, handler, check=done.check)

    def _handler(self, tool: WorkflowTool, compiled: _Compiled):
        if tool.kind == "lookup":
            return functools.partial(self._lookup, tool, compiled)
        if tool.kind == "action":
            return functools.partial(self._action, tool, compiled)
        return functools.partial(self._mock, compiled)

    def _lookup(self, tool: WorkflowTool, compiled: _Compiled, args: dict[str, Any]) -> Any:
        if tool.fixture_path and compiled.fixture_path is not None:
            path = compiled.fixture_path(self.context(args, self.state))
            if not isinstance(path, str):
                path = str(path)
            try:
                return json_copy(resolve_path(self.fixtures, path))
            except PathError as exc:
                raise ToolError(f"not found: {path} ({exc})") from None
        name = tool.from_array or ""
        source = self._fixture_arrays.get(name)
        if source is None:
            source = self._array(name)
        if not tool.match_field:
            return json_copy(source)
        key = tool.match_arg or tool.match_field
        if key not in args:
            raise ToolError(f"missing required argument {key!r}")
        wanted = args[key]
        index = self._indexes.get((id(source), tool.match_field), _ABSENT)
        if index is _ABSENT and source is self._fixture_arrays.get(name):
            # Fixtures only: mutable state can change under an index.
            index = self._indexes[(id(source), tool.match_field)] = match_index(
                source, tool.match_field
            )
        if index is not None and index is not _ABSENT and type(wanted) is index[0]:
            found = index[1].get(wanted)
        else:
            found = find_match(source, tool.match_field, wanted)
        if found is None:
            raise ToolError(
                f"no {tool.from_array} entry with {tool.match_field} = {short(args[key])}"
            )
        return json_copy(found)

    def _array(self, name: str) -> Any:
        # Fixtures first (read-only data), then mutable state (so agents can read what they did).
        found = self._fixture_arrays.get(name)
        if found is not None:
            return found
        try:
            found = self._fixture_arrays[name] = resolve_path(self.fixtures, name)
            return found
        except PathError:
            pass
        try:
            return resolve_path(self.state, name)
        except PathError:
            raise ToolError(f"no fixture {name!r}") from None

    def _action(self, tool: WorkflowTool, compiled: _Compiled, args: dict[str, Any]) -> Any:
        if compiled.value is None:
            value = json_copy(args)
        else:
            value = compiled.value(self.context(args, self.state))
        items = self.state.get(compiled.append_key) if compiled.append_key else None
        if type(items) is list:  # the usual `stateArray: refunds`: no path to walk
            items.append(value)
        else:
            try:
                set_path(self.state, compiled.append_path or f"{tool.target}[]", value)
            except PathError as exc:
                raise ToolError(f"cannot append to {tool.target}: {exc}") from None
        if compiled.response is not None:
            return compiled.response(self.context(args, self.state))
        return {"ok": True, "recorded": value}

    def _mock(self, compiled: _Compiled, args: dict[str, Any]) -> Any:
        if compiled.response is None:
            return {"ok": True}
        return compiled.response(self.context(args, self.state))

    def final_state(self) -> dict[str, Any]:
        """The mutable state after the episode (a copy: later calls cannot change it)."""
        # State is built from JSON (config, arguments, templates): json_copy, not deepcopy's
        # memo and dispatch (an eighth of an in-process rollout's CPU at batch 64).
        return json_copy(self.state)


class WorkflowTemplate(Template):
    """The `workflow` template."""

    name = "workflow"
    config_model = WorkflowConfig
    runtime = WorkflowRuntime

    def tool_names(self, config: WorkflowConfig) -> list[str]:
        """The configured tools."""
        return [t.name for t in config.tools]

    def check_config(self, config: WorkflowConfig, out: list[str]) -> None:
        """Duplicate tools, bad schemas and placeholders, fixtures and state arrays not found."""
        names = [t.name for t in config.tools]
        duplicates(names, lambda i: f"config.tools[{i}].name", "tool", out)
        for i, tool in enumerate(config.tools):
            _check_tool(config, tool, f"config.tools[{i}]", out)

    def state_roots(self, config: WorkflowConfig | None) -> set[str] | None:
        """The initial state's keys and every action's target array."""
        if config is None:
            return None
        roots = set(config.initial_mutable_state)
        for tool in config.tools:
            if tool.target:
                with quiet():
                    first = parse_path(tool.target)[0]
                    if isinstance(first, str):
                        roots.add(first)
        return roots

    def plan(self, spec: EnvironmentSpec, task: TaskSpec, runtime: Any) -> Plan | None:
        """Ground truth {state_array: [record, ...]}: look each record's id up, then act."""
        truth = task.hidden_ground_truth
        if not isinstance(truth, dict):
            return None
        tools = tools_by_name(runtime)
        lookups = [t for n, t in tools.items() if n.startswith(("get_", "lookup"))]
        plan: Plan = []
        for records in truth.values():
            if not isinstance(records, list):
                return None
            for record in records:
                if not isinstance(record, dict) or not record:
                    return None
                key = next(iter(record.values()))
                if lookups and required_args(lookups[0]):
                    plan.append((lookups[0].name, {required_args(lookups[0])[0]: key}))
                action = next(
                    (
                        t
                        for t in tools.values()
                        if t not in lookups
                        and required_args(t)
                        and set(required_args(t)) <= set(record)
                    ),
                    None,
                )
                if action is None:
                    return None
                plan.append((action.name, {k: record[k] for k in required_args(action)}))
        return plan


def _check_tool(config: WorkflowConfig, tool: WorkflowTool, where: str, out: list[str]) -> None:
    check_schema(tool.params_schema, where, out)
    params = declared_params(tool.params_schema)
    for field, value in (
        ("fixturePath", tool.fixture_path),
        ("value", tool.value),
        ("response", tool.response),
    ):
        out.extend(placeholder_problems(value, f"{where}.{field}", params))
    if tool.fixture_path:
        prefix = static_prefix(tool.fixture_path)
        if prefix:
            missing = missing_in(config.fixtures, prefix, "fixture")
            if missing:
                out.append(f"{where}.fixturePath: {missing}")
    if tool.from_array:
        source: Any = None
        for root in (config.fixtures, config.initial_mutable_state):
            try:
                source = resolve_path(root, tool.from_array)
                break
            except PathError:
                continue
        if source is None:
            known = ", ".join(map(repr, config.fixtures)) or "none"
            out.append(f"{where}.fromArray: no fixture {tool.from_array!r} (known: {known})")
        elif not isinstance(source, list | dict):
            out.append(f"{where}.fromArray: {tool.from_array!r} is not an array")
        elif tool.match_field:
            items = list(source.values()) if isinstance(source, dict) else source
            if items and not any(isinstance(it, dict) and tool.match_field in it for it in items):
                out.append(
                    f"{where}.matchField: no {tool.from_array} entry has field {tool.match_field!r}"
                )
        if tool.match_field and params is not None:
            arg = tool.match_arg or tool.match_field
            if arg not in params:
                out.append(f"{where}.paramsSchema: missing argument {arg!r} used by matchField")
    if tool.kind == "action" and tool.target:
        field = "appendTo" if tool.append_to else "stateArray"
        try:
            current = resolve_path(config.initial_mutable_state, tool.target)
        except PathError:
            current = None
        if current is not None and not isinstance(current, list):
            out.append(
                f"{where}.{field}: initialMutableState.{tool.target} is "
                f"{type(current).__name__}, not an array"
            )
        try:
            parse_path(tool.target)
        except PathError as exc:
            out.append(f"{where}.{field}: {exc}")


TEMPLATE = WorkflowTemplate()
