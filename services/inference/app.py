"""The OpenAI-compatible ASGI app: `/v1/models`, `/v1/chat/completions` (tools, streaming).

Every path but `/health` needs `Authorization: Bearer <key>` when keys are configured (the
CLI insists on keys for any non-loopback address). Every refusal is OpenAI's JSON error
object with a 4xx status; an unexpected fault is a 500 with a one-line message, never a
traceback.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rollout.services.inference import api
from rollout.services.inference.policy import ServedPolicy
from rollout.shared.errors import RolloutError
from rollout.shared.models.base import ChatResponse
from rollout.shared.observability import get_logger

log = get_logger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
PUBLIC_PATHS = ("/health",)
# Backend errors that are the request's fault (the rest are the server's).
_REQUEST_FAULTS = (("does not fit the model's context", "context_length_exceeded"),
                   ("chat template failed", "invalid_messages"),
                   ("cannot tokenize the prompt", "invalid_messages"))  # fmt: skip


class KeyRing:
    """The API keys a server accepts; checks take the same time whichever key (if any) matches."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys if k]
        if not self._digests:
            raise RolloutError("no API key given (an empty key accepts nothing)")

    def __len__(self) -> int:
        return len(self._digests)

    def allows(self, presented: str) -> bool:
        """True when `presented` is one of the keys (compared in constant time)."""
        digest = hashlib.sha256(presented.encode()).digest()
        found = False
        for known in self._digests:
            # Every key is compared: the time does not tell which one matched.
            found |= hmac.compare_digest(digest, known)
        return found


@dataclass
class ServeConfig:
    """What the app serves and its limits."""

    model: str
    aliases: tuple[str, ...] = ()
    keys: KeyRing | None = None
    max_n: int = api.DEFAULT_MAX_N
    max_tokens_limit: int = api.DEFAULT_MAX_TOKENS_LIMIT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    started: int = field(default_factory=lambda: int(time.time()))

    @property
    def ids(self) -> tuple[str, ...]:
        """Every model id a request may name."""
        return (self.model, *(a for a in self.aliases if a != self.model))


def error_response(error: api.ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    """OpenAI's error JSON with its status."""
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


class BearerAuth:
    """ASGI middleware: refuse requests without a configured key (401, OpenAI-shaped)."""

    def __init__(self, app: ASGIApp, keys: KeyRing | None) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass authorised requests on; answer the others with 401."""
        if scope["type"] != "http" or self.keys is None or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() == "bearer" and presented.strip() and self.keys.allows(presented.strip()):
            await self.app(scope, receive, send)
            return
        message = (
            "Incorrect API key provided."
            if header
            else "Missing API key: send 'Authorization: Bearer <key>'."
        )
        error = api.ApiError(401, message, code="invalid_api_key")
        response = error_response(error, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise api.ApiError(413, f"request body over {limit} bytes", code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise api.ApiError(413, f"request body over {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def _refuse_failures(responses: list[ChatResponse]) -> None:
    for response in responses:
        if response.finish_reason != "error" and response.error is None:
            continue
        message = response.error or "the model failed to generate"
        for marker, code in _REQUEST_FAULTS:
            if marker in message:
                raise api.ApiError(400, message, param="messages", code=code)
        raise api.ApiError(500, message, type="server_error")


def _sse(document: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(document)}\n\n".encode()


class _Listener:
    """Hands one streamed request's tokens from the generation thread to the event loop."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[tuple[int, int]], index: int
    ) -> None:
        self.loop = loop
        self.queue = queue
        self.index = index
        # Read by the generation thread at every step (a plain bool: no lock needed).
        self.cancelled = False

    def on_token(self, token_id: int) -> None:
        """Called in the generation thread: queue the token on the loop."""
        if not self.cancelled:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (self.index, token_id))


def create_app(policy: ServedPolicy, config: ServeConfig) -> Starlette:
    """The API over `policy` (which the caller starts and closes)."""

    def model_card(model_id: str) -> dict[str, Any]:
        return {
            "id": model_id,
            "object": "model",
            "created": config.started,
            "owned_by": "rollout",
            "root": policy.lineage or config.model,
            "policy_version": policy.version,
        }

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def list_models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card(m) for m in config.ids]})

    async def get_model(request: Request) -> Response:
        model_id = request.path_params["model"]
        if model_id not in config.ids:
            raise _unknown_model(model_id)
        return JSONResponse(model_card(model_id))

    def _unknown_model(model_id: str) -> api.ApiError:
        served = ", ".join(repr(m) for m in config.ids)
        return api.ApiError(
            404,
            f"The model {model_id!r} does not exist on this server; it serves {served}.",
            param="model",
            code="model_not_found",
        )

    async def chat_completions(request: Request) -> Response:
        raw = await _read_body(request, config.max_body_bytes)
        body = api.parse_body(raw, max_n=config.max_n, max_tokens_limit=config.max_tokens_limit)
        if body.model not in config.ids:
            raise _unknown_model(body.model)
        requests = api.chat_requests(body)
        slot = policy.current()
        if body.stream and slot.streams:
            return await _token_stream(body, requests, slot)
        responses, slot = await policy.generate(requests)
        _refuse_failures(responses)
        tokenizer = getattr(slot.backend, "tokenizer", None)
        choices = [api.choice_of(r, body, tokenizer) for r in responses]
        fingerprint = f"policy-v{slot.version}" if slot.version is not None else None
        headers = {"x-rollout-policy-version": str(slot.version)} if slot.version else {}
        usage = api.usage_of(responses)
        cid = api.completion_id()
        if not body.stream:
            document = api.completion_body(cid, body.model, fingerprint, choices, usage)
            return JSONResponse(document, headers=headers)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = api.stream_chunks(
            cid, body.model, fingerprint, choices, usage if include_usage else None
        )

        async def events() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield _sse(chunk)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache"},
        )

    async def _token_stream(body: api.CompletionBody, requests: list[Any], slot: Any) -> Response:
        """Stream each choice's text as its tokens are sampled; calls and reason at the end."""
        loop = asyncio.get_running_loop()
        heard: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
        listeners = [_Listener(loop, heard, i) for i in range(len(requests))]
        # Queued now, with no await since `slot` was read: a switch cannot retire it in between.
        generation = slot.enqueue(requests, listeners)
        # Wait for the first token (or the end): a request that cannot run is still a 4xx.
        first = asyncio.ensure_future(heard.get())
        await asyncio.wait({generation, first}, return_when=asyncio.FIRST_COMPLETED)
        early: list[tuple[int, int]] = []
        if first.done():
            early.append(first.result())
        else:
            first.cancel()
        if generation.done() and not early:
            _refuse_failures(generation.result())
        tokenizer = slot.backend.tokenizer
        fingerprint = f"policy-v{slot.version}" if slot.version is not None else None
        headers = {"x-rollout-policy-version": str(slot.version)} if slot.version else {}
        cid, created = api.completion_id(), int(time.time())
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        texts = [api.TextStream(tokenizer, body.stop) for _ in requests]

        def chunk(index: int, delta: dict[str, Any]) -> bytes:
            return _sse(api.chunk_of(cid, body.model, fingerprint, created, index, delta))

        async def next_token() -> tuple[int, int] | None:
            """The next (choice, token) heard; None once generation ended and all are read."""
            # Tokens reach the loop before the generation's end does (both FIFO callbacks).
            while True:
                if early:
                    return early.pop()
                if not heard.empty():
                    return heard.get_nowait()
                if generation.done():
                    return None
                waiter = asyncio.ensure_future(heard.get())
                await asyncio.wait({generation, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if waiter.done():
                    return waiter.result()
                waiter.cancel()

        async def events() -> AsyncIterator[bytes]:
            try:
                for i in range(len(requests)):
                    yield chunk(i, {"role": "assistant", "content": ""})
                while (heard_one := await next_token()) is not None:
                    index, token = heard_one
                    delta = texts[index].add(token)
                    if delta:
                        yield chunk(index, {"content": delta})
                responses = generation.result()
                failed = [r for r in responses if r.finish_reason == "error" or r.error]
                if failed:
                    # Too late for a status: say it in the stream, as OpenAI does mid-stream.
                    message = failed[0].error or "the model failed to generate"
                    log.error("stream failed", error=message)
                    yield _sse({"error": {"message": message, "type": "server_error"}})
                    return
                for i, response in enumerate(responses):
                    choice = api.choice_of(response, body, tokenizer)
                    rest = texts[i].rest(choice.content)
                    for piece in api.final_chunks(
                        cid, body.model, fingerprint, created, i, choice, rest
                    ):
                        yield _sse(piece)
                if include_usage:
                    usage = {
                        "id": cid, "object": "chat.completion.chunk", "created": created,
                        "model": body.model, "system_fingerprint": fingerprint, "choices": [],
                        "usage": api.usage_of(responses),
                    }  # fmt: skip
                    yield _sse(usage)
                yield b"data: [DONE]\n\n"
            finally:
                if not generation.done():
                    # The client went away: its requests stop at the backend's next step.
                    for listener in listeners:
                        listener.cancelled = True
                    generation.cancel()

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache"},
        )

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, api.ApiError)
        if exc.status >= 500:
            log.error("request failed", path=request.url.path, error=exc.message)
        return error_response(exc)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            message = f"Unknown path {request.url.path}; this server answers /v1/models and /v1/chat/completions."
        else:
            message = f"{request.method} {request.url.path}: {exc.detail}"
        return error_response(api.ApiError(exc.status_code, message), headers=exc.headers)

    async def on_fault(request: Request, exc: Exception) -> Response:
        # A fault of ours: logged with its stack here, reported to the client in one line.
        log.error("request crashed", path=request.url.path, error=repr(exc), exc_info=exc)
        reason = str(exc) if isinstance(exc, RolloutError) else type(exc).__name__
        return error_response(api.ApiError(500, f"server error: {reason}", type="server_error"))

    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", get_model, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ],
        exception_handlers={
            api.ApiError: on_api_error,
            HTTPException: on_http_error,
            Exception: on_fault,
        },
    )
    app.add_middleware(BearerAuth, keys=config.keys)
    app.state.policy = policy
    app.state.config = config
    return app
