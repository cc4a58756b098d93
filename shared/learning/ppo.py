"""Online PPO: an actor-critic on the same asynchronous actor/learner loop as GRPO.

TRL 1.16 ships no PPO trainer (not even under `trl.experimental`), and a trainer that owns its
generation could not be pushed completions that independent actors sampled with older policy
versions anyway. So PPO is written here on torch, on top of the GRPO learner (contexts rendered
as the actor rendered them, checkpoints, resume, staleness):

- the critic is a linear value head on the policy's last hidden state: one forward pass gives
  both the token log-probs and the values, where a separate critic model would double the
  compute and memory of every step on a CPU. The head is saved with each checkpoint
  (`value_head.pt`, next to the HF weights the actors load);
- per completion token, the reward is `-kl_coef * (logp_behaviour - logp_base)` (the KL to the
  frozen initial policy), plus the completion's scalar reward (verifier score, or a reward
  model's) at its last token; a multi-turn completion's turns form one token sequence. A
  completion longer than the reward model reads (`reward_model_max_length`) is left out of
  its step (counted in `completions_too_long_for_rm`), never scored on its start;
- advantages and returns come from GAE over those tokens (`gamma`, `lam`), whitened per step;
- the loss per token is PPO's clipped surrogate, with the ratio against the logprobs the actor
  recorded (the behaviour policy: importance correction for stale actors), plus `vf_coef`
  times the clipped value loss, averaged over the minibatch's tokens;
- one `step` is `ppo_epochs` passes over its completions in `num_minibatches` optimizer steps
  each, and bumps `policy_version` once.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from rollout.shared.errors import RolloutError
from rollout.shared.learning.config import Progress, TrainConfig
from rollout.shared.learning.forward import completion_forward
from rollout.shared.learning.grpo import Group, GRPOLearner, _mean, _Row
from rollout.shared.learning.rm_scoring import past_positions, scorer_for

log = structlog.get_logger(__name__)

VALUE_HEAD = "value_head.pt"


def gae(
    rewards: list[float], values: list[float], gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """(advantages, returns) of one episode by GAE; the value after the last token is 0."""
    advantages = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        following = values[t + 1] if t + 1 < len(values) else 0.0
        delta = rewards[t] + gamma * following - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    return advantages, [a + v for a, v in zip(advantages, values, strict=True)]


@dataclass
class _PpoRow(_Row):
    # Per completion token: behaviour logprob, base logprob, value, advantage, return.
    behaviour: list[float] = field(default_factory=list)
    reference: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    # The actor-to-learner importance weight each token's policy loss is multiplied by
    # (is_correction tis/mis; 1 otherwise).
    is_weight: list[float] = field(default_factory=list)


class PPOLearner(GRPOLearner):
    """A policy and its value head trained online with PPO; `step(groups)` is one version."""

    def __init__(
        self,
        base_model: Path,
        out_dir: Path,
        config: TrainConfig,
        *,
        resume: bool = True,
        reward_model: Path | None = None,
    ) -> None:
        if config.method != "ppo":
            raise RolloutError(f"config.method: PPOLearner trains ppo, not {config.method!r}")
        self.scorer: Any = None
        if reward_model is not None:
            problem = past_positions(
                config.reward_model_max_length, str(reward_model), Path(reward_model)
            )
            if problem:
                raise RolloutError(f"hyperparams.reward_model_max_length: {problem}")
            self.scorer = scorer_for(Path(reward_model), max_len=config.reward_model_max_length)
        super().__init__(base_model, out_dir, config, resume=resume, clip_eps=config.clip_range)
        for name in (
            "completions_rescored",
            "completions_too_long_for_rm",
            "last_value_loss",
            "last_policy_loss",
        ):
            self.metrics.setdefault(name, 0.0)  # a resumed learner has them from its checkpoint

    # -- models ------------------------------------------------------------------------------

    def _kl_weight(self) -> float:
        return float(self.config.kl_coef)

    def _build_models(self, base: Any, checkpoint: Path | None) -> tuple[Any, Any]:
        import torch

        hidden = int(base.config.hidden_size)
        model, ref = super()._build_models(base, checkpoint)
        head = torch.nn.Linear(hidden, 1)
        # Zero init: the critic starts from "worth nothing", not from random per-token noise.
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
        if checkpoint is not None:
            if not (checkpoint / VALUE_HEAD).is_file():
                raise RolloutError(f"{checkpoint}: a PPO checkpoint without its {VALUE_HEAD}")
            head.load_state_dict(torch.load(checkpoint / VALUE_HEAD, weights_only=True))
        self.value_head = head.to(self.device).train()
        return model, ref

    def _optimizer(self) -> Any:
        import torch

        value_lr = self.config.value_learning_rate or self.config.learning_rate
        groups = [
            {"params": self._params, "lr": self.config.learning_rate},
            {"params": list(self.value_head.parameters()), "lr": value_lr},
        ]
        return torch.optim.AdamW(groups, weight_decay=0.0)

    def _save_extra(self, tmp: Path) -> None:
        import torch

        torch.save(self.value_head.state_dict(), tmp / VALUE_HEAD)

    # -- one step ----------------------------------------------------------------------------

    def _step(self, groups: list[Group]) -> Progress:
        started = time.monotonic()
        episodes, rewards = self._episodes(groups)
        rows = [row for episode in episodes for row in episode]
        if not rows:
            self.metrics["steps_without_data"] += 1
            log.info("ppo step skipped: no trainable completions", version=self.policy_version)
            return self._progress(None, _mean(rewards), None)
        self._rollout_stats(rows)
        for episode, reward in zip(episodes, rewards, strict=True):
            self._advantages(episode, reward)
        self._whiten(rows)
        loss, stats = self._update(rows)
        return self._finish_step(
            started, rows, rewards, loss, stats, value_loss=stats["last_value_loss"]
        )

    def _episodes(self, groups: list[Group]) -> tuple[list[list[_PpoRow]], list[float]]:
        """Each fresh completion's turn rows (one episode each) and its scalar reward."""
        episodes: list[list[_PpoRow]] = []
        rewards: list[float] = []
        for g, group in enumerate(groups):
            prompt = list(group.get("prompt") or [])
            tools = group.get("tools") or None
            completions = list(group.get("completions") or [])
            fresh = [c for c in completions if self.accepts(int(c.get("policy_version", 0)))]
            self.metrics["dropped_stale"] += len(completions) - len(fresh)
            for completion in fresh:
                reward = self._reward(g, prompt, tools, completion)
                if reward is None:
                    continue  # longer than the reward model reads: no reward to learn from
                turns = [
                    _PpoRow(r.context, r.completion, r.old_logprobs, 0.0)
                    for r in self._turn_rows(prompt, tools, completion, 0.0)
                ]
                if not turns:
                    continue
                self.metrics["completions_trained"] += 1
                episodes.append(turns)
                rewards.append(reward)
        return episodes, rewards

    def _reward(self, g: int, prompt: list[dict], tools: Any, completion: Any) -> float | None:
        """The completion's scalar reward; None when the reward model cannot read it whole."""
        if self.scorer is not None:
            messages = list(completion.get("messages") or [])
            full = messages if messages[: len(prompt)] == prompt else prompt + messages
            [tokens] = self.scorer.token_counts([full], tools=tools)
            if tokens > self.scorer.readable:
                self._too_long_for_rm(tokens)
                return None
            self.metrics["completions_rescored"] += 1
            return float(self.scorer.score([full], tools=tools)[0])
        try:
            return float(completion["reward"])
        except (KeyError, TypeError, ValueError):
            raise RolloutError(
                f"ppo: groups[{g}]: every completion needs a numeric reward"
            ) from None

    def _too_long_for_rm(self, tokens: int) -> None:
        """Count (and say once per job) a completion the reward model cannot read whole.

        Cut to its start it would be scored on a prefix the policy wrote, the logit read at a
        token of its choosing and its end (the failed calls, the real answer) unseen. The
        reward_model primitive fails such a conversation at 0, the floor of its [0, 1] score;
        PPO's reward is the model's raw logit, which has no floor: any number given in its
        place would be a reward the model never gave, on a scale it does not define (too low
        and one completion's advantage swamps the step's, once whitened). So it is left out
        of the step, as a turn longer than max_seq_len is: no score from a prefix either way.
        """
        if not self.metrics["completions_too_long_for_rm"]:
            log.warning(
                "ppo: a completion longer than the reward model reads is not trained on",
                tokens=tokens,
                reward_model_max_length=self.scorer.readable,
            )
        self.metrics["completions_too_long_for_rm"] += 1

    def _forward(self, model: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
        """(token logprobs, values), both in target space (position t predicts token t+1)."""
        logp, states = completion_forward(
            model, batch, hidden=True, stats=self.forward_stats, precision=self.precision
        )
        # The value head runs outside the autocast: float32 values for the float32 losses.
        values = self.value_head(states.float()).squeeze(-1)
        return logp, values

    def _rollout_stats(self, rows: list[_PpoRow]) -> None:
        """Fill each row's behaviour and base logprobs and rollout-time values (no grad)."""
        import torch

        drift = recorded = mismatch_kl = outside = 0.0
        max_ratio = 1.0
        size = self.config.batch_size
        correction = self.loss.is_correction
        cap = self.loss.is_cap
        with torch.no_grad():
            for start in range(0, len(rows), size):
                chunk = rows[start : start + size]
                batch = self._tensors(chunk)
                logp, values = self._forward(self.model, batch)
                # Without a KL penalty there is no reference model: the KL is then taken as 0.
                ref = self._reference_logprobs(batch) if self._kl_weight() > 0 else None
                for i, row in enumerate(chunk):
                    span = slice(len(row.context) - 1, len(row.context) - 1 + len(row.completion))
                    now = logp[i, span].tolist()
                    if row.old_logprobs is not None:
                        drift += sum(abs(a - b) for a, b in zip(now, row.old_logprobs, strict=True))
                        recorded += len(now)
                        # The actor-vs-learner gap, measured as GRPO's is (policy.updated).
                        for a, b in zip(now, row.old_logprobs, strict=True):
                            ratio = math.exp(min(a - b, 50.0))
                            mismatch_kl += ratio - 1.0 - (a - b)
                            max_ratio = max(max_ratio, ratio)
                            outside += not (1 / cap <= ratio <= cap)
                    row.behaviour = list(row.old_logprobs) if row.old_logprobs else now
                    row.is_weight = [1.0] * len(now)
                    if correction != "none" and row.old_logprobs is not None:
                        # The ratio against the learner's own rollout-time logprobs; the gap
                        # to the actor's becomes a bounded weight (TIS) or a mask (MIS).
                        row.behaviour = now
                        row.is_weight = [
                            _corrected(a - b, correction, cap)
                            for a, b in zip(now, row.old_logprobs, strict=True)
                        ]
                    row.reference = ref[i, span].tolist() if ref is not None else row.behaviour
                    row.values = values[i, span].tolist()
        self.metrics["last_logprob_drift"] = drift / recorded if recorded else 0.0
        self.metrics["last_mismatch_kl"] = mismatch_kl / recorded if recorded else 0.0
        self.metrics["last_max_is_ratio"] = max_ratio
        self.metrics["last_is_outside_fraction"] = outside / recorded if recorded else 0.0

    def _advantages(self, episode: list[_PpoRow], reward: float) -> None:
        """GAE over the episode's tokens (its turns in order), reward at the last token."""
        beta = self._kl_weight()
        rewards = [
            -beta * (b - r)
            for row in episode
            for b, r in zip(row.behaviour, row.reference, strict=True)
        ]
        rewards[-1] += reward
        values = [v for row in episode for v in row.values]
        advantages, returns = gae(rewards, values, self.config.gamma, self.config.lam)
        at = 0
        for row in episode:
            n = len(row.completion)
            row.advantages, row.returns = advantages[at : at + n], returns[at : at + n]
            at += n

    def _whiten(self, rows: list[_PpoRow]) -> None:
        flat = [a for row in rows for a in row.advantages]
        if not self.config.whiten_advantages or len(flat) < 2:
            return
        mean = sum(flat) / len(flat)
        std = (sum((a - mean) ** 2 for a in flat) / len(flat)) ** 0.5
        for row in rows:
            row.advantages = [(a - mean) / (std + 1e-8) for a in row.advantages]

    def _update(self, rows: list[_PpoRow]) -> tuple[float, dict[str, float]]:
        """`ppo_epochs` passes of `num_minibatches` optimizer steps; the mean loss and stats."""
        import torch

        cfg = self.config
        losses: list[float] = []
        policy_sum = value_sum = clipped = tokens_seen = 0.0
        order = list(range(len(rows)))
        parts = min(cfg.num_minibatches, len(rows))
        for epoch in range(cfg.ppo_epochs):
            # Seeded by (seed, step, epoch) alone: a resumed learner shuffles as the lost one.
            random.Random(f"{cfg.seed}:{self.steps}:{epoch}").shuffle(order)
            for m in range(parts):
                minibatch = [rows[i] for i in order[m::parts]]
                total = sum(len(r.completion) for r in minibatch)
                self.optimizer.zero_grad(set_to_none=True)
                loss_sum = 0.0
                for start in range(0, len(minibatch), cfg.batch_size):
                    chunk = minibatch[start : start + cfg.batch_size]
                    batch = self._ppo_tensors(chunk)
                    logp, values = self._forward(self.model, batch)
                    mask = batch["mask"]
                    ratio = torch.exp(logp - batch["behaviour"])
                    adv = batch["advantages"]
                    low, high = 1 - self.clip_eps, 1 + self.clip_eps
                    policy = -torch.min(ratio * adv, torch.clamp(ratio, low, high) * adv)
                    policy = policy * batch["is_weight"]
                    old_v, ret = batch["values"], batch["returns"]
                    clipped_v = old_v + torch.clamp(
                        values - old_v, -cfg.value_clip_range, cfg.value_clip_range
                    )
                    value = 0.5 * torch.max((values - ret) ** 2, (clipped_v - ret) ** 2)
                    loss = ((policy + cfg.vf_coef * value) * mask).sum() / total
                    loss.backward()
                    loss_sum += float(loss.detach())
                    policy_sum += float((policy.detach() * mask).sum())
                    value_sum += float((value.detach() * mask).sum())
                    clipped += float((((ratio < low) | (ratio > high)).float() * mask).sum())
                tokens_seen += total
                torch.nn.utils.clip_grad_norm_(
                    [*self._params, *self.value_head.parameters()], cfg.max_grad_norm
                )
                self.optimizer.step()
                losses.append(loss_sum)
        kl = [b - r for row in rows for b, r in zip(row.behaviour, row.reference, strict=True)]
        return sum(losses) / len(losses), {
            "last_kl": sum(kl) / len(kl),
            "last_clip_fraction": clipped / tokens_seen,
            "last_tokens": float(sum(len(r.completion) for r in rows)),
            "last_policy_loss": policy_sum / tokens_seen,
            "last_value_loss": value_sum / tokens_seen,
            "last_optimizer_steps": float(len(losses)),
        }

    def _ppo_tensors(self, rows: list[_PpoRow]) -> dict[str, Any]:
        import torch

        batch = self._tensors(rows)
        shape = batch["mask"].shape
        keys = ("behaviour", "values", "advantages", "returns", "is_weight")
        extra = {k: torch.zeros(shape) for k in keys}
        for i, row in enumerate(rows):
            span = slice(len(row.context) - 1, len(row.context) - 1 + len(row.completion))
            for key in extra:
                extra[key][i, span] = torch.tensor(getattr(row, key))
        return batch | {k: v.to(self.device) for k, v in extra.items()}


def _corrected(log_w: float, correction: str, cap: float) -> float:
    """The actor-to-learner importance weight of one token, truncated (tis) or masked (mis)."""
    weight = math.exp(min(log_w, 50.0))
    if correction == "tis":
        return min(weight, cap)
    return weight if 1.0 / cap <= weight <= cap else 0.0
