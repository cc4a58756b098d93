"""One TRL training run (SFT, DPO, KTO or a reward model) with our progress, checkpoint and resume semantics.

TRL's trainers (on transformers' Trainer) do the optimisation and write checkpoints with the
weights, optimizer, LR scheduler, RNG states and step; this module picks the checkpoint to
resume from, reports progress per optimizer step, logs each step exactly once, and saves the
final model where HFBackend can load it. With LoRA the final model is the adapter alone (plus
the tokenizer and `rollout_adapter.json`, naming the base it loads onto): actors load it on
the base without merging. A base that is itself an adapter trains on (LoRA) or is merged first
(full fine-tuning).
"""

from __future__ import annotations

import json
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from rollout.shared.errors import RolloutError
from rollout.shared.learning.checkpoints import (
    CHECKPOINTS,
    FINAL_MODEL,
    append_step_log,
    prepare_resume,
    replace_dir,
)
from rollout.shared.learning.config import Progress, TrainConfig, TrainResult
from rollout.shared.learning.loading import (
    device,
    is_peft,
    load_policy,
    precision,
    quiet_libraries,
    torch_threads,
)
from rollout.shared.models.local_models import write_adapter_base

log = structlog.get_logger(__name__)

ProgressHook = Callable[[Progress], None]
CheckpointHook = Callable[[Path, int], None]
# (model, tokenizer, dataset, common TRL config kwargs, callbacks, peft config) -> trainer
TrainerFactory = Callable[[Any, Any, Any, dict[str, Any], list[Any], Any], Any]
# (base model dir, lora) -> (tokenizer, model, base reference); default: a causal LM policy
ModelLoader = Callable[[Path, bool], tuple[Any, Any, str]]


def run_trl(
    *,
    method: str,
    base_model: Path,
    rows: list[dict[str, Any]],
    out_dir: Path,
    config: TrainConfig,
    build_trainer: TrainerFactory,
    on_progress: ProgressHook | None,
    on_checkpoint: CheckpointHook | None,
    resume: bool,
    load_model: ModelLoader | None = None,
) -> TrainResult:
    """Train with the trainer `build_trainer` makes; resume, report, save the final model."""
    from datasets import Dataset

    quiet_libraries()
    out_dir = Path(out_dir)
    if load_model is None:
        tokenizer, model, base_ref = load_policy(base_model, lora=config.lora)
    else:
        tokenizer, model, base_ref = load_model(Path(base_model), config.lora)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = prepare_resume(out_dir, resume)
    try:
        dataset = Dataset.from_list(rows)
    except Exception as exc:  # arrow cannot unify the rows' shapes
        raise RolloutError(f"{method}: training rows have inconsistent shapes: {exc}") from None
    reporter = _reporter_class()(out_dir, on_progress, on_checkpoint)
    with torch_threads(config.threads, model), warnings.catch_warnings():
        # transformers' deprecation chatter about TRL's own argument names is not actionable.
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        trainer = build_trainer(
            model,
            tokenizer,
            dataset,
            trl_kwargs(out_dir, config),
            [reporter],
            None if is_peft(model) else lora_config(config),
        )
        _silence_printer(trainer)
        if state is not None:
            log.info("resuming training", method=method, step=state.step, path=str(state.path))
        try:
            output = trainer.train(resume_from_checkpoint=str(state.path) if state else None)
        except RolloutError:
            raise
        except (ValueError, RuntimeError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise RolloutError(f"{method}: training failed: {first}") from None
        model_dir = _save_final(trainer, tokenizer, out_dir, method, base_ref, config)
    history = trainer.state.log_history
    losses = [h["loss"] for h in history if "loss" in h]
    metrics = {k: float(v) for k, v in (output.metrics or {}).items() if _is_number(v)}
    metrics.update(reporter.last_metrics)
    if reporter.tokens_per_s is not None:
        metrics["tokens_per_s"] = reporter.tokens_per_s
    # Which precision the run trained in (as the online learners record it): 1 for bf16.
    metrics["bf16"] = float(bool(getattr(trainer.args, "bf16", False)))
    return TrainResult(
        model_dir=model_dir,
        steps=int(trainer.state.global_step),
        final_loss=float(losses[-1]) if losses else None,
        metrics=metrics,
    )


def _silence_printer(trainer: Any) -> None:
    # With tqdm off, transformers prints every log dict to stdout; we report through hooks.
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def trl_kwargs(out_dir: Path, config: Any) -> dict[str, Any]:
    """The TRL/Trainer arguments every offline method shares, from its config model."""
    on_cpu = device() == "cpu"
    return {
        "output_dir": str(out_dir / CHECKPOINTS),
        "num_train_epochs": config.epochs,
        "max_steps": config.max_steps or -1,
        "per_device_train_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.grad_accum,
        "learning_rate": config.learning_rate,
        "seed": config.seed,
        "save_strategy": "steps",
        "save_steps": config.save_every,
        # Older checkpoints are in the object store by then (on_checkpoint uploads them).
        "save_total_limit": 3,
        "logging_steps": 1,
        "report_to": [],
        "disable_tqdm": True,
        # Explicit both ways: TRL's configs default to bf16=True, which would change fp32 runs.
        # bf16 is mixed precision (autocast over float32 master weights), on the CPU too.
        "bf16": precision() == "bf16",
        "gradient_checkpointing": False,
        "use_cpu": on_cpu,
        "max_length": config.max_seq_len,
        "include_num_input_tokens_seen": True,
        "dataloader_num_workers": 0,
    }


def lora_config(config: TrainConfig) -> Any:
    """The peft LoRA config of `config` (None without LoRA): every linear layer, no dropout."""
    if not config.lora:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=0.0,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )


def _save_final(
    trainer: Any, tokenizer: Any, out_dir: Path, method: str, base: str, config: TrainConfig
) -> Path:
    model = trainer.model
    tmp = out_dir / (FINAL_MODEL + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    # A peft model saves its adapter only: megabytes per policy version, not the base again.
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if is_peft(model):
        write_adapter_base(tmp, base)
    (tmp / "rollout_training.json").write_text(
        json.dumps(
            {
                "method": method,
                "base_model": base,
                "steps": int(trainer.state.global_step),
                "config": config.model_dump(mode="json"),
            },
            indent=2,
        )
        + "\n"
    )
    return replace_dir(tmp, out_dir / FINAL_MODEL)


def _reporter_class() -> type:
    from transformers import TrainerCallback

    class Reporter(TrainerCallback):
        """Turns Trainer logs into Progress, step-log lines and checkpoint notifications."""

        def __init__(
            self,
            out_dir: Path,
            on_progress: ProgressHook | None,
            on_checkpoint: CheckpointHook | None,
        ) -> None:
            self.out_dir = out_dir
            self.on_progress = on_progress
            self.on_checkpoint = on_checkpoint
            self.started = time.monotonic()
            self.first_step = 0
            self.first_tokens = 0
            self.last_logged = -1
            self.tokens_per_s: float | None = None
            self.last_metrics: dict[str, float] = {}

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.started = time.monotonic()
            self.first_step = int(state.global_step)
            self.first_tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0)
            self.last_logged = int(state.global_step)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            logs = logs or {}
            step = int(state.global_step)
            if "loss" not in logs or step <= self.last_logged:
                return
            self.last_logged = step
            elapsed = max(time.monotonic() - self.started, 1e-9)
            done = step - self.first_step
            tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0) - self.first_tokens
            self.tokens_per_s = tokens / elapsed if tokens > 0 else None
            total = int(state.max_steps or step)
            eta = (total - step) * elapsed / done if done > 0 else None
            self.last_metrics = {k: float(v) for k, v in logs.items() if _is_number(v)}
            progress = Progress(
                step=step,
                total_steps=total,
                loss=float(logs["loss"]),
                reward=_reward(logs),
                tokens_per_s=self.tokens_per_s,
                eta_s=eta,
                epoch=float(state.epoch) if state.epoch is not None else None,
                kl=float(logs["kl"]) if _is_number(logs.get("kl")) else None,
            )
            append_step_log(self.out_dir, progress.model_dump(mode="json"))
            if self.on_progress is not None:
                self.on_progress(progress)

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.on_checkpoint is None:
                return
            step = int(state.global_step)
            path = Path(args.output_dir) / f"checkpoint-{step}"
            self.on_checkpoint(path, step)

    return Reporter


def _reward(logs: dict[str, Any]) -> float | None:
    # DPO's and KTO's implicit reward margin is the closest thing to a reward they have; a
    # reward model's is how often it ranks chosen above rejected.
    for key in ("rewards/margins", "accuracy"):
        value = logs.get(key)
        if _is_number(value):
            return float(value)
    return None
