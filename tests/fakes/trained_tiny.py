"""A scripted *local* model: the tiny LM of `rollout.shared.models.tiny`, overfit in a few
seconds on CPU to answer given prompts with given completions, so hf-backend tests see a real
transformers model produce real tool calls (and malformed ones) under greedy decoding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.shared.models.tiny import IM_END, build_tiny_model


@dataclass
class Lesson:
    """Answer `messages` (with `tools`) with exactly `completion`."""

    messages: list[dict[str, Any]]
    completion: str
    tools: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def train_parrot(
    directory: str | Path, lessons: Sequence[Lesson], *, steps: int = 300, seed: int = 0
) -> Path:
    """Build the tiny model at `directory` and overfit it to `lessons`; return the path."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    corpus = [lesson.completion for lesson in lessons]
    path = build_tiny_model(directory, seed=seed, corpus=corpus, hidden_size=128, layers=2)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rows = []
    for lesson in lessons:
        prompt = tokenizer.apply_chat_template(
            lesson.messages, tools=lesson.tools, add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(lesson.completion + IM_END, add_special_tokens=False)["input_ids"]
        rows.append((prompt_ids + answer_ids, [-100] * len(prompt_ids) + answer_ids))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    # One intra-op thread: on a shared 2-core box, OpenMP threads of a model this small spend
    # most of their time waiting on each other (measured: ~10x slower with 2 threads).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _fit(model, input_ids, mask, labels, steps, seed)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(path)
    return path


def _fit(model: Any, input_ids: Any, mask: Any, labels: Any, steps: int, seed: int) -> None:
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        for _ in range(steps):
            loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if loss.item() < 0.01:
                break
