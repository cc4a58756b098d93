"""A reward model with TRL's RewardTrainer: a sequence classifier on preference pairs: RmConfig.

The base causal LM becomes a sequence classifier with one output (its score head starts
fresh) trained so that chosen conversations score above rejected ones (Bradley-Terry). Every
weight trains; the saved model loads with AutoModelForSequenceClassification, which is how the
`reward_model` verifier primitive scores trajectories with it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout.shared.errors import RolloutError
from rollout.shared.learning.config import RmConfig, TrainConfig, TrainResult
from rollout.shared.learning.data import preference_rows
from rollout.shared.learning.loading import load_base
from rollout.shared.learning.trl_job import CheckpointHook, ProgressHook, run_trl
from rollout.shared.models.local_models import base_ref_of, is_adapter

# Written beside a trained reward model, so a verifier can tell one from a policy.
RM_MARKER = "rollout_reward_model.json"


def train_rm(
    base_model: Path,
    pairs: Sequence[dict[str, Any]],
    out_dir: Path,
    config: TrainConfig,
    *,
    on_progress: ProgressHook | None = None,
    on_checkpoint: CheckpointHook | None = None,
    resume: bool = True,
) -> TrainResult:
    """Train a reward model from `base_model` on (prompt, chosen, rejected) chats with tools."""
    if not isinstance(config, RmConfig):
        raise RolloutError(f"rm: needs an rm config, got one for {config.method}")
    rows = preference_rows(pairs, "rm")
    result = run_trl(
        method="rm",
        base_model=Path(base_model),
        rows=rows,
        out_dir=Path(out_dir),
        config=config,
        build_trainer=lambda *a: rm_trainer(*a, config=config),
        on_progress=on_progress,
        on_checkpoint=on_checkpoint,
        resume=resume,
        load_model=load_classifier,
    )
    (Path(result.model_dir) / RM_MARKER).write_text('{"kind": "reward_model", "num_labels": 1}\n')
    return result


def load_classifier(base_model: Path, lora: bool) -> tuple[Any, Any, str]:
    """(tokenizer, one-output sequence classifier, base reference) from a causal LM dir."""
    if lora or is_adapter(base_model):
        raise RolloutError(
            "base_model: a reward model trains every weight of a full model (no LoRA adapter)"
        )
    tokenizer, _ = load_base(base_model)
    return tokenizer, classifier_from(base_model, tokenizer), base_ref_of(base_model)


def classifier_from(model_dir: Path, tokenizer: Any) -> Any:
    """AutoModelForSequenceClassification with one label from `model_dir` (float32)."""
    import torch
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    # "Some weights were newly initialized" is expected: the score head is new.
    hf_logging.set_verbosity_error()
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            str(model_dir), num_labels=1, local_files_only=True, dtype=torch.float32
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    # Batched scoring finds each sequence's last token through the pad id.
    model.config.pad_token_id = tokenizer.pad_token_id
    return model


def rm_trainer(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    kw: dict[str, Any],
    callbacks: list,
    peft: Any,
    *,
    config: RmConfig,
) -> Any:
    """The TRL RewardTrainer train_rm runs."""
    from trl import RewardConfig, RewardTrainer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        args = RewardConfig(**kw, center_rewards_coefficient=config.center_rewards_coefficient)
    return RewardTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=None,
    )
