"""The online learners' forward: the shared prompt prefix once, the same numbers as a plain one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from learning_kit import SYSTEM, TOOLS
from trl.trainer.utils import selective_log_softmax

from rollout.shared.learning import GRPOLearner, TrainConfig
from rollout.shared.learning.forward import ForwardStats, completion_forward
from rollout.shared.learning.grpo import _Row, merge_turns


def _rows(learner: GRPOLearner) -> list[_Row]:
    # Different user turns after one system message and tool list, completions of different
    # lengths: the shape of a GRPO step's rows (two tasks, two samples each).
    rows = []
    for i, (user, n) in enumerate(
        [("refund O-1", 5), ("refund O-1", 9), ("where is my parcel O-22?", 3), ("hi", 7)]
    ):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
        context = learner._context_ids(messages, TOOLS)
        completion = [(17 * i + 3 * k) % 50 + 5 for k in range(n)]
        rows.append(_Row(context, completion, None, advantage=1.0 - i / 2))
    return rows


def _plain(model: object, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    out = model(
        input_ids=batch["ids"], attention_mask=batch["attention"], output_hidden_states=True
    )
    logp = selective_log_softmax(out.logits[:, :-1].float(), batch["ids"][:, 1:])
    return logp, out.hidden_states[-1][:, :-1]


@pytest.mark.parametrize("lora", [True, False])
def test_shared_prefix_forward_equals_the_plain_one(
    tiny_base: Path, tmp_path: Path, lora: bool
) -> None:
    learner = GRPOLearner(
        tiny_base, tmp_path / "out", TrainConfig(method="grpo", lora=lora, max_seq_len=4096)
    )
    # A LoRA adapter starts as a no-op (B = 0): move it off zero so it shapes the numbers.
    with torch.no_grad():
        for p in learner._params:
            p.add_(0.01 * torch.randn_like(p))
    rows = _rows(learner)
    batch = learner._tensors(rows)
    mask = batch["mask"]
    assert batch["shared"] >= 16, "the rows share their system message and tool list"
    assert batch["shared"] <= batch["first"]
    weights = torch.randn(mask.shape, device=mask.device)

    def grads(logp: torch.Tensor, states: torch.Tensor) -> list[torch.Tensor]:
        learner.optimizer.zero_grad(set_to_none=True)
        ((logp * weights + states.sum(-1) * 1e-3) * mask).sum().backward()
        return [p.grad.clone() for p in learner._params]

    plain_logp, plain_states = _plain(learner.model, batch)
    plain_grads = grads(plain_logp, plain_states)
    stats = ForwardStats()
    logp, states = completion_forward(learner.model, batch, hidden=True, stats=stats)
    ours = grads(logp, states)

    on = mask.bool()
    assert torch.allclose(logp[on], plain_logp[on], atol=1e-5)
    assert torch.allclose(states[on], plain_states[on], atol=1e-5)
    for a, b in zip(ours, plain_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    width = batch["ids"].shape[1]
    assert stats.shared_prefix == batch["shared"]
    assert stats.tail_width == width - batch["shared"]
    assert stats.logit_positions == len(rows) * (width - 1 - batch["first"])


def test_rows_without_a_common_prefix_take_the_plain_forward(
    tiny_base: Path, tmp_path: Path
) -> None:
    learner = GRPOLearner(tiny_base, tmp_path / "out", TrainConfig(method="grpo", lora=True))
    rows = [_Row([5, 6, 7, 8], [9, 10], None, 1.0), _Row([11, 6, 7], [9], None, -1.0)]
    batch = learner._tensors(rows)
    assert batch["shared"] == 0
    plain, _ = _plain(learner.model, batch)
    logp, _ = completion_forward(learner.model, batch)
    on = batch["mask"].bool()
    assert torch.allclose(logp[on], plain[on], atol=1e-5)


def _two_turn_rows(learner: GRPOLearner) -> list[_Row]:
    # Two completions of one prompt, two turns each: turn 2's context is turn 1's context,
    # its sampled tokens and a tool reply, as the hf backend renders a conversation.
    rows = []
    for c, advantage in enumerate([1.0, -1.0]):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "go"}]
        context = learner._context_ids(messages, TOOLS)
        first = [11 + c, 12, 13, 14]
        reply = [20, 21, 22 + c]
        second = [30, 31 + c]
        old1 = [-0.5 - 0.1 * k for k in range(len(first))]
        old2 = [-0.7, -0.9]
        rows.append(_Row(context, first, old1, advantage))
        rows.append(_Row(context + first + reply, second, old2, advantage))
    return rows


def test_merged_turns_give_the_separate_turns_loss_and_gradients(
    tiny_base: Path, tmp_path: Path
) -> None:
    learner = GRPOLearner(
        tiny_base, tmp_path / "out", TrainConfig(method="grpo", beta=0.0, max_seq_len=4096)
    )
    rows = _two_turn_rows(learner)
    merged = merge_turns(rows)
    assert len(merged) == 2
    assert merged[0].trained == [True] * 4 + [False] * 3 + [True] * 2
    assert merged[0].trained_tokens == 6 and merged[0].old_logprobs[4:7] == [0.0] * 3

    def run(batch: list[_Row]) -> tuple[float, dict, list[torch.Tensor]]:
        learner.optimizer.zero_grad(set_to_none=True)
        loss, stats = learner._accumulate(batch)
        return loss, stats, [p.grad.clone() for p in learner._params]

    loss_a, stats_a, grads_a = run(rows)
    loss_b, stats_b, grads_b = run(merged)
    assert loss_b == pytest.approx(loss_a, abs=1e-6)
    assert stats_b["last_tokens"] == stats_a["last_tokens"] == 12
    assert stats_b["last_logprob_drift"] == pytest.approx(stats_a["last_logprob_drift"], 1e-5)
    for a, b in zip(grads_a, grads_b, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_turns_that_do_not_continue_each_other_stay_apart() -> None:
    first = _Row([1, 2, 3], [4, 5], None, 1.0)
    assert len(merge_turns([first, _Row([1, 2, 3, 4, 9, 7], [8], None, 1.0)])) == 2
    assert len(merge_turns([first, _Row([1, 2, 3, 4, 5, 7], [8], None, -1.0)])) == 2
    assert len(merge_turns([first, _Row([1, 2, 3, 4, 5, 7], [8], [-1.0], 1.0)])) == 2
    [one] = merge_turns([first, _Row([1, 2, 3, 4, 5, 7], [8], None, 1.0)])
    assert one.completion == [4, 5, 7, 8] and one.trained == [True, True, False, True]
