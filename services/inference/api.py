"""The OpenAI chat-completions wire format: request validation and response/stream bodies.

Requests are validated into `CompletionBody` (unknown fields are accepted and ignored, as
OpenAI clients send options this server has no use for); every refusal is an `ApiError` with
OpenAI's error shape, naming the offending parameter. Responses are built from the backends'
`ChatResponse`, so whatever a backend parsed (tool calls from Hermes tags or bare JSON, token
ids, logprobs) reaches the client in OpenAI's fields.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from rollout.services.inference.defaults import DEFAULT_MAX_N as DEFAULT_MAX_N
from rollout.services.inference.defaults import DEFAULT_MAX_TOKENS_LIMIT as DEFAULT_MAX_TOKENS_LIMIT
from rollout.shared.aggregates.run_options import SEED_RANGE
from rollout.shared.models.base import ChatRequest, ChatResponse, ToolCall
from rollout.shared.models.hermes import OPEN_TAG

_ROLES = ("system", "developer", "user", "assistant", "tool")
# What the backends report, mapped onto the reasons OpenAI clients know.
_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}


@dataclass
class ApiError(Exception):
    """A refused request: HTTP status and OpenAI's error object."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI returns for an error."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class Function(BaseModel):
    """A tool's function: name, description and JSON Schema parameters."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    """One tool the model may call (only `function` tools exist)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: Function


class Message(BaseModel):
    """One chat message; content parts are joined into text (the backends take text)."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, value: str) -> str:
        if value not in _ROLES:
            raise ValueError(f"unknown role {value!r}; expected one of {', '.join(_ROLES)}")
        return value

    @field_validator("content")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        if isinstance(value, list):
            texts = []
            for part in value:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError("only text content parts are supported")
                texts.append(part["text"])
            value = "".join(texts)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                # JSON's \ud83d alone: a string cut between the halves of a character.
                raise ValueError(
                    f"holds {exc.object[exc.start]!r} at character {exc.start}, half of a "
                    "UTF-16 surrogate pair, which is not text (a string cut mid-character?)"
                ) from None
        return value


class StreamOptions(BaseModel):
    """`stream_options`: whether the last chunk carries the usage."""

    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class CompletionBody(BaseModel):
    """A `/v1/chat/completions` request, within this server's limits."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    # OpenAI's API takes null for these as "the default" (some clients send every field).
    n: int = Field(default=1, ge=1)
    # A 64-bit integer, as OpenAI's: a larger one fails the sampler's generator, and with it
    # every other client's request sampled in the same batch.
    seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    # vLLM's option: each logprob's token is written `token_id:<id>` (what our actors read).
    return_tokens_as_token_ids: bool = False

    @field_validator("n", "stream", "logprobs", "return_tokens_as_token_ids", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        return cls.model_fields[info.field_name].default if value is None else value


def parse_body(raw: bytes, *, max_n: int, max_tokens_limit: int) -> CompletionBody:
    """Validate a request body, or raise ApiError naming the first bad parameter."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        body = CompletionBody.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        more = exc.error_count() - 1
        extra = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise ApiError(400, f"{param}: {first['msg']}{extra}", param=param) from None
    if body.n > max_n:
        raise ApiError(400, f"n: at most {max_n} choices per request, got {body.n}", param="n")
    for name in ("max_tokens", "max_completion_tokens"):
        value = getattr(body, name)
        if value is not None and value > max_tokens_limit:
            raise ApiError(
                400, f"{name}: at most {max_tokens_limit} on this server, got {value}", param=name
            )
    if body.top_logprobs:
        raise ApiError(
            400,
            "top_logprobs: only the sampled tokens' logprobs are available (use 0 or omit it)",
            param="top_logprobs",
        )
    if body.stop is not None and not isinstance(body.stop, str) and len(body.stop) > 4:
        raise ApiError(400, "stop: at most 4 sequences", param="stop")
    return body


def chat_requests(body: CompletionBody) -> list[ChatRequest]:
    """One backend request per choice (`n`); seeded choices get distinct seeds."""
    messages = []
    for m in body.messages:
        message = m.model_dump(exclude_none=True)
        if message["role"] == "developer":  # chat templates know only `system`
            message["role"] = "system"
        message.setdefault("content", None if message["role"] == "assistant" else "")
        messages.append(message)
    tools = None
    if body.tools and body.tool_choice != "none":
        tools = [t.model_dump(exclude_none=True) for t in body.tools]
    limit = body.max_completion_tokens or body.max_tokens
    return [
        ChatRequest(
            messages=messages,
            tools=tools,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            max_tokens=limit,
            seed=None if body.seed is None else _wrapped(body.seed + i),
        )
        for i in range(body.n)
    ]


def _wrapped(seed: int) -> int:
    """SEED in the 64-bit range (a choice's `seed + i` past its top wraps to its bottom)."""
    low, high = SEED_RANGE
    return (seed - low) % (high - low + 1) + low


def completion_id() -> str:
    """A fresh `chatcmpl-...` id."""
    return f"chatcmpl-{uuid.uuid4().hex}"


@dataclass
class Choice:
    """One finished choice, in OpenAI's terms."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    logprobs: dict[str, Any] | None


def _stopped(text: str | None, stop: str | list[str] | None) -> tuple[str | None, bool]:
    if text is None or not stop:
        return text, False
    cut = [i for s in ([stop] if isinstance(stop, str) else stop) if s and (i := text.find(s)) >= 0]
    return (text[: min(cut)], True) if cut else (text, False)


def _wire_calls(calls: list[ToolCall]) -> tuple[list[dict[str, Any]], str]:
    # A call the backend could not read and could not even name is text the model wrote,
    # not a call: it goes back as content rather than as a tool call without a name.
    wire, leftover = [], []
    for call in calls:
        if not call.name:
            leftover.append(call.arguments)
            continue
        wire.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments or "{}"},
            }
        )
    return wire, "\n".join(leftover)


def _logprobs(response: ChatResponse, tokenizer: Any | None, as_ids: bool) -> dict[str, Any] | None:
    if response.logprobs is None:
        return None
    ids = response.token_ids or []
    content = []
    for i, logprob in enumerate(response.logprobs):
        token_id = ids[i] if i < len(ids) else None
        if as_ids and token_id is not None:
            token = f"token_id:{token_id}"
        elif tokenizer is not None and token_id is not None:
            token = tokenizer.decode([token_id])
        else:
            token = ""
        content.append({"token": token, "logprob": logprob, "bytes": None, "top_logprobs": []})
    return {"content": content}


def offers_tools(body: CompletionBody) -> bool:
    """Whether the request lets the model call a tool."""
    return bool(body.tools) and body.tool_choice != "none"


def _reply_text(response: ChatResponse, tokenizer: Any | None) -> str | None:
    """The whole reply as text, what the backend read as tool calls included."""
    if tokenizer is not None and response.token_ids:
        return tokenizer.decode(response.token_ids, skip_special_tokens=True).strip() or None
    parts = [response.content or ""]
    for call in response.tool_calls:
        if not call.name:
            parts.append(call.arguments)
            continue
        try:
            arguments: Any = json.loads(call.arguments or "{}")
        except ValueError:
            arguments = call.arguments
        parts.append(json.dumps({"name": call.name, "arguments": arguments}))
    return "\n".join(p for p in parts if p) or None


def choice_of(response: ChatResponse, body: CompletionBody, tokenizer: Any | None) -> Choice:
    """The OpenAI choice for one backend response (stop sequences applied)."""
    if response.tool_calls and not offers_tools(body):
        # No tool was offered (or tool_choice is "none"): OpenAI then never answers with a
        # call, and a client would find `content: null`. What the backend read as a call
        # (a JSON reply `{"name": ..., "arguments": ...}`) is the model's text.
        response = response.model_copy(
            update={"content": _reply_text(response, tokenizer), "tool_calls": []}
        )
    calls, leftover = _wire_calls(response.tool_calls)
    content = response.content
    if leftover:
        content = f"{content}\n{leftover}" if content else leftover
    content, stopped = _stopped(content, body.stop)
    reason = _FINISH.get(response.finish_reason, "stop")
    if stopped:
        reason = "stop"
    if calls:
        reason = "tool_calls"
    elif reason == "tool_calls":
        reason = "stop"
    logprobs = (
        _logprobs(response, tokenizer, body.return_tokens_as_token_ids) if body.logprobs else None
    )
    return Choice(content, calls, reason, logprobs)


def usage_of(responses: list[ChatResponse]) -> dict[str, int]:
    """Summed token counts (the prompt counted once, as OpenAI does for `n` > 1)."""
    prompt = max((r.usage.prompt_tokens for r in responses if r.usage), default=0)
    completion = sum(r.usage.completion_tokens for r in responses if r.usage)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion_body(
    cid: str, model: str, fingerprint: str | None, choices: list[Choice], usage: dict[str, int]
) -> dict[str, Any]:
    """The JSON body of a non-streamed chat completion."""
    out = []
    for i, choice in enumerate(choices):
        message: dict[str, Any] = {"role": "assistant", "content": choice.content}
        if choice.tool_calls:
            message["tool_calls"] = choice.tool_calls
        out.append(
            {
                "index": i,
                "message": message,
                "logprobs": choice.logprobs,
                "finish_reason": choice.finish_reason,
            }
        )
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": out,
        "usage": usage,
    }


def stream_chunks(
    cid: str,
    model: str,
    fingerprint: str | None,
    choices: list[Choice],
    usage: dict[str, int] | None,
) -> Iterator[dict[str, Any]]:
    """The `chat.completion.chunk` objects of a streamed completion, in order."""
    created = int(time.time())

    def chunk(index: int, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint,
            "choices": [{"index": index, "delta": delta, "logprobs": None, **extra}],
        }

    for i, choice in enumerate(choices):
        yield chunk(i, {"role": "assistant", "content": ""}, finish_reason=None)
        if choice.content:
            piece = chunk(i, {"content": choice.content}, finish_reason=None)
            piece["choices"][0]["logprobs"] = choice.logprobs
            yield piece
        for k, call in enumerate(choice.tool_calls):
            # The whole call in one delta: its index says which call later deltas would extend.
            yield chunk(i, {"tool_calls": [{"index": k, **call}]}, finish_reason=None)
        yield chunk(i, {}, finish_reason=choice.finish_reason)
    if usage is not None:
        yield {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint,
            "choices": [],
            "usage": usage,
        }


def chunk_of(
    cid: str,
    model: str,
    fingerprint: str | None,
    created: int,
    index: int,
    delta: dict[str, Any],
    *,
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One `chat.completion.chunk` for choice `index`."""
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [
            {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        ],
    }


def final_chunks(
    cid: str,
    model: str,
    fingerprint: str | None,
    created: int,
    index: int,
    choice: Choice,
    rest: str,
) -> Iterator[dict[str, Any]]:
    """How a token-streamed choice ends: the rest of its text, its tool calls, its reason."""
    if rest:
        yield chunk_of(cid, model, fingerprint, created, index, {"content": rest})
    for k, call in enumerate(choice.tool_calls):
        yield chunk_of(
            cid, model, fingerprint, created, index, {"tool_calls": [{"index": k, **call}]}
        )
    yield chunk_of(
        cid, model, fingerprint, created, index, {},
        finish_reason=choice.finish_reason, logprobs=choice.logprobs,
    )  # fmt: skip


# A character split over more tokens than this is let out as it decodes (\ufffd and all).
_MAX_SPLIT_TOKENS = 8


class TextStream:
    """One choice's text as its tokens come: only what the finished content will begin with.

    The finished content is the decoded text with tool-call blocks cut out, stripped, and cut
    at a stop sequence; so text is held back while it may still turn out to be a tool call
    (from `<tool_call>` on, or a reply that opens as bare JSON), trailing whitespace, a
    partial stop sequence, or half a UTF-8 character.
    """

    def __init__(self, tokenizer: Any, stop: str | list[str] | None) -> None:
        self.tokenizer = tokenizer
        self.stops = [s for s in ([stop] if isinstance(stop, str) else stop or []) if s]
        self.ids: list[int] = []
        self.sent = ""
        # The decoded text of ids[:_read]; each token decodes only the window ids[_prefix:]
        # (as transformers' TextStreamer and vLLM do), so the work per token stays bounded.
        self.text = ""
        self._prefix = 0
        self._read = 0
        # Set once nothing more can become visible (a tool call or a stop sequence began).
        self._final = False

    def _decode_new(self) -> None:
        """Extend `text` by what the tokens since `_read` add (none while a character is split)."""
        decode = self.tokenizer.decode
        # Decoded with the token before them, so word-initial spaces come out as in a full decode.
        before = decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        window = decode(self.ids[self._prefix :], skip_special_tokens=True)
        pending = len(self.ids) - self._read
        if window.endswith("\ufffd") and pending < _MAX_SPLIT_TOKENS:
            return  # half a UTF-8 character: wait for the rest of it
        self.text += window[len(before) :]
        self._prefix, self._read = self._read, len(self.ids)

    def _visible(self) -> str:
        self._decode_new()
        text = self.text.lstrip()
        if text.startswith(("{", "[")):
            self._final = True
            return ""  # maybe a bare JSON tool call: told at the end
        text, tag, _ = text.partition(OPEN_TAG)
        text, stopped = _stopped(text, self.stops or None)
        if tag or stopped:
            # Nothing after a tool call's tag or a stop sequence is ever shown: stop decoding.
            self._final = True
        if not stopped:
            for k in range(len(OPEN_TAG) - 1, 0, -1):
                if text.endswith(OPEN_TAG[:k]):
                    text = text[:-k]
                    break
            hold = max((len(s) for s in self.stops), default=1) - 1
            text = text[: len(text) - hold] if hold else text
        return text.rstrip("\ufffd").rstrip()

    def add(self, token_id: int) -> str:
        """The text this token lets out (often "")."""
        self.ids.append(token_id)
        if self._final:
            return ""
        visible = self._visible()
        if len(visible) <= len(self.sent) or not visible.startswith(self.sent):
            return ""
        delta, self.sent = visible[len(self.sent) :], visible
        return delta

    def rest(self, content: str | None) -> str:
        """What of the finished content has not been sent yet."""
        content = content or ""
        if not content.startswith(self.sent):
            return ""  # cannot be unsaid; the rules above keep this from happening
        return content[len(self.sent) :]
