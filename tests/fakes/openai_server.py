"""A real local HTTP server speaking OpenAI chat completions, driven by a script.

Only remote model APIs are faked in this project, and they are faked here: over real HTTP,
so the client's request building, retries, timeouts and parsing are all exercised.

    with FakeOpenAI([tool_reply(("lookup_order", {"order_id": "O-1"})), text_reply("done")]) as s:
        backend = OpenAICompatBackend("gpt-test", s.base_url)

A script is a list of replies served in arrival order, or a function of the request body
returning a reply (use `by_conversation` to script several concurrent episodes). A reply is a
`Reply` (status, JSON body, headers, server-side delay) or a plain dict (a 200 body).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

_ids = itertools.count(1)


@dataclass
class Reply:
    """One scripted HTTP answer."""

    body: Any = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    # Seconds the server waits before answering: to trip the client's timeout.
    delay: float = 0.0
    # Seconds between the body's bytes, after the headers went at once (a dripping server).
    drip: float = 0.0


@dataclass
class RecordedRequest:
    """A request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


Script = Sequence[Reply | dict[str, Any]] | Callable[[dict[str, Any]], Reply | dict[str, Any]]


def completion(
    content: str | None = None,
    tool_calls: Sequence[dict[str, Any]] = (),
    *,
    finish_reason: str | None = None,
    logprobs: Sequence[tuple[str, float]] | None = None,
    model: str = "fake-model",
) -> dict[str, Any]:
    """A chat.completion body."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = list(tool_calls)
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
    }
    if logprobs is not None:
        choice["logprobs"] = {
            "content": [{"token": t, "logprob": lp, "top_logprobs": []} for t, lp in logprobs]
        }
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def text_reply(content: str, **kwargs: Any) -> Reply:
    """A final answer with no tool call."""
    return Reply(completion(content, **kwargs))


def tool_reply(*calls: tuple[str, Any], content: str | None = None) -> Reply:
    """Tool calls `(name, arguments)`; dict arguments are JSON-encoded, strings sent as is."""
    return Reply(
        completion(
            content,
            [
                {
                    "id": f"call_{next(_ids)}",
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
                for name, args in calls
            ],
        )
    )


def error_reply(status: int, message: str, *, headers: dict[str, str] | None = None) -> Reply:
    """An OpenAI-shaped error."""
    return Reply({"error": {"message": message, "type": "fake_error"}}, status, headers or {})


def by_conversation(scripts: dict[str, Sequence[Reply | dict[str, Any]]]) -> Callable:
    """Script per episode: the key is a substring of the first user message; the reply is
    chosen by how many assistant turns the conversation already has (batch-order proof)."""

    def answer(body: dict[str, Any]) -> Reply | dict[str, Any]:
        messages = body.get("messages") or []
        user = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        for key, replies in scripts.items():
            if key in user:
                if turn < len(replies):
                    return replies[turn]
                return error_reply(400, f"fake server: script for {key!r} has no turn {turn}")
        return error_reply(400, f"fake server: no script for user message {user[:80]!r}")

    return answer


class FakeOpenAI:
    """The server; a context manager. `base_url` ends in /v1; `requests` records every call."""

    def __init__(
        self, script: Script = (), *, api_key: str | None = None, models: Reply | None = None
    ) -> None:
        self.script = script
        self.api_key = api_key
        # The answer to `GET /models`, when not the usual list (or a 401 without the key).
        self.models = models
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._position = 0
        # Open unless `hold()` closed it; `_held` maps each waiting request to its client port.
        self._gate = threading.Event()
        self._gate.set()
        self._held: dict[int, int] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The /v1 base URL clients should use."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def chat_bodies(self) -> list[dict[str, Any]]:
        """Bodies of the chat completion requests received, in arrival order."""
        return [r.body for r in self.requests if r.path.endswith("/chat/completions")]

    def hold(self) -> None:
        """Make every chat request from now on wait, unanswered, until `release()`."""
        self._gate.clear()

    def release(self) -> None:
        """Answer the requests `hold()` kept waiting, and every later one at once."""
        self._gate.set()

    @property
    def held_ports(self) -> set[int]:
        """Client ports of the chat requests waiting on `hold()` now."""
        with self._lock:
            return set(self._held.values())

    def start(self) -> FakeOpenAI:
        """Serve in a background thread."""
        # A short poll interval keeps shutdown (and so every test's teardown) quick.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and free the port."""
        self._gate.set()  # a held request must not outlive the server
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            if callable(self.script):
                reply = self.script(body)
            elif self._position < len(self.script):
                reply = self.script[self._position]
                self._position += 1
            else:
                reply = error_reply(
                    400, f"fake server: script exhausted after {self._position} replies"
                )
        return reply if isinstance(reply, Reply) else Reply(reply)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out as two writes; with Nagle on, each keep-alive response
            # would stall ~40 ms on the client's delayed ACK.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                # `GET /models`: what a client asks to see the server is there and its key good.
                # Not under `_lock`: a script holding its reply (a held run) holds that lock,
                # and a real server answers this meanwhile (a list append is atomic).
                fake.requests.append(
                    RecordedRequest("GET", self.path, dict(self.headers.items()), None)
                )
                if fake.models is not None:
                    self._send(fake.models)
                elif fake.api_key is not None and (
                    self.headers.get("Authorization") != f"Bearer {fake.api_key}"
                ):
                    self._send(error_reply(401, "Incorrect API key provided"))
                elif self.path.endswith("/models"):
                    self._send(Reply({"object": "list", "data": [{"id": "m", "object": "model"}]}))
                else:
                    self._send(error_reply(404, f"no route {self.path}"))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"null")
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with fake._lock:
                    fake.requests.append(
                        RecordedRequest("POST", self.path, dict(self.headers.items()), body)
                    )
                if fake.api_key is not None and (
                    self.headers.get("Authorization") != f"Bearer {fake.api_key}"
                ):
                    self._send(error_reply(401, "Incorrect API key provided"))
                    return
                if not self.path.endswith("/chat/completions") or not isinstance(body, dict):
                    self._send(error_reply(404, f"no route {self.path}"))
                    return
                if not fake._gate.is_set():
                    key = threading.get_ident()
                    with fake._lock:
                        fake._held[key] = self.client_address[1]
                    try:
                        fake._gate.wait()
                    finally:
                        with fake._lock:
                            del fake._held[key]
                self._send(fake._next_reply(body))

            def _send(self, reply: Reply) -> None:
                if reply.delay:
                    time.sleep(reply.delay)  # server-side latency, to trip client timeouts
                payload = (
                    reply.body.encode()
                    if isinstance(reply.body, str)
                    else json.dumps(reply.body).encode()
                )
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    if reply.drip:
                        self.wfile.flush()
                        for i in range(len(payload)):
                            self.wfile.write(payload[i : i + 1])
                            self.wfile.flush()
                            time.sleep(reply.drip)
                    else:
                        self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): nothing to answer

        return Handler


@pytest.fixture
def fake_openai() -> Iterator[Callable[..., FakeOpenAI]]:
    """Factory fixture: `server = fake_openai(script, api_key=...)`; stopped after the test."""
    servers: list[FakeOpenAI] = []

    def make(script: Script = (), **kwargs: Any) -> FakeOpenAI:
        server = FakeOpenAI(script, **kwargs).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()
