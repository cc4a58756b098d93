"""The training methods, one table: each a config model with the code that trains it.

The learner plans and runs a job from its method's entry (what data it asks the buffer for,
how it shapes rows, which trainer or online learner runs), the CLI offers the table's names and
the experiment plans check stages against it. A new method is its config model (contracts/
training.py), its trainer module and one `register(Method(...))` line below; a plugin or a test
may register one at run time the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from rollout.shared.contracts.training import (
    CONFIG_MODELS,
    METHOD_ALIASES,
    DpoConfig,
    GrpoConfig,
    KtoConfig,
    OpdConfig,
    PpoConfig,
    RmConfig,
    SftConfig,
    TrainConfig,
    register_config,
)
from rollout.shared.errors import RolloutError
from rollout.shared.learning.config import TrainResult
from rollout.shared.learning.dpo import train_dpo
from rollout.shared.learning.grpo import GRPOLearner
from rollout.shared.learning.kto import train_kto
from rollout.shared.learning.opd import OPDLearner
from rollout.shared.learning.ppo import PPOLearner
from rollout.shared.learning.rm import train_rm
from rollout.shared.learning.sft import train_sft
from rollout.shared.learning.trainer_rows import TrainingSet, dpo_rows, kto_rows, sft_rows
from rollout.shared.method_names import method_names

# What an offline method trains on, as the buffer builds it from a run or a dataset:
# `sft` passing conversations, `labelled` every scored rollout grouped by task (with `passed`),
# `pairs` best-vs-worst preference pairs per task; `online` samples its own on an env.
DataKind = Literal["sft", "labelled", "pairs", "online"]


class OfflineTrainer(Protocol):
    """An offline trainer: rows in, an HFBackend-loadable model dir out (resumable)."""

    def __call__(
        self,
        base_model: Path,
        rows: Sequence[dict[str, Any]],
        out_dir: Path,
        config: TrainConfig,
        *,
        on_progress: Any = None,
        on_checkpoint: Any = None,
        resume: bool = True,
    ) -> TrainResult: ...


@dataclass(frozen=True)
class Method:
    """A training method: its settings, what it trains on, and the code that trains it."""

    config: type[TrainConfig]
    title: str
    data: DataKind
    # Offline: the buffer's answer in the trainer's row shape, and the trainer.
    rows: Callable[[TrainingSet], list[dict[str, Any]]] | None = None
    train: OfflineTrainer | None = None
    # Online: the learner class (`step(groups)`, `save()`, `policy_version`, `metrics`) and how
    # many completions a task's group needs to be trained on.
    learner: Callable[..., Any] | None = None
    min_group: int = 2
    # Provider kinds (openai, together) whose fine-tuning API runs this method on their models.
    providers: tuple[str, ...] = ()
    # Trains every weight, whatever LoRA default the base model has for policies.
    full_weights: bool = False

    @property
    def name(self) -> str:
        """The method's name, as jobs, plans and `--method` spell it."""
        return self.config.method_name

    @property
    def online(self) -> bool:
        """Trains on an env, sampling as it goes, rather than on a finished run's rollouts."""
        return self.data == "online"


TABLE: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add `method` to the table (and its config to the contracts' parser); returns it."""
    name = method.name
    if not name or name in METHOD_ALIASES:
        raise ValueError(f"method name {name!r} is empty or an alias")
    if method.online != (method.learner is not None) or method.online == (method.train is not None):
        raise ValueError(f"method {name}: an online method has a learner, an offline one a trainer")
    if not method.online and method.rows is None:
        raise ValueError(f"method {name}: an offline method shapes its rows (`rows`)")
    register_config(method.config)
    TABLE[name] = method
    return method


def get(name: str) -> Method:
    """The method called `name` (an alias such as `ipo` gives its method); RolloutError if none."""
    name = METHOD_ALIASES.get(name, (name, {}))[0]
    if name not in TABLE:
        raise RolloutError(f"method: {name!r} is not a training method; use one of {known()}")
    return TABLE[name]


def names(*, online: bool | None = None) -> tuple[str, ...]:
    """The methods' names in table order (only the online or offline ones when asked)."""
    return tuple(n for n, m in TABLE.items() if online is None or m.online == online)


def known() -> str:
    """Every name `--method` takes, aliases included, for messages."""
    return ", ".join((*names(), *METHOD_ALIASES))


register(Method(SftConfig, "SFT", "sft", rows=lambda s: sft_rows(s.items), train=train_sft,
                providers=("openai", "together")))  # fmt: skip
register(Method(DpoConfig, "DPO", "pairs", rows=dpo_rows, train=train_dpo, providers=("together",)))
register(Method(KtoConfig, "KTO", "labelled", rows=lambda s: kto_rows(s.items), train=train_kto))
register(Method(RmConfig, "a reward model", "pairs", rows=dpo_rows, train=train_rm,
                full_weights=True))  # fmt: skip
register(Method(GrpoConfig, "online GRPO", "online", learner=GRPOLearner))
# PPO's critic needs no group: one completion of a task is enough.
register(Method(PpoConfig, "online PPO", "online", learner=PPOLearner, min_group=1))
# Distillation's signal is per token, from the teacher: one sample of a task is enough.
register(Method(OpdConfig, "on-policy distillation", "online", learner=OPDLearner, min_group=1))
assert set(TABLE) == set(CONFIG_MODELS), "every contract config has its table entry"
# `rollout --help` lists the methods from rollout.shared.method_names without this table.
assert names() == method_names() and names(online=True) == method_names(online=True), (
    "rollout.shared.method_names lists the table's methods, in its order"
)
