"""The `verifiers` template: a verifiers (v1) taskset's tasks, answered in one reply.

The episode offers no tools (a verifiers single-agent task is a prompt and a reply); the
reply is scored by the `verifiers_rubric` primitive in a plugin host. The taskset's code
never runs in this process.
"""

from __future__ import annotations

from typing import Any

from rollout.shared.contracts.envspec import (
    EnvironmentSpec,
    PluginConfig,
    TaskSpec,
    VerifiersConfig,
)
from rollout.shared.envs.templates.base import BaseRuntime
from rollout.shared.envs.templates.plugin import shadowing_problems
from rollout.shared.envs.templates.protocol import Template


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
