"""Rollouts -> training data: SFT conversations and DPO preference pairs.

A rollout here is `{"trajectory": Trajectory dict, "tools": [OpenAI tool dicts], "score": float}`.
Conversations are normalised to what the `hf` backend renders at inference time: tool-call
arguments become the JSON text the chat template would print for the decoded object, so a
model is trained on exactly the token layout it later sees and samples. Tools travel as one
JSON string per row (TRL decodes it) so datasets of different environments share a schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rollout.shared.errors import RolloutError


def sft_examples(rollouts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One `{"messages", "tools"}` chat example per rollout with at least one assistant turn."""
    examples = []
    for i, rollout in enumerate(rollouts):
        messages = conversation(rollout, where=f"rollouts[{i}]")
        if not any(m["role"] == "assistant" for m in messages):
            continue  # nothing to learn from: the model never spoke
        examples.append({"messages": messages, "tools": tools_json(rollout.get("tools"))})
    return examples


def dpo_pairs(
    groups: Mapping[str, Sequence[Mapping[str, Any]]], min_margin: float = 0.0
) -> list[dict[str, Any]]:
    """Preference pairs per task: best with worst, second best with second worst, ...

    A pair needs a score gap of at least `min_margin` (and > 0) and two different replies
    after their shared prompt. Rows are `{"prompt", "chosen", "rejected", "tools", "margin"}`.
    """
    if min_margin < 0:
        raise RolloutError(f"min_margin must be >= 0, got {min_margin}")
    pairs = []
    for task, rollouts in groups.items():
        scored = []
        for i, rollout in enumerate(rollouts):
            score = rollout.get("score")
            if score is None:
                raise RolloutError(f"groups[{task!r}][{i}]: rollout has no score")
            scored.append((float(score), i, rollout))
        scored.sort(key=lambda item: (-item[0], item[1]))
        lo, hi = 0, len(scored) - 1
        while lo < hi:
            (good, _, chosen), (bad, _, rejected) = scored[lo], scored[hi]
            lo, hi = lo + 1, hi - 1
            margin = good - bad
            if margin <= 0 or margin < min_margin:
                break  # the remaining middle pairs are even closer
            pair = _pair(task, chosen, rejected)
            if pair is not None:
                pairs.append({**pair, "margin": margin})
    return pairs


def preference_rows(pairs: Sequence[Mapping[str, Any]], method: str) -> list[dict[str, Any]]:
    """Checked (prompt, chosen, rejected, tools) rows for the pairwise trainers (DPO, RM)."""
    if not pairs:
        raise RolloutError(
            f"{method}: no preference pairs (needs tasks with rollouts whose scores differ by "
            "at least the minimum margin)"
        )
    rows = []
    for i, pair in enumerate(pairs):
        for key in ("prompt", "chosen", "rejected"):
            value = pair.get(key) if isinstance(pair, Mapping) else None
            if not isinstance(value, list) or not value:
                raise RolloutError(f"{method}: pairs[{i}].{key}: missing or empty message list")
        rows.append(
            {k: pair[k] for k in ("prompt", "chosen", "rejected")} | {"tools": pair.get("tools")}
        )
    return rows


def _pair(
    task: str, chosen: Mapping[str, Any], rejected: Mapping[str, Any]
) -> dict[str, Any] | None:
    good = conversation(chosen, where=f"groups[{task!r}]")
    bad = conversation(rejected, where=f"groups[{task!r}]")
    shared = 0
    while shared < min(len(good), len(bad)) and good[shared] == bad[shared]:
        shared += 1
    # The prompt ends before the first assistant turn that differs: DPO compares replies.
    while shared > 0 and good[shared - 1]["role"] == "assistant":
        shared -= 1
    prompt, chosen_rest, rejected_rest = good[:shared], good[shared:], bad[shared:]
    if not prompt or not chosen_rest or not rejected_rest:
        return None
    if chosen_rest[0]["role"] != "assistant" or rejected_rest[0]["role"] != "assistant":
        return None
    return {
        "prompt": prompt,
        "chosen": chosen_rest,
        "rejected": rejected_rest,
        "tools": tools_json(chosen.get("tools")),
    }


def conversation(rollout: Mapping[str, Any], *, where: str = "rollout") -> list[dict[str, Any]]:
    """The trajectory's messages, normalised for training (see the module docstring)."""
    trajectory = rollout.get("trajectory")
    if hasattr(trajectory, "model_dump"):
        trajectory = trajectory.model_dump()
    if not isinstance(trajectory, Mapping):
        raise RolloutError(f"{where}.trajectory: missing or not an object")
    messages = trajectory.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RolloutError(f"{where}.trajectory.messages: missing or empty")
    return [_message(m, f"{where}.trajectory.messages[{j}]") for j, m in enumerate(messages)]


def _message(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise RolloutError(f"{where}: a message needs a 'role'")
    role = message["role"]
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)
    out: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant" and message.get("tool_calls"):
        out["tool_calls"] = [_call(c) for c in message["tool_calls"]]
    if role == "tool":
        out["tool_call_id"] = message.get("tool_call_id")
        out["name"] = message.get("name")
    return out


def _call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function") or call
    arguments = function.get("arguments", "")
    return {
        "id": str(call.get("id") or ""),
        "type": "function",
        "function": {"name": str(function.get("name") or ""), "arguments": _arguments(arguments)},
    }


def _arguments(arguments: Any) -> str:
    # The hf backend decodes JSON-object argument strings and the template prints them with
    # json.dumps defaults; store that exact text (raw text when it is not a JSON object).
    if isinstance(arguments, Mapping):
        return json.dumps(arguments, ensure_ascii=False)
    text = "" if arguments is None else str(arguments)
    try:
        decoded = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        return text
    return json.dumps(decoded, ensure_ascii=False) if isinstance(decoded, dict) else text


def tools_json(tools: Any) -> str | None:
    """Tools as one JSON string (or None): one dataset column type for every environment."""
    if tools is None or tools == []:
        return None
    if isinstance(tools, str):
        return tools
    return json.dumps(list(tools), ensure_ascii=False)
