"""NeMo Gym's resources-server protocol, both ways: serve a rollout env as one, and the wire
shapes the `nemo_gym` template uses to consume one.

nemo-gym itself does not install on this machine's Python; this follows its documented wire
protocol (nemo_gym/base_resources_server.py and the resources-server tutorials):

- a session is a cookie the server sets on the first request; the client keeps it per rollout;
- `POST /seed_session` with the task's fields starts the rollout's state;
- one `POST /<tool_name>` per tool, the JSON arguments as the body, the tool's JSON result back;
- `POST /verify` with `responses_create_params` (the request: `input`, `tools`) and `response`
  (an OpenAI Responses API response: `output` items) plus the task's fields; the answer echoes
  the request and adds `reward`;
- `POST /close_session` ends it. FastAPI's `/openapi.json` lists the tool routes.

Serving: our verifier decides the reward from the session's own tool calls and final state
(never from what the client claims); only the final answer text is read from `response`.
"""

import contextlib
import secrets
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field

from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.contracts.trajectory import ToolCallRecord, Trajectory
from rollout.shared.envs.engine import build_runtime, score
from rollout.shared.envs.validation import validate_environment
from rollout.shared.errors import RolloutError
from rollout.shared.interop.nemo_gym_wire import RESERVED, output_text

log = structlog.get_logger(__name__)

SESSION_COOKIE = "rollout_gym_session"
DEFAULT_MAX_SESSIONS = 256


class SeedSession(BaseModel):
    """`/seed_session`: which task (index or id); a row's other fields are accepted and kept."""

    model_config = ConfigDict(extra="allow")

    task: int | str | None = None


class VerifyRequest(BaseModel):
    """`/verify` (BaseVerifyRequest): the request, the model's response, the task's fields."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: dict[str, Any] = Field(default_factory=dict)
    response: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------- serve


class _Session:
    def __init__(self, index: int, runtime: Any) -> None:
        self.index = index
        self.runtime = runtime
        self.calls: list[ToolCallRecord] = []


def create_app(spec: EnvironmentSpec, *, max_sessions: int = DEFAULT_MAX_SESSIONS) -> Any:
    """A FastAPI app serving `spec` as a NeMo Gym resources server (validated first)."""
    from fastapi import Body, FastAPI, HTTPException, Request, Response

    from rollout.shared.interop.openenv_server import _pick_task

    problems = validate_environment(spec)
    if problems:
        raise RolloutError(f"environment {spec.slug!r} is invalid", problems=problems)
    probe = build_runtime(spec, 0)
    tool_specs = [t.model_dump() for t in probe.tool_specs()]
    clash = sorted({t["name"] for t in tool_specs} & RESERVED)
    if clash:
        raise RolloutError(f"tool name(s) {clash} collide with NeMo Gym's own routes")
    sessions: dict[str, _Session] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        try:
            yield
        finally:  # open sessions and the probe release their temp dirs / plugin hosts
            for sid in list(sessions):
                await end(sid)
            await probe.close()

    app = FastAPI(title=f"rollout env {spec.slug} (NeMo Gym resources server)", lifespan=lifespan)

    def session_of(request: Request) -> _Session:
        sid = request.cookies.get(SESSION_COOKIE)
        session = sessions.get(sid or "")
        if session is None:
            raise HTTPException(400, "no session: POST /seed_session first (and keep its cookie)")
        return session

    async def end(sid: str) -> None:
        session = sessions.pop(sid, None)
        if session is not None:
            await session.runtime.close()

    @app.post("/seed_session")
    async def seed_session(body: SeedSession, request: Request, response: Response) -> dict:
        """Start a rollout on one task (by index or id; task 0 when none is named)."""
        old = request.cookies.get(SESSION_COOKIE)
        if old:
            await end(old)
        if len(sessions) >= max_sessions:
            raise HTTPException(503, f"too many open sessions ({max_sessions})")
        try:
            index = _pick_task(spec, body.task, 0, None)
            runtime = build_runtime(spec, index)
            tools = [t.model_dump() for t in runtime.tool_specs()]
        except RolloutError as exc:
            raise HTTPException(400, exc.message) from None
        sid = secrets.token_urlsafe(24)
        sessions[sid] = _Session(index, runtime)
        response.set_cookie(SESSION_COOKIE, sid, httponly=True, samesite="strict")
        task = spec.tasks[index]
        return {"task_id": task.id, "instruction": task.instruction, "tools": tools}

    @app.post("/verify")
    async def verify(body: VerifyRequest, request: Request) -> dict:
        """Score the session's episode with our verifier; the reward and the breakdown."""
        sid = request.cookies.get(SESSION_COOKIE) or ""
        session = session_of(request)
        try:
            final_state = session.runtime.final_state()
        finally:
            await end(sid)
        trajectory = Trajectory(
            tool_calls=session.calls,
            final_output=output_text(body.response),
            final_state=final_state,
        )
        verdict = await score(spec, session.index, trajectory)
        return {
            **body.model_dump(),
            "reward": verdict.score,
            "verifier": verdict.model_dump(mode="json", by_alias=True),
        }

    @app.post("/close_session")
    async def close_session(request: Request) -> dict:
        """End the session without scoring it."""
        await end(request.cookies.get(SESSION_COOKIE) or "")
        return {}

    async def call(name: str, request: Request, arguments: dict[str, Any]) -> Any:
        session = session_of(request)
        result = await session.runtime.call_tool(name, arguments)
        session.calls.append(
            ToolCallRecord(
                index=len(session.calls),
                name=name,
                arguments=arguments,
                result=result.output,
                error=result.error,
            )
        )
        return {"error": result.error} if result.error is not None else result.output

    for tool in tool_specs:
        # One route per tool, documented in /openapi.json with the tool's own schema.
        def route(name: str = tool["name"]):  # type: ignore[no-untyped-def]
            async def run(request: Request, arguments: dict[str, Any] = Body(default={})) -> Any:  # noqa: B008
                return await call(name, request, arguments)

            return run

        app.add_api_route(
            f"/{tool['name']}",
            route(),
            methods=["POST"],
            summary=tool["description"] or tool["name"],
            operation_id=tool["name"],
            openapi_extra={
                "requestBody": {
                    "content": {"application/json": {"schema": tool["parameters"]}},
                    "required": False,
                }
            },
        )

    @app.post("/{tool_name}")
    async def other_tool(
        tool_name: str,
        request: Request,
        arguments: dict[str, Any] = Body(default={}),  # noqa: B008
    ) -> Any:
        """A tool of this session's task that task 0 does not have (plugin envs may vary)."""
        return await call(tool_name, request, arguments)

    return app


def serve(spec: EnvironmentSpec, sock: socket.socket, on_listening: Callable[[str], None]) -> None:
    """Run the resources server in the foreground (uvicorn) on `sock`; `on_listening(url)` once it accepts connections."""
    # uvicorn only here: the CLI imports this module for every command.
    from rollout.shared.interop.http import run_on

    app = create_app(spec)
    log.info("nemo_gym.serve", slug=spec.slug, address=sock.getsockname())
    run_on(app, sock, on_listening)


# ---------------------------------------------------------------- discover (consume side)
