"""The agent loop: model -> tool calls -> results -> model ... until an answer or a limit.

Many episodes step together: each turn makes one `backend.generate` call for every live
episode, so batching backends (hf, vLLM) see full batches. Every episode ends at its first
budget (shared/contracts/budgets.py: tokens per turn and per rollout, a wall deadline, the same
call repeated), and its trajectory says which (`ended_by`); a tool call the turn was writing
when its tokens ran out is not run. A later turn the model refuses for what the conversation
holds (it outgrew the context) ends the episode the same way, judged (`model_refused`).
Whatever the model gets wrong (malformed tool-call JSON, an unknown tool, arguments that are
not an object, a tool that raises) becomes a tool error in the trajectory and is shown to the
model; the loop never crashes on model output. Backend configuration errors (a bad key) do
raise RolloutError.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from rollout.shared.contracts.budgets import DEFAULT_BUDGETS, Budgets, EndedBy
from rollout.shared.contracts.events import ErrorKind
from rollout.shared.contracts.trajectory import ToolCallRecord, Trajectory
from rollout.shared.envs.runtime import EnvironmentFailed, EnvRuntime, ToolResult
from rollout.shared.errors import RolloutError
from rollout.shared.jsondepth import MAX_DEPTH, bounded
from rollout.shared.models.base import ChatRequest, ChatResponse, ModelBackend, ToolCall
from rollout.shared.models.weights_proof import rollout_digest

DEFAULT_MAX_TOOL_CALLS = 20
DEFAULT_SYSTEM_PROMPT = (
    "You are an agent working in a tool-using environment. Use the tools to complete the "
    "user's task. When the task is done, reply with a short final answer and no tool call."
)
# Tool outputs are shown to the model in full up to this size; beyond it they are cut.
MAX_TOOL_MESSAGE_CHARS = 20_000
# A code point no UTF-8 text holds: a model that writes `"\\ud800"` in a call's JSON (or an
# endpoint that sends one) would make its trajectory impossible to encode, so its whole batch
# would fail to publish and be dead-lettered instead of scored.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# Tool arguments nested deeper than this are refused as the call's error: 300 levels of `[`
# (600 characters) made the trajectory impossible to serialise, and 1000 made json.loads
# raise, either of which failed the whole batch (every sibling errored), not this call.
MAX_ARGUMENT_DEPTH = 64
# A tool's result (the env's, which the model's calls can shape) is cut at this depth.
MAX_RESULT_DEPTH = MAX_DEPTH
# A backend that does not stop at a request's deadline itself is given this long past the
# latest one before the turn is abandoned (the hf backend stops its rows on time).
DEADLINE_GRACE_S = 5.0
# Called with (episode index, trajectory) as each episode ends, before the batch does.
OnFinished = Callable[[int, Trajectory], Awaitable[None]]


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
    # This episode's budgets; None: the ones given to run_episodes.
    budgets: Budgets | None = None


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
    # Each model turn's weights digest (None where the backend proves none).
    weights: list[str | None] = field(default_factory=list)
    final_output: str | None = None
    finish_reason: str = "stop"
    error: str | None = None
    error_kind: ErrorKind | None = None
    done: bool = False
    turn: int = 0
    budgets: Budgets = field(default_factory=lambda: DEFAULT_BUDGETS)
    deadline: float | None = None
    tokens: int = 0
    ended_by: EndedBy | None = None
    # The last tool call (name, canonical arguments) and how many times in a row it came.
    last_call: tuple[str, str] | None = None
    repeats: int = 0
    # Which limit bounds this turn's tokens, for `ended_by` when the turn runs out.
    turn_limit: EndedBy = "max_turn_tokens"

    def request(self) -> ChatRequest:
        seed = self.sampling.seed
        # The turn may write what is left of the rollout's tokens, at most a turn's worth.
        caps = [("max_turn_tokens", self.budgets.max_turn_tokens), ("max_turn_tokens",
                self.sampling.max_tokens)]  # fmt: skip
        if self.budgets.max_rollout_tokens is not None:
            caps.append(("max_rollout_tokens", self.budgets.max_rollout_tokens - self.tokens))
        limit, max_tokens = min(((k, v) for k, v in caps if v is not None), key=lambda c: c[1])
        self.turn_limit = limit
        # A different seed per turn, derived from the episode's, keeps turns reproducible
        # without every turn sampling the same way.
        return ChatRequest(
            messages=self.messages,
            tools=self.tools or None,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            max_tokens=max(1, max_tokens),
            seed=None if seed is None else seed + self.turn,
            deadline=self.deadline,
        )

    def end(self, budget: EndedBy) -> None:
        """End the episode because `budget` ran out."""
        self.ended_by, self.done = budget, True


async def run_episode(
    runtime: EnvRuntime,
    backend: ModelBackend,
    instruction: str,
    *,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
    sampling: SamplingParams | None = None,
    budgets: Budgets | None = None,
) -> Trajectory:
    """Run one episode to its end and return its trajectory (the caller closes `runtime`)."""
    [trajectory] = await run_episodes(
        [Episode(runtime, instruction)],
        backend,
        system_prompt=system_prompt,
        max_tool_calls=max_tool_calls,
        sampling=sampling,
        budgets=budgets,
    )
    return trajectory


async def run_episodes(
    episodes: Sequence[Episode],
    backend: ModelBackend,
    *,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
    sampling: SamplingParams | None = None,
    budgets: Budgets | None = None,
    on_finished: OnFinished | None = None,
) -> list[Trajectory]:
    """Run many episodes in lock step, one batched `generate` per turn; trajectories in order.

    `system_prompt=None` or `""` sends no system message; an Episode's own `system_prompt`,
    `sampling` and `budgets` override the shared ones (a budget left unset: the platform's). `on_finished(index, trajectory)` is awaited as each episode ends, so a caller
    can report it while the rest of the batch goes on.
    """
    if max_tool_calls < 0:
        raise RolloutError(f"max_tool_calls must be >= 0, got {max_tool_calls}")
    shared = budgets or DEFAULT_BUDGETS
    started = time.monotonic()
    states = [_start(ep, system_prompt, max_tool_calls, sampling) for ep in episodes]
    for state in states:
        # A budget left unset is the platform's.
        state.budgets = (state.episode.budgets or shared).over(DEFAULT_BUDGETS)
        seconds = state.budgets.max_rollout_seconds
        state.deadline = None if seconds is None else started + seconds
    finished: list[Trajectory | None] = [None] * len(states)

    async def report() -> None:
        # Finish (and report) every episode that ended since the last turn, in order.
        for i, state in enumerate(states):
            if state.done and finished[i] is None:
                finished[i] = _finish(state)
                if on_finished is not None:
                    await on_finished(i, finished[i])

    while True:
        now = time.monotonic()
        for state in states:
            if not state.done and state.deadline is not None and now >= state.deadline:
                state.end("max_rollout_seconds")
        await report()
        live = [s for s in states if not s.done]
        if not live:
            break
        responses = await _generate(backend, [s.request() for s in live], live)
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
    return [t for t in finished if t is not None]


async def _generate(
    backend: ModelBackend, requests: list[ChatRequest], live: list[_State]
) -> list[ChatResponse]:
    deadlines = [s.deadline for s in live]
    if any(d is None for d in deadlines):
        return await backend.generate(requests)
    # Every live episode has a deadline: a backend that overruns the latest of them (a hung
    # endpoint) is abandoned, and each episode ends on its own deadline.
    timeout = max(deadlines) - time.monotonic() + DEADLINE_GRACE_S  # type: ignore[type-var]
    try:
        return await asyncio.wait_for(backend.generate(requests), timeout=max(timeout, 0.0))
    except TimeoutError:
        return [ChatResponse(finish_reason="deadline") for _ in requests]


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


def _text(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD (so it encodes as UTF-8)."""
    return _LONE_SURROGATE.sub("\ufffd", text) if _LONE_SURROGATE.search(text) else text


def _json_text(value: Any) -> Any:
    """A parsed JSON value with every string (keys too) passed through `_text`."""
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict):
        return {_text(k): _json_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_text(v) for v in value]
    return value


def _encodable(response: ChatResponse) -> ChatResponse:
    """The response with no lone surrogate in its text, names or arguments."""
    texts = [response.content or "", response.error or ""]
    texts += [f"{c.id}{c.name}{c.arguments}{c.error or ''}" for c in response.tool_calls]
    if not any(_LONE_SURROGATE.search(t) for t in texts):
        return response
    calls = [
        c.model_copy(
            update={
                "id": _text(c.id),
                "name": _text(c.name),
                "arguments": _text(c.arguments),
                "error": c.error and _text(c.error),
            }
        )
        for c in response.tool_calls
    ]
    content = response.content and _text(response.content)
    error = response.error and _text(response.error)
    return response.model_copy(update={"content": content, "tool_calls": calls, "error": error})


async def _apply(state: _State, response: ChatResponse) -> None:
    state.turn += 1
    response = _encodable(response)
    if response.finish_reason == "deadline":
        # The backend stopped this row at the rollout's deadline: what it wrote is kept.
        _record_turn(state, response)
        state.end("max_rollout_seconds")
        return
    if response.error is not None and response.rejected and state.turn > 1:
        # The model refused a request the episode's own turns made (the conversation outgrew
        # its context, or its chat template fails on what was written): the episode ends where
        # it got to and is judged, like at a budget. As an error it would leave pass rates and
        # GRPO's groups, so filling the context would be a way out of every failing verdict.
        state.finish_reason = "model_refused"
        state.end("model_refused")
        return
    if response.error is not None:
        # The backend gave up on this request (endpoint down, retries exhausted), or refused
        # the task's own first request: no verdict.
        state.error = response.error
        state.error_kind = "model"
        state.finish_reason = "error"
        state.done = True
        return
    _record_turn(state, response)
    if response.finish_reason == "length":
        # Out of tokens: the episode ends, and the call it was writing is not run. JSON that
        # parses is no proof the call was finished (an amount cut short is still a number);
        # calls before it were, since the model went on to write another.
        *finished, cut = response.tool_calls or [None]
        await _run_calls(state, finished)
        if cut is not None and state.done:  # a finished call ended the episode first
            state.messages.append(_tool_message(cut, None, "not run: the episode ended"))
        elif not state.done:
            state.finish_reason = "length"
            state.end(state.turn_limit)
            if cut is not None:
                _not_run(state, [cut], f"the turn ran out of tokens ({state.turn_limit})")
        return
    if not response.tool_calls:
        state.finish_reason, state.done = "stop", True
        return
    await _run_calls(state, response.tool_calls)
    rollout_tokens = state.budgets.max_rollout_tokens
    if not state.done and rollout_tokens is not None and state.tokens >= rollout_tokens:
        state.end("max_rollout_tokens")


async def _run_calls(state: _State, calls: list[ToolCall]) -> None:
    """Run a turn's calls in order, each answered, within the episode's call limits."""
    for call in calls:
        if state.finish_reason in ("error", "max_repeated_calls"):  # an earlier call ended it
            why = "the environment failed" if state.ended_by is None else "the episode ended"
            state.messages.append(_tool_message(call, None, f"not run: {why}"))
            continue
        if len(state.records) >= state.max_tool_calls:
            # Every call id still needs an answer for the conversation to stay well formed.
            state.messages.append(
                _tool_message(
                    call, None, f"tool call limit ({state.max_tool_calls}) reached; not run"
                )
            )
            state.finish_reason = "max_tool_calls"
            state.end("max_tool_calls")
            continue
        if repeated := _repeated(state, call):
            state.messages.append(_tool_message(call, None, f"not run: {repeated}"))
            continue
        arguments, result = await _execute(state, call)
        # A result nested past MAX_RESULT_DEPTH is kept cut there (the rest as a string): one
        # 2,000 deep made json.dumps raise here, and past about 255 the trajectory could not
        # be serialised, either of which failed the whole batch, not this call.
        output = bounded(result.output, MAX_RESULT_DEPTH)
        state.records.append(
            ToolCallRecord(
                index=len(state.records),
                name=call.name or "<malformed>",
                arguments=arguments,
                result=output if result.ok else None,
                error=result.error,
            )
        )
        state.messages.append(_tool_message(call, output, result.error))


def _not_run(state: _State, calls: list[ToolCall], why: str) -> None:
    """Record `calls` as tool errors, none run, each id answered (the conversation stays well
    formed); as errors, a call cut short never scores better than a malformed one."""
    for call in calls:
        error = f"not run: {why} while writing this call"
        state.records.append(
            ToolCallRecord(
                index=len(state.records), name=call.name or "<malformed>", arguments={},
                error=error,
            )
        )  # fmt: skip
        state.messages.append(_tool_message(call, None, error))


def _record_turn(state: _State, response: ChatResponse) -> None:
    if response.token_ids is not None and response.logprobs is not None:
        state.token_ids.append(list(response.token_ids))
        state.logprobs.append(list(response.logprobs))
    else:
        state.has_tokens = False
    state.weights.append(response.weights_sha256)
    state.tokens += _completion_tokens(response)
    state.messages.append(response.assistant_message())
    state.final_output = response.content


def _completion_tokens(response: ChatResponse) -> int:
    if response.usage is not None and response.usage.completion_tokens:
        return response.usage.completion_tokens
    if response.token_ids is not None:
        return len(response.token_ids)
    # A backend that reports no tokens: about four characters a token.
    text = (response.content or "") + "".join(c.arguments + c.name for c in response.tool_calls)
    return (len(text) + 3) // 4


def _repeated(state: _State, call: ToolCall) -> str | None:
    """Why `call` is not run when it repeats one time too many (the episode then ends)."""
    key = (call.name, _canonical(call.arguments))
    state.repeats = state.repeats + 1 if key == state.last_call else 1
    state.last_call = key
    limit = state.budgets.max_repeated_calls
    if not limit or state.repeats < limit:
        return None
    # Like every other budget, the episode is judged on what it did: a policy that loops has
    # not done its task and fails. Ending it as an error would take it out of pass rates and
    # GRPO's groups, so looping would be a way out of every failure the verifier would give.
    state.finish_reason = "max_repeated_calls"
    state.end("max_repeated_calls")
    return (
        f"repeated call: {call.name}({_clip(call.arguments.strip(), 200)}) {limit} times in a "
        f"row (max_repeated_calls {limit}); the last one was not run"
    )


def _canonical(arguments: str) -> str:
    # {"a": 1, "b": 2} and {"b":2,"a":1} are the same call.
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except (ValueError, RecursionError):
        return arguments.strip()


async def _execute(state: _State, call: ToolCall) -> tuple[dict[str, Any], ToolResult]:
    if call.error is not None:
        return {}, ToolResult(error=call.error)
    if call.name not in state.tool_names:
        available = ", ".join(state.tool_names) or "(none)"
        return {}, ToolResult(error=f"unknown tool '{call.name}'; available tools: {available}")
    raw = call.arguments.strip()
    try:
        arguments = (
            json.loads(raw, parse_constant=_not_a_number, parse_float=_finite) if raw else {}
        )
    except json.JSONDecodeError as exc:
        return {}, ToolResult(
            error=f"invalid JSON arguments for '{call.name}': {exc.msg} at char {exc.pos} "
            f"in {_clip(raw, 200)!r}"
        )
    except (ValueError, RecursionError) as exc:  # valid JSON Python will not read: an integer
        # of 4,301+ digits, arrays nested past the interpreter's recursion limit; NaN and
        # infinities (not JSON)
        return {}, ToolResult(
            error=f"invalid JSON arguments for '{call.name}': {_clip(str(exc), 200)} "
            f"in {_clip(raw, 200)!r}"
        )
    if _nested_past(arguments, MAX_ARGUMENT_DEPTH, raw):
        return {}, ToolResult(
            error=f"arguments for '{call.name}' are nested more than {MAX_ARGUMENT_DEPTH} deep"
        )
    if "\\u" in raw:  # a `\\ud800` escape decodes to a lone surrogate
        arguments = _json_text(arguments)
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


def _not_a_number(token: str) -> float:
    # NaN, Infinity and -Infinity, which Python's json reads but JSON has not: in a tool's
    # state they passed every `amount > balance` check, and a trajectory holding one could
    # not be exported (a snapshot row refuses non-finite numbers).
    raise ValueError(f"{token} is not a JSON number")


def _finite(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):  # 1e999
        raise ValueError(f"{token[:40]} is too large for a number")
    return value


def _nested_past(value: Any, limit: int, raw: str) -> bool:
    """Whether the parsed `value` (of the text `raw`) nests lists and objects past `limit`."""
    if raw.count("[") + raw.count("{") <= limit:  # too few brackets to go that deep
        return False
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in item)
    return False


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
        # Cut as tool results are: the env's state can hold what the model's calls built.
        final_state = bounded(state.episode.runtime.final_state(), MAX_RESULT_DEPTH)
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
        weights_sha256=rollout_digest(state.weights),
        ended_by=state.ended_by,
        turns=state.turn,
        completion_tokens=state.tokens,
    )
