"""NeMo Gym's resources-server wire shapes: what the `nemo_gym` template sends and reads.

The server side (shared/interop/nemo_gym.py) serves a rollout env with the same shapes.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from rollout.shared.contracts.trajectory import ToolCallRecord

RESERVED = frozenset(
    {"seed_session", "verify", "close_session", "aggregate_metrics", "sandbox_access", "mcp"}
)


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

    return value if isinstance(value, str) else json.dumps(value, default=str)


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
