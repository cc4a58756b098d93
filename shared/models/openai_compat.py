"""OpenAI-compatible chat completions over httpx: OpenAI, Together, `vllm serve`, any gateway.

Model names this module understands (see `registry.py`):

- ``openai/<model>``: ``OPENAI_API_KEY``; ``OPENAI_BASE_URL`` overrides https://api.openai.com/v1.
- ``together/<model>``: ``TOGETHER_API_KEY``; ``TOGETHER_BASE_URL`` overrides
  https://api.together.xyz/v1.
- ``openai-compatible:<base_url>#<model>`` or just ``<base_url>#<model>`` with an http(s) base
  URL, e.g. ``http://localhost:8000/v1#Qwen/Qwen2.5-0.5B-Instruct`` for ``vllm serve``. Options
  go in the base URL's query string and are removed before the request: ``timeout`` (s),
  ``retries``, ``concurrency``, ``logprobs=1`` (ask for token logprobs), ``token_ids=1`` (vLLM's
  ``return_tokens_as_token_ids``, so token ids come back too).

Which endpoints may be called and which key each gets is the operator's policy
(`rollout.shared.models.endpoints`), never the name's: a URL outside the allow-list, or an
option naming a credential (``key_env``...), is refused before anything is sent.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx
import structlog

from rollout.shared.errors import RolloutError
from rollout.shared.models.base import ChatRequest, ChatResponse, ToolCall, Usage
from rollout.shared.models.endpoints import (
    NAME_OPTIONS,
    OPENAI_DEFAULT_BASE,
    TOGETHER_DEFAULT_BASE,
    Endpoint,
    EndpointPolicy,
    credential_options,
    credential_refusal,
    load_policy,
    url_problem,
)

log = structlog.get_logger(__name__)

ENDPOINT_PREFIX = "openai-compatible:"

# 408/409/425/429 and every 5xx are worth another try; other 4xx will fail the same way again.
_RETRYABLE_4XX = {408, 409, 425, 429}
# How long the pre-run check (`check`) waits for the endpoint: a run's creation waits on it.
CHECK_TIMEOUT_S = 5.0
# Keys each role may carry on the wire; extra bookkeeping keys would be rejected by strict APIs.
_WIRE_KEYS = {
    "system": ("role", "content", "name"),
    "developer": ("role", "content", "name"),
    "user": ("role", "content", "name"),
    "assistant": ("role", "content", "tool_calls", "name"),
    "tool": ("role", "content", "tool_call_id"),
}


class EndpointRefused(RolloutError):
    """The endpoint refused the request for its configuration (401, 403 or 404: `status`)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class MissingApiKey(RolloutError):
    """A provider model without its API key in this process's environment (`variable`)."""

    def __init__(self, message: str, *, variable: str) -> None:
        super().__init__(message)
        self.variable = variable


class OpenAICompatBackend:
    """A chat-completions endpoint; a batch is sent as concurrent requests under a cap."""

    # Where `request_body` goes, relative to the base URL (a subclass may speak another API).
    completions_path = "/chat/completions"

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        api_key: str | None = None,
        key_env: str | None = None,
        label: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 5,
        concurrency: int = 16,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        max_retry_after: float = 120.0,
        logprobs: bool = False,
        token_ids: bool = False,
        extra_headers: dict[str, str] | None = None,
        endpoint: Endpoint | None = None,
    ) -> None:
        self.model = model
        # The operator's entry this backend was allowed under (None: built directly by code).
        self.endpoint = endpoint
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.key_env = key_env
        self.name = label or f"{self.base_url}#{model}"
        self.timeout = timeout
        self.max_retries = max_retries
        self.concurrency = max(1, concurrency)
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_retry_after = max_retry_after
        self.logprobs = logprobs or token_ids
        self.token_ids = token_ids
        self.extra_headers = dict(extra_headers or {})
        # One client per event loop: httpx clients must not cross loops, and the CLI and
        # tests call asyncio.run more than once with the same backend.
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"OpenAICompatBackend({self.name!r})"

    async def generate(self, requests: list[ChatRequest]) -> list[ChatResponse]:
        """Send every request concurrently (at most `concurrency` in flight); keep the order."""
        if not requests:
            return []
        client = self._get_client()
        gate = asyncio.Semaphore(self.concurrency)
        results: list[ChatResponse | None] = [None] * len(requests)

        async def one(i: int, request: ChatRequest) -> None:
            async with gate:
                results[i] = await self._complete(client, request)

        # A TaskGroup cancels the siblings when one raises (e.g. a 401): no point going on.
        try:
            async with asyncio.TaskGroup() as group:
                for i, request in enumerate(requests):
                    group.create_task(one(i, request))
        except BaseExceptionGroup as group:
            # Surface the first real error (a RolloutError for 401 etc.), not a group.
            raise group.exceptions[0] from None
        return [r for r in results if r is not None]

    async def check(self) -> str | None:
        """Why this endpoint cannot serve now, asked once with a short timeout: unreachable,
        its key refused, its chat route missing or failing. `GET /models` first: any answer
        but 401/403, 404 or a 5xx means it is there and takes the key. A server without a model
        list (404) may still serve completions, and a failing list says little of the chat
        route, so then the route itself is asked for one token: a 404 or a 5xx there is the
        problem; any other answer counts as serving."""
        slow = f"{self.base_url} did not answer within {CHECK_TIMEOUT_S:g}s; is it overloaded?"
        try:
            # One limit for the whole exchange: httpx's own is per read, and a server that
            # drips its answer would hold a run's creation for as long as it likes.
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                response = await self._probe("GET", "/models")
                if response.status_code != 404 and response.status_code < 500:
                    return self._check_answer(response)
                response = await self._probe("POST", self.completions_path, self.probe_body())
        except (TimeoutError, httpx.TimeoutException):
            return slow
        except httpx.TransportError as exc:
            return (
                f"cannot reach {self.base_url}: {type(exc).__name__}: {exc}; is its server"
                " running and the URL right?"
            )
        return self._check_answer(response)

    def probe_body(self) -> dict[str, Any]:
        """The check's one-token request, asked only of a server with no working model list."""
        return {"model": self.model, "messages": [{"role": "user", "content": "ping"}],
                "max_tokens": 1}  # fmt: skip

    async def _probe(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> httpx.Response:
        """One check request; its body is read only when the status says something is wrong."""
        async with self._get_client().stream(method, path, json=body) as response:
            if response.status_code in (401, 403, 404) or response.status_code >= 500:
                await response.aread()
            return response

    def _check_answer(self, response: httpx.Response) -> str | None:
        """The problem a check's answer shows (a refused key, no route, a failing server)."""
        status = response.status_code
        if status in (401, 403, 404):
            # Said of this model already: without the backend's name in front.
            why = self._config_error(status, response).removeprefix(f"{self.name}: ")
        elif status >= 500:
            why = (
                f"{self.base_url} answers HTTP {status} ({_server_message(response)}): the"
                " server is up but failing; see its logs"
            )
        else:
            return None
        return why if len(why) <= 500 else why[:497] + "..."

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        if self._client is not None:
            try:
                await self._client.aclose()
            except RuntimeError:
                # Its loop is already closed; the sockets went with it.
                pass
            self._client = None
            self._client_loop = None

    def _get_client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop or self._client.is_closed:
            headers = {"Content-Type": "application/json", **self.extra_headers}
            if self.api_key:
                headers["Authorization"] = f"Bearer {self.api_key}"
            limits = httpx.Limits(
                max_connections=self.concurrency, max_keepalive_connections=self.concurrency
            )
            self._client = httpx.AsyncClient(
                base_url=self.base_url,
                headers=headers,
                timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
                limits=limits,
                # A redirect could point the key at another host; a 3xx is an answer, not a hop.
                follow_redirects=False,
                event_hooks={"request": [self._stay_on_endpoint]},
            )
            self._client_loop = loop
        return self._client

    async def _stay_on_endpoint(self, request: httpx.Request) -> None:
        # Defence in depth: whatever builds a request, it goes under the allowed base URL only.
        base = httpx.URL(self.base_url + "/")
        url = request.url
        if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port) or not (
            url.path.startswith(base.path)
        ):
            raise RolloutError(
                f"{self.name}: refused to send a request to {url.scheme}://{url.host}"
                f"{url.path}: not under the endpoint {self.base_url}"
            )

    def request_body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body of a chat completions call for one request."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [_wire_message(m) for m in request.messages],
            "temperature": request.temperature,
            "top_p": request.top_p,
        }
        if request.tools:
            body["tools"] = request.tools
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if request.seed is not None:
            body["seed"] = request.seed
        if self.logprobs:
            body["logprobs"] = True
        if self.token_ids:
            body["return_tokens_as_token_ids"] = True
        return body

    async def _complete(self, client: httpx.AsyncClient, request: ChatRequest) -> ChatResponse:
        body = self.request_body(request)
        attempt = 0
        while True:
            retry_after: float | None = None
            try:
                response = await client.post(self.completions_path, json=body)
            except httpx.TimeoutException:
                reason = f"no response within {self.timeout:g}s (timeout)"
            except httpx.TransportError as exc:
                reason = f"cannot reach {self.base_url}: {type(exc).__name__}: {exc}"
            else:
                status = response.status_code
                if status == 200:
                    return self._parse(response, request)
                reason = f"HTTP {status}: {_server_message(response)}"
                if status in (401, 403, 404):
                    raise EndpointRefused(self._config_error(status, response), status=status)
                if status not in _RETRYABLE_4XX and status < 500:
                    # The request itself was refused (too long, bad tools...): this episode
                    # ends with the reason, the rest of the batch is unaffected.
                    return _error_response(
                        f"{self.name}: request rejected: {reason}", rejected=True
                    )
                retry_after = _retry_after_seconds(response)
            if attempt >= self.max_retries:
                return _error_response(
                    f"{self.name}: gave up after {attempt + 1} attempts: {reason}"
                )
            delay = self._delay(attempt, retry_after)
            log.warning(
                "model request failed; retrying",
                backend=self.name,
                attempt=attempt + 1,
                reason=reason,
                delay_s=round(delay, 3),
            )
            await asyncio.sleep(delay)
            attempt += 1

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            # The server knows when it will take us again; a little jitter spreads the herd.
            return min(retry_after, self.max_retry_after) + random.uniform(0, self.backoff_base)
        ceiling = min(self.backoff_max, self.backoff_base * (2**attempt))
        # "Equal jitter": at least half the exponential step, so retries really back off.
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    def _config_error(self, status: int, response: httpx.Response) -> str:
        detail = _server_message(response)
        key_hint = f"check {self.key_env}" if self.key_env else "check the endpoint's API key"
        if status == 401:
            return f"{self.name}: authentication failed (HTTP 401: {detail}); {key_hint}"
        if status == 403:
            return (
                f"{self.name}: permission denied (HTTP 403: {detail}); "
                f"the key may not have access to model '{self.model}'; {key_hint}"
            )
        return (
            f"{self.name}: not found (HTTP 404: {detail}); check the model name "
            f"'{self.model}' and the base URL {self.base_url}"
        )

    def _parse(self, response: httpx.Response, request: ChatRequest) -> ChatResponse:
        try:
            data = response.json()
            choice = data["choices"][0]
            message = choice.get("message") or {}
        except (ValueError, KeyError, IndexError, TypeError, RecursionError):
            return _error_response(
                f"{self.name}: unexpected response (not a chat completion): {response.text[:200]!r}"
            )
        tool_calls: list[ToolCall] = []
        for i, raw in enumerate(message.get("tool_calls") or []):
            tool_calls.append(_parse_tool_call(i, raw))
        content = message.get("content")
        if isinstance(content, list):
            # Some gateways answer with content parts; keep the text.
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        token_ids, logprobs = _parse_logprobs(choice.get("logprobs"))
        usage = None
        if isinstance(data.get("usage"), dict):
            usage = Usage(
                **{
                    k: int(v or 0)
                    for k, v in data["usage"].items()
                    if k in ("prompt_tokens", "completion_tokens", "total_tokens")
                }
            )
        finish = choice.get("finish_reason") or ("tool_calls" if tool_calls else "stop")
        return ChatResponse(
            content=content,
            tool_calls=tool_calls,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            usage=usage,
        )


def _wire_message(message: dict[str, Any]) -> dict[str, Any]:
    keys = _WIRE_KEYS.get(message.get("role", ""))
    if keys is None:
        return dict(message)
    out = {k: message[k] for k in keys if k in message}
    if out.get("role") == "assistant" and not out.get("tool_calls"):
        out.pop("tool_calls", None)
    if out.get("role") == "tool" and not isinstance(out.get("content"), str):
        out["content"] = json.dumps(out.get("content"))
    return out


def _parse_tool_call(index: int, raw: Any) -> ToolCall:
    call_id = f"call_{index}"
    if not isinstance(raw, dict):
        return ToolCall(id=call_id, name="", error=f"malformed tool call: {raw!r}")
    call_id = str(raw.get("id") or call_id)
    function = raw.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return ToolCall(id=call_id, name="", error=f"malformed tool call (no name): {raw!r}")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str):
        # Some gateways send the arguments already decoded.
        arguments = json.dumps(arguments)
    return ToolCall(id=call_id, name=function["name"], arguments=arguments)


def _parse_logprobs(raw: Any) -> tuple[list[int] | None, list[float] | None]:
    if not isinstance(raw, dict) or not isinstance(raw.get("content"), list):
        return None, None
    logprobs: list[float] = []
    token_ids: list[int] = []
    for item in raw["content"]:
        if not isinstance(item, dict):
            return None, None
        logprobs.append(float(item.get("logprob", 0.0)))
        token = str(item.get("token", ""))
        # vLLM's return_tokens_as_token_ids renders each token as "token_id:<id>".
        if token.startswith("token_id:") and token[9:].isdigit():
            token_ids.append(int(token[9:]))
    return (token_ids if len(token_ids) == len(logprobs) else None), logprobs


def _server_message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:200].strip() or response.reason_phrase
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if data.get("message"):
            return str(data["message"])
    return json.dumps(data)[:200]


def _retry_after_seconds(response: httpx.Response) -> float | None:
    # OpenAI sends the finer-grained retry-after-ms alongside the standard header.
    millis = response.headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_response(message: str, *, rejected: bool = False) -> ChatResponse:
    return ChatResponse(content=None, finish_reason="error", error=message, rejected=rejected)


def openai_backend(model: str) -> OpenAICompatBackend:
    """`openai/<model>`: the operator's `openai` endpoint (OPENAI_API_KEY, OPENAI_BASE_URL)."""
    return _provider_backend("openai", model)


def together_backend(model: str) -> OpenAICompatBackend:
    """`together/<model>`: the operator's `together` endpoint (TOGETHER_API_KEY)."""
    return _provider_backend("together", model)


def _provider_backend(provider: str, model: str) -> OpenAICompatBackend:
    label = f"{provider}/{model}"
    if not model.strip():
        raise RolloutError(f"model '{label}': missing the model name after '{provider}/'")
    endpoint = load_policy().named(provider)
    key = endpoint.api_key()
    default = OPENAI_DEFAULT_BASE if provider == "openai" else TOGETHER_DEFAULT_BASE
    if key is None and endpoint.base_url == default:
        base_env = f"{provider.upper()}_BASE_URL"
        raise MissingApiKey(
            f"model '{label}' needs an API key: set {endpoint.key_source()} "
            f"(or point {base_env} at an endpoint that needs none)",
            variable=endpoint.key_source(),
        )
    return OpenAICompatBackend(
        model,
        endpoint.base_url,
        api_key=key,
        key_env=endpoint.key_env,
        label=label,
        endpoint=endpoint,
    )


@dataclass(frozen=True)
class EndpointName:
    """A parsed `<base_url>#<model>` name: where it points, its options, the endpoint allowed."""

    base_url: str
    model: str
    options: dict[str, str]
    endpoint: Endpoint


def parse_endpoint_name(spec: str, policy: EndpointPolicy | None = None) -> EndpointName:
    """Parse and police `openai-compatible:<base_url>#<model>` / `<base_url>#<model>`: a name
    that chooses a credential or names an endpoint outside the operator's list is refused."""
    policy = load_policy() if policy is None else policy
    raw = spec[len(ENDPOINT_PREFIX) :] if spec.startswith(ENDPOINT_PREFIX) else spec
    example = "http://localhost:8000/v1#my-model"
    if "#" not in raw:
        raise RolloutError(
            f"model '{spec}': an endpoint needs '#<model>' after its base URL, e.g. {example}"
        )
    url, _, model = raw.partition("#")
    model = model.strip()
    if not model:
        raise RolloutError(f"model '{spec}': empty model name after '#', e.g. {example}")
    problem = url_problem(url.strip())
    if problem:
        raise RolloutError(f"model '{spec}': {problem}")
    parts = urlsplit(url.strip())
    credentials = credential_options(parts.query)
    if credentials:
        raise RolloutError(credential_refusal(spec, credentials, policy))
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(options) - NAME_OPTIONS)
    if unknown:
        raise RolloutError(
            f"model '{spec}': unknown endpoint option(s) {', '.join(unknown)}; "
            f"valid: {', '.join(sorted(NAME_OPTIONS))}"
        )
    base = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    endpoint = policy.for_url(base, f"model '{spec}'")
    return EndpointName(base, model, options, endpoint)


def endpoint_backend(spec: str) -> OpenAICompatBackend:
    """`openai-compatible:<base_url>#<model>` or `<base_url>#<model>` (http/https), on an
    endpoint the operator allowed, with the key the operator gave that endpoint."""
    name = parse_endpoint_name(spec)
    options = name.options
    kwargs: dict[str, Any] = {}
    try:
        if "timeout" in options:
            kwargs["timeout"] = float(options["timeout"])
        if "retries" in options:
            kwargs["max_retries"] = int(options["retries"])
        if "concurrency" in options:
            kwargs["concurrency"] = int(options["concurrency"])
    except ValueError as exc:
        raise RolloutError(f"model '{spec}': bad endpoint option value: {exc}") from None
    return OpenAICompatBackend(
        name.model,
        name.base_url,
        api_key=name.endpoint.api_key(),
        key_env=name.endpoint.key_env,
        label=f"{name.base_url}#{name.model}" if not options else spec,
        logprobs=_truthy(options.get("logprobs")),
        token_ids=_truthy(options.get("token_ids")),
        endpoint=name.endpoint,
        **kwargs,
    )


def check_endpoint_policy(model: str) -> str | None:
    """Why the operator's endpoint policy refuses a model name, or None (other forms pass).

    Reads no key: the tracker checks names at run creation without holding any secret."""
    name = (model or "").strip()
    try:
        if name.startswith(("openai/", "together/")):
            load_policy().named(name.partition("/")[0])
        elif name.startswith((ENDPOINT_PREFIX, "http://", "https://")):
            parse_endpoint_name(name)
    except RolloutError as exc:
        return f"model: {exc}"
    return None


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


__all__ = [
    "ENDPOINT_PREFIX",
    "EndpointRefused",
    "EndpointName",
    "MissingApiKey",
    "OpenAICompatBackend",
    "check_endpoint_policy",
    "endpoint_backend",
    "openai_backend",
    "parse_endpoint_name",
    "together_backend",
]
