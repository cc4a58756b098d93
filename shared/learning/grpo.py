"""Online GRPO: actors sample asynchronously, the learner steps on groups as they arrive.

TRL's GRPOTrainer owns its generation loop (it samples from a prompt dataset itself, or via a
`rollout_func` it calls), so it cannot be *pushed* groups that independent actors produced
with older policy versions. The objective is therefore implemented here on torch (TRL's
`selective_log_softmax` computes the token log-probs), as in GRPO/DAPO:

- advantages are group-normalised rewards: (r - mean(group)) / (std(group) + 1e-4);
- per completion token, the PPO-style clipped surrogate with the ratio against the
  logprobs the actor recorded when sampling (importance correction for stale policies);
- an optional KL penalty to the base policy (k3 estimator), weighted by `config.beta`;
- the loss is averaged over every completion token of the step (no length bias per sequence).

Those are the defaults; `loss_type`, `advantage`, `is_correction` and `aggregation` choose the
GRPO family's variants (DAPO, Dr. GRPO, GSPO, CISPO; RLOO, REINFORCE++; truncated or masked
importance sampling): shared/learning/policy_loss.py.

Multi-turn completions train every assistant turn: turn k's context is the conversation up
to that turn rendered exactly as the `hf` backend rendered it when sampling, followed by the
token ids the actor sampled. Completions more than `max_staleness` versions behind the learner
are dropped (counted in `metrics["dropped_stale"]`). One `step` is one optimizer step and
bumps `policy_version`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import structlog

from rollout.shared.errors import RolloutError
from rollout.shared.learning.checkpoints import (
    CHECKPOINTS,
    GRPO_MARKER,
    append_step_log,
    checkpoint_dirs,
    prepare_resume,
)
from rollout.shared.learning.config import Progress, TrainConfig
from rollout.shared.learning.forward import ForwardStats, completion_forward
from rollout.shared.learning.loading import (
    device,
    is_peft,
    load_policy,
    precision,
    quiet_libraries,
    torch_threads,
)
from rollout.shared.learning.policy_loss import (
    LossSettings,
    batch_normalised,
    group_advantages,
    overlong_penalty,
    per_token_loss,
    reduce_loss,
)
from rollout.shared.learning.trl_job import lora_config
from rollout.shared.models.hf import _template_messages, shared_prefix_length
from rollout.shared.models.local_models import write_adapter_base

log = structlog.get_logger(__name__)

CLIP_EPS = 0.2


class Completion(TypedDict, total=False):
    """One sampled episode of a group: per-turn token ids and logprobs, messages, reward."""

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    messages: list[dict[str, Any]]
    reward: float
    policy_version: int


class Group(TypedDict, total=False):
    """Completions of one prompt (same task), compared with each other for advantages."""

    prompt: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    completions: list[Completion]


@dataclass
class _Row:
    context: list[int]
    completion: list[int]
    old_logprobs: list[float] | None
    advantage: float
    # Per completion token, whether it is trained on: a row merged from consecutive turns
    # holds the tool reply between them, which the model did not sample. None: every token.
    trained: list[bool] | None = None
    # Which rollout the row comes from, and its turns in order: (turn index, sampled tokens).
    rollout_id: str = ""
    turns: tuple[tuple[int, int], ...] = ()

    @property
    def trained_tokens(self) -> int:
        """How many of the completion's tokens the loss covers."""
        return len(self.completion) if self.trained is None else sum(self.trained)


def merge_turns(rows: list[_Row]) -> list[_Row]:
    """Consecutive turns of one completion as one row wherever a turn's context is exactly
    the previous turn's context and sampled tokens, then more (the tool reply).

    Causal attention makes each position's logits depend on the tokens before it only, so
    the merged row's loss and gradients are the separate rows'; the shared positions are
    computed once instead of once per turn (a second turn otherwise recomputes the whole
    first turn).
    """
    out: list[_Row] = []
    for row in rows:
        last = out[-1] if out else None
        if last is not None and _continues(last, row):
            seen = len(last.context) + len(last.completion)
            gap = len(row.context) - seen
            trained = last.trained or [True] * len(last.completion)
            old = None
            if last.old_logprobs is not None and row.old_logprobs is not None:
                old = [*last.old_logprobs, *[0.0] * gap, *row.old_logprobs]
            out[-1] = _Row(
                last.context,
                [*last.completion, *row.context[seen:], *row.completion],
                old,
                last.advantage,
                [*trained, *[False] * gap, *[True] * len(row.completion)],
                rollout_id=last.rollout_id,
                turns=last.turns + row.turns,
            )
        else:
            out.append(row)
    return out


def _continues(last: _Row, row: _Row) -> bool:
    seen = len(last.context) + len(last.completion)
    return (
        row.advantage == last.advantage
        and row.rollout_id == last.rollout_id
        # Both turns with the actor's logprobs or neither: a merged row has one kind.
        and (row.old_logprobs is None) == (last.old_logprobs is None)
        and len(row.context) >= seen
        and row.context[: len(last.context)] == last.context
        and row.context[len(last.context) : seen] == last.completion
    )


class GRPOLearner:
    """A policy being trained online with GRPO; `step(groups)` is one optimizer step."""

    # Which of a step's metrics the job reports as its progress `kl`.
    progress_kl = "last_kl"

    def __init__(
        self,
        base_model: Path,
        out_dir: Path,
        config: TrainConfig,
        *,
        resume: bool = True,
        clip_eps: float = CLIP_EPS,
    ) -> None:
        import torch

        quiet_libraries()
        self.config = config
        self.clip_eps = clip_eps
        # The loss, advantage and correction variant (plain GRPO for older configs).
        self.loss = LossSettings.of(config)
        self.base_model = Path(base_model)
        self.out_dir = Path(out_dir)
        self.device = device()
        # fp32 or bf16 (autocast forwards; weights, adapter and losses stay float32).
        self.precision = precision()
        self._lock = threading.Lock()
        self.tokenizer, base, self.base_ref = load_policy(base_model, lora=config.lora)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        state = prepare_resume(self.out_dir, resume)
        if state is not None and state.kind != "grpo":
            raise RolloutError(
                f"{self.out_dir}: holds a {state.kind} checkpoint, not a GRPO learner's; "
                "use another output directory or resume=False"
            )
        if state is not None:
            saved = json.loads((state.path / GRPO_MARKER).read_text()).get("config") or {}
            if saved.get("method", config.method) != config.method:
                raise RolloutError(
                    f"{self.out_dir}: holds a {saved['method']} learner's checkpoint, not a "
                    f"{config.method} one's; use another output directory or resume=False"
                )
        self.policy_version = 0
        self.steps = 0
        self.metrics: dict[str, float] = {
            "dropped_stale": 0.0,
            "groups_without_signal": 0.0,
            "completions_trained": 0.0,
            "completions_without_tokens": 0.0,
            "turns_too_long": 0.0,
            "steps_without_data": 0.0,
            "overlong_penalised": 0.0,
        }
        self.last_checkpoint: Path | None = None
        # What the last policy forward computed (shared prefix, logit positions): for tests.
        self.forward_stats = ForwardStats()
        # Train a completion's consecutive turns as one row where exact (see merge_turns).
        self.merge_turns = True
        # Per trained rollout, per turn, what each token got in the last step (the viewer's
        # token signals): {rollout_id: {turn: {advantage, ratio, gap, clipped}}}.
        self.record_signals = True
        self.last_signals: dict[str, dict[str, dict[str, list[Any]]]] = {}
        self._ref_adapter: dict[str, Any] | None = None
        self._elapsed_total = 0.0
        self._steps_timed = 0
        self.model, self.ref_model = self._build_models(base, state.path if state else None)
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = self._optimizer()
        if state is not None:
            self._restore(state.path)
        else:
            random.seed(config.seed)
            torch.manual_seed(config.seed)

    # -- public API ------------------------------------------------------------------------

    def accepts(self, policy_version: int) -> bool:
        """False when `policy_version` is more than `max_staleness` versions behind."""
        return self.policy_version - int(policy_version) <= self.config.max_staleness

    def step(self, groups: list[Group]) -> Progress:
        """One optimizer step on `groups`; stale completions are dropped and counted."""
        with self._lock, torch_threads(self.config.threads, self.model):
            return self._step(groups)

    def save(self) -> Path:
        """Write the current policy (HFBackend-loadable) + optimizer/RNG/step; return its dir."""
        with self._lock:
            return self._save()

    # -- models ------------------------------------------------------------------------------

    def _optimizer(self) -> Any:
        import torch

        return torch.optim.AdamW(self._params, lr=self.config.learning_rate, weight_decay=0.0)

    def _kl_weight(self) -> float:
        """Weight of the KL to the base policy; a frozen reference is kept only when > 0."""
        return float(self.config.beta)

    def _build_models(self, base: Any, checkpoint: Path | None) -> tuple[Any, Any]:
        import torch

        ref = None
        if self.config.lora:
            from peft import get_peft_model

            # A base that is an adapter already (a trained name) trains that adapter on.
            model = base if is_peft(base) else get_peft_model(base, lora_config(self.config))
            if is_peft(base):
                # The KL reference is the policy training starts from (the SFT adapter), not
                # the pretrained weights under it: switching the adapter off would pull an
                # SFT'd model back towards a base that passes nothing. A copy of the starting
                # adapter's weights (a few MB) is swapped in for the reference forward.
                self._ref_adapter = {
                    name: p.detach().clone()
                    for name, p in model.named_parameters()
                    if p.requires_grad
                }
            if checkpoint is not None:
                from peft import load_peft_weights, set_peft_model_state_dict

                adapter = load_peft_weights(str(checkpoint), device="cpu")
                set_peft_model_state_dict(model, adapter)
            # The reference is the same model with the adapter switched off: no copy.
        else:
            if self._kl_weight() > 0:
                ref = copy.deepcopy(base).to(self.device).eval()
                for p in ref.parameters():
                    p.requires_grad_(False)
            if checkpoint is not None:
                from transformers import AutoModelForCausalLM

                model = AutoModelForCausalLM.from_pretrained(
                    str(checkpoint), local_files_only=True, dtype=torch.float32
                )
            else:
                model = base
        model.to(self.device)
        model.train()
        return model, ref

    # -- one step ----------------------------------------------------------------------------

    def _step(self, groups: list[Group]) -> Progress:
        started = time.monotonic()
        rows, rewards = self._rows(groups)
        if not rows:
            self.metrics["steps_without_data"] += 1
            log.info("grpo step skipped: no trainable completions", version=self.policy_version)
            return self._progress(None, _mean(rewards), None)
        loss, stats = self._optimize(rows)
        return self._finish_step(started, rows, rewards, loss, stats)

    def _finish_step(
        self,
        started: float,
        rows: list[Any],
        rewards: list[float],
        loss: float,
        stats: dict[str, float],
        **logged: float,
    ) -> Progress:
        """Count the new policy version, time the step and log it once (GRPO and PPO alike)."""
        self.policy_version += 1
        self.steps += 1
        elapsed = max(time.monotonic() - started, 1e-9)
        tokens = sum(len(r.context) + len(r.completion) for r in rows)
        self.metrics.update(stats)
        # Which precision the step ran in (metrics are floats): 1 for bf16 autocast.
        self.metrics["bf16"] = float(self.precision == "bf16")
        self._elapsed_total += elapsed
        self._steps_timed += 1
        progress = self._progress(loss, _mean(rewards), tokens / elapsed)
        progress.kl = stats.get(self.progress_kl)
        append_step_log(
            self.out_dir,
            progress.model_dump(mode="json")
            | {
                "policy_version": self.policy_version,
                "dropped_stale": self.metrics["dropped_stale"],
                "precision": self.precision,
            }
            | logged,
        )
        return progress

    def _progress(self, loss: float | None, reward: float | None, tps: float | None) -> Progress:
        total = self.config.max_steps or self.steps
        eta = None
        if self.config.max_steps and self._steps_timed:
            eta = max(0, total - self.steps) * self._elapsed_total / self._steps_timed
        return Progress(
            step=self.steps,
            total_steps=total,
            loss=loss,
            reward=reward,
            tokens_per_s=tps,
            eta_s=eta,
            epoch=None,
        )

    def _rows(self, groups: list[Group]) -> tuple[list[_Row], list[float]]:
        rewards: list[float] = []
        # (prompt, tools, completion, advantage) of every completion with a signal.
        chosen: list[tuple[list[dict], Any, Completion, float]] = []
        stale: list[int] = []
        for g, group in enumerate(groups):
            prompt = list(group.get("prompt") or [])
            tools = group.get("tools") or None
            completions = list(group.get("completions") or [])
            fresh = [c for c in completions if self.accepts(int(c.get("policy_version", 0)))]
            self.metrics["dropped_stale"] += len(completions) - len(fresh)
            try:
                scores = [float(c["reward"]) for c in fresh]
            except (KeyError, TypeError, ValueError):
                raise RolloutError(
                    f"grpo: groups[{g}]: every completion needs a numeric reward"
                ) from None
            rewards.extend(scores)
            scores = [s + self._overlong(c) for c, s in zip(fresh, scores, strict=True)]
            advantages = group_advantages(
                scores, self.loss.advantage, scale=self.loss.loss_type != "dr_grpo"
            )
            if advantages is None:
                # Every completion scored the same (or one alone): no direction to move in.
                self.metrics["groups_without_signal"] += 1
                continue
            for completion, advantage in zip(fresh, advantages, strict=True):
                chosen.append((prompt, tools, completion, advantage))
                stale.append(self.policy_version - int(completion.get("policy_version", 0)))
        if self.loss.advantage == "reinforce_pp":
            normalised = batch_normalised([a for *_, a in chosen])
            chosen = [(*c[:3], a) for c, a in zip(chosen, normalised, strict=True)]
        rows: list[_Row] = []
        for prompt, tools, completion, advantage in chosen:
            turns = self._turn_rows(prompt, tools, completion, advantage)
            if turns:
                self.metrics["completions_trained"] += 1
            rows.extend(merge_turns(turns) if self.merge_turns else turns)
        self.metrics["last_staleness"] = sum(stale) / len(stale) if stale else 0.0
        return rows, rewards

    def _overlong(self, completion: Completion) -> float:
        """DAPO's overlong penalty for a completion (0 when the setting is off)."""
        buffer = self.loss.overlong_buffer
        if not buffer:
            return 0.0
        lengths = [len(t) for t in completion.get("token_ids") or []]
        penalty = overlong_penalty(lengths, self.loss.max_tokens, buffer)
        if penalty:
            self.metrics["overlong_penalised"] += 1
        return penalty

    def _turn_rows(
        self, prompt: list[dict], tools: Any, completion: Completion, advantage: float
    ) -> list[_Row]:
        token_ids = completion.get("token_ids") or []
        if not token_ids:
            self.metrics["completions_without_tokens"] += 1
            return []
        messages = list(completion.get("messages") or [])
        full = messages if messages[: len(prompt)] == prompt else prompt + messages
        starts = [i for i, m in enumerate(full) if m.get("role") == "assistant"]
        if not starts:
            starts = [len(full)]  # a single turn given without its assistant message
        logprobs = completion.get("logprobs") or []
        rows = []
        for k, ids in enumerate(token_ids[: len(starts)]):
            context = self._context_ids(full[: starts[k]], tools)
            if len(context) + len(ids) > self.config.max_seq_len:
                if not self.metrics["turns_too_long"]:
                    # Said once per job: a max_seq_len too short for the env's chats drops
                    # their later turns (the second call, the final answer) from training.
                    log.warning(
                        "grpo: a turn longer than max_seq_len is not trained on",
                        tokens=len(context) + len(ids),
                        max_seq_len=self.config.max_seq_len,
                        turn=k,
                    )
                self.metrics["turns_too_long"] += 1
                continue
            old = logprobs[k] if k < len(logprobs) and len(logprobs[k]) == len(ids) else None
            rows.append(
                _Row(
                    context, [int(t) for t in ids], old, advantage,
                    rollout_id=str(completion.get("rollout_id") or ""), turns=((k, len(ids)),),
                )
            )  # fmt: skip
        return rows

    def _context_ids(self, messages: list[dict], tools: Any) -> list[int]:
        # Render exactly as HFBackend.render_prompt did when the actor sampled this turn.

        text = self.tokenizer.apply_chat_template(
            _template_messages(messages), tools=tools, add_generation_prompt=True, tokenize=False
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _optimize(self, rows: list[_Row]) -> tuple[float, dict[str, float]]:
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, stats = self._accumulate(rows)
        torch.nn.utils.clip_grad_norm_(self._params, 1.0)
        self.optimizer.step()
        return loss_sum, stats

    def _accumulate(self, rows: list[_Row]) -> tuple[float, dict[str, float]]:
        """Forward and backward over `rows` in micro-batches: the step's gradients, summed."""
        import torch

        total_tokens = sum(r.trained_tokens for r in rows)
        self.last_signals = {}
        loss_sum = kl_sum = clipped = drift = 0.0
        recorded = mismatch_kl = outside = 0.0
        max_ratio = 1.0
        size = self.config.batch_size
        for start in range(0, len(rows), size):
            batch = self._tensors(rows[start : start + size])
            ref = None
            if self.config.beta > 0:
                # Before the policy's forward: the reference may swap adapter weights in place.
                with torch.no_grad():
                    ref = self._reference_logprobs(batch)
            logp = self._logprobs(self.model, batch)
            mask = batch["mask"]
            # Before the update, new == old up to numerics unless the actor's tokens or
            # rendering differ from ours (or the actor was stale): worth watching.
            with torch.no_grad():
                old = torch.where(batch["has_old"], batch["old"], logp.detach())
                recorded_mask = batch["has_old"].float() * mask
                drift += float(((logp - old).abs() * recorded_mask).sum())
            detail: dict[str, Any] = {}
            per_token, counts = per_token_loss(
                logp, batch["old"], batch["has_old"], self._advantages(batch, logp), mask,
                self.loss, detail,
            )  # fmt: skip
            self._record_signals(rows[start : start + size], batch, logp, detail)
            if ref is not None:
                delta = ref - logp
                kl = torch.exp(delta) - delta - 1
                per_token = per_token + self.config.beta * kl
                kl_sum += float((kl.detach() * mask).sum())
            loss = reduce_loss(per_token, mask, self.loss, tokens=total_tokens, rows=len(rows))
            loss.backward()
            loss_sum += float(loss.detach())
            clipped += counts["clipped_tokens"]
            recorded += counts["recorded_tokens"]
            mismatch_kl += counts["mismatch_kl_sum"]
            outside += counts["is_outside_tokens"]
            max_ratio = max(max_ratio, counts["max_is_ratio"])
        return loss_sum, {
            "last_kl": kl_sum / total_tokens,
            "last_clip_fraction": clipped / total_tokens,
            "last_tokens": float(total_tokens),
            "last_logprob_drift": drift / recorded if recorded else 0.0,
            # The actor-vs-learner gap on the tokens the actor recorded (policy.updated).
            "last_mismatch_kl": mismatch_kl / recorded if recorded else 0.0,
            "last_max_is_ratio": max_ratio,
            "last_is_outside_fraction": outside / recorded if recorded else 0.0,
        }

    def _record_signals(
        self, rows: list[_Row], batch: dict[str, Any], logp: Any, detail: dict[str, Any]
    ) -> None:
        """Keep each trained token's advantage, applied ratio, actor-vs-learner logprob gap
        and clip, per rollout and turn (what the viewer shades the trajectory's tokens by)."""
        if not self.record_signals:
            return
        gap = logp.detach() - batch["old"]
        for i, row in enumerate(rows):
            if not row.rollout_id or not row.turns:
                continue
            where = batch["mask"][i].nonzero().squeeze(-1)
            if len(where) != sum(n for _, n in row.turns):
                continue  # not the row's sampled tokens alone: nothing trustworthy to show
            advantage = detail["advantage"][i, where].tolist()
            ratio = detail["weight"][i, where].tolist()
            clipped = detail["clipped"][i, where].tolist()
            known = batch["has_old"][i, where].tolist()
            gaps = gap[i, where].tolist()
            turns = self.last_signals.setdefault(row.rollout_id, {})
            start = 0
            for turn, n in row.turns:
                span = slice(start, start + n)
                start += n
                turns[str(turn)] = {
                    "advantage": [round(v, 4) for v in advantage[span]],
                    "ratio": [round(v, 4) for v in ratio[span]],
                    "gap": [
                        round(g, 4) if k else None
                        for g, k in zip(gaps[span], known[span], strict=True)
                    ],
                    "clipped": [int(c > 0) for c in clipped[span]],
                }

    def _advantages(self, batch: dict[str, Any], logp: Any) -> Any:
        """The advantage of each row of `batch` (a subclass may give one per token)."""
        return batch["advantage"]

    def _tensors(self, rows: list[_Row]) -> dict[str, Any]:
        import torch

        width = max(len(r.context) + len(r.completion) for r in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        # Target space: position t predicts token t + 1.
        mask = torch.zeros((len(rows), width - 1))
        old = torch.zeros((len(rows), width - 1))
        has_old = torch.zeros((len(rows), width - 1), dtype=torch.bool)
        for i, row in enumerate(rows):
            seq = row.context + row.completion
            ids[i, : len(seq)] = torch.tensor(seq)
            attention[i, : len(seq)] = 1
            first = len(row.context) - 1
            span = slice(first, first + len(row.completion))
            trained = torch.ones(len(row.completion)) if row.trained is None else (
                torch.tensor(row.trained, dtype=torch.float32)
            )  # fmt: skip
            mask[i, span] = trained
            if row.old_logprobs is not None:
                old[i, span] = torch.tensor(row.old_logprobs)
                has_old[i, span] = trained.bool()
        advantage = torch.tensor([r.advantage for r in rows])

        # Target space: the first logits read are at `first`, so the prefix run once ends there.
        first = min(len(r.context) for r in rows) - 1
        shared = shared_prefix_length([r.context for r in rows], first)
        return {
            "first": first,
            "shared": shared,
            "ids": ids.to(self.device),
            "attention": attention.to(self.device),
            "mask": mask.to(self.device),
            "old": old.to(self.device),
            "has_old": has_old.to(self.device),
            "advantage": advantage.to(self.device),
        }

    def _logprobs(self, model: Any, batch: dict[str, Any]) -> Any:
        logp, _ = completion_forward(
            model, batch, stats=self.forward_stats, precision=self.precision
        )
        return logp

    def _reference_logprobs(self, batch: dict[str, Any]) -> Any:
        if self.ref_model is not None:
            return self._logprobs(self.ref_model, batch)
        if self._ref_adapter is not None:
            with self._starting_adapter():
                return self._logprobs(self.model, batch)
        with self.model.disable_adapter():  # a new adapter: the reference is the base under it
            return self._logprobs(self.model, batch)

    @contextlib.contextmanager
    def _starting_adapter(self) -> Iterator[None]:
        """The adapter's weights as training started, for the reference forward only."""
        import torch

        params = dict(self.model.named_parameters())
        current = {name: params[name].detach().clone() for name in self._ref_adapter}
        with torch.no_grad():
            for name, weights in self._ref_adapter.items():
                params[name].copy_(weights)
            try:
                yield
            finally:
                for name, weights in current.items():
                    params[name].copy_(weights)

    # -- checkpoints -------------------------------------------------------------------------

    def _save(self) -> Path:
        import torch

        root = self.out_dir / CHECKPOINTS
        final = root / f"policy-{self.policy_version:06d}"
        if final.exists() and (final / GRPO_MARKER).exists():
            return final
        tmp = root / f".tmp-policy-{self.policy_version:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        # With LoRA this is the adapter alone: actors load it onto the base without merging,
        # and swap it for the next version's without reloading the base.
        self.model.save_pretrained(tmp)
        self.tokenizer.save_pretrained(tmp)
        if self.config.lora:
            write_adapter_base(tmp, self.base_ref)
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, tmp / "rng.pt")
        self._save_extra(tmp)
        # The marker is written last: a dir without it is an interrupted save.
        (tmp / GRPO_MARKER).write_text(
            json.dumps(
                {
                    "policy_version": self.policy_version,
                    "steps": self.steps,
                    "metrics": self.metrics,
                    "base_model": str(self.base_model),
                    "config": self.config.model_dump(mode="json"),
                },
                indent=2,
            )
            + "\n"
        )
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        self.last_checkpoint = final
        self._prune()
        return final

    def _save_extra(self, tmp: Path) -> None:
        """Write what a subclass adds to a checkpoint (before its marker)."""

    def _prune(self) -> None:
        # Actors may still be loading a recent version; keep a staleness window of them.
        keep = max(3, self.config.max_staleness + 2)
        complete = [path for _, path, ok in checkpoint_dirs(self.out_dir) if ok]
        for path in complete[:-keep]:
            shutil.rmtree(path, ignore_errors=True)

    def _restore(self, path: Path) -> None:
        import torch

        state = json.loads((path / GRPO_MARKER).read_text())
        method = self.config.method
        self.policy_version = int(state["policy_version"])
        self.steps = int(state["steps"])
        self.metrics.update({k: float(v) for k, v in state.get("metrics", {}).items()})
        self.optimizer.load_state_dict(
            torch.load(path / "optimizer.pt", map_location=self.device, weights_only=True)
        )
        rng = torch.load(path / "rng.pt", weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.last_checkpoint = path
        log.info("learner resumed", method=method, version=self.policy_version, path=str(path))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
