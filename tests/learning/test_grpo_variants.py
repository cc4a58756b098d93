"""The GRPO family on the tiny model: every variant moves a hand-worked group the right way,
and the off-policy correction bounds an update from logprobs the learner disagrees with."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rollout.errors import RolloutError
from rollout.shared.learning import GRPOLearner, TrainConfig

PROMPT = [{"role": "user", "content": "Pick one."}]


def _group(learner: GRPOLearner, logprobs: dict[str, list[float]] | None = None) -> list[dict]:
    """One task, two completions: `yes` rewarded 1.0, `no sir` 0.0 (hand-worked advantages)."""
    completions = []
    for text, reward in (("yes", 1.0), ("no sir", 0.0)):
        ids = learner.tokenizer(text, add_special_tokens=False)["input_ids"]
        completion = {
            "token_ids": [ids],
            "messages": [*PROMPT, {"role": "assistant", "content": text}],
            "reward": reward,
            "policy_version": learner.policy_version,
            "rollout_id": text,
        }
        if logprobs is not None:
            completion["logprobs"] = [logprobs[text]]
        completions.append(completion)
    return [{"prompt": PROMPT, "tools": None, "completions": completions}]


def _sequence_logps(learner: GRPOLearner, groups: list[dict]) -> list[float]:
    """The learner's log-probability of each completion (the rows in group order)."""
    learner.merge_turns = False
    rows, _ = learner._rows(groups)
    batch = learner._tensors(rows)
    with torch.no_grad():
        logp = learner._logprobs(learner.model, batch)
    return [float(v) for v in (logp * batch["mask"]).sum(-1)]


VARIANTS = [
    {"loss_type": "grpo"},
    {"loss_type": "dapo"},
    {"loss_type": "dr_grpo"},
    {"loss_type": "gspo"},
    {"loss_type": "cispo"},
    {"loss_type": "grpo", "advantage": "rloo"},
    {"loss_type": "grpo", "advantage": "reinforce_pp"},
    {"loss_type": "grpo", "aggregation": "sequence"},
    {"loss_type": "dapo", "is_correction": "tis"},
    {"loss_type": "grpo", "is_correction": "mis"},
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
def test_every_variant_raises_the_rewarded_completion_over_the_other(
    tiny_base: Path, tmp_path: Path, variant: dict
) -> None:
    config = TrainConfig(method="grpo", learning_rate=1e-3, beta=0.0, **variant)
    learner = GRPOLearner(tiny_base, tmp_path / "g", config, resume=False)
    groups = _group(learner)
    yes, no = _sequence_logps(learner, groups)
    # On-policy: the actor's logprobs are the learner's own.
    learner.step(_group(learner))
    yes2, no2 = _sequence_logps(learner, groups)
    # Adam's first step moves every weight by about lr along the sign of the advantage-weighted
    # gradient, so to first order the rewarded sequence gains on the other, whatever variant.
    assert (yes2 - no2) > (yes - no), (variant, yes, no, yes2, no2)
    assert learner.policy_version == 1
    assert learner.metrics["last_mismatch_kl"] == pytest.approx(0.0, abs=1e-6)


def _grad_norm(learner: GRPOLearner, groups: list[dict]) -> tuple[float, dict[str, float]]:
    learner.optimizer.zero_grad(set_to_none=True)
    rows, _ = learner._rows(groups)
    _, stats = learner._accumulate(rows)
    norm = sum(float((p.grad**2).sum()) for p in learner._params if p.grad is not None) ** 0.5
    return norm, stats


@pytest.mark.parametrize("loss_type", ["grpo", "cispo"])
def test_the_correction_bounds_an_update_from_logprobs_the_learner_disagrees_with(
    tiny_base: Path, tmp_path: Path, loss_type: str
) -> None:
    norms, stats = {}, {}
    for correction in ("none", "tis", "mis"):
        extra = {} if correction == "none" else {"is_correction": correction, "is_cap": 2.0}
        config = TrainConfig(method="grpo", beta=0.0, loss_type=loss_type, **extra)
        learner = GRPOLearner(tiny_base, tmp_path / correction, config, resume=False)
        learner.merge_turns = False
        # The "actor" recorded every token 4 nats less likely than the learner finds it (a
        # broken engine or a very stale policy): importance ratios of e^4, about 55.
        honest = _sequence_logps_per_token(learner, _group(learner))
        skewed = {text: [lp - 4.0 for lp in lps] for text, lps in honest.items()}
        norms[correction], stats[correction] = _grad_norm(learner, _group(learner, skewed))
        if correction == "none":
            # Per token, as the viewer shows it: the learner is 4 nats above the actor, the
            # ratio e^4; the rewarded sample's ratio is outside 1 + epsilon: clipped.
            learner.optimizer.zero_grad(set_to_none=True)
            learner._accumulate(learner._rows(_group(learner, skewed))[0])
            yes = learner.last_signals["yes"]["0"]
            assert yes["gap"] == pytest.approx([4.0] * len(yes["gap"]), abs=1e-3)
            assert yes["ratio"] == pytest.approx([torch.e**4] * len(yes["gap"]), rel=1e-3)
            assert yes["advantage"][0] > 0 and set(yes["clipped"]) == {1}
    for s in stats.values():  # the gap is measured the same whatever corrects it
        assert s["last_max_is_ratio"] == pytest.approx(torch.e**4, rel=1e-3)
        assert s["last_mismatch_kl"] == pytest.approx(torch.e**4 - 1 - 4, rel=1e-3)
        assert s["last_is_outside_fraction"] == 1.0
    # MIS masks every token: nothing moves. TIS caps each weight at 2: the gradient is that of
    # an on-policy step times 2 at most, far below the uncorrected one's for the punished
    # sample (ratio 55 kept by the min for a negative advantage).
    assert norms["mis"] == 0.0
    assert 0 < norms["tis"]
    if loss_type == "grpo":
        assert norms["tis"] * 10 < norms["none"], norms


def _sequence_logps_per_token(learner: GRPOLearner, groups: list[dict]) -> dict[str, list[float]]:
    rows, _ = learner._rows(groups)
    batch = learner._tensors(rows)
    with torch.no_grad():
        logp = learner._logprobs(learner.model, batch)
    out = {}
    for i, (text, row) in enumerate(zip(("yes", "no sir"), rows, strict=True)):
        first = len(row.context) - 1
        out[text] = [float(v) for v in logp[i, first : first + len(row.completion)]]
    return out


def test_bad_combinations_are_refused_naming_the_setting() -> None:
    bad = [
        ({"loss_type": "dr_grpo", "aggregation": "token"}, "aggregation: dr_grpo"),
        ({"loss_type": "gspo", "aggregation": "token"}, "aggregation: gspo"),
        ({"loss_type": "cispo", "epsilon": 0.2}, "epsilon: cispo"),
        ({"epsilon": 0.3, "epsilon_high": 0.2}, "epsilon_high: 0.2 is below epsilon 0.3"),
        ({"is_cap": 2.0}, "is_cap: only with is_correction tis or mis"),
        ({"overlong_buffer": 300, "max_tokens": 256}, "overlong_buffer: 300 must be below"),
        ({"loss_type": "ppo"}, "loss_type"),
    ]
    for settings, expected in bad:
        with pytest.raises(RolloutError) as refused:
            TrainConfig.from_user({"method": "grpo", **settings})
        assert any(expected in p for p in refused.value.problems), refused.value.problems
    ok = TrainConfig.from_user(
        {"method": "grpo", "loss_type": "dapo", "dynamic_sampling": True, "overlong_buffer": 64}
    )
    assert ok.loss_type == "dapo" and ok.dynamic_sampling


def test_the_overlong_penalty_lowers_a_long_completions_reward(
    tiny_base: Path, tmp_path: Path
) -> None:
    config = TrainConfig(method="grpo", beta=0.0, max_tokens=4, overlong_buffer=2)
    learner = GRPOLearner(tiny_base, tmp_path / "g", config, resume=False)
    learner.merge_turns = False
    groups = _group(learner)
    # Both completions rewarded alike: no signal, unless the long one is penalised.
    for c in groups[0]["completions"]:
        c["reward"] = 1.0
    long_ids = groups[0]["completions"][1]["token_ids"][0]
    groups[0]["completions"][1]["token_ids"] = [(long_ids * 4)[:4]]  # 4 tokens: at the cap
    rows, _ = learner._rows(groups)
    assert learner.metrics["overlong_penalised"] == 1
    assert [r.advantage > 0 for r in rows] == [True, False]
