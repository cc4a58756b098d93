"""The one batch interface every model backend implements, and its request/response shapes."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field


class ToolCall(BaseModel):
    """One tool call the model asked for; `arguments` is the raw JSON text the model wrote."""

    id: str
    name: str
    arguments: str = ""
    # Set when the model's call could not be parsed (bad JSON, no name): the agent loop
    # records it as a tool error and shows it to the model instead of crashing.
    error: str | None = None


class Usage(BaseModel):
    """Token counts for one generation."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ChatRequest(BaseModel):
    """One chat completion request: OpenAI-shaped messages and tools plus sampling params."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    seed: int | None = None
    # When the rollout's wall budget runs out (time.monotonic() of this process): a backend
    # that can stops the request there, finish reason "deadline". Never sent anywhere.
    deadline: float | None = Field(None, exclude=True)


class ChatResponse(BaseModel):
    """What the model produced for one request."""

    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    # Ids and logprobs of the sampled completion tokens, when the backend can give them.
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"
    usage: Usage | None = None
    # A per-request failure (retries exhausted, request rejected): the episode ends with it
    # while the rest of the batch goes on. Configuration errors raise RolloutError instead.
    error: str | None = None
    # With `error`: the endpoint refused this request itself (too long for the model's context,
    # a chat template that fails on it, content filtered, ...), so sending it again will not
    # help; false when it failed on the way (unreachable, 5xx, retries exhausted). A judge
    # tells a sample it cannot read from a judge that is down; the agent loop judges an
    # episode whose own later turns made its request one the model refuses.
    rejected: bool = False
    # The sha256 of the weights that generated it, when the backend can prove it
    # (weights_proof.py): a trained policy in process, or a server that reports it.
    weights_sha256: str | None = None

    def assistant_message(self) -> dict[str, Any]:
        """The OpenAI-shaped assistant message to append to the conversation."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in self.tool_calls
            ]
        return message


@runtime_checkable
class ModelBackend(Protocol):
    """Generates chat completions for a batch of requests, in order."""

    name: str

    async def generate(self, requests: list[ChatRequest]) -> list[ChatResponse]:
        """Return one response per request, in the same order."""
        ...


async def close_backend(backend: ModelBackend) -> None:
    """Release a backend's connections or weights if it holds any (the method is optional)."""
    aclose = getattr(backend, "aclose", None)
    if aclose is not None:
        await aclose()


async def backend_problem(backend: ModelBackend) -> str | None:
    """Why `backend` cannot generate now (its endpoint unreachable, its key refused), found
    without generating; None when it can, or when it has no such check (the method is
    optional: a local model that loaded is ready)."""
    check = getattr(backend, "check", None)
    return await check() if check is not None else None
