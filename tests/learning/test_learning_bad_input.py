"""Bad input gets a RolloutError that says what is wrong, before any training starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from learning_kit import refund_rollouts

from rollout.errors import RolloutError
from rollout.shared.learning import (
    GRPOLearner,
    TrainConfig,
    sft_examples,
    train_dpo,
    train_sft,
)

SFT = TrainConfig(method="sft", max_steps=1)


def test_no_examples(tiny_base: Path, tmp_path: Path) -> None:
    with pytest.raises(RolloutError, match="sft: no training examples"):
        train_sft(tiny_base, [], tmp_path / "o", SFT)
    with pytest.raises(RolloutError, match="dpo: no preference pairs"):
        train_dpo(tiny_base, [], tmp_path / "o", TrainConfig(method="dpo"))
    assert not (tmp_path / "o").exists()  # nothing half-created


def test_example_without_an_assistant_turn(tiny_base: Path, tmp_path: Path) -> None:
    examples = [{"messages": [{"role": "user", "content": "hi"}]}]
    with pytest.raises(RolloutError, match=r"examples\[0\].messages: no assistant turn"):
        train_sft(tiny_base, examples, tmp_path / "o", SFT)


def test_unknown_method() -> None:
    with pytest.raises(RolloutError) as err:
        TrainConfig.from_user({"method": "xyz", "epochs": 1})
    assert err.value.problems == [
        "hyperparams.method: must be one of sft, dpo, kto, rm, grpo, ppo, opd (got 'xyz')"
    ]


@pytest.mark.parametrize("kind", ["missing", "empty", "garbage"])
def test_base_model_that_cannot_be_loaded(tmp_path: Path, kind: str) -> None:
    base = tmp_path / "base"
    if kind != "missing":
        base.mkdir()
    if kind == "garbage":
        (base / "config.json").write_text("{not json")
    examples = sft_examples(refund_rollouts())
    expected = "no model directory" if kind == "missing" else "cannot load a causal LM"
    with pytest.raises(RolloutError, match=f"base_model: {expected}"):
        train_sft(base, examples, tmp_path / "o", SFT)
    with pytest.raises(RolloutError, match=f"base_model: {expected}"):
        GRPOLearner(base, tmp_path / "g", TrainConfig(method="grpo"))
    assert not (tmp_path / "o").exists() and not (tmp_path / "g").exists()


def test_call_arguments_nested_past_the_recursion_limit_stay_text() -> None:
    from rollout.shared.learning.data import conversation

    # The loop refuses such a call, but its text stays in the conversation: json.loads raised
    # RecursionError (no ValueError) there, failing the dataset of the whole run.
    deep = "[" * 5000 + "]" * 5000
    call = {"id": "c0", "type": "function", "function": {"name": "refund", "arguments": deep}}
    messages = [
        {"role": "user", "content": "Refund O-1"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    [_, assistant] = conversation({"trajectory": {"messages": messages}})
    assert assistant["tool_calls"][0]["function"]["arguments"] == deep
