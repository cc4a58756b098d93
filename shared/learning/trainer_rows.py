"""Training sets in the shapes the trainers take: SFT rows, DPO pairs, KTO examples."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollout.shared.learning.data import conversation, sft_examples, tools_json


@dataclass
class TrainingSet:
    """A buffer answer: its items, their aligned metadata, and the buffer's counts."""

    items: list[dict[str, Any]]
    meta: list[dict[str, Any]]
    stats: dict[str, float] = field(default_factory=dict)


def as_rollout(messages: list[dict[str, Any]], tools: Any) -> dict[str, Any]:
    """A buffer conversation in the shape shared.learning.data normalises (a rollout)."""
    return {"trajectory": {"messages": messages}, "tools": tools or None}


def sft_rows(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """SFT examples as the trainer takes them (conversations normalised, tools as JSON)."""
    return sft_examples([as_rollout(e["messages"], e.get("tools")) for e in examples])


def dpo_rows(pairs: TrainingSet) -> list[dict[str, Any]]:
    """DPO pairs as the trainer takes them: normalised prompt/chosen/rejected, tools, margin."""
    rows = []
    for i, (pair, meta) in enumerate(zip(pairs.items, pairs.meta, strict=True)):
        cut = len(pair["prompt"])
        where = f"dpo_pairs[{i}]"
        chosen = conversation(as_rollout(pair["prompt"] + pair["chosen"], None), where=where)
        rejected = conversation(as_rollout(pair["prompt"] + pair["rejected"], None), where=where)
        rows.append(
            {
                "prompt": chosen[:cut],
                "chosen": chosen[cut:],
                "rejected": rejected[cut:],
                "tools": tools_json(pair.get("tools") or None),
                "margin": float(meta.get("margin", 0.0)),
            }
        )
    return rows


def kto_rows(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One unpaired KTO example per rollout: prompt, completion, label (= passed), tools."""
    rows = []
    for g, group in enumerate(groups):
        cut = len(group["prompt"])
        for c, completion in enumerate(group["completions"]):
            where = f"labelled[{g}].completions[{c}]"
            messages = conversation(
                as_rollout(group["prompt"] + completion["messages"], None), where=where
            )
            rows.append(
                {
                    "prompt": messages[:cut],
                    "completion": messages[cut:],
                    "label": bool(completion["passed"]),
                    "tools": tools_json(group.get("tools") or None),
                }
            )
    return rows
