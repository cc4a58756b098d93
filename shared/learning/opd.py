"""On-policy distillation: the student samples on the env, a teacher scores the student's tokens.

The GRPO learner's loop, with the signal changed (Agarwal et al., "On-Policy Distillation of
Language Models", 2024; Thinking Machines' "On-Policy Distillation", 2025): for every token the
student sampled, the teacher's logprob of it minus the student's is that token's advantage.
That is the negative of a one-sample estimate of the per-token reverse KL(student || teacher),
so a token the teacher finds likelier than the student did is pushed up and one the teacher
finds unlikely is pushed down, at the states the student visits itself (no exposure bias, as
SFT on the teacher's own samples has). No reward is used; the verifier still scores each
rollout, for the record. The surrogate, clipping and off-policy correction are GRPO's
(shared/learning/policy_loss.py) with a per-token advantage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollout.shared.errors import RolloutError
from rollout.shared.learning.config import TrainConfig
from rollout.shared.learning.grpo import Group, GRPOLearner, _Row, merge_turns
from rollout.shared.learning.loading import load_policy


class OPDLearner(GRPOLearner):
    """A student trained online towards `teacher`'s per-token distribution; one step per batch."""

    # The job's progress `kl`: the reverse KL to the teacher, the quantity being minimised.
    progress_kl = "last_reverse_kl"

    def __init__(
        self,
        base_model: Path,
        out_dir: Path,
        config: TrainConfig,
        *,
        resume: bool = True,
        teacher: Path | None = None,
    ) -> None:
        if teacher is None:
            raise RolloutError("teacher: on-policy distillation needs a teacher model")
        super().__init__(base_model, out_dir, config, resume=resume)
        self.teacher = self._load_teacher(Path(teacher))
        self.metrics.setdefault("last_reverse_kl", 0.0)
        self._kl_sum = self._kl_tokens = 0.0

    def _load_teacher(self, path: Path) -> Any:
        tokenizer, model, _ = load_policy(path, lora=False, where="teacher")
        ours, theirs = self.tokenizer.get_vocab(), tokenizer.get_vocab()
        if ours != theirs:
            raise RolloutError(
                f"teacher: {path} has another tokenizer than the student's ({len(theirs)} vs "
                f"{len(ours)} tokens); distillation scores the student's own tokens, so both "
                "must share one"
            )
        model.to(self.device).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        return model

    def _rows(self, groups: list[Group]) -> tuple[list[_Row], list[float]]:
        rewards: list[float] = []
        rows: list[_Row] = []
        stale: list[int] = []
        for group in groups:
            prompt = list(group.get("prompt") or [])
            tools = group.get("tools") or None
            completions = list(group.get("completions") or [])
            fresh = [c for c in completions if self.accepts(int(c.get("policy_version", 0)))]
            self.metrics["dropped_stale"] += len(completions) - len(fresh)
            for completion in fresh:
                # The record of how the student does; the teacher's logprobs are the signal.
                rewards.append(float(completion.get("reward") or 0.0))
                stale.append(self.policy_version - int(completion.get("policy_version", 0)))
                turns = self._turn_rows(prompt, tools, completion, 0.0)
                if turns:
                    self.metrics["completions_trained"] += 1
                rows.extend(merge_turns(turns) if self.merge_turns else turns)
        self.metrics["last_staleness"] = sum(stale) / len(stale) if stale else 0.0
        return rows, rewards

    def _advantages(self, batch: dict[str, Any], logp: Any) -> Any:
        """Per sampled token: kl_coef x (teacher logprob - student logprob)."""
        import torch

        with torch.no_grad():
            teacher = self._logprobs(self.teacher, batch)
        mask = batch["mask"]
        reverse_kl = (logp.detach() - teacher) * mask
        self._kl_sum += float(reverse_kl.sum())
        self._kl_tokens += float(mask.sum())
        return -float(self.config.kl_coef) * reverse_kl

    def _accumulate(self, rows: list[_Row]) -> tuple[float, dict[str, float]]:
        self._kl_sum = self._kl_tokens = 0.0
        loss, stats = super()._accumulate(rows)
        stats["last_reverse_kl"] = self._kl_sum / self._kl_tokens if self._kl_tokens else 0.0
        return loss, stats
