"""ASGI middleware that gives an inference server the proof of weight version.

For `vllm serve` (and any ASGI server that takes middleware by import path)::

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve BASE --enable-lora \\
        --middleware rollout.shared.models.server_proof.WeightsProof

On `POST .../load_lora_adapter` it takes the digest of the files at `lora_path`
(`weights_proof.weights_digest`), refuses the load (409) when the request's
`rollout_weights_sha256` names another digest (a half-synced shared folder, the wrong
files), strips that field before the server sees the body, and remembers the adapter
name's digest once the server answered 2xx; `unload_lora_adapter` forgets it. Every
completion answer for a remembered name carries the `x-rollout-weights-sha256` header.
It runs in the API server process: with several API server processes each must see the
loads (run one, or route loads and completions for a name to the same process).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from rollout.shared.errors import RolloutError
from rollout.shared.models.weights_proof import HEADER, LOAD_FIELD, is_sha256, weights_digest

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_COMPLETIONS = ("/completions", "/chat/completions")
# Adapter-management bodies are tiny; a completion body may be large but is only parsed for
# its `model` field.
_MAX_BODY = 64 * 1024 * 1024


class WeightsProof:
    """Remembers the digest of each loaded adapter and stamps it on that adapter's answers."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.digests: dict[str, str] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route adapter loads, unloads and completions through the proof; pass the rest."""
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", "")).rstrip("/")
        if path.endswith("/load_lora_adapter"):
            handler = self._load
        elif path.endswith("/unload_lora_adapter"):
            handler = self._unload
        elif path.endswith(_COMPLETIONS):
            handler = self._complete
        else:
            await self.app(scope, receive, send)
            return
        body = await _read(receive)
        if body is None:
            await _error(send, 413, f"request body over {_MAX_BODY} bytes")
            return
        await handler(scope, body, receive, send)

    async def _load(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        data = _json_object(body)
        if data is None:
            await self.app(scope, _replay(body, receive), send)
            return
        name, path = data.get("lora_name"), data.get("lora_path")
        expected = data.pop(LOAD_FIELD, None)
        body = _dumps(data)
        scope = _with_length(scope, body)
        if not isinstance(name, str) or not isinstance(path, str):
            await self.app(scope, _replay(body, receive), send)
            return
        if expected is not None and not is_sha256(expected):
            await _error(send, 400, f"{LOAD_FIELD} must be a sha256 hex digest")
            return
        try:
            digest = await asyncio.to_thread(weights_digest, path)
        except RolloutError as exc:
            await _error(send, 404, f"cannot load adapter {name!r}: {exc}")
            return
        if expected is not None and digest != expected:
            await _error(
                send,
                409,
                f"adapter {name!r} at {path}: its weights have sha256 {digest}, not the "
                f"{expected} the load asked for (files not yet copied, or the wrong folder)",
            )
            return

        def accepted() -> None:
            # Known before the answer leaves: a completion right after it carries the proof.
            self.digests[name] = digest

        await self._forward(scope, _replay(body, receive), send, digest, on_success=accepted)

    async def _unload(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        data = _json_object(body) or {}
        name = data.get("lora_name")

        def removed() -> None:
            if isinstance(name, str):
                self.digests.pop(name, None)

        await self._forward(scope, _replay(body, receive), send, None, on_success=removed)

    async def _complete(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        data = _json_object(body) or {}
        model = data.get("model")
        digest = self.digests.get(model) if isinstance(model, str) else None
        await self._forward(scope, _replay(body, receive), send, digest)

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        digest: str | None,
        on_success: Callable[[], None] | None = None,
    ) -> None:
        """Run the app; add the digest header to its answer; `on_success` on a 2xx status."""

        async def stamped(message: Message) -> None:
            if message.get("type") == "http.response.start":
                if on_success is not None and 200 <= int(message.get("status", 0)) < 300:
                    on_success()
                if digest is not None:
                    headers = [
                        (k, v)
                        for k, v in message.get("headers", [])
                        if k.lower() != HEADER.encode()
                    ]
                    headers.append((HEADER.encode(), digest.encode()))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, stamped)


async def _read(receive: Receive) -> bytes | None:
    """The whole request body (None when it is over _MAX_BODY)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message.get("type") != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > _MAX_BODY:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the (already read) body once, then the client's own
    messages: a disconnect still reaches the server, which then stops generating."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _with_length(scope: Scope, body: bytes) -> Scope:
    # The body may have lost a field: its declared length must follow.
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
    return {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _dumps(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode()


async def _error(send: Send, status: int, message: str) -> None:
    body = _dumps({"error": {"message": message, "type": "invalid_request_error"}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = ["WeightsProof"]
