"""Online PPO on the tiny model: GAE, value head, clipped losses, staleness, resume."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from learning_kit import load_model
from test_learning_grpo import _groups, _mean_reward

from rollout.errors import RolloutError
from rollout.shared.learning import (
    GRPOLearner,
    PPOLearner,
    TrainConfig,
    gae,
    load_checkpoint_state,
    read_step_log,
)
from rollout.shared.learning.ppo import VALUE_HEAD
from rollout.shared.models.base import ChatRequest
from rollout.shared.models.hf import HFBackend


def test_gae_matches_a_hand_worked_episode() -> None:
    # gamma 0.9, lambda 0.8, reward 1 at the last of three tokens, values 0.5, 0.4, 0.8:
    #   deltas      t2 = 1 - 0.8 = 0.2,  t1 = 0.9*0.8 - 0.4 = 0.32,  t0 = 0.9*0.4 - 0.5 = -0.14
    #   advantages  A2 = 0.2,  A1 = 0.32 + 0.72*0.2 = 0.464,  A0 = -0.14 + 0.72*0.464 = 0.19408
    advantages, returns = gae([0.0, 0.0, 1.0], [0.5, 0.4, 0.8], gamma=0.9, lam=0.8)
    assert advantages == pytest.approx([0.19408, 0.464, 0.2])
    assert returns == pytest.approx([0.69408, 0.864, 1.0])
    # lambda 1 and gamma 1: the advantage is the reward-to-go minus the value (Monte Carlo).
    advantages, returns = gae([0.1, -0.2, 1.0], [0.3, 0.0, 0.5], gamma=1.0, lam=1.0)
    assert advantages == pytest.approx([0.6, 0.8, 0.5])
    assert returns == pytest.approx([0.9, 0.8, 1.0])


async def test_ppo_raises_mean_reward(tiny_base: Path, tmp_path: Path) -> None:
    config = TrainConfig(method="ppo", learning_rate=2e-2, value_learning_rate=1e-2,
                         batch_size=32, kl_coef=0.0, ppo_epochs=2, max_steps=6)  # fmt: skip
    learner = PPOLearner(tiny_base, tmp_path / "ppo", config, resume=False)
    actor = HFBackend(tiny_base)
    before = _mean_reward(await _groups(actor, 0, seed=10_000))
    for step in range(6):
        groups = await _groups(actor, learner.policy_version, seed=step * 1000)
        progress = learner.step(groups)
        assert progress.step == step + 1 and progress.total_steps == 6
        assert progress.loss is not None and torch.isfinite(torch.tensor(progress.loss))
        # The learner recomputes exactly the logprobs the actor recorded before updating.
        assert learner.metrics["last_logprob_drift"] < 1e-3
        # The same gap as policy.updated reports it: on-policy, noise only.
        assert learner.metrics["last_mismatch_kl"] < 1e-5
        assert learner.metrics["last_is_outside_fraction"] == 0.0
        assert learner.metrics["last_optimizer_steps"] == 2  # ppo_epochs x 1 minibatch
        actor.reload(learner.save())
    after = _mean_reward(await _groups(actor, learner.policy_version, seed=10_000))
    assert learner.policy_version == 6
    assert after > before + 0.2, (before, after)


async def test_value_loss_falls_on_a_fixed_batch(tiny_base: Path, tmp_path: Path) -> None:
    # gamma = lambda = 1 and no KL: the returns are the rewards themselves, fixed targets.
    config = TrainConfig(method="ppo", learning_rate=1e-6, value_learning_rate=3e-3,
                         kl_coef=0.0, gamma=1.0, lam=1.0, max_staleness=64, batch_size=32,
                         value_clip_range=10.0)  # fmt: skip
    learner = PPOLearner(tiny_base, tmp_path / "v", config, resume=False)
    groups = await _groups(HFBackend(tiny_base), 0, seed=3)
    losses = []
    for _ in range(6):
        learner.step(groups)
        losses.append(learner.metrics["last_value_loss"])
    # Adam oscillates a little step to step; the trend is what the critic must show.
    assert max(losses[-2:]) < 0.5 * losses[0], losses


async def test_kl_penalty_is_zero_before_the_policy_moves(tiny_base: Path, tmp_path: Path) -> None:
    config = TrainConfig(method="ppo", learning_rate=5e-2, kl_coef=0.5, max_staleness=4)
    learner = PPOLearner(tiny_base, tmp_path / "k", config, resume=False)
    actor = HFBackend(tiny_base)
    learner.step(await _groups(actor, 0, seed=1))
    assert abs(learner.metrics["last_kl"]) < 1e-4  # behaviour == base on the first step
    actor.reload(learner.save())
    learner.step(await _groups(actor, 1, seed=2))
    assert learner.metrics["last_kl"] > 1e-3  # sampled by a moved policy: KL to the base > 0


async def test_multi_turn_contexts_match_what_the_actor_rendered(
    tiny_base: Path, tmp_path: Path
) -> None:
    actor = HFBackend(tiny_base)
    tools = [{"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}]
    prompt = [{"role": "user", "content": "Use the tool, then answer."}]
    completions = []
    for seed in range(2):
        [first] = await actor.generate(
            [ChatRequest(messages=prompt, tools=tools, max_tokens=6, seed=seed)]
        )
        convo = prompt + [
            first.assistant_message(),
            {"role": "tool", "tool_call_id": "x", "name": "echo", "content": "42"},
        ]
        [second] = await actor.generate(
            [ChatRequest(messages=convo, tools=tools, max_tokens=6, seed=seed + 7)]
        )
        completions.append(
            {
                "token_ids": [first.token_ids, second.token_ids],
                "logprobs": [first.logprobs, second.logprobs],
                "messages": convo + [second.assistant_message()],
                "reward": float(seed),
                "policy_version": 0,
            }
        )
    config = TrainConfig(method="ppo", learning_rate=1e-3, kl_coef=0.05)
    learner = PPOLearner(tiny_base, tmp_path / "p", config, resume=False)
    learner.step([{"prompt": prompt, "tools": tools, "completions": completions}])
    assert learner.metrics["completions_trained"] == 2
    assert learner.metrics["last_tokens"] == sum(
        len(t) for c in completions for t in c["token_ids"]
    )
    assert learner.metrics["last_logprob_drift"] < 1e-3


async def test_stale_completions_are_dropped(tiny_base: Path, tmp_path: Path) -> None:
    config = TrainConfig(method="ppo", learning_rate=1e-2, max_staleness=0, kl_coef=0.0)
    learner = PPOLearner(tiny_base, tmp_path / "s", config, resume=False)
    old = await _groups(HFBackend(tiny_base), 0, seed=1)
    learner.step(old[:2])
    assert learner.policy_version == 1 and not learner.accepts(0)
    progress = learner.step(old[2:4])  # sampled by version 0, learner is at 1: all stale
    assert learner.policy_version == 1 and progress.loss is None
    assert learner.metrics["dropped_stale"] == 2 * len(old[0]["completions"])
    assert learner.metrics["steps_without_data"] == 1


async def test_learner_resumes_policy_value_head_and_optimizer(
    tiny_base: Path, tmp_path: Path
) -> None:
    config = TrainConfig(method="ppo", learning_rate=1e-2, kl_coef=0.1, max_staleness=3,
                         num_minibatches=2)  # fmt: skip
    learner = PPOLearner(tiny_base, tmp_path / "g", config, resume=False)
    actor = HFBackend(tiny_base)
    for step in range(2):
        learner.step((await _groups(actor, learner.policy_version, seed=step))[:3])
    saved = learner.save()
    assert (saved / VALUE_HEAD).is_file()
    state = load_checkpoint_state(tmp_path / "g")
    assert state is not None and state.path == saved and state.step == 2
    learner.step((await _groups(actor, 2, seed=99))[:3])  # not saved: lost in the "crash"

    again = PPOLearner(tiny_base, tmp_path / "g", config, resume=True)
    assert again.policy_version == 2 and again.steps == 2
    _, saved_model = load_model(saved)
    for (name, a), b in zip(again.model.named_parameters(), saved_model.parameters(), strict=True):
        assert torch.equal(a, b.to(a.device)), name  # the saved copy loads on the CPU
    head = torch.load(saved / VALUE_HEAD, weights_only=True)
    assert torch.equal(again.value_head.weight, head["weight"].to(again.value_head.weight.device))
    assert bool(head["weight"].abs().sum() > 0)  # the head was trained, not left at zero
    # Same groups from the same state -> the same update as an uninterrupted learner's.
    groups = (await _groups(actor, 2, seed=5))[:3]
    shutil.copytree(tmp_path / "g", tmp_path / "twin")
    twin = PPOLearner(tiny_base, tmp_path / "twin", config, resume=True)
    again.step(groups)
    twin.step(groups)
    for a, b in zip(again.model.parameters(), twin.model.parameters(), strict=True):
        assert torch.allclose(a, b)
    assert torch.allclose(again.value_head.weight, twin.value_head.weight)
    assert [line["step"] for line in read_step_log(tmp_path / "g")] == [1, 2, 3]


async def test_ppo_and_grpo_checkpoints_are_not_mixed(tiny_base: Path, tmp_path: Path) -> None:
    grpo = GRPOLearner(tiny_base, tmp_path / "o", TrainConfig(method="grpo"), resume=False)
    grpo.save()
    with pytest.raises(RolloutError, match="holds a grpo learner's checkpoint"):
        PPOLearner(tiny_base, tmp_path / "o", TrainConfig(method="ppo"), resume=True)
    with pytest.raises(RolloutError, match="PPOLearner trains ppo"):
        PPOLearner(tiny_base, tmp_path / "x", TrainConfig(method="grpo"))


def test_config_bounds_are_named() -> None:
    from rollout.shared.learning.config import TrainConfig as Config

    with pytest.raises(RolloutError) as err:
        Config.from_user({"method": "ppo", "clip_range": 0, "lam": 1.5, "ppo_epochs": 0})
    problems = "\n".join(err.value.problems)
    assert "hyperparams.clip_range: must be > 0" in problems
    assert "hyperparams.lam: must be <= 1" in problems
    assert "hyperparams.ppo_epochs: must be >= 1" in problems


@pytest.fixture(scope="module")
def tiny_rm(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny reward model (8 TRL steps) that scores refunds above refusals."""
    from test_learning_kto_rm import _pairs

    from rollout.shared.learning.rm import train_rm

    config = TrainConfig(method="rm", max_steps=8, learning_rate=3e-3, batch_size=2)
    out = tmp_path_factory.mktemp("rm")
    return train_rm(tiny_base, _pairs(), out, config, resume=False).model_dir


def test_a_reward_model_rewards_ppo_in_place_of_the_verifier(
    tiny_base: Path, tiny_rm: Path, tmp_path: Path
) -> None:
    from learning_kit import TOOLS, refund_messages

    from rollout.shared.learning.rm_scoring import RewardScorer

    rm = tiny_rm
    scorer = RewardScorer(rm)
    tokenizer, _ = load_model(tiny_base)
    prompt = refund_messages(1)[:2]
    replies = [[{"role": "assistant", "content": text}]
               for text in ("Refunded order O-1: $25.", "I cannot help with refunds.")]  # fmt: skip
    scores = scorer.score([prompt + r for r in replies], tools=TOOLS)
    completions = [
        {"token_ids": [tokenizer(r[0]["content"], add_special_tokens=False)["input_ids"]],
         "messages": prompt + r, "reward": 0.0, "policy_version": 0}  # the verifier: no signal
        for r in replies
    ]  # fmt: skip
    group = {"prompt": prompt, "tools": TOOLS, "completions": completions}
    config = TrainConfig(method="ppo", learning_rate=1e-2, kl_coef=0.0, max_staleness=64)
    learner = PPOLearner(tiny_base, tmp_path / "p", config, resume=False, reward_model=rm)

    for _ in range(3):
        progress = learner.step([group])
    # The rewards trained on are the reward model's scores, not the verifier's zeros.
    assert progress.reward == pytest.approx(sum(scores) / 2, abs=1e-4)
    assert learner.metrics["completions_rescored"] == 6
    learner.save()
    again = PPOLearner(tiny_base, tmp_path / "p", config, resume=True, reward_model=rm)
    assert again.metrics["completions_rescored"] == 6  # counted across a resume
    assert progress.loss is not None and learner.metrics["last_value_loss"] > 0
    with pytest.raises(RolloutError, match="not a reward model"):
        PPOLearner(tiny_base, tmp_path / "q", config, reward_model=tiny_base)


def test_ppo_never_rewards_a_completion_on_the_start_the_reward_model_reads(
    tiny_base: Path, tiny_rm: Path, tmp_path: Path
) -> None:
    from learning_kit import TOOLS, refund_messages

    from rollout.shared.learning.rm_scoring import RewardScorer

    scorer = RewardScorer(tiny_rm, max_len=100_000)
    tokenizer, _ = load_model(tiny_base)
    refund = refund_messages(1)
    prompt, refusal = refund[:2], [{"role": "assistant", "content": "I cannot help with refunds."}]
    # A completion that opens like the refund the reward model likes, then talks on and
    # ends in a refusal: its first `max_len` tokens are the refund and nothing after it.
    talk = [{"role": "user", "content": "And the other orders? " * 30},
            {"role": "assistant", "content": "Let me look into that. " * 30}]  # fmt: skip
    long = refund + talk + refusal
    max_len = scorer.token_counts([refund], tools=TOOLS)[0]
    [whole] = scorer.token_counts([long], tools=TOOLS)
    assert whole > max_len + 100
    # What scoring its first max_len tokens gave: the refund's score, above a refusal's.
    [text] = scorer.texts([long], tools=TOOLS)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"][:max_len]])
    with torch.no_grad():
        prefix_score = float(scorer.model(input_ids=ids).logits[0, 0])
    [refused_score, refund_score] = scorer.score([prompt + refusal, refund], tools=TOOLS)
    assert prefix_score > refused_score, (prefix_score, refused_score)
    assert prefix_score == pytest.approx(refund_score, abs=1e-4)

    def completion(messages: list[dict]) -> dict:
        ids = tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"]
        return {"token_ids": [ids], "messages": messages, "reward": 0.0, "policy_version": 0}

    group = {"prompt": prompt, "tools": TOOLS,
             "completions": [completion(long), completion(prompt + refusal)]}  # fmt: skip
    config = TrainConfig(method="ppo", kl_coef=0.0, reward_model_max_length=max_len)
    learner = PPOLearner(tiny_base, tmp_path / "p", config, resume=False, reward_model=tiny_rm)
    progress = learner.step([group])
    # The long completion is not trained on at its prefix's score: it is left out, counted.
    assert progress.reward == pytest.approx(refused_score, abs=1e-4)
    assert learner.metrics["completions_too_long_for_rm"] == 1
    assert learner.metrics["completions_rescored"] == 1
    assert learner.metrics["completions_trained"] == 1
    # The scorer itself never cuts one either: it refuses to score what it cannot read whole.
    with pytest.raises(RolloutError, match="longer than the reward model reads"):
        learner.scorer.score([long], tools=TOOLS)


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`local/smollm2-135m` prepared into a fresh ROLLOUT_HOME (once per module)."""
    from rollout.shared.models import smollm2

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROLLOUT_HOME", str(tmp_path_factory.mktemp("smollm2-home")))
        return smollm2.ensure_smollm2()


@pytest.mark.slow
@pytest.mark.smollm2
async def test_one_lora_ppo_step_on_smollm2(smollm2_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from rollout.shared.models import smollm2
    from rollout.shared.models.local_models import train_defaults

    defaults = train_defaults(smollm2.NAME)  # LoRA r=16 on every linear layer
    config = TrainConfig(
        method="ppo",
        **(defaults | {"learning_rate": 1e-3, "kl_coef": 0.05, "batch_size": 4, "max_steps": 1}),
    )
    learner = PPOLearner(smollm2_dir, tmp_path / "ppo", config, resume=False)
    actor = HFBackend(smollm2_dir)
    prompt = [{"role": "user", "content": "Route this ticket: my parcel never arrived."}]
    replies = await actor.generate(
        [ChatRequest(messages=prompt, max_tokens=8, seed=s) for s in range(4)]
    )
    completions = [
        {"token_ids": [r.token_ids], "logprobs": [r.logprobs], "policy_version": 0,
         "messages": prompt + [r.assistant_message()], "reward": float("parcel" in (r.content or ""))}
        for r in replies
    ]  # fmt: skip
    progress = learner.step([{"prompt": prompt, "tools": None, "completions": completions}])
    assert progress.loss is not None and torch.isfinite(torch.tensor(progress.loss))
    assert learner.metrics["last_logprob_drift"] < 1e-2  # the actor's tokens, re-scored
    saved = learner.save()
    lora_b = [v for k, v in load_file(saved / "adapter_model.safetensors").items() if "lora_B" in k]
    assert lora_b and any(bool(t.abs().sum() > 0) for t in lora_b)  # B starts at zero
    assert (saved / VALUE_HEAD).is_file()
    actor.reload(saved)
    [reply] = await actor.generate([ChatRequest(messages=prompt, max_tokens=4, seed=9)])
    assert reply.error is None and reply.token_ids


def test_the_correction_bounds_a_ppo_update_from_logprobs_the_learner_disagrees_with(
    tiny_base: Path, tmp_path: Path
) -> None:
    from test_grpo_variants import _group, _sequence_logps_per_token

    norms, gaps = {}, {}
    for correction in ("none", "tis", "mis"):
        extra = {} if correction == "none" else {"is_correction": correction, "is_cap": 2.0}
        # The policy loss alone (no value loss, no KL), one pass, gradients left in place: the
        # step's size is read off the gradient, not off Adam's normalised update. Whitened
        # advantages: some tokens are punished (A < 0), where the clip does not bound r A.
        config = TrainConfig(
            method="ppo", vf_coef=0.0, kl_coef=0.0, ppo_epochs=1, learning_rate=1e-12,
            max_grad_norm=1000.0, **extra,
        )  # fmt: skip
        learner = PPOLearner(tiny_base, tmp_path / correction, config, resume=False)
        learner.merge_turns = False
        # The actor recorded every token 4 nats less likely than the learner finds it.
        honest = _sequence_logps_per_token(learner, _group(learner))
        skewed = {text: [lp - 4.0 for lp in lps] for text, lps in honest.items()}
        learner.step(_group(learner, skewed))
        norms[correction] = sum(float((p.grad**2).sum()) for p in learner._params) ** 0.5
        gaps[correction] = learner.metrics["last_is_outside_fraction"]
    # Every token is outside [1/2, 2] (ratio e^4): MIS masks them all, TIS caps each weight at
    # 2 (and takes the ratio against the learner's own logprobs, so the clip does not hide the
    # punished sample), far below the uncorrected update.
    assert gaps == {"none": 1.0, "tis": 1.0, "mis": 1.0}
    assert norms["mis"] == 0.0
    assert 0 < norms["tis"] * 10 < norms["none"], norms


def test_ppo_refuses_a_cap_without_a_correction() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="is_cap: only with is_correction tis or mis"):
        TrainConfig(method="ppo", is_cap=2.0)
