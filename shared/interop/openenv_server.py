"""Serve any rollout env as an OpenEnv server, on openenv-core's own app (FastAPI + WebSocket).

Routes are OpenEnv's: HTTP `/health`, `/metadata`, `/schema`, `/reset`, `/step`, `/state`, and
`/ws` sessions (one env object per session; OpenEnv's HTTP `/reset` and `/step` are stateless,
one fresh env per request, so a multi-step episode uses `/ws`).

An action is a tool call `{"tool": NAME, "arguments": {...}}`, or `{"answer": TEXT}` to end
the episode with a final answer. The episode also ends after `max_steps` tool calls. When it
ends, our verifier scores the trajectory: the observation's `reward` is the verifier's score
and `verifier` carries passed and the per-primitive breakdown. Rewards are never taken from
the client.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from pydantic import Field

from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.contracts.trajectory import ToolCallRecord, Trajectory
from rollout.shared.envs.engine import build_runtime, score
from rollout.shared.envs.validation import validate_environment
from rollout.shared.errors import RolloutError
from rollout.shared.interop.backends import require
from rollout.shared.interop.http import run_on

log = structlog.get_logger(__name__)

require("openenv")

from openenv.core.env_server.http_server import create_fastapi_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import (  # noqa: E402
    Action,
    EnvironmentMetadata,
    Observation,
    State,
)

DEFAULT_MAX_STEPS = 32
DEFAULT_MAX_SESSIONS = 64
_CLOSING: set[asyncio.Future[Any]] = set()


class ToolAction(Action):
    """One tool call, or a final answer that ends the episode."""

    tool: str | None = Field(default=None, description="Tool to call (see the reset tools).")
    arguments: dict[str, Any] = Field(default_factory=dict, description="The tool's arguments.")
    answer: str | None = Field(default=None, description="Final answer: ends the episode.")


class ToolObservation(Observation):
    """What the agent sees: the task and tools at reset, a tool's result after a step."""

    instruction: str = ""
    task_id: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    result: Any = None
    error: str | None = None
    verifier: dict[str, Any] | None = None


class EpisodeState(State):
    """OpenEnv state plus the env's own final state (what our verifier will see)."""

    slug: str = ""
    task_index: int | None = None
    env_state: dict[str, Any] = Field(default_factory=dict)


def _pick_task(spec: EnvironmentSpec, task: Any, seed: int | None, split: str | None) -> int:
    indices = [i for i, t in enumerate(spec.tasks) if split is None or t.split == split]
    if not indices:
        raise RolloutError(
            f"environment {spec.slug!r} has no tasks" + (f" in split {split!r}" if split else "")
        )
    if isinstance(task, int) and not isinstance(task, bool):
        if not 0 <= task < len(spec.tasks):
            raise RolloutError(f"task index {task} out of range (0..{len(spec.tasks) - 1})")
        return task
    if isinstance(task, str):
        for i, t in enumerate(spec.tasks):
            if t.id == task:
                return i
        raise RolloutError(f"no task with id {task!r}")
    return indices[(seed or 0) % len(indices)]


def environment_class(spec: EnvironmentSpec, max_steps: int = DEFAULT_MAX_STEPS) -> type:
    """An openenv `Environment` subclass playing episodes of `spec` on our engine."""

    class RolloutEnvironment(Environment[ToolAction, ToolObservation, EpisodeState]):
        """One OpenEnv session: an episode at a time of one rollout env."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._runtime: Any = None
            self._loop: asyncio.AbstractEventLoop | None = None
            self._calls: list[ToolCallRecord] = []
            self._state = EpisodeState(slug=spec.slug)
            self._task_index: int | None = None

        def reset(
            self, seed: int | None = None, episode_id: str | None = None, **kw: Any
        ) -> ToolObservation:  # noqa: E501
            """Sync reset is not served: the server awaits reset_async."""
            raise RolloutError("use reset_async")

        def step(
            self, action: ToolAction, timeout_s: float | None = None, **kw: Any
        ) -> ToolObservation:  # noqa: E501
            """Sync step is not served: the server awaits step_async."""
            raise RolloutError("use step_async")

        async def reset_async(
            self,
            seed: int | None = None,
            episode_id: str | None = None,
            task: int | str | None = None,
            split: str | None = None,
            **kwargs: Any,
        ) -> ToolObservation:
            """Start an episode on one task (by index, id, or seed over the split)."""
            await self._end()
            try:
                index = _pick_task(spec, task, seed, split)
                self._loop = asyncio.get_running_loop()
                self._runtime = build_runtime(spec, index)
                tools = [t.to_openai()["function"] for t in self._runtime.tool_specs()]
            except RolloutError as exc:
                return ToolObservation(error=str(exc), done=True)
            self._task_index = index
            self._calls = []
            self._state = EpisodeState(
                episode_id=episode_id or uuid.uuid4().hex, slug=spec.slug, task_index=index
            )
            t = spec.tasks[index]
            return ToolObservation(instruction=t.instruction, task_id=t.id, tools=tools)

        async def step_async(
            self, action: ToolAction, timeout_s: float | None = None, **kwargs: Any
        ) -> ToolObservation:
            """One tool call; the verifier's reward when the episode ends."""
            if self._runtime is None:
                return ToolObservation(
                    error="no episode: reset first (OpenEnv's HTTP /step is stateless: "
                    "play episodes over /ws)",
                    done=True,
                )
            if action.answer is not None or action.tool is None:
                return await self._finish(action.answer)
            result = await self._runtime.call_tool(action.tool, action.arguments)
            self._calls.append(
                ToolCallRecord(
                    index=len(self._calls),
                    name=action.tool,
                    arguments=action.arguments,
                    result=result.output,
                    error=result.error,
                )
            )
            self._state.step_count = len(self._calls)
            if len(self._calls) >= max_steps:
                obs = await self._finish(None)
                obs.result, obs.error = result.output, result.error
                return obs
            return ToolObservation(result=result.output, error=result.error)

        async def _finish(self, answer: str | None) -> ToolObservation:
            runtime, self._runtime = self._runtime, None
            try:
                final_state = runtime.final_state()
            finally:
                await runtime.close()
            self._state.env_state = final_state
            trajectory = Trajectory(
                tool_calls=self._calls, final_output=answer, final_state=final_state
            )
            verdict = await score(spec, self._task_index, trajectory)
            return ToolObservation(
                done=True,
                reward=verdict.score,
                verifier=verdict.model_dump(mode="json", by_alias=True),
            )

        async def _end(self) -> None:
            runtime, self._runtime = self._runtime, None
            if runtime is not None:
                await runtime.close()

        @property
        def state(self) -> EpisodeState:
            """The OpenEnv state, with the env's live state while an episode runs."""
            if self._runtime is not None:
                self._state.env_state = self._runtime.final_state()
            return self._state

        def get_metadata(self) -> EnvironmentMetadata:
            """The env's slug and description."""
            return EnvironmentMetadata(
                name=spec.slug,
                description=spec.description or spec.name or spec.slug,
                version=spec.spec_hash()[:16],
            )

        def close(self) -> None:
            """Close an unfinished episode's runtime on the loop that opened it."""
            runtime, self._runtime = self._runtime, None
            if runtime is None or self._loop is None or self._loop.is_closed():
                return
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self._loop:
                fut: asyncio.Future[Any] = self._loop.create_task(runtime.close())
            else:
                fut = asyncio.wrap_future(
                    asyncio.run_coroutine_threadsafe(runtime.close(), self._loop), loop=self._loop
                )
            _CLOSING.add(fut)
            fut.add_done_callback(_CLOSING.discard)

    RolloutEnvironment.__name__ = f"RolloutEnvironment[{spec.slug}]"
    return RolloutEnvironment


def create_app(
    spec: EnvironmentSpec,
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
) -> Any:
    """The OpenEnv FastAPI app serving `spec` (validated first: a bad env never serves)."""
    problems = validate_environment(spec)
    if problems:
        raise RolloutError(f"environment {spec.slug!r} is invalid", problems=problems)
    return create_fastapi_app(
        environment_class(spec, max_steps),
        ToolAction,
        ToolObservation,
        max_concurrent_envs=max_sessions,
    )


def serve(spec: EnvironmentSpec, sock: socket.socket, on_listening: Callable[[str], None]) -> None:
    """Run the OpenEnv server in the foreground (uvicorn) on `sock`; `on_listening(url)` once it accepts connections."""
    app = create_app(spec)
    log.info("openenv.serve", slug=spec.slug, address=sock.getsockname())
    run_on(app, sock, on_listening)
