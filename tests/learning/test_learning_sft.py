"""SFT through TRL on the tiny model: loss only on assistant tokens, weights change, loss drops."""

from __future__ import annotations

from pathlib import Path

import torch
from learning_kit import load_model, refund_rollouts, weights

from rollout.shared.learning import Progress, TrainConfig, read_step_log, sft_examples, train_sft
from rollout.shared.learning.loading import load_base
from rollout.shared.learning.sft import sft_trainer
from rollout.shared.learning.trl_job import trl_kwargs
from rollout.shared.models.base import ChatRequest
from rollout.shared.models.hf import HFBackend
from rollout.shared.models.local_models import adapter_base


def test_labels_cover_exactly_the_assistant_turns(tiny_base: Path, tmp_path: Path) -> None:
    from datasets import Dataset

    examples = sft_examples(refund_rollouts(range(1, 2)))
    tokenizer, model = load_base(tiny_base)
    config = TrainConfig(method="sft", max_steps=1)
    trainer = sft_trainer(
        model, tokenizer, Dataset.from_list(examples), trl_kwargs(tmp_path, config), [], None
    )
    row = trainer.train_dataset[0]
    trained = [t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label != -100]
    assert tokenizer.decode(trained) == (
        '<tool_call>\n{"name": "get_order", "arguments": {"id": "O-1"}}\n</tool_call><|im_end|>'
        '<tool_call>\n{"name": "refund", "arguments": {"order_id": "O-1", "amount": 25}}\n'
        "</tool_call><|im_end|>Refunded O-1.<|im_end|>"
    )
    # Labels equal the inputs wherever they are set: next-token targets, nothing else.
    assert all(lab in (-100, t) for t, lab in zip(row["input_ids"], row["labels"], strict=True))


def test_sft_lowers_assistant_loss_and_changes_weights(tiny_base: Path, tmp_path: Path) -> None:
    examples = sft_examples(refund_rollouts())
    seen: list[Progress] = []
    checkpoints: list[int] = []
    config = TrainConfig(
        method="sft", max_steps=12, learning_rate=5e-3, batch_size=2, save_every=6, threads=1
    )
    before = _assistant_loss(tiny_base, examples)
    result = train_sft(
        tiny_base,
        examples,
        tmp_path / "out",
        config,
        on_progress=seen.append,
        on_checkpoint=lambda path, step: checkpoints.append(step) or _assert_dir(path),
        resume=False,
    )
    after = _assistant_loss(result.model_dir, examples)
    assert result.steps == 12
    assert after < before - 1.5, (before, after)
    assert [p.step for p in seen] == list(range(1, 13))
    assert seen[-1].loss < seen[0].loss and seen[-1].tokens_per_s > 0
    assert checkpoints == [6, 12]
    assert [e["step"] for e in read_step_log(tmp_path / "out")] == list(range(1, 13))
    base, trained = weights(tiny_base), weights(result.model_dir)
    assert any(not torch.equal(base[k], trained[k]) for k in base)
    # The trained model is a model the hf backend serves.
    backend = HFBackend(result.model_dir)
    [reply] = backend._generate_all(
        [ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=4, seed=1)]
    )
    assert reply.error is None and reply.token_ids


def test_sft_with_lora_saves_an_adapter_that_loads_onto_its_base(
    tiny_base: Path, tmp_path: Path
) -> None:
    config = TrainConfig(
        method="sft", max_steps=4, learning_rate=5e-3, lora=True, lora_r=4, save_every=2
    )
    before = weights(tiny_base)
    result = train_sft(tiny_base, sft_examples(refund_rollouts()), tmp_path / "o", config)
    # The adapter alone is shipped, naming its base; the base's weights are untouched.
    assert (result.model_dir / "adapter_config.json").exists()
    assert not (result.model_dir / "model.safetensors").exists()
    assert adapter_base(result.model_dir) == f"hf:{tiny_base.resolve()}"
    after = weights(tiny_base)
    assert all(torch.equal(before[k], after[k]) for k in before)
    backend = HFBackend(result.model_dir)  # base + adapter, not merged
    assert backend.adapter_base == f"hf:{tiny_base.resolve()}"
    assert hasattr(backend.model, "peft_config")
    [reply] = backend._generate_all(
        [ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=4, seed=1)]
    )
    assert reply.error is None and reply.token_ids


def _assert_dir(path: Path) -> None:
    assert (path / "trainer_state.json").exists() and (path / "optimizer.pt").exists()


def _assistant_loss(model_dir: Path, examples: list[dict]) -> float:
    import json

    tokenizer, model = load_model(model_dir)
    losses = []
    for example in examples:
        out = tokenizer.apply_chat_template(
            example["messages"],
            tools=json.loads(example["tools"]),
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        ids = torch.tensor([out["input_ids"]])
        mask = torch.tensor(out["assistant_masks"][1:], dtype=torch.bool)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1]
        nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
        losses.append(float(nll[mask].mean()))
    return sum(losses) / len(losses)
