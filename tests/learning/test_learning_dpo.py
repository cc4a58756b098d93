"""DPO through TRL: the trained policy prefers the chosen reply more than the base did."""

from __future__ import annotations

from pathlib import Path

from learning_kit import TOOLS, load_model, refund_messages, sequence_logprob

from rollout.shared.learning import TrainConfig, dpo_pairs, train_dpo


def test_dpo_raises_the_chosen_over_rejected_margin(tiny_base: Path, tmp_path: Path) -> None:
    groups = {}
    for order in range(1, 5):
        good = refund_messages(order)
        bad = good[:2] + [{"role": "assistant", "content": "I cannot help with refunds."}]
        groups[f"task-{order}"] = [
            {"trajectory": {"messages": good}, "tools": TOOLS, "score": 1.0},
            {"trajectory": {"messages": bad}, "tools": TOOLS, "score": 0.0},
        ]
    pairs = dpo_pairs(groups, min_margin=0.5)
    assert len(pairs) == 4
    config = TrainConfig(method="dpo", max_steps=6, learning_rate=3e-3, batch_size=2, beta=0.1)
    result = train_dpo(tiny_base, pairs, tmp_path / "dpo", config, resume=False)
    assert result.steps == 6
    assert result.metrics["rewards/margins"] > 0

    def margin(model_dir: Path) -> float:
        tokenizer, model = load_model(model_dir)
        total = 0.0
        for p in pairs:
            chosen = sequence_logprob(model, tokenizer, p["prompt"], p["chosen"], p["tools"])
            rejected = sequence_logprob(model, tokenizer, p["prompt"], p["rejected"], p["tools"])
            total += chosen - rejected
        return total / len(pairs)

    before, after = margin(tiny_base), margin(result.model_dir)
    assert after > before + 5.0, (before, after)
