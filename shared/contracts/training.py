"""Training configuration: one documented model per method, a union discriminated on `method`.

Each method's model holds every hyperparameter a local job of that method takes (the trainer's
and the learner's), so `hyperparams` of `CreateTrainingJob` is exactly that model minus
`method`. A name means one thing per method: `beta` is DPO's/KTO's preference temperature and
GRPO's KL weight, and each model's field description says which. `TrainConfig(method=...)`
builds the method's own model, so existing callers keep working.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from rollout.shared.errors import RolloutError
from rollout.shared.method_names import METHOD_ALIASES

# TRL's DPO loss functions (DPOConfig.loss_type), each a single loss; `ipo` is the IPO paper's.
DpoLossType = Literal[
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sigmoid_norm",
]
DPO_LOSS_TYPES: tuple[str, ...] = DpoLossType.__args__  # type: ignore[attr-defined]
# The GRPO family's variants (shared/learning/policy_loss.py; docs/algorithms.md).
GrpoLossType = Literal["grpo", "dapo", "dr_grpo", "gspo", "cispo"]
AdvantageKind = Literal["group", "rloo", "reinforce_pp"]
IsCorrection = Literal["none", "tis", "mis"]
Aggregation = Literal["token", "sequence"]

_T = TypeVar("_T")


class TrainConfig(BaseModel):
    """Settings every local training method shares; `TrainConfig(method=M, ...)` builds M's."""

    model_config = ConfigDict(extra="forbid")
    method_name: ClassVar[str] = ""

    method: str = Field(description="The training method this config is for.")
    learning_rate: float = Field(5e-5, gt=0, le=1, description="Optimizer (AdamW) step size.")
    batch_size: int = Field(
        4, ge=1, le=4096, description="Examples (offline) or completions (online) per micro-batch."
    )
    max_steps: int | None = Field(
        None, ge=1, le=1_000_000, description="Optimizer steps; None trains for `epochs`."
    )
    lora: bool = Field(False, description="Train a LoRA adapter instead of every weight.")
    lora_r: int = Field(8, ge=1, le=1024, description="LoRA rank (with `lora`).")
    lora_alpha: int = Field(16, ge=1, le=4096, description="LoRA scaling numerator (with `lora`).")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seed of data order and initialisation.")
    save_every: int = Field(20, ge=1, description="Checkpoint every this many optimizer steps.")
    max_seq_len: int = Field(
        1024, ge=8, le=131_072, description="Longest tokenized sequence trained on."
    )
    threads: int | None = Field(
        None, ge=1, le=1024, description="torch intra-op threads; None: 1 for tiny CPU models."
    )

    def __new__(cls, *args: Any, **data: Any) -> TrainConfig:
        # The shared base is never built itself: `TrainConfig(method="dpo", ...)` is a DpoConfig.
        if cls is TrainConfig:
            method = data.get("method")
            if method not in CONFIG_MODELS:
                known = ", ".join(CONFIG_MODELS)
                raise ValueError(f"method: must be one of {known} (got {method!r})")
            cls = CONFIG_MODELS[method]
        return super().__new__(cls)

    @classmethod
    def from_user(cls, data: dict[str, Any], *, where: str = "hyperparams") -> TrainConfig:
        """Validate user input into its method's model; RolloutError naming `<where>.<field>`."""
        if not isinstance(data, dict):
            raise RolloutError(f"{where}: must be a mapping, got {type(data).__name__}")
        try:
            if cls is TrainConfig:
                return parse_config(data)
            return cls.model_validate(data)
        except ValidationError as exc:
            raise RolloutError(
                "invalid training configuration", problems=config_problems(exc, where)
            ) from None


class _OfflineConfig(TrainConfig):
    """Settings of methods that train on a fixed data set for some epochs."""

    epochs: float = Field(1.0, gt=0, le=1000, description="Passes over the data set.")
    grad_accum: int = Field(
        1, ge=1, le=1024, description="Micro-batches accumulated per optimizer step."
    )


class SftConfig(_OfflineConfig):
    """Supervised fine-tuning (TRL SFTTrainer) on passing rollouts, assistant tokens only."""

    method_name: ClassVar[str] = "sft"
    method: Literal["sft"] = Field(description="Supervised fine-tuning.")


class DpoConfig(_OfflineConfig):
    """Direct preference optimisation (TRL DPOTrainer) on the buffer's preference pairs."""

    method_name: ClassVar[str] = "dpo"
    method: Literal["dpo"] = Field(description="Direct preference optimisation and its family.")
    beta: float = Field(
        0.1,
        gt=0,
        le=100,
        description="Preference temperature: how far the policy may move from the reference "
        "(for `ipo`, the regularisation strength tau).",
    )
    loss_type: DpoLossType = Field(
        "sigmoid", description="TRL's DPO loss: sigmoid (DPO), ipo (IPO), hinge (SLiC), ..."
    )
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="Assumed label noise (robust and exo_pair losses)."
    )
    min_margin: float = Field(
        0.0, ge=0, description="Pairs whose scores differ by no more than this are skipped."
    )


class KtoConfig(_OfflineConfig):
    """Kahneman-Tversky optimisation (TRL KTOTrainer): passed rollouts desirable, failed not."""

    method_name: ClassVar[str] = "kto"
    method: Literal["kto"] = Field(description="KTO on verifier-labelled rollouts.")
    beta: float = Field(
        0.1, gt=0, le=100, description="Preference temperature: deviation from the reference."
    )
    desirable_weight: float = Field(
        1.0, gt=0, le=100, description="Weight of passed (desirable) rollouts' losses."
    )
    undesirable_weight: float = Field(
        1.0, gt=0, le=100, description="Weight of failed (undesirable) rollouts' losses."
    )

    @model_validator(mode="after")
    def _kl_needs_pairs(self) -> KtoConfig:
        # KTO's KL estimate pairs each completion with another prompt of the same batch.
        if self.batch_size < 2:
            raise ValueError("batch_size: KTO needs at least 2 examples per batch")
        return self


class RmConfig(_OfflineConfig):
    """A reward model (TRL RewardTrainer): a sequence classifier on the buffer's pairs."""

    method_name: ClassVar[str] = "rm"
    method: Literal["rm"] = Field(description="Reward-model training.")
    center_rewards_coefficient: float | None = Field(
        None, ge=0, le=10, description="Weight pushing rewards towards mean zero (None: off)."
    )
    min_margin: float = Field(
        0.0, ge=0, description="Pairs whose scores differ by no more than this are skipped."
    )


class OnlineCorrection(TrainConfig):
    """The off-policy correction settings the online methods share (GRPO family, PPO)."""

    is_correction: IsCorrection = Field(
        "none",
        description="Correction for the actor-vs-learner logprob gap and staleness: none (the "
        "ratio against the actor's logprobs), tis (truncated importance weight), mis (masked).",
    )
    is_cap: float | None = Field(
        None, gt=1, le=1000, description="tis/mis: the importance weight's bound (default 3)."
    )

    @model_validator(mode="after")
    def _correction_agrees(self) -> OnlineCorrection:
        if self.is_cap is not None and self.is_correction == "none":
            raise ValueError("is_cap: only with is_correction tis or mis")
        return self


class GrpoConfig(OnlineCorrection):
    """Online GRPO: actors sample groups asynchronously, the learner steps as they arrive."""

    method_name: ClassVar[str] = "grpo"
    method: Literal["grpo"] = Field(description="Group relative policy optimisation, online.")
    beta: float = Field(
        0.1,
        ge=0,
        le=100,
        description="Weight of the KL penalty to the policy training starts from (0: none).",
    )
    group_size: int = Field(4, ge=2, le=256, description="Completions sampled per task and step.")
    max_staleness: int = Field(
        2, ge=0, le=64, description="Completions more policy versions old are not trained on."
    )
    tasks_per_step: int = Field(4, ge=1, le=4096, description="Tasks sampled per optimizer step.")
    temperature: float = Field(1.0, gt=0, le=2, description="Sampling temperature of the actors.")
    max_tokens: int = Field(256, ge=1, le=131_072, description="Tokens sampled per model turn.")
    max_tool_calls: int = Field(8, ge=0, le=1024, description="Tool calls per episode.")
    run_deadline_s: float = Field(
        900.0, gt=0, le=86_400, description="Deadline of each sampling run, in seconds."
    )
    loss_type: GrpoLossType = Field(
        "grpo",
        description="grpo (clipped surrogate), dapo (clip-higher, token-level), dr_grpo "
        "(unscaled advantages, constant normaliser), gspo (one ratio per sequence), cispo "
        "(clipped, detached importance weight): docs/algorithms.md.",
    )
    advantage: AdvantageKind = Field(
        "group",
        description="group ((r - mean) / std in the task's group), rloo (leave-one-out "
        "baseline), reinforce_pp (group mean, then normalised over the step's batch).",
    )
    epsilon: float | None = Field(
        None, gt=0, le=1, description="Lower clip: the ratio is kept above 1 - epsilon "
        "(default by loss_type: 0.2; gspo 3e-4).",
    )  # fmt: skip
    epsilon_high: float | None = Field(
        None,
        gt=0,
        le=100,
        description="Upper clip, 1 + epsilon_high (DAPO's clip-higher; default by loss_type: "
        "epsilon, dapo 0.28, gspo 4e-4); for cispo the importance weight's cap (5.0).",
    )
    aggregation: Aggregation | None = Field(
        None,
        description="token (every trained token weighs the same) or sequence (each row's "
        "mean, then the mean over rows); default by loss_type: gspo sequence, else token.",
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO's dynamic sampling: groups whose rewards are all equal are dropped "
        "and more tasks sampled until tasks_per_step groups carry a signal (or 4 refills).",
    )
    overlong_buffer: int | None = Field(
        None,
        ge=1,
        le=131_072,
        description="DAPO's overlong penalty: a turn longer than max_tokens - overlong_buffer "
        "loses up to 1 reward, linearly, reaching -1 at max_tokens (None: off).",
    )

    @model_validator(mode="after")
    def _variants_agree(self) -> GrpoConfig:
        # Each refusal names the setting to change (plans report it with its path).
        if self.loss_type == "dr_grpo" and self.aggregation is not None:
            raise ValueError(
                "aggregation: dr_grpo normalises by a constant (rows x max_tokens); leave it unset"
            )
        if self.loss_type == "gspo" and self.aggregation == "token":
            raise ValueError("aggregation: gspo's ratio is one per sequence; use sequence")
        if self.loss_type == "cispo" and self.epsilon is not None:
            raise ValueError("epsilon: cispo clips the importance weight from above only")
        if (
            self.loss_type != "cispo"
            and self.epsilon is not None
            and self.epsilon_high is not None
            and self.epsilon_high < self.epsilon
        ):
            raise ValueError(
                f"epsilon_high: {self.epsilon_high} is below epsilon {self.epsilon} "
                "(clip-higher widens the upper side)"
            )
        if self.overlong_buffer is not None and self.overlong_buffer >= self.max_tokens:
            raise ValueError(
                f"overlong_buffer: {self.overlong_buffer} must be below max_tokens "
                f"({self.max_tokens})"
            )
        return self


class OpdConfig(GrpoConfig):
    """On-policy distillation: the student samples on the env, a teacher scores its tokens.

    Each sampled token's advantage is `kl_coef` times the teacher's logprob of it minus the
    student's (the negative per-token reverse KL): the student is pulled towards what the
    teacher would have said at the states it visits itself. No reward is needed; the env's
    verifier still scores every rollout, for the record.
    """

    method_name: ClassVar[str] = "opd"
    method: Literal["opd"] = Field(  # type: ignore[assignment]
        description="On-policy distillation: the per-token reverse KL to a teacher, online."
    )
    teacher: str = Field(
        min_length=1,
        description="The teacher: a local model (local/..., hf:DIR), a trained name or a plan "
        "stage; it must share the student's tokenizer.",
    )
    kl_coef: float = Field(
        1.0, gt=0, le=100, description="Weight of the per-token reverse KL as the advantage."
    )
    beta: float = Field(
        0.0, ge=0, le=100, description="Weight of a KL penalty to the starting policy (0: none)."
    )
    group_size: int = Field(1, ge=1, le=256, description="Completions sampled per task and step.")

    @model_validator(mode="after")
    def _distillation_agrees(self) -> OpdConfig:
        # The signal is the teacher's, per token: the reward-shaping settings have no say.
        if self.dynamic_sampling:
            raise ValueError("dynamic_sampling: distillation learns from the teacher, not rewards")
        if self.advantage != "group":
            raise ValueError(
                "advantage: distillation's advantage is the per-token reverse KL to the teacher"
            )
        if self.overlong_buffer is not None:
            raise ValueError("overlong_buffer: distillation learns from the teacher, not rewards")
        return self


class PpoConfig(OnlineCorrection):
    """Online PPO: a value head, GAE and clipped policy/value losses on the actor/learner loop.

    One step is one policy version: `ppo_epochs` passes over the step's completions, each in
    `num_minibatches` optimizer steps. A completion's reward is its verifier score (or the
    `reward_model`'s) at its last token, minus `kl_coef` times the per-token KL to the base.
    """

    method_name: ClassVar[str] = "ppo"
    method: Literal["ppo"] = Field(description="Proximal policy optimisation, online.")
    clip_range: float = Field(
        0.2, gt=0, le=1, description="Policy ratio clip: the ratio is kept in [1-c, 1+c]."
    )
    value_clip_range: float = Field(
        0.2, gt=0, le=100, description="How far a value may move from its rollout-time value."
    )
    vf_coef: float = Field(0.5, ge=0, le=100, description="Weight of the value loss.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount per completion token.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda (0: one-step TD, 1: Monte Carlo).")
    kl_coef: float = Field(
        0.05, ge=0, le=100, description="Per-token KL penalty to the base policy (0: none)."
    )
    ppo_epochs: int = Field(2, ge=1, le=64, description="Passes over each step's completions.")
    num_minibatches: int = Field(
        1, ge=1, le=1024, description="Optimizer steps per pass (completions split evenly)."
    )
    whiten_advantages: bool = Field(
        True, description="Normalise advantages to mean 0, std 1 over each step's tokens."
    )
    value_learning_rate: float | None = Field(
        None, gt=0, le=1, description="Step size of the value head; None: `learning_rate`."
    )
    max_grad_norm: float = Field(1.0, gt=0, le=1000, description="Gradient norm clip.")
    reward_model: str | None = Field(
        None,
        min_length=1,
        description="A trained reward model (`rollout improve --method rm`) whose score "
        "replaces the verifier's as each completion's reward; None: the verifier's.",
    )
    reward_model_max_length: int = Field(
        2048,
        ge=16,
        le=131_072,
        description="Tokens of a conversation the `reward_model` reads (as the reward_model "
        "primitive's maxLength), at most its max_position_embeddings (checked when the job "
        "is created); a longer completion is left out of its step, never scored on its start.",
    )
    group_size: int = Field(2, ge=1, le=256, description="Completions sampled per task and step.")
    max_staleness: int = Field(
        2, ge=0, le=64, description="Completions more policy versions old are not trained on."
    )
    tasks_per_step: int = Field(4, ge=1, le=4096, description="Tasks sampled per policy version.")
    temperature: float = Field(1.0, gt=0, le=2, description="Sampling temperature of the actors.")
    max_tokens: int = Field(256, ge=1, le=131_072, description="Tokens sampled per model turn.")
    max_tool_calls: int = Field(8, ge=0, le=1024, description="Tool calls per episode.")
    run_deadline_s: float = Field(
        900.0, gt=0, le=86_400, description="Deadline of each sampling run, in seconds."
    )


TrainingConfig = Annotated[
    SftConfig | DpoConfig | KtoConfig | RmConfig | GrpoConfig | PpoConfig | OpdConfig,
    Field(discriminator="method"),
]
# Every method's config by name: the built-in ones above, and any registered at run time
# (shared/learning/methods.py registers each method's config with its trainer).
CONFIG_MODELS: dict[str, type[TrainConfig]] = {
    m.method_name: m for m in get_args(get_args(TrainingConfig)[0])
}
_ADAPTERS: dict[tuple[type[TrainConfig], ...], TypeAdapter[Any]] = {}


def register_config(model: type[TrainConfig]) -> None:
    """Let `parse_config` and the job contracts accept `model`'s method (by `method_name`)."""
    name = model.method_name
    field = model.model_fields.get("method")
    if not name or field is None or get_args(field.annotation) != (name,):
        raise ValueError(f"{model.__name__}: needs method_name and `method: Literal[{name!r}]`")
    CONFIG_MODELS[name] = model


def method_names() -> tuple[str, ...]:
    """The names of every method a config exists for, in registration order."""
    return tuple(CONFIG_MODELS)


def known_method(name: str) -> str:
    """`name` when a config exists for it; ValueError naming the known ones otherwise."""
    if name not in CONFIG_MODELS:
        raise ValueError(f"must be one of {', '.join(CONFIG_MODELS)} (got {name!r})")
    return name


def _adapter() -> TypeAdapter[Any]:
    # The union of every registered config, discriminated on `method` (rebuilt when one is added).
    models = tuple(CONFIG_MODELS.values())
    if models not in _ADAPTERS:
        union = models[0] if len(models) == 1 else Union[models]  # noqa: UP007
        _ADAPTERS[models] = TypeAdapter(Annotated[union, Field(discriminator="method")])
    return _ADAPTERS[models]


class TrainingConfigSchema(RootModel[TrainingConfig]):
    """The hyperparameters of a local training job, by method (schemas/training_config.json)."""


def parse_config(data: dict[str, Any], *, strict: bool = False) -> TrainConfig:
    """`data` validated into its method's model (pydantic ValidationError when invalid)."""
    return _adapter().validate_python(data, strict=strict)


def validate_strict(validate: Callable[..., _T], data: Any) -> tuple[_T | None, list[Any]]:
    """(value, []) or (None, pydantic's errors), refusing a value of another type than its
    field's (`"4"` or `true` for a number, `1` for a flag) that lax validation would convert.

    For input whose types are the user's own (TOML), where a coerced `seed = true` would run
    as seed 1 unnoticed. A whole float for an integer (`n = 4.0`) is still taken, as it was.
    """
    try:
        return validate(data, strict=True), []
    except ValidationError as exc:
        errors = [e for e in exc.errors() if not _whole_float(e)]
    if errors:
        return None, errors
    try:
        return validate(data), []
    except ValidationError as exc:
        return None, exc.errors()


def _whole_float(err: Any) -> bool:
    value = err.get("input")
    return err.get("type") == "int_type" and isinstance(value, float) and value.is_integer()


def resolve_method(method: str, hyperparams: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(method, hyperparams) with an alias (`ipo`) replaced by the method and setting it means."""
    if method not in METHOD_ALIASES:
        return method, hyperparams
    real, fixed = METHOD_ALIASES[method]
    return real, {**hyperparams, **fixed}


def config_problems(exc: Any, where: str) -> list[str]:
    """pydantic errors as '<where>.<field>: <what is wrong>' lines users can act on."""
    return config_error_lines(exc.errors(), where)


def config_error_lines(errors: list[Any], where: str) -> list[str]:
    """pydantic's error details (`ValidationError.errors()`) as `config_problems` words them."""
    problems = []
    for err in errors:
        loc = [str(p) for p in err["loc"]]
        # The union's tag (`grpo`, ...) is not part of the path the user wrote.
        if loc and loc[0] in CONFIG_MODELS and err.get("type") != "union_tag_invalid":
            loc = loc[1:]
        path = ".".join([where, *loc]) if loc else where
        message = _message(err)
        if err.get("type") in ("union_tag_invalid", "union_tag_not_found"):
            path = f"{where}.method"
        elif err.get("type") == "value_error" and (m := re.match(r"(\w+): (.*)", message)):
            # A model-level check names its own field first ("batch_size: ...").
            path, message = f"{path}.{m.group(1)}", m.group(2)
        problems.append(f"{path}: {message}")
    return problems


def _message(err: dict[str, Any]) -> str:
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    if kind == "greater_than":
        return f"must be > {_number(ctx.get('gt'))}"
    if kind == "greater_than_equal":
        return f"must be >= {_number(ctx.get('ge'))}"
    if kind == "less_than":
        return f"must be < {_number(ctx.get('lt'))}"
    if kind == "less_than_equal":
        return f"must be <= {_number(ctx.get('le'))}"
    if kind == "union_tag_invalid":
        return f"must be one of {', '.join(CONFIG_MODELS)} (got {ctx.get('tag')!r})"
    if kind == "union_tag_not_found":
        return "required"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')} (got {err.get('input')!r})"
    if kind == "extra_forbidden":
        return "unknown setting"
    if kind == "missing":
        return "required"
    if kind == "value_error":
        return str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if kind in _TYPE_WORDS:
        return f"must be {_TYPE_WORDS[kind]}, got {_shown(err.get('input'))}"
    return str(err.get("msg", "invalid"))


# What a field of each type takes, by pydantic's error type for a value it did not take.
_TYPE_WORDS = {
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
}


def _shown(value: Any) -> str:
    """A value as the user wrote it: `true` (TOML's and JSON's spelling), `'4'`, `4.7`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
