"""TrainConfig validation and rollouts -> SFT examples / DPO pairs (no training here)."""

from __future__ import annotations

import json

import pytest
from learning_kit import TOOLS, refund_messages, refund_rollouts

from rollout.errors import RolloutError
from rollout.shared.learning import TrainConfig, dpo_pairs, sft_examples


def test_config_defaults_and_user_values() -> None:
    config = TrainConfig.from_user({"method": "grpo", "learning_rate": 1e-4, "max_staleness": 0})
    assert (config.method, config.learning_rate, config.max_staleness) == ("grpo", 1e-4, 0)
    assert config.group_size == 4 and config.lora is False


def test_each_method_has_its_own_model_and_beta_meaning() -> None:
    from rollout.shared.contracts.training import DpoConfig, GrpoConfig, SftConfig

    assert isinstance(TrainConfig(method="sft"), SftConfig)
    assert isinstance(TrainConfig(method="grpo", beta=0.0), GrpoConfig)
    dpo = TrainConfig.from_user({"method": "dpo", "loss_type": "ipo"})
    assert isinstance(dpo, DpoConfig) and dpo.loss_type == "ipo"
    assert "KL" in GrpoConfig.model_fields["beta"].description
    assert "temperature" in DpoConfig.model_fields["beta"].description
    assert "beta" not in SftConfig.model_fields
    for model in (SftConfig, DpoConfig, GrpoConfig):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} is undocumented"


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (
            {"method": "xyz"},
            "hyperparams.method: must be one of sft, dpo, kto, rm, grpo, ppo, opd (got 'xyz')",
        ),
        ({"method": "sft", "beta": 0.1}, "hyperparams.beta: unknown setting"),
        ({"method": "dpo", "beta": 0}, "hyperparams.beta: must be > 0"),
        (
            {"method": "kto", "batch_size": 1},
            "hyperparams.batch_size: KTO needs at least 2 examples per batch",
        ),
        ({"method": "grpo", "temperature": 3}, "hyperparams.temperature: must be <= 2"),
        ({"method": "sft", "learning_rate": 0}, "hyperparams.learning_rate: must be > 0"),
        ({"method": "sft", "batch_size": 0}, "hyperparams.batch_size: must be >= 1"),
        ({"method": "sft", "lr": 0.1}, "hyperparams.lr: unknown setting"),
        ({}, "hyperparams.method: required"),
    ],
)
def test_config_errors_name_the_field(data: dict, problem: str) -> None:
    with pytest.raises(RolloutError) as err:
        TrainConfig.from_user(data)
    assert problem in err.value.problems


def test_sft_examples_keep_tool_calls_and_results_in_rendered_form() -> None:
    rollouts = refund_rollouts(range(1, 3)) + [
        {"trajectory": {"messages": refund_messages(1)[:2]}, "tools": TOOLS}  # never answered
    ]
    examples = sft_examples(rollouts)
    assert len(examples) == 2
    messages = examples[0]["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    # Compact JSON from the model becomes the text the chat template prints at inference.
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == '{"id": "O-1"}'
    assert messages[3] == {
        "role": "tool",
        "content": '{"id": "O-1", "amount": 25}',
        "tool_call_id": "call_0",
        "name": "get_order",
    }
    assert json.loads(examples[0]["tools"]) == TOOLS


def test_sft_examples_reject_a_rollout_without_messages() -> None:
    with pytest.raises(RolloutError, match=r"rollouts\[0\].trajectory.messages: missing or empty"):
        sft_examples([{"trajectory": {"messages": []}}])


def test_dpo_pairs_best_with_worst_above_the_margin() -> None:
    good = refund_messages(1)
    wrong = good[:2] + [{"role": "assistant", "content": "I cannot help."}]
    half = good[:4] + [{"role": "assistant", "content": "Looked it up."}]
    group = [
        {"trajectory": {"messages": wrong}, "tools": TOOLS, "score": 0.0},
        {"trajectory": {"messages": good}, "tools": TOOLS, "score": 1.0},
        {"trajectory": {"messages": half}, "tools": TOOLS, "score": 0.5},
    ]
    pairs = dpo_pairs({"task-1": group}, min_margin=0.6)
    assert len(pairs) == 1
    pair = pairs[0]
    assert pair["margin"] == 1.0
    assert [m["role"] for m in pair["prompt"]] == ["system", "user"]
    assert pair["chosen"][0]["tool_calls"][0]["function"]["name"] == "get_order"
    assert pair["rejected"] == [{"role": "assistant", "content": "I cannot help."}]
    # Equal scores or a gap below the margin make no pair.
    assert dpo_pairs({"t": group[1:]}, min_margin=0.6) == []
    # The prompt stops before the first differing assistant turn, tool results included.
    [partial] = dpo_pairs({"t": group[1:]}, min_margin=0.1)
    assert [m["role"] for m in partial["prompt"]] == ["system", "user", "assistant", "tool"]


def test_dpo_pairs_need_scores() -> None:
    with pytest.raises(RolloutError, match=r"groups\['t'\]\[0\]: rollout has no score"):
        dpo_pairs({"t": refund_rollouts(range(1, 3))})
