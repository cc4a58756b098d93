"""rollout: write agent environments in Python, run models on them, score, train, compare."""

from rollout.environment import Environment, Task
from rollout.errors import RolloutError
from rollout.helpers import (
    action_tool,
    browser_config,
    browser_page,
    code_editing_config,
    custom_config,
    custom_tool,
    lookup_tool,
    mock_tool,
    plugin_config,
    primitive,
    sql_config,
    verifier_config,
    workflow_config,
)

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


def __getattr__(name: str) -> object:
    # The client pulls in the NATS stack; environment files that only import Environment and
    # Task (and the sandboxed test runs) stay light.
    if name in ("Client", "AsyncClient"):
        from rollout import client

        return getattr(client, name)
    raise AttributeError(f"module 'rollout' has no attribute {name!r}")
