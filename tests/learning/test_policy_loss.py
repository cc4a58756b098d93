"""The GRPO family's losses on hand-worked batches: each moves the way its paper says."""

from __future__ import annotations

import math

import pytest
import torch

from rollout.shared.learning.policy_loss import (
    LossSettings,
    batch_normalised,
    group_advantages,
    overlong_penalty,
    per_token_loss,
    reduce_loss,
)


def test_advantages_by_kind() -> None:
    scores = [1.0, 0.0, 0.0, 1.0]
    group = group_advantages(scores, "group")
    assert group == pytest.approx([1, -1, -1, 1], abs=1e-3)  # (r - 0.5) / 0.5
    # RLOO: r_i minus the mean of the other three: 1 - 1/3, 0 - 2/3.
    assert group_advantages(scores, "rloo") == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    # Dr. GRPO: centred, not divided by the group's std.
    assert group_advantages(scores, "group", scale=False) == [0.5, -0.5, -0.5, 0.5]
    # REINFORCE++: centred in the group, then normalised over the whole step.
    centred = group_advantages(scores, "reinforce_pp") + group_advantages(
        [3.0, 1.0], "reinforce_pp"
    )
    assert centred == [0.5, -0.5, -0.5, 0.5, 1.0, -1.0]
    normalised = batch_normalised(centred)
    assert sum(normalised) == pytest.approx(0, abs=1e-9)
    assert (sum(a * a for a in normalised) / 6) ** 0.5 == pytest.approx(1, abs=1e-3)
    # A group whose samples all scored alike has no signal, whatever the kind.
    assert all(group_advantages([0.5, 0.5], k) is None for k in ("group", "rloo", "reinforce_pp"))


def test_overlong_penalty_is_soft_then_full() -> None:
    assert overlong_penalty([70, 10], max_tokens=100, buffer=20) == 0.0
    assert overlong_penalty([90], max_tokens=100, buffer=20) == pytest.approx(-0.5)
    assert overlong_penalty([100], max_tokens=100, buffer=20) == -1.0
    assert overlong_penalty([100], max_tokens=100, buffer=0) == 0.0  # off


def _grad(settings: LossSettings, advantage: float, actor_gap: float = 0.0):
    """d loss / d logp of one token the actor recorded `actor_gap` nats below the learner."""
    logp = torch.tensor([[-1.0]], requires_grad=True)
    actor = logp.detach() - actor_gap
    mask = torch.ones(1, 1)
    loss, counts = per_token_loss(
        logp, actor, torch.tensor([[True]]), torch.tensor([advantage]), mask, settings
    )
    reduce_loss(loss, mask, settings, tokens=1, rows=1).backward()
    return float(logp.grad), counts


def test_clip_higher_lets_a_rewarded_token_rise_further() -> None:
    # The actor sampled the token at 1/1.25 of the learner's probability: ratio 1.25.
    gap = math.log(1.25)
    grpo, _ = _grad(LossSettings(loss_type="grpo"), 1.0, gap)
    dapo, _ = _grad(LossSettings(loss_type="dapo", epsilon_high=0.28), 1.0, gap)
    assert grpo == 0.0  # past 1 + 0.2: clipped, no gradient
    assert dapo == pytest.approx(-1.25)  # inside 1 + 0.28: d(-ratio * A)/dlogp = -ratio


def test_cispo_keeps_the_gradient_of_a_clipped_token() -> None:
    gap = math.log(10.0)  # ratio 10, far past any clip
    grpo, _ = _grad(LossSettings(loss_type="grpo"), 1.0, gap)
    cispo, counts = _grad(LossSettings(loss_type="cispo", epsilon_high=5.0), 1.0, gap)
    assert grpo == 0.0
    # CISPO: -sg(min(ratio, 5)) * A * logp: the weight is capped at 5, the gradient flows.
    assert cispo == pytest.approx(-5.0)
    assert counts["clipped_tokens"] == 1.0


def test_gspo_clips_the_sequence_ratio_not_the_tokens() -> None:
    settings = LossSettings(
        loss_type="gspo", epsilon=3e-4, epsilon_high=4e-4, aggregation="sequence"
    )
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    # Token ratios exp(+0.1) and exp(-0.1): far outside GSPO's range each, exactly 1 together.
    actor = torch.tensor([[-1.1, -1.9]])
    mask = torch.ones(1, 2)
    loss, counts = per_token_loss(
        logp, actor, torch.ones(1, 2, dtype=torch.bool), torch.tensor([1.0]), mask, settings
    )
    reduce_loss(loss, mask, settings, tokens=2, rows=1).backward()
    assert counts["clipped_tokens"] == 0.0
    # Sequence ratio s = exp(mean log-ratio) = 1; loss = -s * A; d/dlogp_t = -s * A / 2 each.
    assert logp.grad[0].tolist() == pytest.approx([-0.5, -0.5])
    grpo = LossSettings(loss_type="grpo")
    _, counts = per_token_loss(
        logp.detach(), actor, torch.ones(1, 2, dtype=torch.bool), torch.tensor([1.0]), mask, grpo
    )
    assert counts["clipped_tokens"] == 0.0  # 0.1 is inside GRPO's 0.2 either way


def test_aggregations_weigh_rows_as_documented() -> None:
    per_token = torch.tensor([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    token = LossSettings(aggregation="token")
    sequence = LossSettings(aggregation="sequence")
    dr = LossSettings(loss_type="dr_grpo", max_tokens=10)
    assert float(reduce_loss(per_token, mask, token, tokens=4, rows=2)) == pytest.approx(5 / 4)
    assert float(reduce_loss(per_token, mask, sequence, tokens=4, rows=2)) == pytest.approx(1.5)
    assert float(reduce_loss(per_token, mask, dr, tokens=4, rows=2)) == pytest.approx(5 / 20)


@pytest.mark.parametrize(("correction", "bound"), [("none", None), ("tis", 3.0), ("mis", 0.0)])
def test_the_correction_bounds_an_update_from_disagreeing_logprobs(
    correction: str, bound: float | None
) -> None:
    # The actor recorded the token e^3 (about 20) times less likely than the learner finds it
    # (a broken engine, or a very stale policy); the sample was punished (A = -1).
    settings = LossSettings(loss_type="grpo", is_correction=correction, is_cap=3.0)
    grad, counts = _grad(settings, -1.0, 3.0)
    assert counts["max_is_ratio"] == pytest.approx(math.exp(3.0), rel=1e-5)
    assert counts["mismatch_kl_sum"] == pytest.approx(math.exp(3.0) - 1 - 3.0, rel=1e-5)
    assert counts["is_outside_tokens"] == 1.0
    if bound is None:
        # Uncorrected: -min(r * A, clip(r) * A) with A < 0 keeps r * A: a step ~20x too large.
        assert grad == pytest.approx(math.exp(3.0), rel=1e-5)
    else:
        # TIS: the weight is truncated at the cap; MIS: the token is masked out.
        assert grad == pytest.approx(bound)


def test_on_policy_tokens_are_untouched_by_the_correction() -> None:
    for correction in ("none", "tis", "mis"):
        grad, counts = _grad(LossSettings(is_correction=correction), 1.0, 0.0)
        assert grad == pytest.approx(-1.0)
        assert counts["mismatch_kl_sum"] == pytest.approx(0.0, abs=1e-7)
        assert counts["is_outside_tokens"] == 0.0
