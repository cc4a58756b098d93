"""The `verifiers` template: a verifiers (v1) taskset's tasks, answered in one reply.

The episode offers no tools (a verifiers single-agent task is a prompt and a reply); the
reply is scored by the `verifiers_rubric` primitive in a plugin host. The taskset's code
never runs in this process.
"""

from __future__ import annotations

from rollout.shared.contracts.envspec import EnvironmentSpec, TaskSpec, VerifiersConfig
from rollout.shared.envs.templates.base import BaseRuntime


class VerifiersRuntime(BaseRuntime):
    """One episode of a verifiers task: no tools, nothing but the reply."""

    template = "verifiers"

    def __init__(self, spec: EnvironmentSpec, task: TaskSpec, config: VerifiersConfig) -> None:
        super().__init__(spec, task)
        self.config = config


__all__ = ["VerifiersRuntime"]
