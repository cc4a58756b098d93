"""Python plugin environments: `config.entrypoint = "module.path:function"`.

The function is a factory: `factory(options: dict) -> env`, where `env` implements

    tools() -> list[dict]            # {"name", "description", "parameters"} (OpenAI function shape)
    reset(task: dict) -> None        # start an episode; task has instruction, input, split, id
    step(name: str, arguments: dict) -> Any   # run one tool (may be async); raise to report an error
    state() -> dict                  # what the verifier sees
    close() -> None                  # optional

`tools`, `reset` and `state` are synchronous. The entrypoint is validated like the seed's
`rollout_func`: a string of shape `module.path:function`, no null bytes, at most 260 characters,
and import failures named clearly.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any

from rollout.errors import RolloutError
from rollout.shared.contracts.envspec import EnvironmentSpec, PluginConfig, TaskSpec
from rollout.shared.envs.templates.base import BaseRuntime, ToolError, json_safe

MAX_ENTRYPOINT_LEN = 260
ENTRYPOINT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,127}:[A-Za-z_][A-Za-z0-9_]{0,127}$")
PROTOCOL = ("tools", "reset", "step", "state")


class PluginError(ValueError):
    """An entrypoint that is malformed, does not import, or breaks the protocol."""


def check_entrypoint(value: object) -> str:
    """Validate the shape of a `module.path:function` entrypoint (no import)."""
    if not isinstance(value, str):
        raise PluginError(f"entrypoint must be a string, got {type(value).__name__}")
    if not value:
        raise PluginError("entrypoint must not be empty")
    if "\x00" in value:
        raise PluginError("entrypoint must not contain null bytes")
    if len(value) > MAX_ENTRYPOINT_LEN:
        raise PluginError(f"entrypoint must be <= {MAX_ENTRYPOINT_LEN} chars")
    if not ENTRYPOINT_RE.match(value) or ".." in value or value.split(":")[0].endswith("."):
        raise PluginError(
            f"entrypoint {value!r} must match 'module.path:function_name' "
            "(letters / digits / underscore / dot only)"
        )
    return value


def resolve_entrypoint(value: object, sources: dict[str, str] | None = None) -> Callable[..., Any]:
    """Import the module (from its bundled sources when given) and return the factory; every
    failure is a PluginError naming it."""
    spec = check_entrypoint(value)
    module_path, _, fn_name = spec.partition(":")
    if sources:
        from rollout.shared.envs.plugin_sources import materialize

        try:
            materialize(sources, module_path.split(".")[0])
        except RolloutError as exc:
            raise PluginError(exc.message) from None
    try:
        module = importlib.import_module(module_path)
    except ImportError as exc:
        raise PluginError(f"module {module_path!r} could not be imported: {exc}") from None
    except Exception as exc:  # user code failing at import time: name it, no traceback
        raise PluginError(
            f"module {module_path!r} raised {type(exc).__name__} on import: {exc}"
        ) from None
    if not hasattr(module, fn_name):
        raise PluginError(f"{spec!r}: module {module_path!r} has no attribute {fn_name!r}")
    fn = getattr(module, fn_name)
    if not callable(fn):
        raise PluginError(f"{spec!r}: {fn_name!r} is not callable ({type(fn).__name__})")
    return fn


def make_plugin_env(config: PluginConfig) -> Any:
    """Call the factory and check the result implements the protocol."""
    factory = resolve_entrypoint(config.entrypoint, config.sources)
    try:
        env = factory(dict(config.options))
    except Exception as exc:
        raise PluginError(
            f"{config.entrypoint!r} raised {type(exc).__name__} when called: {exc}"
        ) from None
    missing = [m for m in PROTOCOL if not callable(getattr(env, m, None))]
    if missing:
        raise PluginError(
            f"{config.entrypoint!r} returned {type(env).__name__}, which lacks "
            f"{', '.join(missing)} (needs tools/reset/step/state)"
        )
    return env


def plugin_tool_dicts(env: Any) -> list[dict[str, Any]]:
    """The plugin's tools as validated dicts (PluginError when malformed)."""
    try:
        tools = env.tools()
    except Exception as exc:
        raise PluginError(f"tools() raised {type(exc).__name__}: {exc}") from None
    if not isinstance(tools, list | tuple):
        raise PluginError(f"tools() must return a list, got {type(tools).__name__}")
    out = []
    for i, tool in enumerate(tools):
        if hasattr(tool, "model_dump"):
            tool = tool.model_dump()
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise PluginError(f"tools()[{i}] must be a dict with a string 'name'")
        params = tool.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise PluginError(f"tools()[{i}].parameters must be an object")
        out.append(
            {
                "name": tool["name"],
                "description": str(tool.get("description", "")),
                "parameters": params,
            }
        )
    return out


class PluginRuntime(BaseRuntime):
    """One episode of a plugin environment."""

    template = "plugin"
    sanitize_outputs = True

    def __init__(self, spec: EnvironmentSpec, task: TaskSpec, config: PluginConfig) -> None:
        super().__init__(spec, task)
        self.env = make_plugin_env(config)
        task_view = {
            "instruction": task.instruction,
            "input": task.input or {},
            "split": task.split,
            "id": task.id,
        }
        try:
            self.env.reset(task_view)
        except Exception as exc:
            raise PluginError(f"reset() raised {type(exc).__name__}: {exc}") from None
        for tool in plugin_tool_dicts(self.env):
            self.add_tool(
                tool["name"], tool["description"], tool["parameters"], self._handler(tool["name"])
            )

    def _handler(self, name: str):
        async def run(args: dict[str, Any]) -> Any:
            out = self.env.step(name, args)
            if inspect.isawaitable(out):
                out = await out
            return out

        return run

    def final_state(self) -> dict[str, Any]:
        """The plugin's state() (an error marker if it fails, so scoring still happens)."""
        try:
            state = self.env.state()
        except Exception as exc:
            return {"_stateError": f"{type(exc).__name__}: {exc}"}
        if not isinstance(state, dict):
            return {"_stateError": f"state() returned {type(state).__name__}, not a dict"}
        return json_safe(state)

    async def close(self) -> None:
        """Call the plugin's close() when it has one."""
        close = getattr(self.env, "close", None)
        if callable(close):
            out = close()
            if inspect.isawaitable(out):
                await out


__all__ = ["PluginError", "PluginRuntime", "ToolError", "check_entrypoint", "resolve_entrypoint"]
