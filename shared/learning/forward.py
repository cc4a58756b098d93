"""Token log-probs of a training batch, with the prompt prefix its rows share computed once.

The rows of an online step (GRPO, PPO) are a group's completions of one prompt, and every
prompt of an env starts with the same system message and tool list: on SmolLM2 and
ticket-routing 170 of a row's ~230 tokens. A plain forward computes those positions once per
row, and the vocabulary projection and its log-softmax at every position although only the
completion's are read. Here the shared prefix runs once (batch 1, with gradients) and its KV
cache is expanded to the batch, so the rows compute only their own tails; the backward sums
the rows' gradients through the expansion into the prefix, so loss and gradients equal the
plain forward's (tests/learning/test_shared_prefix_forward.py). Logits are computed only from
the first position any row's completion is predicted at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollout.shared.learning.loading import autocast
from rollout.shared.models.hf import _cache_of, _forward_kwargs


@dataclass
class ForwardStats:
    """What the last batch computed: rows, the prefix run once, and tail positions per row."""

    rows: int = 0
    shared_prefix: int = 0
    tail_width: int = 0
    logit_positions: int = 0


def completion_forward(
    model: Any,
    batch: dict[str, Any],
    *,
    hidden: bool = False,
    stats: ForwardStats | None = None,
    precision: str = "fp32",
) -> tuple[Any, Any]:
    """(log-probs, last hidden states or None), both (rows, width - 1) in target space.

    `batch` is `_tensors`' right-padded batch: `ids`, `attention`, and `first` (the earliest
    position predicting a completion token) and `shared` (prefix length, 0 for none). Positions
    before `first` hold zeros: callers read only completion positions (their mask).
    With `precision` bf16 the model's forwards run under bf16 autocast (the LM head's matmul
    included, so the logits carry bf16 rounding); the log-softmax over them and everything
    after it run in float32.
    """
    import torch
    from trl.trainer.utils import selective_log_softmax

    ids, attention = batch["ids"], batch["attention"]
    rows, width = ids.shape
    first = int(batch.get("first", 0))
    shared = int(batch.get("shared", 0))
    cache_kw, extra = _forward_kwargs(model)
    if not extra:
        # A model without `logits_to_keep` gets the plain forward over every position.
        first = shared = 0
    keep = width - first  # positions first .. width - 1; the last one predicts nothing
    kwargs: dict[str, Any] = {"output_hidden_states": hidden}
    if extra:
        kwargs["logits_to_keep"] = keep
    # Only the model's forwards autocast: the log-softmax below, and whatever the caller
    # computes from the log-probs (ratios, advantages, losses), stay in float32.
    with autocast(precision, ids.device.type):
        if shared:
            head = model(input_ids=ids[:1, :shared], use_cache=True)
            past = _cache_of(head)
            past.batch_repeat_interleave(rows)
            position = torch.arange(shared, width, device=ids.device).expand(rows, -1)
            out = model(
                input_ids=ids[:, shared:],
                attention_mask=attention,
                position_ids=position,
                use_cache=False,
                **{cache_kw: past},
                **kwargs,
            )
        else:
            out = model(input_ids=ids, attention_mask=attention, **kwargs)
    logits = out.logits[:, -keep:]
    targets = ids[:, first + 1 :]
    logp = selective_log_softmax(logits[:, :-1].float(), targets)
    if stats is not None:
        stats.rows, stats.shared_prefix = rows, shared
        stats.tail_width, stats.logit_positions = width - shared, rows * (keep - 1)
    states = None
    if hidden:
        last = out.hidden_states[-1]
        # The tail's states start at `shared`; keep those from `first` (>= shared) on.
        states = last[:, first - shared : -1] if shared else last[:, first:-1]
    if first:
        pad = logp.new_zeros((rows, first))
        logp = torch.cat([pad, logp], dim=1)
        if states is not None:
            states = torch.cat([states.new_zeros((rows, first, states.shape[-1])), states], 1)
    return logp, states
