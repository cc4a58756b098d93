"""Supervised fine-tuning on agent conversations with TRL's SFTTrainer, assistant tokens only."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout.shared.errors import RolloutError
from rollout.shared.learning.config import TrainConfig, TrainResult
from rollout.shared.learning.trl_job import CheckpointHook, ProgressHook, run_trl


def train_sft(
    base_model: Path,
    examples: Sequence[dict[str, Any]],
    out_dir: Path,
    config: TrainConfig,
    *,
    on_progress: ProgressHook | None = None,
    on_checkpoint: CheckpointHook | None = None,
    resume: bool = True,
) -> TrainResult:
    """Fine-tune `base_model` on `{"messages", "tools"}` chats; loss on assistant tokens only.

    The loss mask comes from the chat template's `{% generation %}` markers (TRL's
    `assistant_only_loss`): system, user and tool-result tokens are context, never targets.
    """
    rows = _validated(examples)

    return run_trl(
        method="sft",
        base_model=Path(base_model),
        rows=rows,
        out_dir=Path(out_dir),
        config=config,
        build_trainer=sft_trainer,
        on_progress=on_progress,
        on_checkpoint=on_checkpoint,
        resume=resume,
    )


def sft_trainer(
    model: Any, tokenizer: Any, dataset: Any, kw: dict[str, Any], callbacks: list, peft: Any
) -> Any:
    """The TRL SFTTrainer train_sft runs (assistant-only loss from the template's markers)."""
    from trl import SFTConfig, SFTTrainer

    check_lengths(tokenizer, dataset, kw.get("max_length"))

    with warnings.catch_warnings():
        # transformers flags TRL's own argument names as deprecated: not actionable here.
        warnings.simplefilter("ignore", FutureWarning)
        args = SFTConfig(**kw, assistant_only_loss=True, packing=False)
    return SFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=peft,
    )


def rendered_length(tokenizer: Any, example: dict[str, Any]) -> int:
    """Tokens of one chat example as TRL renders it for SFT (chat template, tools)."""
    tools = example.get("tools")
    ids = tokenizer.apply_chat_template(
        example["messages"],
        tools=json.loads(tools) if isinstance(tools, str) else tools,
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    return len(ids)


def check_lengths(tokenizer: Any, examples: Any, max_length: int | None) -> None:
    """Refuse examples longer than `max_length`: TRL would cut their ends off silently.

    The end of a multi-turn chat holds its last tool call and the final answer, the turns that
    teach a model to finish: cut, the model learns the first call and never to stop (issue 20).
    """
    if not max_length:
        return
    lengths = [rendered_length(tokenizer, example) for example in examples]
    over = [(i, n) for i, n in enumerate(lengths) if n > max_length]
    if not over:
        return
    worst, longest = max(over, key=lambda item: item[1])
    raise RolloutError(
        f"sft: max_seq_len {max_length} is shorter than {len(over)} of {len(lengths)} "
        f"examples (longest: examples[{worst}], {longest} tokens); their ends, with the last "
        "assistant turns, would not be trained",
        problems=[f"max_seq_len: raise it to at least {longest}, or train on shorter chats"],
    )


def _validated(examples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    if not examples:
        raise RolloutError(
            "sft: no training examples (SFT needs rollouts with at least one assistant turn; "
            "does the run have passing rollouts?)"
        )
    rows = []
    for i, example in enumerate(examples):
        messages = example.get("messages") if isinstance(example, dict) else None
        if not isinstance(messages, list) or not messages:
            raise RolloutError(f"sft: examples[{i}].messages: missing or empty")
        if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages):
            raise RolloutError(f"sft: examples[{i}].messages: no assistant turn to learn from")
        rows.append({"messages": messages, "tools": example.get("tools")})
    return rows
