"""The `nemo_gym` template: play episodes on a remote NeMo Gym resources server.

One session per episode (the server's cookie): `/seed_session` when the episode starts, a
`POST /<tool>` per tool call, `/verify` when the verifier asks for the final state; its
`reward` lands in the final state, where the `env_reward` primitive reads it. Tested against
the documented wire protocol (our own `rollout env serve --protocol nemo-gym`), not nemo-gym
itself, which does not install here.

A server's HTTP 500 is its handler raising on what it was sent: on a tool call, the model's
arguments did it (`int("five")`), so the model reads it as a tool error and goes on; at
`/verify` (and a 400, 413 or 422 there: what was sent does not fit its request model), the
answer did it when the server verifies a control answer ("", "0") in a session of its own at
the same moment, and the episode scores the reward 0. Either as an errored episode
would be left out of pass rates and GRPO's groups: a model could escape a failing verdict by
sending what the server cannot parse. A server that is gone, a gateway's 502-504, or a
`/verify` that fails on the controls too ends the episode errored (no verdict).
"""

from __future__ import annotations

import functools
import socket
import ssl
from typing import Any

import httpx
from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel, EnvironmentSpec, TaskSpec
from rollout.shared.contracts.trajectory import ToolCallRecord
from rollout.shared.envs.checks import duplicates
from rollout.shared.envs.runtime import EnvironmentFailed
from rollout.shared.envs.templates.base import BaseRuntime, ToolError
from rollout.shared.envs.templates.openenv import ENV_REWARD, check_url
from rollout.shared.envs.templates.protocol import Template
from rollout.shared.errors import RolloutError
from rollout.shared.interop.nemo_gym_wire import discover_tools, responses_payload

# The config of its specs: a contract (schemas/templates/<name>.json is generated from it).


class NemoGymTool(CamelModel):
    """A tool of a NeMo Gym resources server (a `POST /<name>` route)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class NemoGymConfig(CamelModel):
    """Config of the `nemo_gym` template: episodes on a remote NeMo Gym resources server.

    Each episode is one session (a cookie): `/seed_session` with `seed` and the task's `input`,
    a `POST /<tool>` per tool call, `/verify` at the end (its `reward` is what `env_reward`
    reads). Tools are `tools` when given, else the server's POST routes from `/openapi.json`.
    The URL carries no credentials.
    """

    url: str = Field(min_length=1, max_length=2048, description="http(s):// base URL.")
    tools: list[NemoGymTool] | None = None
    # A tool that records the final answer (sent as the response's output message at /verify).
    answer_tool: str | None = Field(
        default="submit_answer", min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$"
    )
    seed: dict[str, Any] = Field(default_factory=dict)
    timeout_seconds: float = Field(default=30.0, gt=0, le=600)


PROBE_TIMEOUT_S = 5.0
# What a FastAPI server answers when its handler raised; other 5xx (a gateway, an overload)
# say nothing about what it was sent.
HANDLER_RAISED = 500
# What a server answers /verify with when what the episode sent does not fit its request model:
# a bad request, one too large, one that fails validation (a field longer than it allows).
REFUSED_CONTENT = (400, 413, 422)
# Answers no policy wrote, verified when /verify raised on the model's: a server that verifies
# one of them can verify, and it was the answer it could not.
CONTROL_ANSWERS = ("", "0")


class ServerError(RolloutError):
    """The server answered 5xx (`status`)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Refused(ToolError):
    """The server answered 4xx (`status`): the model reads it as its call's error."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


# A request's headers and body go out as two writes: without TCP_NODELAY the body waits for
# the server's delayed ACK (~40 ms a tool call on loopback).
_NODELAY = {"socket_options": [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]}


@functools.cache
def _tls() -> ssl.SSLContext:
    # Loading the CA bundle costs ~0.25 s per client: one context serves every episode.
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def _transport(cls: type) -> Any:
    return cls(verify=_tls(), **_NODELAY)


def fetch_openapi(
    url: str, timeout_s: float = PROBE_TIMEOUT_S, client: httpx.Client | None = None
) -> dict[str, Any]:
    """The server's `/openapi.json`; RolloutError when it does not answer like a Gym server."""
    base = check_url(url)
    try:
        if client is not None:
            response = client.get("/openapi.json", timeout=timeout_s)
        else:
            response = httpx.get(f"{base}/openapi.json", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise RolloutError(
            f"the NeMo Gym server at {base} did not answer /openapi.json "
            f"({type(exc).__name__}: {exc})"
        ) from None
    try:
        body = response.json() if response.status_code == 200 else None
    except ValueError:
        body = None
    paths = body.get("paths") if isinstance(body, dict) else None
    if not isinstance(paths, dict) or "/verify" not in paths or "/seed_session" not in paths:
        raise RolloutError(
            f"{base} is not a NeMo Gym resources server (its /openapi.json has no /seed_session "
            f"and /verify routes; HTTP {response.status_code})"
        )
    return body  # type: ignore[return-value]


class NemoGymRuntime(BaseRuntime):
    """One episode: one resources-server session."""

    template = "nemo_gym"
    sanitize_outputs = True

    def __init__(self, spec: EnvironmentSpec, task: TaskSpec, config: NemoGymConfig) -> None:
        super().__init__(spec, task)
        self.config = config
        self.base_url = check_url(config.url)
        self._failure: str | None = None
        self._answer: str | None = None
        self._calls: list[ToolCallRecord] = []
        self._verified: dict[str, Any] | None = None
        self._fields = {**config.seed, **(task.input or {})}
        timeout = httpx.Timeout(config.timeout_seconds)
        self._sync = httpx.Client(
            base_url=self.base_url, timeout=timeout, transport=_transport(httpx.HTTPTransport)
        )
        self._async: httpx.AsyncClient | None = None
        try:
            tools = (
                [t.model_dump() for t in config.tools]
                if config.tools is not None
                else discover_tools(
                    fetch_openapi(self.base_url, config.timeout_seconds, self._sync)
                )
            )
            self._check(self._sync.post("/seed_session", json=self._fields), "seed_session")
        except (RolloutError, httpx.HTTPError) as exc:
            self._failure = f"nemo_gym {self.base_url}: {exc}"
            self._sync.close()
            return
        self._async = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=timeout,
            cookies=self._sync.cookies,
            transport=_transport(httpx.AsyncHTTPTransport),
        )
        self._tool_list = tools
        for tool in tools:
            self.add_tool(
                tool["name"],
                tool.get("description") or "",
                tool.get("parameters") or {"type": "object", "properties": {}},
                self._tool(tool["name"]),
                check_args=False,  # the server validates its own request models
            )
        if config.answer_tool and config.answer_tool not in self._tools:
            self.add_tool(
                config.answer_tool,
                "Submit the final answer; the episode is verified with it.",
                {
                    "type": "object",
                    "properties": {"answer": {"type": "string"}},
                    "required": ["answer"],
                },
                self._submit,
            )

    @staticmethod
    def _check(response: httpx.Response, op: str) -> Any:
        if response.status_code >= 500:
            raise ServerError(
                f"{op} failed: HTTP {response.status_code}: {response.text[:300]}",
                response.status_code,
            )
        try:
            body = response.json()
        except ValueError:
            body = response.text
        if response.status_code >= 400:
            detail = body.get("detail") if isinstance(body, dict) else body
            raise Refused(f"{op}: HTTP {response.status_code}: {detail}", response.status_code)
        return body

    def _tool(self, name: str):  # type: ignore[no-untyped-def]
        async def run(args: dict[str, Any]) -> Any:
            if self._failure is not None or self._async is None:
                raise EnvironmentFailed(self._failure or "the session is closed")
            try:
                response = await self._async.post(f"/{name}", json=args)
                body = self._check(response, name)
            except ServerError as exc:
                if exc.status != HANDLER_RAISED:
                    self._failure = f"nemo_gym {self.base_url}: {name}: {exc}"
                    raise EnvironmentFailed(self._failure) from None
                # The handler raised on these arguments: the server lives on, the model reads it.
                error = f"the server failed on this call: {exc}"
                self._calls.append(
                    ToolCallRecord(index=len(self._calls), name=name, arguments=args, error=error)
                )
                raise ToolError(error) from None
            except (httpx.HTTPError, RolloutError) as exc:
                self._failure = f"nemo_gym {self.base_url}: {name}: {type(exc).__name__}: {exc}"
                raise EnvironmentFailed(self._failure) from None
            error = body.get("error") if isinstance(body, dict) and len(body) == 1 else None
            self._calls.append(
                ToolCallRecord(
                    index=len(self._calls),
                    name=name,
                    arguments=args,
                    result=None if error else body,
                    error=str(error) if error else None,
                )
            )
            if error:
                raise ToolError(str(error))
            return body

        return run

    async def _submit(self, args: dict[str, Any]) -> Any:
        self._answer = str(args.get("answer", ""))
        return {"submitted": True}

    def tool_specs(self):  # type: ignore[no-untyped-def]
        """The server's tools (EnvironmentFailed when the session could not start)."""
        if self._failure is not None:
            raise EnvironmentFailed(self._failure)
        return super().tool_specs()

    async def call_tool(self, name: str, arguments: dict[str, Any]):  # type: ignore[no-untyped-def]
        """BaseRuntime.call_tool, except that a lost server ends the episode (raises)."""
        if self._failure is not None:
            raise EnvironmentFailed(self._failure)
        result = await super().call_tool(name, arguments)
        if self._failure is not None:
            raise EnvironmentFailed(self._failure)
        return result

    def final_state(self) -> dict[str, Any]:
        """`/verify` once: its reward, the answer sent, and the server's verify answer."""
        if self._failure is not None:
            raise EnvironmentFailed(self._failure)
        if self._verified is None:
            payload = responses_payload(
                self.task.instruction, self._tool_list, self._calls, self._answer
            )
            if self._async is not None:
                self._sync.cookies = self._async.cookies
            try:
                body = self._check(
                    self._sync.post("/verify", json={**self._fields, **payload}), "verify"
                )
            except (ServerError, Refused) as exc:
                content = exc.status == HANDLER_RAISED or exc.status in REFUSED_CONTENT
                control = self._control_verified() if content else None
                if control is None:
                    self._failure = f"nemo_gym {self.base_url}: {exc}"
                    raise EnvironmentFailed(self._failure) from None
                body = {
                    "reward": 0.0,
                    "verifyError": (
                        f"{exc}; the server verified the control answer {control!r} in a "
                        "session of its own: the episode's answer is at fault"
                    ),
                }
            except (httpx.HTTPError, RolloutError, ToolError) as exc:
                self._failure = f"nemo_gym {self.base_url}: {exc}"
                raise EnvironmentFailed(self._failure) from None
            if not isinstance(body, dict):
                body = {}
            self._verified = {
                k: v for k, v in body.items() if k not in ("responses_create_params", "response")
            }
        reward = self._verified.get("reward")
        return {
            "reward": reward if isinstance(reward, int | float) else None,
            "done": True,
            "answer": self._answer,
            "verify": self._verified,
        }

    def _control_verified(self) -> str | None:
        """The first control answer the server verifies in a fresh session, or None."""
        with httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(self.config.timeout_seconds),
            transport=_transport(httpx.HTTPTransport),
        ) as client:
            for answer in CONTROL_ANSWERS:
                payload = responses_payload(self.task.instruction, self._tool_list, [], answer)
                try:
                    self._check(client.post("/seed_session", json=self._fields), "seed_session")
                    self._check(client.post("/verify", json={**self._fields, **payload}), "verify")
                except (httpx.HTTPError, RolloutError, ToolError):
                    continue
                return answer
        return None

    async def close(self) -> None:
        """Close the session (unless /verify already ended it) and the HTTP clients."""
        if self._async is not None:
            if self._verified is None and self._failure is None:
                try:
                    await self._async.post("/close_session", json={})
                except httpx.HTTPError:
                    pass  # the server drops it on its own; nothing to score anyway
            await self._async.aclose()
            self._async = None
        self._sync.close()


__all__ = ["NemoGymRuntime", "fetch_openapi"]


class NemoGymTemplate(Template):
    """The `nemo_gym` template: episodes on a remote NeMo Gym resources server."""

    name = "nemo_gym"
    aliases = ("nemo-gym",)
    config_model = NemoGymConfig
    runtime = NemoGymRuntime

    def tool_names(self, config: NemoGymConfig) -> None:
        """Only the server knows its tools."""
        return None

    def check_config(self, config: NemoGymConfig, out: list[str]) -> None:
        """Plan time: the server must answer like a resources server; tools are unique."""
        try:
            fetch_openapi(config.url)
        except RolloutError as exc:
            out.append(f"config.url: {exc.message}")
        if config.tools is not None:
            names = [t.name for t in config.tools]
            duplicates(names, lambda i: f"config.tools[{i}].name", "tool", out)

    def default_primitives(self, task: TaskSpec) -> list[dict[str, Any]]:
        """The remote environment rewards the episode."""
        return [dict(ENV_REWARD)]


TEMPLATE = NemoGymTemplate()
