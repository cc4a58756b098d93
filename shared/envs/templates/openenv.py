"""The `openenv` template: play episodes on a remote OpenEnv server over its WebSocket `/ws`.

One WebSocket session per episode, driven by openenv-core's own client (`GenericEnvClient`).
The client is async and bound to the loop it connected on, while a runtime is built and asked
for its tools and final state synchronously (like every template): so every client lives on
one background event loop thread, sync calls block on it and `call_tool` awaits it without
blocking the caller's loop.

The env's reward is recorded in the final state (`reward`, `done`, `rewards` per step), where
the `env_reward` primitive reads it; the server's own state is under `state`, so our other
primitives can score it too (e.g. `state_match` on `state.env_state.refunds`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel, EnvironmentSpec, TaskSpec
from rollout.shared.envs.runtime import EnvironmentFailed
from rollout.shared.envs.templates.base import BaseRuntime, ToolError
from rollout.shared.envs.templates.protocol import Template
from rollout.shared.errors import RolloutError
from rollout.shared.interop.backends import require

# The config of its specs: a contract (schemas/templates/<name>.json is generated from it).


class OpenEnvConfig(CamelModel):
    """Config of the `openenv` template: episodes are played on a remote OpenEnv server.

    Each episode is one WebSocket session on `url`/ws: `reset` with the task's `input` as
    keyword arguments (over `resetOptions`), a `step` per tool call. `actions="tools"` expects
    the server to list its tools in the reset observation (as `rollout env serve` does: a step
    is `{"tool", "arguments"}`); `actions="raw"` offers one tool, `actionTool`, whose
    parameters are the server's action schema (from `/schema`) and whose arguments are sent
    as the action. The URL carries no credentials.
    """

    url: str = Field(min_length=1, max_length=2048, description="http(s):// or ws(s):// base URL.")
    actions: Literal["tools", "raw"] = "tools"
    action_tool: str = Field(
        default="step", min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$"
    )
    # tools mode: a tool that sends {"answer": ...} (ends the episode on `rollout env serve`).
    answer_tool: str | None = Field(
        default="submit_answer", min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$"
    )
    # Sent when the model stops before the server said done (None: leave the episode as is).
    finish_action: dict[str, Any] | None = None
    reset_options: dict[str, Any] = Field(default_factory=dict)
    timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    max_message_mb: float = Field(default=16.0, gt=0, le=256)


_SCHEMES = {"http": "http", "https": "https", "ws": "http", "wss": "https"}
SCHEMA_TIMEOUT_S = 5.0


def check_url(url: str) -> str:
    """The server's http(s) base URL (no trailing slash); RolloutError naming what is wrong."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a bad port)
    except ValueError as exc:
        raise RolloutError(f"not a URL: {exc}") from None
    if parts.scheme not in _SCHEMES:
        raise RolloutError(f"{url!r}: the scheme must be http, https, ws or wss")
    if not parts.hostname:
        raise RolloutError(f"{url!r}: no host")
    if parts.username is not None or parts.password is not None:
        # Credentials go where the operator's endpoint policy says, never in an env's config.
        raise RolloutError("the URL must not carry credentials (user:password@)")
    if parts.query or parts.fragment:
        raise RolloutError(f"{url!r}: no query or fragment (reset options go in resetOptions)")
    netloc = parts.netloc
    return f"{_SCHEMES[parts.scheme]}://{netloc}{parts.path.rstrip('/')}"


def fetch_schema(url: str, timeout_s: float = SCHEMA_TIMEOUT_S) -> dict[str, Any]:
    """The server's `/schema` (action, observation, state); RolloutError when it does not answer."""
    import httpx

    base = check_url(url)
    try:
        response = httpx.get(f"{base}/schema", timeout=timeout_s, follow_redirects=False)
    except httpx.HTTPError as exc:
        raise RolloutError(
            f"the OpenEnv server at {base} did not answer /schema ({type(exc).__name__}: {exc})"
        ) from None
    if response.status_code != 200:
        raise RolloutError(
            f"the OpenEnv server at {base} answered /schema with HTTP {response.status_code}"
        )
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("action"), dict):
        raise RolloutError(
            f"{base}/schema is not an OpenEnv schema (no 'action' JSON schema): is it an "
            "OpenEnv server?"
        )
    return body


class _Loop:
    """One background event loop that every OpenEnv client of this process lives on."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="openenv-clients", daemon=True
                ).start()
                cls._loop = loop
            return cls._loop


def _submit(coro: Any) -> concurrent.futures.Future[Any]:
    return asyncio.run_coroutine_threadsafe(coro, _Loop.get())


def _lost_errors() -> tuple[type[BaseException], ...]:
    lost: tuple[type[BaseException], ...] = (ConnectionError, OSError, RuntimeError, TimeoutError)
    try:
        from websockets.exceptions import WebSocketException
    except ModuleNotFoundError:
        # Without the interop extra (the service image) no OpenEnv client can run, so none of
        # its errors can occur; importing the template must not need it.
        return lost
    return (*lost, WebSocketException)


_LOST = _lost_errors()
_SERVER_ERROR = "Server error: "


def _failed(op: str, exc: BaseException) -> Exception:
    # openenv's client raises RuntimeError("Server error: ...") when the server answered with
    # an error (a bad action, the env raised): the session lives on, so the model reads it.
    text = str(exc)
    if isinstance(exc, RuntimeError) and text.startswith(_SERVER_ERROR):
        return ToolError(f"the server refused the {op}: {text.removeprefix(_SERVER_ERROR)}")
    return EnvironmentFailed(f"{op} failed: {type(exc).__name__}: {text}")


def action_parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """The action schema as tool parameters (OpenEnv's `metadata` field left out)."""
    action = dict(schema.get("action") or {})
    props = {k: v for k, v in (action.get("properties") or {}).items() if k != "metadata"}
    params: dict[str, Any] = {"type": "object", "properties": props}
    required = [r for r in action.get("required") or [] if r in props]
    if required:
        params["required"] = required
    if "$defs" in action:
        params["$defs"] = action["$defs"]
    return params


class OpenEnvRuntime(BaseRuntime):
    """One episode: one WebSocket session on the server (reset at start, a step per tool)."""

    template = "openenv"
    sanitize_outputs = True

    def __init__(self, spec: EnvironmentSpec, task: TaskSpec, config: OpenEnvConfig) -> None:
        require("openenv")
        from openenv.core.generic_client import GenericEnvClient

        super().__init__(spec, task)
        self.config = config
        self._failure: str | None = None
        self._done = False
        self._reward: float | None = None
        self._rewards: list[float | None] = []
        self._observation: dict[str, Any] = {}
        self._reset_observation: dict[str, Any] = {}
        self._timeout = config.timeout_seconds
        self.base_url = check_url(config.url)
        self._client = GenericEnvClient(
            base_url=self.base_url,
            connect_timeout_s=self._timeout,
            message_timeout_s=self._timeout,
            max_message_size_mb=config.max_message_mb,
        )
        options = {**config.reset_options, **(task.input or {})}
        try:
            schema = fetch_schema(self.base_url, self._timeout) if config.actions == "raw" else {}
            first = self._wait(self._client.reset(**options), "reset")
        except (RolloutError, EnvironmentFailed, ToolError) as exc:
            self._failure = f"openenv {self.base_url}: {exc}"
            self._close_client()
            return
        self._record(first)
        self._reset_observation = self._observation
        if config.actions == "raw":
            parameters = action_parameters(schema)
            self.add_tool(
                config.action_tool,
                str((schema.get("action") or {}).get("description") or "One environment step."),
                parameters,
                self._raw_step,
                # Checked here too so the model reads which field is wrong; the server still
                # validates its own action model ($ref schemas are left to it).
                check_args="$defs" not in parameters,
            )
            return
        tools = self._observation.get("tools")
        if not isinstance(tools, list) or not tools:
            self._failure = (
                f"openenv {self.base_url}: the reset observation lists no tools "
                "(set config.actions = 'raw' to send the server's own actions)"
            )
            self._close_client()
            return
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            name = tool["name"]
            self.add_tool(
                name,
                str(tool.get("description") or ""),
                tool.get("parameters") or {"type": "object", "properties": {}},
                self._tool_step(name),
                check_args=False,
            )
        if config.answer_tool and config.answer_tool not in self._tools:
            self.add_tool(
                config.answer_tool,
                "Submit the final answer; ends the episode.",
                {
                    "type": "object",
                    "properties": {"answer": {"type": "string"}},
                    "required": ["answer"],
                },
                self._answer_step,
            )

    # ------------------------------------------------------------ plumbing

    def _wait(self, coro: Any, op: str) -> Any:
        try:
            return _submit(coro).result(self._timeout + 5)
        except concurrent.futures.TimeoutError:
            raise EnvironmentFailed(f"{op} timed out after {self._timeout:g}s") from None
        except _LOST as exc:
            raise _failed(op, exc) from None

    async def _await(self, coro: Any, op: str) -> Any:
        try:
            return await asyncio.wait_for(asyncio.wrap_future(_submit(coro)), self._timeout + 5)
        except TimeoutError:
            raise EnvironmentFailed(f"{op} timed out after {self._timeout:g}s") from None
        except _LOST as exc:
            raise _failed(op, exc) from None

    def _record(self, result: Any) -> None:
        observation = result.observation if isinstance(result.observation, dict) else {}
        self._observation = observation
        reward = result.reward
        self._reward = float(reward) if isinstance(reward, int | float) else None
        self._rewards.append(self._reward)
        self._done = bool(result.done)

    async def _send(self, action: dict[str, Any]) -> dict[str, Any]:
        if self._failure is not None:
            raise EnvironmentFailed(self._failure)
        if self._done:
            raise ToolError("the episode has ended (the server said done)")
        try:
            result = await self._await(self._client.step(action), "step")
        except EnvironmentFailed as exc:
            self._failure = f"openenv {self.base_url}: {exc}"
            raise
        self._record(result)
        return self._observation

    def _tool_step(self, name: str):  # type: ignore[no-untyped-def]
        async def run(args: dict[str, Any]) -> Any:
            obs = await self._send({"tool": name, "arguments": args})
            if obs.get("error"):
                raise ToolError(str(obs["error"]))
            return obs.get("result")

        return run

    async def _answer_step(self, args: dict[str, Any]) -> Any:
        await self._send({"answer": str(args.get("answer", ""))})
        return {"done": self._done, "reward": self._reward}

    async def _raw_step(self, args: dict[str, Any]) -> Any:
        obs = await self._send(dict(args))
        return {"observation": obs, "reward": self._reward, "done": self._done}

    # ------------------------------------------------------------ runtime protocol

    def tool_specs(self):  # type: ignore[no-untyped-def]
        """The server's tools (EnvironmentFailed when the session could not start)."""
        if self._failure is not None:
            raise EnvironmentFailed(self._failure)
        return super().tool_specs()

    async def call_tool(self, name: str, arguments: dict[str, Any]):  # type: ignore[no-untyped-def]
        """BaseRuntime.call_tool, except that a lost session ends the episode (raises)."""
        if self._failure is not None:
            raise EnvironmentFailed(self._failure)
        result = await super().call_tool(name, arguments)
        if self._failure is not None:
            raise EnvironmentFailed(self._failure)
        return result

    def final_state(self) -> dict[str, Any]:
        """The reward the server recorded, its done flag, last observation and state."""
        if self._failure is not None:
            raise EnvironmentFailed(self._failure)
        if not self._done and self.config.finish_action is not None:
            self._record(self._wait(self._client.step(dict(self.config.finish_action)), "finish"))
        server_state = self._wait(self._client.state(), "state")
        return {
            "reward": self._reward,
            "done": self._done,
            "rewards": list(self._rewards[1:]),
            "observation": self._observation,
            "reset": self._reset_observation,
            "state": server_state if isinstance(server_state, dict) else {},
        }

    def _close_client(self) -> None:
        client = getattr(self, "_client", None)
        if client is not None:
            _submit(client.close())  # best effort: the server ends the session on disconnect

    async def close(self) -> None:
        """End the WebSocket session."""
        client, self._client = self._client, None  # type: ignore[assignment]
        if client is None:
            return
        try:
            await asyncio.wait_for(asyncio.wrap_future(_submit(client.close())), self._timeout)
        except _LOST:
            pass  # the session is gone either way


__all__ = ["OpenEnvRuntime", "action_parameters", "check_url", "fetch_schema"]


ENV_REWARD = {"name": "reward", "type": "env_reward"}


class OpenEnvTemplate(Template):
    """The `openenv` template: episodes on a remote OpenEnv server."""

    name = "openenv"
    config_model = OpenEnvConfig
    runtime = OpenEnvRuntime

    def tool_names(self, config: OpenEnvConfig) -> None:
        """Only the server knows its tools."""
        return None

    def check_config(self, config: OpenEnvConfig, out: list[str]) -> None:
        """Plan time, not minute 47: the server must be an OpenEnv server answering /schema."""
        try:
            check_url(config.url)
            fetch_schema(config.url)
        except RolloutError as exc:
            out.append(f"config.url: {exc.message}")

    def default_primitives(self, task: TaskSpec) -> list[dict[str, Any]]:
        """The remote environment rewards the episode."""
        return [dict(ENV_REWARD)]


TEMPLATE = OpenEnvTemplate()
