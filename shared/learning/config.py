"""Training configurations (one model per method), progress and result shapes."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

# The config models live with the contracts (their JSON Schema is schemas/training_config.json).
from rollout.shared.contracts.training import (
    CONFIG_MODELS,
    DpoConfig,
    GrpoConfig,
    KtoConfig,
    OpdConfig,
    PpoConfig,
    RmConfig,
    SftConfig,
    TrainConfig,
    TrainingConfig,
    config_problems,
    method_names,
    parse_config,
)

__all__ = [
    "CONFIG_MODELS",
    "DpoConfig",
    "GrpoConfig",
    "KtoConfig",
    "OpdConfig",
    "PpoConfig",
    "Progress",
    "RmConfig",
    "SftConfig",
    "TrainConfig",
    "TrainResult",
    "TrainingConfig",
    "config_problems",
    "method_names",
    "parse_config",
]


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
