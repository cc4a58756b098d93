"""Kahneman-Tversky optimisation with TRL's KTOTrainer on verifier-labelled rollouts: KtoConfig.

Each example is one rollout, unpaired: its prompt, its completion and a label, desirable when
the rollout passed its verifier and undesirable when it failed. The reference is the base
model (or the policy with its LoRA adapter switched off).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout.shared.errors import RolloutError
from rollout.shared.learning.config import KtoConfig, TrainConfig, TrainResult
from rollout.shared.learning.trl_job import CheckpointHook, ProgressHook, run_trl


def train_kto(
    base_model: Path,
    examples: Sequence[dict[str, Any]],
    out_dir: Path,
    config: TrainConfig,
    *,
    on_progress: ProgressHook | None = None,
    on_checkpoint: CheckpointHook | None = None,
    resume: bool = True,
) -> TrainResult:
    """Train `base_model` towards desirable and away from undesirable completions.

    Rows are conversational `prompt` and `completion` message lists, a boolean `label` and
    `tools`; both labels must occur (KTO weighs one against the other).
    """
    if not isinstance(config, KtoConfig):
        raise RolloutError(f"kto: needs a kto config, got one for {config.method}")
    rows = _validated(examples)
    return run_trl(
        method="kto",
        base_model=Path(base_model),
        rows=rows,
        out_dir=Path(out_dir),
        config=config,
        build_trainer=lambda *a: kto_trainer(*a, config=config),
        on_progress=on_progress,
        on_checkpoint=on_checkpoint,
        resume=resume,
    )


def kto_trainer(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    kw: dict[str, Any],
    callbacks: list,
    peft: Any,
    *,
    config: KtoConfig,
) -> Any:
    """The TRL KTOTrainer train_kto runs (sequential batches: its KL pairs are neighbours)."""
    from trl import KTOConfig, KTOTrainer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        args = KTOConfig(
            **kw,
            beta=config.beta,
            desirable_weight=config.desirable_weight,
            undesirable_weight=config.undesirable_weight,
        )
    return KTOTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=peft,
    )


def _validated(examples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    if not examples:
        raise RolloutError("kto: no labelled rollouts (the run has no scored conversations)")
    rows = []
    for i, example in enumerate(examples):
        for key in ("prompt", "completion"):
            value = example.get(key) if isinstance(example, dict) else None
            if not isinstance(value, list) or not value:
                raise RolloutError(f"kto: examples[{i}].{key}: missing or empty message list")
        if not isinstance(example.get("label"), bool):
            raise RolloutError(f"kto: examples[{i}].label: must be true or false")
        rows.append(
            {k: example[k] for k in ("prompt", "completion", "label")}
            | {"tools": example.get("tools")}
        )
    labels = {row["label"] for row in rows}
    if labels != {True, False}:
        which = "passed" if True in labels else "failed"
        raise RolloutError(
            f"kto: every rollout {which}; KTO needs both passed (desirable) and failed "
            "(undesirable) rollouts"
        )
    return rows
