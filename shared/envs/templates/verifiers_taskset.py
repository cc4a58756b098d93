"""The `verifiers` template: a verifiers (v1) taskset's tasks, answered in one reply.

The episode offers no tools (a verifiers single-agent task is a prompt and a reply); the
reply is scored by the `verifiers_rubric` primitive in a plugin host. The taskset's code
never runs in this process.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel, EnvironmentSpec, TaskSpec
from rollout.shared.envs.templates.base import BaseRuntime
from rollout.shared.envs.templates.plugin import PluginConfig, shadowing_problems
from rollout.shared.envs.templates.protocol import Template

# The config of its specs: a contract (schemas/templates/<name>.json is generated from it).


class VerifiersConfig(CamelModel):
    """Config of the `verifiers` template: a Prime Intellect verifiers (v1) taskset.

    `taskset` is a verifiers taskset id (an importable module exporting one `vf.Taskset`
    subclass); `options` are its `TasksetConfig` fields. Each task's hidden ground truth is
    the taskset's own task data; the `verifiers_rubric` primitive scores the reply with the
    task's `@vf.reward` functions. The taskset's code runs only in a plugin host.
    """

    taskset: str = Field(
        min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
    )
    options: dict[str, Any] = Field(default_factory=dict)
    # The taskset module's own .py files, bundled when it is the user's code (as for plugins).
    sources: dict[str, str] = Field(default_factory=dict)


class VerifiersRuntime(BaseRuntime):
    """One episode of a verifiers task: no tools, nothing but the reply."""

    template = "verifiers"

    def __init__(self, spec: EnvironmentSpec, task: TaskSpec, config: VerifiersConfig) -> None:
        super().__init__(spec, task)
        self.config = config


class VerifiersTemplate(Template):
    """The `verifiers` template: a verifiers taskset's tasks, scored by its rubric."""

    name = "verifiers"
    config_model = VerifiersConfig
    runtime = VerifiersRuntime

    def check_config(self, config: VerifiersConfig, out: list[str]) -> None:
        """The taskset's module may not shadow rollout or the stdlib (its code is not loaded)."""
        # Its code is loaded only in a plugin host (at load and scoring), never here.
        probe = PluginConfig(entrypoint=f"{config.taskset}:x", sources=config.sources)
        out.extend(
            p.replace("config.entrypoint", "config.taskset") for p in shadowing_problems(probe)
        )

    def default_primitives(self, task: TaskSpec) -> list[dict[str, Any]]:
        """The taskset's own rubric scores the reply."""
        return [{"name": "rubric", "type": "verifiers_rubric"}]


TEMPLATE = VerifiersTemplate()

__all__ = ["TEMPLATE", "VerifiersRuntime", "VerifiersTemplate"]
