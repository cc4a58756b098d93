"""rollout: write agent environments in Python, run models on them, score, train, compare."""

from __future__ import annotations

from rollout.errors import RolloutError
from rollout.shared.lazy import lazy_names

# Where each public name is defined. They load on first use (PEP 562): `rollout.shared` and
# `rollout.cli` live inside this package, so whatever this module imports eagerly every CLI
# verb and every service would pay for (the env engine alone is most of a second).
_EXPORTS = {
    "AsyncClient": "rollout.client",
    "Client": "rollout.client",
    "Environment": "rollout.environment",
    "Task": "rollout.environment",
    "action_tool": "rollout.helpers",
    "browser_config": "rollout.helpers",
    "browser_page": "rollout.helpers",
    "code_editing_config": "rollout.helpers",
    "custom_config": "rollout.helpers",
    "custom_tool": "rollout.helpers",
    "lookup_tool": "rollout.helpers",
    "mock_tool": "rollout.helpers",
    "plugin_config": "rollout.helpers",
    "primitive": "rollout.helpers",
    "sql_config": "rollout.helpers",
    "verifier_config": "rollout.helpers",
    "workflow_config": "rollout.helpers",
}
# Submodules `import rollout` used to load as a side effect, so `rollout.helpers` still works.
_SUBMODULES = ("environment", "helpers")

__all__ = [
    "AsyncClient",
    "Client",
    "Environment",
    "RolloutError",
    "Task",
    "action_tool",
    "browser_config",
    "browser_page",
    "code_editing_config",
    "custom_config",
    "custom_tool",
    "lookup_tool",
    "mock_tool",
    "plugin_config",
    "primitive",
    "sql_config",
    "verifier_config",
    "workflow_config",
]


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, frozenset(_SUBMODULES))
