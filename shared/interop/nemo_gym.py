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
import time
from collections.abc import AsyncIterator
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field

from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.contracts.trajectory import ToolCallRecord, Trajectory
from rollout.shared.errors import RolloutError

log = structlog.get_logger(__name__)

SESSION_COOKIE = "rollout_gym_session"
RESERVED = frozenset(
    {"seed_session", "verify", "close_session", "aggregate_metrics", "sandbox_access", "mcp"}
)
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


def output_text(response: dict[str, Any]) -> str | None:
    """The final assistant text of a Responses API response (its last output message)."""
    text = None
    for item in response.get("output") or []:
        if isinstance(item, dict) and item.get("type") == "message":
            parts = [
                p.get("text", "")
                for p in item.get("content") or []
                if isinstance(p, dict) and p.get("type") == "output_text"
            ]
            text = "".join(parts)
    return text


def responses_payload(
    instruction: str,
    tools: list[dict[str, Any]],
    calls: list[ToolCallRecord],
    answer: str | None,
    model: str = "rollout",
) -> dict[str, Any]:
    """`responses_create_params` and `response` for `/verify`, valid as OpenAI's models."""
    from openai.types.responses import Response
    from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming

    output: list[dict[str, Any]] = []
    for call in calls:
        call_id = f"call_{call.index}"
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{call.index}",
                "call_id": call_id,
                "name": call.name,
                "arguments": _json(call.arguments),
                "status": "completed",
            }
        )
        result = {"error": call.error} if call.error else call.result
        output.append({"type": "function_call_output", "call_id": call_id, "output": _json(result)})
    if answer is not None:
        output.append(
            {
                "type": "message",
                "id": "msg_final",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": answer, "annotations": []}],
            }
        )
    function_tools = [
        {
            "type": "function",
            "name": t["name"],
            "description": t.get("description") or "",
            "parameters": t.get("parameters") or {"type": "object", "properties": {}},
            "strict": False,
        }
        for t in tools
    ]
    params: ResponseCreateParamsNonStreaming = {
        "input": [{"role": "user", "content": instruction}],
        "tools": function_tools,  # type: ignore[typeddict-item]
    }
    # Checked against OpenAI's Responses models; `function_call_output` items are NeMo Gym's own
    # addition to a response's output (NeMoGymFunctionCallOutput), so they skip that check.
    response = Response.model_validate(
        {
            "id": f"resp_{secrets.token_hex(8)}",
            "object": "response",
            "created_at": time.time(),
            "model": model,
            "output": [i for i in output if i["type"] != "function_call_output"],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": function_tools,
        }
    ).model_dump(mode="json", exclude_none=True)
    response["output"] = output
    return {"responses_create_params": dict(params), "response": response}


def _json(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value, default=str)


# ---------------------------------------------------------------- serve


class _Session:
    def __init__(self, index: int, runtime: Any) -> None:
        self.index = index
        self.runtime = runtime
        self.calls: list[ToolCallRecord] = []


def create_app(spec: EnvironmentSpec, *, max_sessions: int = DEFAULT_MAX_SESSIONS) -> Any:
    """A FastAPI app serving `spec` as a NeMo Gym resources server (validated first)."""
    from fastapi import Body, FastAPI, HTTPException, Request, Response

    from rollout.shared.envs.engine import build_runtime, score
    from rollout.shared.envs.validation import validate_environment
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


def serve(spec: EnvironmentSpec, *, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the resources server in the foreground (uvicorn)."""
    import uvicorn

    app = create_app(spec)
    log.info("nemo_gym.serve", slug=spec.slug, host=host, port=port)
    uvicorn.run(app, host=host, port=port, log_level="warning")


# ---------------------------------------------------------------- discover (consume side)


def discover_tools(openapi: dict[str, Any]) -> list[dict[str, Any]]:
    """Tools from a resources server's /openapi.json: every POST route but NeMo Gym's own."""
    schemas = (openapi.get("components") or {}).get("schemas") or {}
    tools = []
    for path, item in sorted((openapi.get("paths") or {}).items()):
        name = path.strip("/")
        post = item.get("post") if isinstance(item, dict) else None
        if not post or not name or "/" in name or "{" in name or name in RESERVED:
            continue
        body = (post.get("requestBody") or {}).get("content", {}).get("application/json", {})
        schema = body.get("schema") or {"type": "object", "properties": {}}
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            schema = schemas.get(ref.rsplit("/", 1)[-1]) or {"type": "object", "properties": {}}
        params = {
            "type": "object",
            "properties": dict(schema.get("properties") or {}),
        }
        if schema.get("required"):
            params["required"] = list(schema["required"])
        tools.append(
            {
                "name": name,
                "description": str(post.get("description") or post.get("summary") or ""),
                "parameters": params,
            }
        )
    return tools
