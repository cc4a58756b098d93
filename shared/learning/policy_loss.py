"""The GRPO family's losses, advantages and off-policy correction, as functions of tensors.

One step trains on completions the actors sampled, each token with the logprob the actor
recorded (`actor`). The learner takes one optimizer step per batch of groups, so its own
logprobs before the step (`logp.detach()`) are the "old" policy of the PPO ratio exactly;
the actor's differ from them by the engine's numerics and by staleness (the actor sampled with
an older version). What each setting does (docs/algorithms.md):

- `loss_type`: `grpo` (the clipped surrogate), `dapo` (the same with clip-higher,
  `epsilon_high` 0.28, token-level aggregation), `dr_grpo` (advantages not divided by the
  group's std; the loss normalised by a constant, rows x `max_tokens`), `gspo` (one ratio per
  sequence: the exp of the mean token log-ratio, clipped by 3e-4/4e-4), `cispo` (the importance
  weight itself is clipped at `epsilon_high` and detached, so every token keeps its gradient).
- `advantage`: `group` ((r - mean) / std within the task's group), `rloo` (r minus the mean
  of the group's other samples), `reinforce_pp` (r minus the group mean, then normalised over
  the whole step's batch: REINFORCE++ with a group baseline).
- `is_correction`: `none` (the ratio is taken against the actor's logprobs, as before: the
  clip alone bounds it), `tis` (the ratio against the learner's own, times the actor-to-learner
  importance weight truncated at `is_cap`), `mis` (that weight, zero where it is outside
  [1/is_cap, is_cap]: those tokens are masked).
- `aggregation`: `token` (every trained token of the step weighs the same) or `sequence`
  (each row's mean, then the mean over rows).

Every step also measures the actor-vs-learner gap on the tokens the actor recorded: the mean
KL (k3 estimate of KL(actor || learner)), the largest importance ratio and the fraction of
tokens outside [1/is_cap, is_cap].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

from rollout.shared.contracts.training import (
    AdvantageKind,
    Aggregation,
    GrpoLossType,
    IsCorrection,
)

LOSS_TYPES: tuple[str, ...] = get_args(GrpoLossType)
ADVANTAGES: tuple[str, ...] = get_args(AdvantageKind)
CORRECTIONS: tuple[str, ...] = get_args(IsCorrection)
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)

# Per loss type: (epsilon, epsilon_high, aggregation) when the config leaves them unset.
# grpo keeps this learner's token-level mean (no length bias); GSPO's clip range is its
# paper's (v2, section 5.1); CISPO's epsilon_high is the IS weight's cap, 5.0 as in ScaleRL.
LOSS_DEFAULTS: dict[str, tuple[float, float, str]] = {
    "grpo": (0.2, 0.2, "token"),
    "dapo": (0.2, 0.28, "token"),
    "dr_grpo": (0.2, 0.2, "token"),
    "gspo": (3e-4, 4e-4, "sequence"),
    "cispo": (0.2, 5.0, "token"),
}
DEFAULT_IS_CAP = 3.0
_STD_EPS = 1e-4


@dataclass(frozen=True)
class LossSettings:
    """A config's loss settings with every default resolved."""

    loss_type: str = "grpo"
    epsilon: float = 0.2
    epsilon_high: float = 0.2
    aggregation: str = "token"
    is_correction: str = "none"
    is_cap: float = DEFAULT_IS_CAP
    max_tokens: int = 256
    advantage: str = "group"
    overlong_buffer: int | None = None

    @classmethod
    def of(cls, config: Any) -> LossSettings:
        """The settings of a GRPO-family config (older configs: plain GRPO)."""
        loss_type = getattr(config, "loss_type", None) or "grpo"
        eps, eps_high, aggregation = LOSS_DEFAULTS[loss_type]
        given = getattr(config, "epsilon", None)
        eps = given if given is not None else eps
        high = getattr(config, "epsilon_high", None)
        if high is None:
            # DAPO's clip-higher and the per-type caps; otherwise symmetric around the given.
            high = eps_high if given is None or loss_type in ("dapo", "cispo") else eps
        return cls(
            loss_type=loss_type,
            epsilon=float(eps),
            epsilon_high=float(high),
            aggregation=getattr(config, "aggregation", None) or aggregation,
            is_correction=getattr(config, "is_correction", None) or "none",
            is_cap=float(getattr(config, "is_cap", None) or DEFAULT_IS_CAP),
            max_tokens=int(getattr(config, "max_tokens", 256) or 256),
            advantage=getattr(config, "advantage", None) or "group",
            overlong_buffer=getattr(config, "overlong_buffer", None),
        )


def group_advantages(scores: list[float], kind: str, *, scale: bool = True) -> list[float] | None:
    """Each sample's advantage within its group; None when the group has no signal."""
    n = len(scores)
    if n < 2:
        return None
    mean = sum(scores) / n
    std = (sum((s - mean) ** 2 for s in scores) / n) ** 0.5
    if std < 1e-8:
        return None  # every sample scored the same: no direction to move in
    if kind == "rloo":
        # r_i minus the mean of the others: n / (n - 1) times the centred reward.
        return [(s - mean) * n / (n - 1) for s in scores]
    if kind == "reinforce_pp" or not scale:
        return [s - mean for s in scores]  # reinforce_pp: normalised over the batch later
    return [(s - mean) / (std + _STD_EPS) for s in scores]


def batch_normalised(advantages: list[float]) -> list[float]:
    """REINFORCE++: the step's advantages normalised to mean 0, std 1 over the whole batch."""
    if len(advantages) < 2:
        return list(advantages)
    mean = sum(advantages) / len(advantages)
    std = (sum((a - mean) ** 2 for a in advantages) / len(advantages)) ** 0.5
    return [(a - mean) / (std + _STD_EPS) for a in advantages]


def overlong_penalty(turn_lengths: list[int], max_tokens: int, buffer: int) -> float:
    """DAPO's soft overlong punishment of the longest turn: 0 up to max_tokens - buffer, then
    falling linearly to -1 at max_tokens (a turn cut at the cap gets -1)."""
    if not turn_lengths or buffer <= 0:
        return 0.0
    longest = max(turn_lengths)
    free = max_tokens - buffer
    if longest <= free:
        return 0.0
    return max(-1.0, (free - longest) / buffer)


def per_token_loss(
    logp: Any,
    actor: Any,
    has_actor: Any,
    advantage: Any,
    mask: Any,
    settings: LossSettings,
    detail: dict[str, Any] | None = None,
) -> tuple[Any, dict[str, float]]:
    """The unreduced loss per token (rows x positions) and this micro-batch's counts.

    `logp`: the learner's logprobs (with grad); `actor`: the recorded ones where `has_actor`;
    `advantage`: one per row, or one per token (rows x positions: on-policy distillation's);
    `mask`: the trained tokens (their weight). A `detail` dict is filled with what each token
    got (rows x positions, detached): `advantage`, `weight` (the importance ratio the loss
    applied: the PPO ratio, or the corrected weight) and `clipped`.
    """
    import torch

    learner_old = logp.detach()
    recorded = has_actor.float() * mask
    actor_lp = torch.where(has_actor, actor, learner_old)
    # The actor-to-learner importance weight of each recorded token (1 elsewhere).
    log_w = (learner_old - actor_lp) * has_actor.float()
    weight = torch.exp(log_w)
    cap = settings.is_cap
    outside = ((weight > cap) | (weight < 1.0 / cap)).float() * recorded
    counts = {
        "recorded_tokens": float(recorded.sum()),
        "mismatch_kl_sum": float(((weight - 1.0 - log_w) * recorded).sum()),
        "max_is_ratio": float((weight * recorded).max()) if recorded.any() else 1.0,
        "is_outside_tokens": float(outside.sum()),
    }
    # The PPO ratio: against the actor's logprobs (none), or the learner's own with the
    # importance weight applied separately (tis, mis).
    old = actor_lp if settings.is_correction == "none" else learner_old
    log_ratio = logp - old
    if settings.loss_type == "gspo":
        # One ratio per sequence: exp(mean log-ratio), with each token's gradient flowing
        # through it (GSPO's sequence-level importance ratio).
        lengths = mask.sum(-1).clamp(min=1.0)
        seq = (log_ratio * mask).sum(-1, keepdim=True) / lengths[:, None]
        log_ratio = seq.expand_as(logp)
    ratio = torch.exp(log_ratio)
    adv = advantage[:, None] if advantage.dim() == 1 else advantage
    low, high = 1.0 - settings.epsilon, 1.0 + settings.epsilon_high
    if settings.loss_type == "cispo":
        # The weight is clipped and detached; the gradient is the advantage-weighted logp's.
        clipped_weight = torch.clamp(ratio, max=settings.epsilon_high).detach()
        loss = -clipped_weight * adv * logp
        clipped = (ratio > settings.epsilon_high).float() * mask
    else:
        loss = -torch.min(ratio * adv, torch.clamp(ratio, low, high) * adv)
        clipped = ((ratio < low) | (ratio > high)).float() * mask
    applied = ratio.detach()
    if settings.is_correction == "tis":
        applied = applied * torch.clamp(weight, max=cap).detach()
        loss = loss * torch.clamp(weight, max=cap).detach()
    elif settings.is_correction == "mis":
        keep = ((weight <= cap) & (weight >= 1.0 / cap)).float()
        applied = applied * (weight * keep).detach()
        loss = loss * (weight * keep).detach()
    counts["clipped_tokens"] = float(clipped.sum())
    if detail is not None:
        detail["advantage"] = adv.detach().expand_as(logp)
        detail["weight"] = applied
        detail["clipped"] = clipped.detach()
    return loss, counts


def reduce_loss(
    per_token: Any, mask: Any, settings: LossSettings, *, tokens: int, rows: int
) -> Any:
    """This micro-batch's share of the step's loss (`tokens`, `rows`: the whole step's)."""
    weighted = per_token * mask
    if settings.loss_type == "dr_grpo":
        return weighted.sum() / (max(rows, 1) * settings.max_tokens)
    if settings.aggregation == "sequence":
        lengths = mask.sum(-1).clamp(min=1.0)
        return (weighted.sum(-1) / lengths).sum() / max(rows, 1)
    return weighted.sum() / max(tokens, 1)
