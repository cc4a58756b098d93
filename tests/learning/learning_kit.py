"""Helpers shared by the learning tests: small agent conversations and model scoring."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order",
            "description": "Read an order by id.",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "refund",
            "description": "Issue a refund.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
            },
        },
    },
]
SYSTEM = "You are a support agent."


def call(i: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped tool call with raw JSON text arguments, as the agent loop records it."""
    return {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, separators=(",", ":"))},
    }


def refund_messages(order: int) -> list[dict[str, Any]]:
    """A correct two-tool-call refund conversation for order `order`."""
    oid, amount = f"O-{order}", 20 * order + 5
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Please refund order {oid} in full."},
        {"role": "assistant", "content": None, "tool_calls": [call(0, "get_order", {"id": oid})]},
        {
            "role": "tool",
            "tool_call_id": "call_0",
            "name": "get_order",
            "content": json.dumps({"id": oid, "amount": amount}),
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call(1, "refund", {"order_id": oid, "amount": amount})],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "refund", "content": '{"ok": true}'},
        {"role": "assistant", "content": f"Refunded {oid}."},
    ]


def refund_rollouts(orders: range = range(1, 5)) -> list[dict[str, Any]]:
    """Rollouts as the platform stores them: trajectory dict + tools."""
    return [{"trajectory": {"messages": refund_messages(o)}, "tools": TOOLS} for o in orders]


def corpus() -> list[str]:
    """Tokenizer corpus so the tiny BPE has merges for these conversations."""
    return [json.dumps(refund_messages(o)) for o in range(1, 5)] + [json.dumps(TOOLS)]


def weights(model_dir: Path) -> dict[str, Any]:
    """Every tensor of a saved model dir."""
    from safetensors.torch import load_file

    return load_file(str(Path(model_dir) / "model.safetensors"))


def sequence_logprob(model: Any, tokenizer: Any, prompt: list, reply: list, tools: Any) -> float:
    """Sum of log-probs of the `reply` messages' tokens after `prompt` (what DPO compares)."""
    import torch

    tools = json.loads(tools) if isinstance(tools, str) else tools
    head = tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(prompt + reply, tools=tools)
    head = _ids(head)
    full = _ids(full)
    assert full[: len(head)] == head
    ids = torch.tensor([full])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    return float(logp[len(head) - 1 :].sum())


def _ids(encoded: Any) -> list[int]:
    if isinstance(encoded, dict) or hasattr(encoded, "keys"):
        return list(encoded["input_ids"])
    return list(encoded)


def load_model(path: Path) -> tuple[Any, Any]:
    """(tokenizer, model) in float32 eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return tokenizer, model
