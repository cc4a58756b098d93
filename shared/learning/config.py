"""Training configuration, progress and result shapes shared by every learning method."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollout.errors import RolloutError

Method = Literal["sft", "dpo", "grpo"]
METHODS: tuple[str, ...] = ("sft", "dpo", "grpo")


class TrainConfig(BaseModel):
    """Hyperparameters of one training job (SFT, DPO or GRPO)."""

    model_config = ConfigDict(extra="forbid")

    method: Method
    epochs: float = Field(1.0, gt=0)
    learning_rate: float = Field(5e-5, gt=0)
    batch_size: int = Field(4, ge=1)
    grad_accum: int = Field(1, ge=1)
    max_steps: int | None = Field(None, ge=1)
    lora: bool = False
    lora_r: int = Field(8, ge=1)
    lora_alpha: int = Field(16, ge=1)
    seed: int = Field(0, ge=0)
    save_every: int = Field(20, ge=1)
    max_seq_len: int = Field(1024, ge=8)
    # DPO: the preference temperature; GRPO: the weight of the KL penalty to the base policy.
    beta: float = Field(0.1, ge=0)
    # GRPO: completions more than this many policy versions old are not trained on.
    max_staleness: int = Field(2, ge=0)
    group_size: int = Field(4, ge=2)
    # torch intra-op threads; None picks 1 for tiny CPU models (OpenMP overhead dominates).
    threads: int | None = Field(None, ge=1)

    @classmethod
    def from_user(cls, data: dict[str, Any], *, where: str = "hyperparams") -> TrainConfig:
        """Validate user input; RolloutError naming each bad field as `<where>.<field>`."""
        if not isinstance(data, dict):
            raise RolloutError(f"{where}: must be a mapping, got {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise RolloutError(
                "invalid training configuration", problems=config_problems(exc, where)
            ) from None


def config_problems(exc: ValidationError, where: str) -> list[str]:
    """pydantic errors as '<where>.<field>: <what is wrong>' lines users can act on."""
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        path = f"{where}.{loc}" if loc else where
        problems.append(f"{path}: {_message(err)}")
    return problems


def _message(err: dict[str, Any]) -> str:
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    if kind == "greater_than":
        return f"must be > {_number(ctx.get('gt'))}"
    if kind == "greater_than_equal":
        return f"must be >= {_number(ctx.get('ge'))}"
    if kind == "literal_error":
        return f"must be one of {', '.join(METHODS)} (got {err.get('input')!r})"
    if kind == "extra_forbidden":
        return "unknown setting"
    if kind == "missing":
        return "required"
    return str(err.get("msg", "invalid"))


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


class Progress(BaseModel):
    """A training progress report (one per optimizer step)."""

    step: int
    total_steps: int
    loss: float | None = None
    reward: float | None = None
    tokens_per_s: float | None = None
    eta_s: float | None = None
    epoch: float | None = None
    kl: float | None = None


class TrainResult(BaseModel):
    """What a finished training run produced: an HFBackend-loadable model dir and numbers."""

    model_dir: Path
    steps: int
    final_loss: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
