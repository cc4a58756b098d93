"""Training precision: ROLLOUT_TRAIN_PRECISION, bf16 autocast forwards over float32 weights.

bf16 is asked for explicitly on the CPU here (torch autocasts there too): the same code path
a CUDA learner takes by default, with float32 master weights, adapter, value head and losses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from learning_kit import refund_rollouts

from rollout.errors import RolloutError
from rollout.shared.learning import (
    GRPOLearner,
    OPDLearner,
    PPOLearner,
    TrainConfig,
    loading,
    read_step_log,
    sft_examples,
    train_sft,
)
from rollout.shared.learning.loading import autocast, load_base, precision
from rollout.shared.learning.sft import sft_trainer
from rollout.shared.learning.trl_job import trl_kwargs

PROMPT = [{"role": "user", "content": "Pick one."}]
TEXTS = ("yes", "no sir", "maybe so", "never")


def _groups(learner: GRPOLearner) -> list[dict]:
    """Hand-given completions of PROMPT with different rewards: every one has a signal."""
    completions = []
    for reward, text in enumerate(TEXTS):
        ids = learner.tokenizer(text, add_special_tokens=False)["input_ids"]
        completions.append(
            {
                "token_ids": [ids],
                "messages": [*PROMPT, {"role": "assistant", "content": text}],
                "reward": float(reward),
                "policy_version": learner.policy_version,
            }
        )
    return [{"prompt": PROMPT, "tools": None, "completions": completions}]


def _watch(model: Any) -> list[torch.dtype]:
    """The dtypes of the activations `model`'s first MLP produces, appended per forward."""
    # Not the LM head: TRL's SFT trainer reads its weight directly instead of calling it.
    [mlp] = [m for name, m in model.named_modules() if name.endswith("layers.0.mlp")]
    seen: list[torch.dtype] = []
    mlp.register_forward_hook(lambda _module, _inputs, out: seen.append(out.dtype))
    return seen


def _trainable(learner: GRPOLearner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.model.named_parameters() if p.requires_grad}


# -- the setting ---------------------------------------------------------------------------


def test_precision_parses_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUT_TRAIN_DEVICE", "cpu")
    monkeypatch.delenv("ROLLOUT_TRAIN_PRECISION", raising=False)
    assert precision() == "fp32"  # auto on the CPU
    for value, want in [("auto", "fp32"), (" FP32 ", "fp32"), ("bf16", "bf16"), ("", "fp32")]:
        monkeypatch.setenv("ROLLOUT_TRAIN_PRECISION", value)
        assert precision() == want, value


def test_an_unknown_precision_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, tiny_base: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv("ROLLOUT_TRAIN_PRECISION", "fp16")
    with pytest.raises(RolloutError) as err:
        precision()
    assert "ROLLOUT_TRAIN_PRECISION" in str(err.value)
    assert all(v in str(err.value) for v in ("auto", "fp32", "bf16"))
    # A learner refuses it before loading anything.
    with pytest.raises(RolloutError, match="ROLLOUT_TRAIN_PRECISION"):
        GRPOLearner(tiny_base, tmp_path / "g", TrainConfig(method="grpo"), resume=False)


def test_cuda_precision_follows_the_gpus_bf16_support(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUT_TRAIN_DEVICE", "cuda")
    monkeypatch.setattr(loading, "_cuda_bf16", lambda where: True)
    monkeypatch.setenv("ROLLOUT_TRAIN_PRECISION", "auto")
    assert precision() == "bf16"
    monkeypatch.setattr(loading, "_cuda_bf16", lambda where: False)
    assert precision() == "fp32"
    monkeypatch.setenv("ROLLOUT_TRAIN_PRECISION", "fp32")
    assert precision() == "fp32"
    monkeypatch.setenv("ROLLOUT_TRAIN_PRECISION", "bf16")
    with pytest.raises(RolloutError, match="no native bf16"):
        precision()


def test_autocast_is_a_no_op_in_fp32() -> None:
    with autocast("fp32", "cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast("bf16", "cpu"):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


# -- online learners -----------------------------------------------------------------------


@pytest.mark.parametrize("lora", [True, False])
def test_a_bf16_grpo_step_autocasts_its_forwards_over_float32_weights(
    monkeypatch: pytest.MonkeyPatch, tiny_base: Path, tmp_path: Path, lora: bool
) -> None:
    monkeypatch.setenv("ROLLOUT_TRAIN_PRECISION", "bf16")
    # beta > 0: the reference forward (adapter off, or the frozen copy) runs as well.
    config = TrainConfig(method="grpo", learning_rate=1e-2, beta=0.05, lora=lora)
    learner = GRPOLearner(tiny_base, tmp_path / "g", config, resume=False)
    assert learner.precision == "bf16"
    seen = _watch(learner.model)
    before = _trainable(learner)
    progress = learner.step(_groups(learner))
    assert seen and set(seen) == {torch.bfloat16}
    assert progress.loss is not None and torch.isfinite(torch.tensor(progress.loss))
    assert torch.isfinite(torch.tensor(learner.metrics["last_kl"]))
    after = _trainable(learner)
    assert all(p.dtype == torch.float32 for p in after.values())
    assert any(not torch.equal(before[n], after[n]) for n in before)
    # The log-probs the losses are computed from are float32.
    batch = learner._tensors(learner._rows(_groups(learner))[0])
    with torch.no_grad():
        assert learner._logprobs(learner.model, batch).dtype == torch.float32
    assert learner.metrics["bf16"] == 1.0
    assert read_step_log(tmp_path / "g")[-1]["precision"] == "bf16"


@pytest.mark.parametrize("method", ["grpo", "ppo"])
def test_an_fp32_step_does_not_autocast(
    monkeypatch: pytest.MonkeyPatch, tiny_base: Path, tmp_path: Path, method: str
) -> None:
    monkeypatch.setenv("ROLLOUT_TRAIN_PRECISION", "fp32")
    learner_class, kl = {"grpo": (GRPOLearner, {"beta": 0.05}),
                         "ppo": (PPOLearner, {"kl_coef": 0.05})}[method]  # fmt: skip
    config = TrainConfig(method=method, learning_rate=1e-2, lora=True, **kl)
    learner = learner_class(tiny_base, tmp_path / method, config, resume=False)
    seen = _watch(learner.model)
    learner.step(_groups(learner))
    assert seen and set(seen) == {torch.float32}
    assert learner.metrics["bf16"] == 0.0
    assert read_step_log(tmp_path / method)[-1]["precision"] == "fp32"


def test_a_bf16_ppo_step_keeps_the_value_head_and_values_float32(
    monkeypatch: pytest.MonkeyPatch, tiny_base: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv("ROLLOUT_TRAIN_PRECISION", "bf16")
    config = TrainConfig(method="ppo", learning_rate=1e-2, kl_coef=0.05, lora=True)
    learner = PPOLearner(tiny_base, tmp_path / "p", config, resume=False)
    seen = _watch(learner.model)
    before = _trainable(learner)
    head = [p.detach().clone() for p in learner.value_head.parameters()]
    progress = learner.step(_groups(learner))
    assert seen and set(seen) == {torch.bfloat16}
    assert progress.loss is not None and torch.isfinite(torch.tensor(progress.loss))
    assert torch.isfinite(torch.tensor(learner.metrics["last_value_loss"]))
    after = _trainable(learner)
    assert all(p.dtype == torch.float32 for p in after.values())
    assert any(not torch.equal(before[n], after[n]) for n in before)
    trained_head = list(learner.value_head.parameters())
    assert all(p.dtype == torch.float32 for p in trained_head)
    assert any(not torch.equal(a, b) for a, b in zip(head, trained_head, strict=True))
    batch = learner._tensors(learner._rows(_groups(learner))[0])
    with torch.no_grad():
        logp, values = learner._forward(learner.model, batch)
    assert logp.dtype == values.dtype == torch.float32
    assert learner.metrics["bf16"] == 1.0


def test_a_bf16_opd_step_autocasts_the_teachers_forward_too(
    monkeypatch: pytest.MonkeyPatch, tiny_base: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv("ROLLOUT_TRAIN_PRECISION", "bf16")
    config = TrainConfig(method="opd", teacher=str(tiny_base), learning_rate=1e-2)
    learner = OPDLearner(tiny_base, tmp_path / "o", config, resume=False, teacher=tiny_base)
    student, teacher = _watch(learner.model), _watch(learner.teacher)
    learner.step(_groups(learner))
    assert student and set(student) == {torch.bfloat16}
    assert teacher and set(teacher) == {torch.bfloat16}
    assert torch.isfinite(torch.tensor(learner.metrics["last_reverse_kl"]))


# -- TRL methods -----------------------------------------------------------------------------


def test_trl_arguments_ask_for_bf16_only_in_bf16(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from trl import DPOConfig, KTOConfig, RewardConfig, SFTConfig

    monkeypatch.setenv("ROLLOUT_TRAIN_DEVICE", "cpu")
    config = TrainConfig(method="sft", max_steps=1)
    for value, want in [("auto", False), ("fp32", False), ("bf16", True)]:
        monkeypatch.setenv("ROLLOUT_TRAIN_PRECISION", value)
        kw = trl_kwargs(tmp_path, config)
        # Explicit either way: TRL's configs would default to bf16=True otherwise.
        assert kw["bf16"] is want, value
        for cls in (SFTConfig, DPOConfig, KTOConfig, RewardConfig):
            assert cls(**kw).bf16 is want, (cls.__name__, value)


@pytest.mark.parametrize(("setting", "dtype"), [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_an_sft_step_autocasts_on_the_cpu_only_in_bf16(
    monkeypatch: pytest.MonkeyPatch,
    tiny_base: Path,
    tmp_path: Path,
    setting: str,
    dtype: torch.dtype,
) -> None:
    from datasets import Dataset

    monkeypatch.setenv("ROLLOUT_TRAIN_PRECISION", setting)
    tokenizer, model = load_base(tiny_base)
    seen = _watch(model)
    config = TrainConfig(method="sft", max_steps=1, batch_size=2, learning_rate=1e-3)
    examples = Dataset.from_list(sft_examples(refund_rollouts(range(1, 3))))
    trainer = sft_trainer(model, tokenizer, examples, trl_kwargs(tmp_path, config), [], None)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    output = trainer.train()
    assert torch.isfinite(torch.tensor(output.training_loss))
    assert seen and set(seen) == {dtype}
    params = dict(trainer.model.named_parameters())
    assert all(p.dtype == torch.float32 for p in params.values())
    assert any(not torch.equal(before[n], params[n]) for n in before)


def test_a_trl_run_records_its_precision(
    monkeypatch: pytest.MonkeyPatch, tiny_base: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv("ROLLOUT_TRAIN_PRECISION", "bf16")
    config = TrainConfig(method="sft", max_steps=1, batch_size=2, save_every=10)
    result = train_sft(
        tiny_base, sft_examples(refund_rollouts(range(1, 3))), tmp_path / "s", config
    )
    assert result.metrics["bf16"] == 1.0
