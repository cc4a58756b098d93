"""Direct preference optimisation (and IPO, hinge, ...) with TRL's DPOTrainer: DpoConfig."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout.shared.errors import RolloutError
from rollout.shared.learning.config import DpoConfig, TrainConfig, TrainResult
from rollout.shared.learning.data import preference_rows
from rollout.shared.learning.trl_job import CheckpointHook, ProgressHook, run_trl


def train_dpo(
    base_model: Path,
    pairs: Sequence[dict[str, Any]],
    out_dir: Path,
    config: TrainConfig,
    *,
    on_progress: ProgressHook | None = None,
    on_checkpoint: CheckpointHook | None = None,
    resume: bool = True,
) -> TrainResult:
    """Train `base_model` to prefer `chosen` over `rejected` (the reference is the base model).

    Rows come from `dpo_pairs`: conversational `prompt`, `chosen`, `rejected` message lists
    plus `tools`. `config` is a DpoConfig: `beta` is the preference temperature, `loss_type`
    picks TRL's loss (sigmoid: DPO, ipo: IPO, hinge, ...).
    """
    rows = preference_rows(pairs, "dpo")
    if not isinstance(config, DpoConfig):
        raise RolloutError(f"dpo: needs a dpo config, got one for {config.method}")

    return run_trl(
        method="dpo",
        base_model=Path(base_model),
        rows=rows,
        out_dir=Path(out_dir),
        config=config,
        build_trainer=lambda *a: dpo_trainer(*a, config=config),
        on_progress=on_progress,
        on_checkpoint=on_checkpoint,
        resume=resume,
    )


def dpo_trainer(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    kw: dict[str, Any],
    callbacks: list,
    peft: Any,
    *,
    config: DpoConfig,
) -> Any:
    """The TRL DPOTrainer train_dpo runs (reference: the base model, or LoRA switched off)."""
    from trl import DPOConfig, DPOTrainer

    with warnings.catch_warnings():
        # transformers flags TRL's own argument names as deprecated: not actionable here.
        warnings.simplefilter("ignore", FutureWarning)
        args = DPOConfig(
            **kw,
            beta=config.beta,
            loss_type=[config.loss_type],
            label_smoothing=config.label_smoothing,
        )
    return DPOTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=peft,
    )
