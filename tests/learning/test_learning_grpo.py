"""Online GRPO on the tiny model: actor samples (hf backend), learner steps, actor reloads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from learning_kit import load_model

from rollout.errors import RolloutError
from rollout.shared.learning import GRPOLearner, TrainConfig, load_checkpoint_state
from rollout.shared.models.base import ChatRequest
from rollout.shared.models.hf import HFBackend

PROMPTS = [[{"role": "user", "content": f"Say anything, number {i}."}] for i in range(8)]
GROUP = 4


def _reward(token_ids: list[int], vocab: int) -> float:
    # A task with a learnable, graded signal: the share of tokens from the lower half of
    # the vocabulary (about 0.5 for an untrained model).
    return sum(1 for t in token_ids if t < vocab // 2) / max(1, len(token_ids))


async def _groups(backend: HFBackend, version: int, seed: int) -> list[dict]:
    requests = [
        ChatRequest(messages=p, max_tokens=8, seed=seed + 10 * i + j)
        for i, p in enumerate(PROMPTS)
        for j in range(GROUP)
    ]
    replies = await backend.generate(requests)
    vocab = len(backend.tokenizer)
    groups = []
    for i, prompt in enumerate(PROMPTS):
        completions = []
        for reply in replies[i * GROUP : (i + 1) * GROUP]:
            completions.append(
                {
                    "token_ids": [reply.token_ids],
                    "logprobs": [reply.logprobs],
                    "messages": prompt + [reply.assistant_message()],
                    "reward": _reward(reply.token_ids, vocab),
                    "policy_version": version,
                }
            )
        groups.append({"prompt": prompt, "tools": None, "completions": completions})
    return groups


def _mean_reward(groups: list[dict]) -> float:
    rewards = [c["reward"] for g in groups for c in g["completions"]]
    return sum(rewards) / len(rewards)


async def test_grpo_raises_mean_reward(tiny_base: Path, tmp_path: Path) -> None:
    config = TrainConfig(method="grpo", learning_rate=2e-2, batch_size=32, beta=0.0, max_steps=8)
    learner = GRPOLearner(tiny_base, tmp_path / "grpo", config, resume=False)
    actor = HFBackend(tiny_base)
    before = _mean_reward(await _groups(actor, 0, seed=10_000))
    for step in range(8):
        groups = await _groups(actor, learner.policy_version, seed=step * 1000)
        progress = learner.step(groups)
        assert progress.step == step + 1 and progress.total_steps == 8
        # The learner recomputes exactly the logprobs the actor recorded before updating.
        assert learner.metrics["last_logprob_drift"] < 1e-3
        actor.reload(learner.save())  # the actor picks the new policy up without restarting
    after = _mean_reward(await _groups(actor, learner.policy_version, seed=10_000))
    assert learner.policy_version == 8
    assert after > before + 0.2, (before, after)


async def test_multi_turn_contexts_match_what_the_actor_rendered(
    tiny_base: Path, tmp_path: Path
) -> None:
    actor = HFBackend(tiny_base)
    tools = [{"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}]
    prompt = [{"role": "user", "content": "Use the tool, then answer."}]
    completions = []
    for seed in range(3):
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
                "rollout_id": f"r{seed}",
            }
        )
    config = TrainConfig(method="grpo", learning_rate=1e-3, beta=0.05)
    learner = GRPOLearner(tiny_base, tmp_path / "g", config, resume=False)
    learner.step([{"prompt": prompt, "tools": tools, "completions": completions}])
    assert learner.metrics["completions_trained"] == 3
    assert learner.metrics["last_tokens"] == sum(
        len(t) for c in completions for t in c["token_ids"]
    )
    assert learner.metrics["last_logprob_drift"] < 1e-3
    # What each sampled token got, per rollout and turn, split back out of the merged rows:
    # the completion's advantage on every token (rewards 0, 1, 2: -1.22, 0, +1.22), a ratio
    # of 1 and no gap on fresh samples, nothing clipped.
    signals = learner.last_signals
    assert sorted(signals) == ["r0", "r1", "r2"]
    for seed, completion in enumerate(completions):
        turns = signals[f"r{seed}"]
        assert sorted(turns) == ["0", "1"]
        for k, ids in enumerate(completion["token_ids"]):
            got = turns[str(k)]
            assert len(got["advantage"]) == len(got["ratio"]) == len(got["gap"]) == len(ids)
            assert got["advantage"] == pytest.approx([(seed - 1) * 1.2247] * len(ids), abs=1e-3)
            assert got["ratio"] == pytest.approx([1.0] * len(ids), abs=1e-3)
            assert all(abs(g) < 1e-3 for g in got["gap"]) and got["clipped"] == [0] * len(ids)


async def test_stale_completions_are_dropped(tiny_base: Path, tmp_path: Path) -> None:
    config = TrainConfig(method="grpo", learning_rate=1e-2, max_staleness=0, beta=0.0)
    learner = GRPOLearner(tiny_base, tmp_path / "g", config, resume=False)
    actor = HFBackend(tiny_base)
    old = await _groups(actor, 0, seed=1)
    learner.step(old[:4])
    assert learner.policy_version == 1
    assert learner.accepts(1) and not learner.accepts(0)
    progress = learner.step(old[4:])  # sampled by version 0, learner is at 1: all stale
    assert learner.policy_version == 1 and progress.loss is None
    assert learner.metrics["dropped_stale"] == 4 * GROUP
    assert learner.metrics["steps_without_data"] == 1


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"loss_type": "dapo", "advantage": "rloo", "is_correction": "tis"},
        {"loss_type": "gspo", "advantage": "reinforce_pp", "is_correction": "mis", "is_cap": 2.0},
    ],
    ids=["grpo", "dapo-rloo-tis", "gspo-reinforce_pp-mis"],
)
async def test_learner_resumes_from_its_checkpoint(
    tiny_base: Path, tmp_path: Path, variant: dict
) -> None:
    config = TrainConfig(method="grpo", learning_rate=1e-2, beta=0.1, max_staleness=3, **variant)
    learner = GRPOLearner(tiny_base, tmp_path / "g", config, resume=False)
    actor = HFBackend(tiny_base)
    for step in range(2):
        learner.step(await _groups(actor, learner.policy_version, seed=step))
    saved = learner.save()
    state = load_checkpoint_state(tmp_path / "g")
    assert state is not None and state.path == saved and state.step == 2
    learner.step(await _groups(actor, 2, seed=99))  # not saved: lost in the "crash"

    again = GRPOLearner(tiny_base, tmp_path / "g", config, resume=True)
    assert again.policy_version == 2 and again.steps == 2
    _, saved_model = load_model(saved)
    for (name, a), b in zip(again.model.named_parameters(), saved_model.parameters(), strict=True):
        assert torch.equal(a, b.to(a.device)), name  # the saved copy loads on the CPU
    assert (
        again.optimizer.state_dict()["state"].keys()
        == learner.optimizer.state_dict()["state"].keys()
    )
    # Same groups from the same state -> the same update as an uninterrupted learner would make.
    groups = await _groups(actor, 2, seed=5)
    shutil.copytree(tmp_path / "g", tmp_path / "twin")
    twin = GRPOLearner(tiny_base, tmp_path / "twin", config, resume=True)
    again.step(groups)
    twin.step(groups)
    for a, b in zip(again.model.parameters(), twin.model.parameters(), strict=True):
        assert torch.allclose(a, b)
    assert [line["step"] for line in _log(tmp_path / "g")] == [1, 2, 3]


def _log(out: Path) -> list[dict]:
    from rollout.shared.learning import read_step_log

    return read_step_log(out)


def test_learner_refuses_a_missing_base_model(tmp_path: Path) -> None:
    with pytest.raises(RolloutError, match="base_model: no model directory at"):
        GRPOLearner(tmp_path / "nope", tmp_path / "g", TrainConfig(method="grpo"))


async def test_lora_grpo_ships_adapters_the_actor_swaps_on_one_base(
    tiny_base: Path, tmp_path: Path
) -> None:
    from rollout.shared.models.local_models import adapter_base

    config = TrainConfig(method="grpo", learning_rate=2e-2, batch_size=32, beta=0.1,
                         max_steps=2, lora=True, lora_r=4)  # fmt: skip
    base_ref = f"hf:{tiny_base.resolve()}"  # noqa: ASYNC240
    learner = GRPOLearner(tiny_base, tmp_path / "grpo", config, resume=False)
    actor = HFBackend(tiny_base)
    learner.step(await _groups(actor, 0, seed=1))
    first = learner.save()
    # The adapter alone, naming its base: no merged copy of the weights per version.
    assert (first / "adapter_config.json").exists() and not (first / "model.safetensors").exists()
    assert adapter_base(first) == base_ref
    actor = HFBackend(first)
    base_weight = actor.model.get_base_model().model.embed_tokens.weight
    before = {k: v.clone() for k, v in actor.model.state_dict().items() if "lora_B" in k}
    learner.step(await _groups(actor, 1, seed=2))
    actor.reload(learner.save())
    # The base stayed loaded (same tensor); the adapter is the new version's.
    assert actor.model.get_base_model().model.embed_tokens.weight is base_weight
    after = {k: v for k, v in actor.model.state_dict().items() if "lora_B" in k}
    assert len(after) == len(before)
    assert any(not torch.equal(a, b) for a, b in zip(after.values(), before.values(), strict=True))
    [reply] = await actor.generate([ChatRequest(messages=PROMPTS[0], max_tokens=4, seed=3)])
    assert reply.error is None and reply.token_ids


async def test_kl_reference_of_a_trained_adapter_is_that_adapter(
    tiny_base: Path, tmp_path: Path
) -> None:
    # GRPO after SFT: the penalty must hold the policy near the SFT'd model it starts from,
    # not near the pretrained base under the adapter (which the SFT moved away from).
    config = TrainConfig(method="grpo", learning_rate=2e-2, batch_size=32, beta=0.1,
                         max_steps=4, lora=True, lora_r=4)  # fmt: skip
    first = GRPOLearner(tiny_base, tmp_path / "sft-like", config, resume=False)
    actor = HFBackend(tiny_base)
    first.step(await _groups(actor, 0, seed=1))
    first.step(await _groups(actor, 1, seed=2))
    adapter = first.save()

    learner = GRPOLearner(adapter, tmp_path / "grpo", config, resume=False)
    groups = await _groups(HFBackend(adapter), 0, seed=3)
    rows, _ = learner._rows(groups)
    batch = learner._tensors(rows)
    mask = batch["mask"].bool()
    with torch.no_grad():
        policy = learner._logprobs(learner.model, batch)[mask]
        reference = learner._reference_logprobs(batch)[mask]
        with learner.model.disable_adapter():
            pretrained = learner._logprobs(learner.model, batch)[mask]
    assert torch.allclose(reference, policy, atol=1e-5)
    assert (pretrained - policy).abs().max() > 1e-3  # the adapter did move the model
    learner.step(groups)
    assert learner.metrics["last_kl"] < 1e-6  # measured before the update: policy == reference
    with torch.no_grad():
        after = learner._logprobs(learner.model, batch)[mask]
        assert torch.equal(learner._reference_logprobs(batch)[mask], reference)
    assert (after - policy).abs().max() > 0  # the step changed the policy, not the reference
