"""Experiment plans: one TOML file describes a whole experiment (schemas/experiment_plan.json).

A plan names its environments (`slug@version` in the registry, or an environment file), its
models, its stages in order (`run`, `train`, `evaluate`, `compare`), the resources and the
checkpoint policy its jobs use, and one seed. Stages refer to each other by name: a `train`
takes its data `from` an earlier run, an `evaluate` or `run` may use a model an earlier
`train` produced, a `compare` names two earlier run or evaluate stages. The structure is
checked here; what needs the registry, the files or other stages is checked by
rollout.shared.plans.validate, which reports every problem with its path.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollout.shared.contracts.budgets import Budgets

# Stage, env and model names: also the keys a stage's references use.
NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_\-]{0,63}$"
STAGE_KINDS: tuple[str, ...] = ("run", "train", "evaluate", "compare")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvEntry(_Strict):
    """An environment: a registered `slug[@version]` (`ref`) or an environment `file`."""

    ref: str | None = Field(
        None,
        min_length=1,
        description="`slug` (newest version) or `slug@version` of a registered environment.",
    )
    file: str | None = Field(
        None,
        min_length=1,
        description="An environment file (.py), relative to the plan; pushed when the plan runs.",
    )
    slug: str | None = Field(
        None, description="With `file`: which environment of the file (when it defines several)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvEntry:
        if (self.ref is None) == (self.file is None):
            raise ValueError("ref: give exactly one of `ref` (slug@version) or `file`")
        if self.slug is not None and self.file is None:
            raise ValueError("slug: only with `file`")
        return self


class RunStage(_Strict):
    """Sample a model on an environment's tasks (n rollouts per task), scored by its verifier."""

    env: str = Field(description="An environment of `envs`.")
    model: str = Field(description="A model of `models`, or an earlier train stage's name.")
    n: int = Field(1, ge=1, le=1024, description="Rollouts per task.")
    split: str | None = Field(None, min_length=1, description="Only tasks of this split.")
    temperature: float = Field(0.7, ge=0, le=2, description="Sampling temperature.")
    max_tokens: int = Field(512, ge=1, le=131_072, description="Tokens sampled per model turn.")
    max_tool_calls: int = Field(16, ge=0, le=1024, description="Tool calls per episode.")
    deadline_s: float = Field(3600.0, gt=0, le=86_400, description="Seconds before it fails.")
    budgets: Budgets | None = Field(
        None, description="Overrides of the env's rollout budgets (tokens, seconds, repeats)."
    )


class PassingSelection(_Strict):
    """Which passing rollouts of the `from` run are trained on (sft): few per task, a cap in all."""

    per_task: int = Field(
        4, ge=1, le=1024, description="At most this many per task, best score first."
    )
    limit: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="At most this many in all, one round over the tasks before a second.",
    )


class TrainStage(_Strict):
    """Train a model: offline on an earlier run's rollouts, or online (grpo, ppo) on an env."""

    method: str = Field(description="sft, dpo, ipo, kto, rm, grpo or ppo.")
    model: str = Field(description="Base model: a model of `models` or an earlier train stage.")
    from_: str | None = Field(
        None,
        alias="from",
        description="The run or evaluate stage whose rollouts are trained on (offline methods).",
    )
    env: str | None = Field(None, description="The environment trained on (grpo, ppo).")
    suffix: str | None = Field(
        None, description="The trained model is `BASE:SUFFIX` (default: derived from the plan)."
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="The method's hyperparameters (schemas/training_config.json); "
        "`reward_model` (ppo) may name an earlier `rm` train stage.",
    )
    passing: PassingSelection | None = Field(
        None,
        description="sft: train on passing rollouts of `from`, at most `per_task` per task and "
        "`limit` in all (default: every passing rollout), so solved tasks do not drown the rest.",
    )
    skip_without_data: bool = Field(
        False,
        description="sft: when `from` has no passing rollout, skip the stage (later stages use "
        "its base model) instead of failing the plan.",
    )
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class CompareStage(_Strict):
    """Compare two earlier run or evaluate stages: pass rates with 95% intervals."""

    base: str = Field(description="The baseline stage.")
    other: str = Field(description="The stage compared against it.")


class Stage(_Strict):
    """One step of the plan: a `name` and exactly one of run, train, evaluate, compare."""

    name: str = Field(pattern=NAME_PATTERN, description="Unique; later stages refer to it.")
    run: RunStage | None = None
    train: TrainStage | None = None
    evaluate: RunStage | None = Field(
        None, description="A run meant for measuring (usually on a held-out split)."
    )
    compare: CompareStage | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Stage:
        given = [k for k in STAGE_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            got = ", ".join(given) or "none"
            raise ValueError(f"kind: give exactly one of {', '.join(STAGE_KINDS)} (got {got})")
        return self

    @property
    def kind(self) -> str:
        """run, train, evaluate or compare."""
        return next(k for k in STAGE_KINDS if getattr(self, k) is not None)


class Resources(_Strict):
    """What the plan's runs and jobs may use."""

    replicas: int = Field(
        1, ge=1, le=1024, description="Actor replicas a run is spread over (one work item each)."
    )
    threads: int | None = Field(
        None, ge=1, le=1024, description="torch threads of each training job (None: its default)."
    )
    devices: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where training runs: cpu, cuda (checked at plan time) or auto."
    )


class CheckpointPolicy(_Strict):
    """When training jobs snapshot their weights (and resume from them after a crash)."""

    save_every: int = Field(20, ge=1, le=1_000_000, description="Optimizer steps per checkpoint.")


class ExperimentPlan(_Strict):
    """A whole experiment, validated before anything starts; its canonical JSON is hashed."""

    name: str = Field(pattern=NAME_PATTERN, description="The experiment's name.")
    description: str = Field("", description="What the experiment is for.")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seed of every run and training job.")
    envs: dict[str, EnvEntry] = Field(description="Environments by the name stages use.")
    models: dict[str, str] = Field(
        default_factory=dict,
        description="Models by the name stages use: `local/...`, `hf:DIR`, `BASE:SUFFIX`, ...",
    )
    resources: Resources = Field(default_factory=Resources)
    checkpoints: CheckpointPolicy = Field(default_factory=CheckpointPolicy)
    stages: list[Stage] = Field(min_length=1, description="Executed in order.")
