"""The Template protocol: everything rollout knows about one environment template.

Each template is one module (`templates/<name>.py`) ending in a `TEMPLATE` object of a
`Template` subclass; the registry (`templates/__init__.py`) maps names to them, one line each.
Plan-time validation, the engine, the default verifier, the sandbox check and the scripted
demonstrations ask the template, so none of them branch on a template's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel

from rollout.shared.contracts.envspec import EnvironmentSpec, TaskSpec

# A scripted demonstration: the tool calls, in order, that solve one task.
Plan = list[tuple[str, dict[str, Any]]]

STATE_MATCH = {"name": "state", "type": "state_match"}


class Template:
    """One template: its config model, runtime, plan-time checks, fixed tools and plan.

    Subclasses set the class attributes and override only the hooks that differ from these
    defaults (a template with fixed tools, no extra checks, a state_match verifier and no plan).
    """

    # The name in `template = "..."` and the other spellings accepted for it.
    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    # The pydantic model of `config` (a contract: defined in contracts/envspec.py or here).
    config_model: ClassVar[type[BaseModel]]
    # Called as runtime(spec, task, config) for one episode (an EnvRuntime).
    runtime: ClassVar[type]
    # Tools every episode offers, whatever the config says.
    fixed_tools: ClassVar[tuple[str, ...]] = ()
    # Its tools or verifier run code in the bubblewrap sandbox.
    sandboxed: ClassVar[bool] = False
    # Starting an episode leases a plugin host (slow, blocking): start in a worker thread,
    # several episodes at once (see start_group).
    starts_in_host: ClassVar[bool] = False

    def complete_config(self, config: dict[str, Any]) -> None:
        """Add to an SDK environment's raw config what only the user's machine has (in place)."""
        return None

    def tool_names(self, config: Any) -> list[str] | None:
        """Tool names known without running anything; None when only the env knows them."""
        return list(self.fixed_tools)

    def check_config(self, config: Any, out: list[str]) -> None:
        """Append the config's problems (each `config.<path>: message`) to out."""
        return None

    def plan_tools(self, config: Any, out: list[str]) -> list[str] | None:
        """Tool names for checking the verifier at plan time (may probe the env; problems to out)."""
        return self.tool_names(config)

    def state_roots(self, config: Any) -> set[str] | None:
        """Top-level keys the final state can have, when knowable statically.

        `config` is None when the config itself is invalid (reported already).
        """
        return None

    def ground_truth_keys(self) -> set[str] | None:
        """Ground-truth keys read by a default verifier that is not a lone state_match (whose
        keys are state paths); None when any key may matter."""
        return None

    def check_task(self, config: Any, task: TaskSpec, where: str, out: list[str]) -> None:
        """Append one task's template-specific problems (`where` is e.g. `tasks[2]`) to out."""
        return None

    def default_primitives(self, task: TaskSpec) -> list[dict[str, Any]]:
        """The verifier used when the env has none: state_match against the ground truth."""
        return [dict(STATE_MATCH)]

    def start_group(
        self, spec: EnvironmentSpec, tasks: Sequence[TaskSpec], config: Any, pool: Any = None
    ) -> list[Any]:
        """Start one episode per task (all or none); `pool` is a plugin host pool or None."""
        return [self.runtime(spec, task, config) for task in tasks]

    def plan(self, spec: EnvironmentSpec, task: TaskSpec, runtime: Any) -> Plan | None:
        """A scripted plan that solves the task, from its hidden ground truth (None: no plan)."""
        return None


def tools_by_name(runtime: Any) -> dict[str, Any]:
    """The runtime's tool specs by name."""
    return {spec.name: spec for spec in runtime.tool_specs()}


def required_args(spec: Any) -> list[str]:
    """A tool's required arguments (all its properties when it marks none required)."""
    params = spec.parameters or {}
    return list(params.get("required") or list((params.get("properties") or {}).keys()))


__all__ = ["STATE_MATCH", "Plan", "Template", "required_args", "tools_by_name"]
