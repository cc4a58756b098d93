"""verifiers (Prime Intellect, v1 API) both ways: a taskset as a rollout env, and an env as a
verifiers taskset module.

Load: `environment("my_taskset")` runs the taskset in a plugin host (a sandboxed worker, never
this process) and turns its tasks into a rollout env of template `verifiers`: the prompt is
the instruction, the task's wire data is the hidden ground truth, and the `verifiers_rubric`
primitive scores a reply with the task's own `@vf.reward` functions, also in the host.

Export: `export_module(spec, out_dir)` writes a verifiers taskset module whose tasks are the
env's tasks and whose reward is rollout's verifier for the reply.
"""

from __future__ import annotations

import json
import keyword
from pathlib import Path
from typing import Any

from rollout.shared.contracts.envspec import EnvironmentSpec, PluginConfig, VerifiersConfig
from rollout.shared.errors import RolloutError

_ADAPTER = "_verifiers_adapter"
_ADAPTER_SOURCE = (Path(__file__).parent / f"{_ADAPTER}.py").read_text(encoding="utf-8")
_MARK = "verifiers: "
MAX_TASKS = 10_000


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
    from rollout.shared.envs.plugin_host.client import HostFailed, ReplyError, default_pool
    from rollout.shared.envs.plugin_host.worker import PluginError
    from rollout.shared.envs.templates.plugin import lease_host

    pool = pool or default_pool()
    try:
        host = lease_host(plugin_config(config), pool)
    except (PluginError, HostFailed) as exc:
        raise RolloutError(_strip(str(exc))) from None
    options = {"taskset": config.taskset, "options": dict(config.options)}
    try:
        host.call("reset", {"options": options, "task": {}})
        reply = host.call("step", {"name": op, "arguments": arguments})
    except HostFailed as exc:
        raise RolloutError(_strip(str(exc))) from None
    except (PluginError, ReplyError) as exc:
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
    from rollout.shared.envs.plugin_sources import bundle_sources

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


def environment(
    taskset: str,
    *,
    slug: str | None = None,
    options: dict[str, Any] | None = None,
    limit: int = MAX_TASKS,
    pass_at: float = 1.0,
) -> Any:
    """A verifiers taskset as a rollout `Environment` (template `verifiers`)."""
    from rollout.shared.envs.environment import Environment

    config = config_for(taskset, options)
    tasks = tasks_of(config, limit)
    name = slug or taskset.rsplit(".", 1)[-1].lower().replace("_", "-")
    return Environment(
        slug=name,
        template="verifiers",
        description=f"verifiers taskset {taskset}",
        config=config.model_dump(by_alias=True),
        tasks=tasks,
        verifier=[{"name": "rubric", "type": "verifiers_rubric", "passAt": pass_at}],
    )


# ---------------------------------------------------------------- export

_MODULE = '''"""A verifiers (v1) taskset exported from the rollout environment {slug!r}.

Each task is one of the env's tasks; the reward is rollout's own verifier on the reply
(needs `rolloutdev` installed). Generated by `rollout env export-verifiers`.
"""

from __future__ import annotations

import json

import verifiers.v1 as vf

__all__ = ["RolloutTaskset", "load_environment", "load_taskset"]

SPEC = json.loads({spec!r})


class RolloutTaskData(vf.TaskData):
    task_index: int


class RolloutTask(vf.Task[RolloutTaskData, vf.State]):
    @vf.reward
    async def rollout_verifier(self, task: RolloutTaskData, trace: vf.Trace) -> float:
        from rollout.shared.contracts.trajectory import Trajectory
        from rollout.shared.envs import score

        trajectory = Trajectory(final_output=trace.last_reply, final_state={{}})
        verdict = await score(SPEC, task.task_index, trajectory)
        return float(verdict.score)


class RolloutTaskset(vf.Taskset[RolloutTask]):
    def load(self):
        for index, task in enumerate(SPEC["tasks"]):
            yield RolloutTask(
                RolloutTaskData(prompt=task["instruction"], id=task.get("id"), task_index=index),
                self.config.task,
            )


def load_taskset(**options) -> RolloutTaskset:
    """The taskset (verifiers' `TasksetConfig` fields as keywords)."""
    return vf.load_taskset(vf.TasksetConfig(id=__name__, **options))


def load_environment(**options) -> vf.Env:
    """The verifiers environment: this taskset played by a single agent."""
    config = vf.resolve_env_config({{"taskset": {{"id": __name__, **options}}}})
    return vf.load_environment(config)
'''


def export_module(spec: EnvironmentSpec, out_dir: str | Path, name: str | None = None) -> Path:
    """Write `<out_dir>/<name>.py`, a verifiers taskset module of `spec`; its path."""
    module = name or spec.slug.replace("-", "_")
    if not module.isidentifier() or keyword.iskeyword(module):
        raise RolloutError(f"--name {module!r} is not a Python module name")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{module}.py"
    text = _MODULE.format(slug=spec.slug, spec=json.dumps(spec.to_json_dict(), sort_keys=True))
    path.write_text(text, encoding="utf-8")
    return path
