"""Template runtimes, one module each, and the registry that picks one for a spec."""

from __future__ import annotations

from typing import Any

from rollout.shared.contracts.envspec import (
    BrowserConfig,
    CodeEditingConfig,
    CustomConfig,
    PluginConfig,
    SqlConfig,
    VerifiersConfig,
    WorkflowConfig,
)
from rollout.shared.envs.templates.browser import BrowserRuntime
from rollout.shared.envs.templates.code_editing import CodeEditingRuntime
from rollout.shared.envs.templates.custom import CustomRuntime
from rollout.shared.envs.templates.nemo_gym import NemoGymRuntime
from rollout.shared.envs.templates.openenv import OpenEnvRuntime
from rollout.shared.envs.templates.plugin import PluginRuntime
from rollout.shared.envs.templates.sql import SqlRuntime
from rollout.shared.envs.templates.verifiers_taskset import VerifiersRuntime
from rollout.shared.envs.templates.workflow import WorkflowRuntime

RUNTIMES: dict[str, type] = {
    "workflow": WorkflowRuntime,
    "custom": CustomRuntime,
    "sql": SqlRuntime,
    "code-editing": CodeEditingRuntime,
    "browser": BrowserRuntime,
    "plugin": PluginRuntime,
    "openenv": OpenEnvRuntime,
    "verifiers": VerifiersRuntime,
    "nemo_gym": NemoGymRuntime,
}

FIXED_TOOLS = {
    "sql": ["describe_schema", "run_sql", "submit_answer"],
    "browser": ["navigate", "read_page", "click", "type", "submit"],
    "code-editing": ["list_files", "read_file", "write_file", "delete_file"],
}


def static_tool_names(template: str, config: Any) -> list[str] | None:
    """Tool names known without running anything; None when only the plugin knows them."""
    if isinstance(config, WorkflowConfig | CustomConfig):
        return [t.name for t in config.tools]
    if isinstance(config, CodeEditingConfig):
        extra = ["run_tests"] if config.test_command is not None else []
        return FIXED_TOOLS["code-editing"] + extra
    if isinstance(config, SqlConfig | BrowserConfig):
        return list(FIXED_TOOLS[template])
    if isinstance(config, VerifiersConfig):
        return []
    if isinstance(config, PluginConfig):
        return None
    return None


__all__ = ["FIXED_TOOLS", "RUNTIMES", "static_tool_names"]
