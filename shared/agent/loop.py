"""The agent loop: model -> tool calls -> results -> model ... until an answer or a limit.

Many episodes step together: each turn makes one `backend.generate` call for every live
episode, so batching backends (hf, vLLM) see full batches. Whatever the model gets wrong
(malformed tool-call JSON, an unknown tool, arguments that are not an object, a tool that
raises) becomes a tool error in the trajectory and is shown to the model; the loop never
crashes on model output. Backend configuration errors (a bad key) do raise RolloutError.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from rollout.errors import RolloutError
from rollout.shared.contracts.events import ErrorKind
from rollout.shared.contracts.trajectory import ToolCallRecord, Trajectory
from rollout.shared.envs.runtime import EnvironmentFailed, EnvRuntime, ToolResult
from rollout.shared.models.base import ChatRequest, ChatResponse, ModelBackend, ToolCall

DEFAULT_MAX_TOOL_CALLS = 20
DEFAULT_SYSTEM_PROMPT = (
    "You are an agent working in a tool-using environment. Use the tools to complete the "
    "user's task. When the task is done, reply with a short final answer and no tool call."
)
# Tool outputs are shown to the model in full up to this size; beyond it they are cut.
MAX_TOOL_MESSAGE_CHARS = 20_000


class SamplingParams(BaseModel):
    """Sampling settings passed to the backend on every turn."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    seed: int | None = None


@dataclass
class Episode:
    """One episode to run: a live runtime, the task's instruction, optional own sampling."""

    runtime: EnvRuntime
    instruction: str
    sampling: SamplingParams | None = None
    system_prompt: str | None = None
    # Earlier turns of a multi-turn prompt (a leading system message replaces the default one);
    # the instruction is the user turn that follows them.
    history: list[dict[str, Any]] | None = None


@dataclass
class _State:
    episode: Episode
    sampling: SamplingParams
    max_tool_calls: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_names: list[str]
    records: list[ToolCallRecord] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    has_tokens: bool = True
    final_output: str | None = None
    finish_reason: str = "stop"
    error: str | None = None
    error_kind: ErrorKind | None = None
    done: bool = False
    turn: int = 0

    def request(self) -> ChatRequest:
        seed = self.sampling.seed
        # A different seed per turn, derived from the episode's, keeps turns reproducible
        # without every turn sampling the same way.
        return ChatRequest(
            messages=self.messages,
            tools=self.tools or None,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            max_tokens=self.sampling.max_tokens,
            seed=None if seed is None else seed + self.turn,
        )


async def run_episode(
    runtime: EnvRuntime,
    backend: ModelBackend,
    instruction: str,
    *,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
    sampling: SamplingParams | None = None,
) -> Trajectory:
    """Run one episode to its end and return its trajectory (the caller closes `runtime`)."""
    [trajectory] = await run_episodes(
        [Episode(runtime, instruction)],
        backend,
        system_prompt=system_prompt,
        max_tool_calls=max_tool_calls,
        sampling=sampling,
    )
    return trajectory


async def run_episodes(
    episodes: Sequence[Episode],
    backend: ModelBackend,
    *,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
    sampling: SamplingParams | None = None,
) -> list[Trajectory]:
    """Run many episodes in lock step, one batched `generate` per turn; trajectories in order.

    `system_prompt=None` or `""` sends no system message; an Episode's own `system_prompt`
    and `sampling` override the shared ones.
    """
    if max_tool_calls < 0:
        raise RolloutError(f"max_tool_calls must be >= 0, got {max_tool_calls}")
    states = [_start(ep, system_prompt, max_tool_calls, sampling) for ep in episodes]
    while True:
        live = [s for s in states if not s.done]
        if not live:
            break
        responses = await backend.generate([s.request() for s in live])
        if len(responses) != len(live):
            raise RolloutError(
                f"model backend {getattr(backend, 'name', backend)!r} returned "
                f"{len(responses)} responses for {len(live)} requests"
            )
        if all(getattr(s.episode.runtime, "immediate_tools", False) for s in live):
            # No call can wait (declarative tools): in order, with no task per episode (a
            # task and a gather per turn cost more than the calls themselves).
            for s, r in zip(live, responses, strict=True):
                await _apply(s, r)
        else:
            # Episodes are independent: run their tools concurrently (sandboxed test runs are
            # slow).
            await asyncio.gather(*(_apply(s, r) for s, r in zip(live, responses, strict=True)))
    return [_finish(s) for s in states]


def _start(
    episode: Episode,
    system_prompt: str | None,
    max_tool_calls: int,
    sampling: SamplingParams | None,
) -> _State:
    prompt = episode.system_prompt if episode.system_prompt is not None else system_prompt
    history = [dict(m) for m in episode.history or []]
    if history and history[0].get("role") == "system":
        prompt = None  # the conversation brings its own
    messages: list[dict[str, Any]] = []
    if prompt:
        messages.append({"role": "system", "content": prompt})
    messages.extend(history)
    messages.append({"role": "user", "content": episode.instruction})
    try:
        specs = episode.runtime.tool_specs()
    except EnvironmentFailed as exc:  # e.g. its plugin host died in reset: only this episode
        state = _State(
            episode=episode,
            sampling=episode.sampling or sampling or SamplingParams(),
            max_tool_calls=max_tool_calls,
            messages=messages,
            tools=[],
            tool_names=[],
        )
        state.error, state.finish_reason, state.done = str(exc), "error", True
        return state
    return _State(
        episode=episode,
        sampling=episode.sampling or sampling or SamplingParams(),
        max_tool_calls=max_tool_calls,
        messages=messages,
        tools=[spec.to_openai() for spec in specs],
        tool_names=[spec.name for spec in specs],
    )


async def _apply(state: _State, response: ChatResponse) -> None:
    state.turn += 1
    if response.error is not None:
        # The backend gave up on this request (endpoint down, retries exhausted): no verdict.
        state.error = response.error
        state.error_kind = "model"
        state.finish_reason = "error"
        state.done = True
        return
    if response.token_ids is not None and response.logprobs is not None:
        state.token_ids.append(list(response.token_ids))
        state.logprobs.append(list(response.logprobs))
    else:
        state.has_tokens = False
    state.messages.append(response.assistant_message())
    state.final_output = response.content
    if not response.tool_calls:
        state.finish_reason = "length" if response.finish_reason == "length" else "stop"
        state.done = True
        return
    for call in response.tool_calls:
        if state.finish_reason == "error":  # the environment failed on an earlier call
            state.messages.append(_tool_message(call, None, "not run: the environment failed"))
            continue
        if len(state.records) >= state.max_tool_calls:
            # Every call id still needs an answer for the conversation to stay well formed.
            state.messages.append(
                _tool_message(
                    call, None, f"tool call limit ({state.max_tool_calls}) reached; not run"
                )
            )
            state.finish_reason = "max_tool_calls"
            state.done = True
            continue
        arguments, result = await _execute(state, call)
        state.records.append(
            ToolCallRecord(
                index=len(state.records),
                name=call.name or "<malformed>",
                arguments=arguments,
                result=result.output if result.ok else None,
                error=result.error,
            )
        )
        state.messages.append(_tool_message(call, result.output, result.error))


async def _execute(state: _State, call: ToolCall) -> tuple[dict[str, Any], ToolResult]:
    if call.error is not None:
        return {}, ToolResult(error=call.error)
    if call.name not in state.tool_names:
        available = ", ".join(state.tool_names) or "(none)"
        return {}, ToolResult(error=f"unknown tool '{call.name}'; available tools: {available}")
    raw = call.arguments.strip()
    try:
        arguments = json.loads(raw) if raw else {}
    except ValueError as exc:
        return {}, ToolResult(
            error=f"invalid JSON arguments for '{call.name}': {exc.msg} at char {exc.pos} "
            f"in {_clip(raw, 200)!r}"
        )
    if not isinstance(arguments, dict):
        return {}, ToolResult(
            error=f"arguments for '{call.name}' must be a JSON object, "
            f"got {type(arguments).__name__}"
        )
    try:
        result = await state.episode.runtime.call_tool(call.name, arguments)
    except EnvironmentFailed as exc:  # its host crashed or hung: this episode ends, errored
        state.error, state.finish_reason, state.done = str(exc), "error", True
        result = ToolResult(error=str(exc))
    except Exception as exc:  # a runtime must not raise, but a plugin might: record it
        result = ToolResult(error=f"tool '{call.name}' failed: {type(exc).__name__}: {exc}")
    return arguments, result


def _tool_message(call: ToolCall, output: Any, error: str | None) -> dict[str, Any]:
    if error is not None:
        content = json.dumps({"error": error})
    elif isinstance(output, str):
        content = output
    else:
        content = json.dumps(output, default=str)
    return {
        "role": "tool",
        "tool_call_id": call.id,
        "name": call.name,
        "content": _clip(content, MAX_TOOL_MESSAGE_CHARS),
    }


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"


def _finish(state: _State) -> Trajectory:
    final_state: dict[str, Any] = {}
    error, kind = state.error, state.error_kind
    try:
        final_state = state.episode.runtime.final_state()
    except Exception as exc:  # the verifier still gets the trajectory and the reason
        if error is None:
            error, kind = f"final_state failed: {type(exc).__name__}: {exc}", "env"
    return Trajectory(
        messages=state.messages,
        tool_calls=state.records,
        final_output=state.final_output,
        final_state=final_state,
        finish_reason=state.finish_reason,
        error=error,
        error_kind=kind,
        token_ids=state.token_ids if state.has_tokens and state.token_ids else None,
        logprobs=state.logprobs if state.has_tokens and state.logprobs else None,
    )
