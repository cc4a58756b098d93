"""A verifiers taskset in a plugin host (a sandboxed worker, never this process): its config,
its tasks, and calls into it (the `verifiers` template and the `verifiers_rubric` primitive).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollout.shared.envs.plugin_host.client import HostFailed, ReplyError, default_pool
from rollout.shared.envs.plugin_host.worker import PluginError
from rollout.shared.envs.plugin_sources import bundle_sources
from rollout.shared.envs.templates.plugin import PluginConfig, lease_host
from rollout.shared.envs.templates.verifiers_taskset import VerifiersConfig
from rollout.shared.errors import RolloutError

_ADAPTER = "_verifiers_adapter"


_ADAPTER_SOURCE = (Path(__file__).parent / f"{_ADAPTER}.py").read_text(encoding="utf-8")


_MARK = "verifiers: "


MAX_TASKS = 10_000


class OperationStopped(RolloutError):
    """The operation itself (not the host's start) crashed its host, ran past the step deadline
    or raised past the adapter (SystemExit): what it was given may have done it."""


def _strip(message: str) -> str:
    at = message.find(_MARK)
    return message[at:] if at >= 0 else message


def plugin_config(config: VerifiersConfig) -> PluginConfig:
    """The plugin-host config that runs this taskset through the adapter."""
    sources = dict(config.sources)
    if _ADAPTER + ".py" in sources:
        raise RolloutError(f"config.sources: module name {_ADAPTER!r} is reserved")
    sources[_ADAPTER + ".py"] = _ADAPTER_SOURCE
    return PluginConfig(entrypoint=f"{_ADAPTER}:factory", sources=sources)


def host_call(config: VerifiersConfig, op: str, arguments: dict[str, Any], pool: Any = None) -> Any:
    """One adapter operation in a leased plugin host (RolloutError naming what failed)."""
    pool = pool or default_pool()
    try:
        host = lease_host(plugin_config(config), pool)
    except (PluginError, HostFailed) as exc:
        raise RolloutError(_strip(str(exc))) from None
    options = {"taskset": config.taskset, "options": dict(config.options)}
    try:
        host.call("reset", {"options": options, "task": {}})
    except HostFailed as exc:
        pool.release(host)  # a failed host is closed there
        raise RolloutError(_strip(str(exc))) from None
    except (PluginError, ReplyError) as exc:
        pool.release(host)
        raise RolloutError(_strip(str(exc))) from None
    try:
        reply = host.call("step", {"name": op, "arguments": arguments})
    except (HostFailed, ReplyError) as exc:
        pool.release(host)
        raise OperationStopped(_strip(str(exc))) from None
    except PluginError as exc:
        pool.release(host)
        raise RolloutError(_strip(str(exc))) from None
    pool.release(host)
    return reply.get("output")


async def ahost_call(
    config: VerifiersConfig, op: str, arguments: dict[str, Any], pool: Any = None
) -> Any:
    """host_call without blocking the caller's event loop."""
    import asyncio

    return await asyncio.to_thread(host_call, config, op, arguments, pool)


def config_for(taskset: str, options: dict[str, Any] | None = None) -> VerifiersConfig:
    """The template config for a taskset id, with its own sources bundled when it is user code."""
    try:
        config = VerifiersConfig(taskset=taskset, options=dict(options or {}))
    except ValueError as exc:
        raise RolloutError(f"verifiers taskset {taskset!r} is not a module name: {exc}") from None
    try:
        sources = bundle_sources(f"{taskset}:x")
    except RolloutError as exc:
        raise RolloutError(exc.message.replace("config.entrypoint", "taskset")) from None
    return config.model_copy(update={"sources": sources})


def tasks_of(config: VerifiersConfig, limit: int = MAX_TASKS, pool: Any = None) -> list[dict]:
    """The taskset's tasks as rollout task dicts (prompt -> instruction, data -> ground truth)."""
    rows = (host_call(config, "load", {"limit": limit}, pool) or {}).get("rows")
    if not isinstance(rows, list) or not rows:
        raise RolloutError(f"verifiers taskset {config.taskset!r} produced no tasks")
    if len(rows) > limit:
        raise RolloutError(f"verifiers taskset {config.taskset!r} has more than {limit} tasks")
    tasks = []
    for i, row in enumerate(rows):
        prompt = row.get("prompt") if isinstance(row, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise RolloutError(f"verifiers task {i} has no prompt text")
        metadata = {k: row[k] for k in ("system_prompt", "name") if row.get(k)}
        task: dict[str, Any] = {
            "instruction": prompt,
            "hiddenGroundTruth": row.get("data") or {},
            "metadata": metadata,
        }
        if row.get("id"):
            task["id"] = str(row["id"])
        tasks.append(task)
    return tasks
