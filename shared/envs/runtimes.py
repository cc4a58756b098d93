"""Runtimes: one episode of a (spec, task), built or started (tools in, state out)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import ValidationError

from rollout.shared.contracts.envspec import EnvironmentSpec, TaskSpec
from rollout.shared.contracts.trajectory import ToolCallRecord, Trajectory
from rollout.shared.envs.coerce import as_spec, as_task, pydantic_problems
from rollout.shared.envs.plugin_host.client import HostPool, default_pool, starter
from rollout.shared.envs.plugin_host.worker import PluginError
from rollout.shared.envs.runtime import EnvRuntime
from rollout.shared.envs.templates import REGISTRY, Template, typed_config
from rollout.shared.errors import RolloutError


def build_runtime(spec: Any, task: Any) -> EnvRuntime:
    """Start one episode of `spec` on `task` (Task, dict or index); RolloutError if invalid.

    The returned runtime is used from async code: `await rt.call_tool(...)`, `await rt.close()`.
    """
    env = as_spec(spec)
    t = as_task(env, task)
    template = _template(env)
    config = _typed_config(env)
    try:
        return template.runtime(env, t, config)
    except PluginError as exc:
        raise RolloutError(f"environment {env.slug!r}: config.entrypoint: {exc}") from None
    except Exception as exc:  # e.g. the sql schema fails: name it, never a traceback
        raise RolloutError(
            f"environment {env.slug!r}: cannot start the {env.template} runtime: "
            f"{type(exc).__name__}: {exc}"
        ) from None


def _template(env: EnvironmentSpec) -> Template:
    template = REGISTRY.get(env.template)
    if template is None:
        raise RolloutError(f"unknown template {env.template!r} (known: {', '.join(REGISTRY)})")
    return template


def _typed_config(env: EnvironmentSpec) -> Any:
    try:
        return typed_config(env)
    except ValidationError as exc:
        raise RolloutError(
            f"environment {env.slug!r}: invalid config",
            problems=pydantic_problems(exc, "config"),
        ) from None


async def start_runtime(spec: Any, task: Any) -> EnvRuntime:
    """build_runtime for async callers: a plugin's host lease and reset run in a worker thread.

    A cold plugin host takes a fraction of a second to start and import its plugin, and a
    reset may take up to the step timeout: the caller's event loop goes on meanwhile.
    """
    env = as_spec(spec)
    # The others start in microseconds (and sqlite wants its thread).
    if not _template(env).starts_in_host:
        return build_runtime(env, task)
    # Not asyncio.to_thread: see client.starter (a host must not be spawned from a thread
    # that ends with this loop).
    return await asyncio.get_running_loop().run_in_executor(starter(), build_runtime, env, task)


async def start_runtimes(
    spec: Any, tasks: Sequence[Any], pool: HostPool | None = None
) -> list[EnvRuntime]:
    """start_runtime for one batch's tasks (cold starts overlap); all or none.

    A plugin batch may share hosts (HostSettings.episodes_per_host; `pool` defaults to the
    process's). On an error the runtimes already started are closed and the first is raised.
    """
    env = as_spec(spec)
    if not _template(env).starts_in_host:
        # Built in microseconds, in this thread: in order, with no task per episode.
        started: list[EnvRuntime] = []
        try:
            for t in tasks:
                started.append(build_runtime(env, t))
        except BaseException:
            for rt in started:
                await rt.close()
            raise
        return started
    typed = [as_task(env, t) for t in tasks]
    size = (pool or default_pool()).settings.episodes_per_host
    chunks = [typed[i : i + size] for i in range(0, len(typed), size)]
    loop = asyncio.get_running_loop()
    starts = [loop.run_in_executor(starter(), _start_host_group, env, c, pool) for c in chunks]
    results = await asyncio.gather(*starts, return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        for r in results:
            if not isinstance(r, BaseException):
                for rt in r:
                    await rt.close()
        raise failures[0]
    return [rt for r in results for rt in r]  # type: ignore[union-attr]


def _start_host_group(
    env: EnvironmentSpec, tasks: list[TaskSpec], pool: HostPool | None
) -> list[EnvRuntime]:
    config = _typed_config(env)
    try:
        return _template(env).start_group(env, tasks, config, pool)
    except PluginError as exc:
        raise RolloutError(f"environment {env.slug!r}: config.entrypoint: {exc}") from None


async def run_tool_script(
    spec: Any,
    task: Any,
    calls: Iterable[tuple[str, dict[str, Any]]],
    final_output: str | None = None,
) -> Trajectory:
    """Replay a fixed list of tool calls against a fresh runtime and return the trajectory.

    Handy for tests, benchmarks and checking ground truths without a model.
    """
    runtime = build_runtime(spec, task)
    records: list[ToolCallRecord] = []
    try:
        for i, (name, args) in enumerate(calls):
            result = await runtime.call_tool(name, args)
            records.append(
                ToolCallRecord(
                    index=i, name=name, arguments=args, result=result.output, error=result.error
                )
            )
        state = runtime.final_state()
    finally:
        await runtime.close()
    return Trajectory(tool_calls=records, final_output=final_output, final_state=state)
