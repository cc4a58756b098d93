"""KTO, IPO and reward models through TRL on the tiny base: each learns what it is shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from learning_kit import TOOLS, load_model, refund_messages, sequence_logprob

from rollout.errors import RolloutError
from rollout.shared.learning import TrainConfig, dpo_pairs, read_step_log, train_dpo
from rollout.shared.learning.kto import train_kto
from rollout.shared.learning.rm import RM_MARKER, train_rm
from rollout.shared.learning.rm_scoring import RewardScorer


def _bad(order: int) -> list[dict]:
    return refund_messages(order)[:2] + [
        {"role": "assistant", "content": "I cannot help with refunds."}
    ]


def _pairs() -> list[dict]:
    groups = {
        f"task-{order}": [
            {"trajectory": {"messages": refund_messages(order)}, "tools": TOOLS, "score": 1.0},
            {"trajectory": {"messages": _bad(order)}, "tools": TOOLS, "score": 0.0},
        ]
        for order in range(1, 5)
    }
    return dpo_pairs(groups, min_margin=0.5)


def _margin(model_dir: Path, pairs: list[dict]) -> float:
    tokenizer, model = load_model(model_dir)
    total = 0.0
    for p in pairs:
        chosen = sequence_logprob(model, tokenizer, p["prompt"], p["chosen"], p["tools"])
        rejected = sequence_logprob(model, tokenizer, p["prompt"], p["rejected"], p["tools"])
        total += chosen - rejected
    return total / len(pairs)


def test_ipo_is_a_dpo_loss_type_and_raises_the_margin(tiny_base: Path, tmp_path: Path) -> None:
    pairs = _pairs()
    config = TrainConfig(
        method="dpo", loss_type="ipo", max_steps=6, learning_rate=3e-3, batch_size=2, beta=0.1
    )
    result = train_dpo(tiny_base, pairs, tmp_path / "ipo", config, resume=False)
    assert result.steps == 6 and result.final_loss is not None
    assert all(step["loss"] == step["loss"] for step in read_step_log(tmp_path / "ipo"))
    recorded = json.loads((result.model_dir / "rollout_training.json").read_text())
    assert recorded["config"]["loss_type"] == "ipo"
    assert _margin(result.model_dir, pairs) > _margin(tiny_base, pairs) + 3.0


def _kto_examples() -> list[dict]:
    out = []
    for order in range(1, 5):
        good = refund_messages(order)
        out.append({"prompt": good[:2], "completion": good[2:], "label": True, "tools": None})
        out.append({"prompt": good[:2], "completion": _bad(order)[2:], "label": False})
    for row in out:
        row["tools"] = json.dumps(TOOLS)
    return out


def test_kto_moves_towards_passed_and_away_from_failed(tiny_base: Path, tmp_path: Path) -> None:
    config = TrainConfig(method="kto", max_steps=6, learning_rate=3e-3, batch_size=4)
    result = train_kto(tiny_base, _kto_examples(), tmp_path / "kto", config, resume=False)
    assert result.steps == 6
    assert result.final_loss is not None and result.final_loss == result.final_loss
    assert _margin(result.model_dir, _pairs()) > _margin(tiny_base, _pairs()) + 3.0


def test_kto_needs_both_labels(tiny_base: Path, tmp_path: Path) -> None:
    only_good = [e for e in _kto_examples() if e["label"]]
    config = TrainConfig(method="kto", max_steps=1, batch_size=2)
    with pytest.raises(RolloutError, match="every rollout passed"):
        train_kto(tiny_base, only_good, tmp_path / "kto", config)


def test_reward_model_ranks_chosen_above_rejected(tiny_base: Path, tmp_path: Path) -> None:
    pairs = _pairs()
    config = TrainConfig(method="rm", max_steps=8, learning_rate=3e-3, batch_size=2)
    result = train_rm(tiny_base, pairs, tmp_path / "rm", config, resume=False)
    assert result.steps == 8 and result.final_loss is not None
    assert (result.model_dir / RM_MARKER).is_file()
    scorer = RewardScorer(result.model_dir)
    chosen = scorer.score([p["prompt"] + p["chosen"] for p in pairs], tools=TOOLS)
    rejected = scorer.score([p["prompt"] + p["rejected"] for p in pairs], tools=TOOLS)
    assert all(c > r for c, r in zip(chosen, rejected, strict=True)), (chosen, rejected)


def test_reward_scorer_refuses_a_policy(tiny_base: Path) -> None:
    with pytest.raises(RolloutError, match="not a reward model"):
        RewardScorer(tiny_base)
