"""Base models: which names can be trained, where their weights are, and provider models."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rollout.shared.errors import RolloutError
from rollout.shared.learning.tiny_agent import ensure_tiny_agent
from rollout.shared.models import catalog, names, trained
from rollout.shared.models.openai_compat import OPENAI_DEFAULT_BASE, TOGETHER_DEFAULT_BASE

TINY_AGENT = "local/tiny-agent"
PROVIDERS = {
    "openai/": ("openai", "OPENAI_API_KEY", "OPENAI_BASE_URL", OPENAI_DEFAULT_BASE),
    "together/": ("together", "TOGETHER_API_KEY", "TOGETHER_BASE_URL", TOGETHER_DEFAULT_BASE),
}
LOCAL_FORMS = (
    "hf:<dir>, a local model (local/smollm2-135m, local/tiny-agent), "
    "or a trained BASE:SUFFIX / job id"
)


@dataclass(frozen=True)
class TrainBase:
    """A resolved base model: local weights (a folder) or a provider's model."""

    name: str
    kind: Literal["local", "openai", "together"]
    # local: how to get the folder (a record of a trained policy, or a path / the tiny agent)
    path: Path | None = None
    record: trained.PolicyRecord | None = None
    # provider: the provider's model name, its API base URL and key
    remote_model: str = ""
    base_url: str = ""
    api_key: str | None = None

    @property
    def local(self) -> bool:
        """True when the weights are trained here (TRL), False for provider fine-tunes."""
        return self.kind == "local"

    @property
    def train_defaults(self) -> dict[str, Any]:
        """Hyperparameters this base trains with unless the user sets them (e.g. LoRA)."""
        if not self.local:
            return {}
        names = [self.name] + ([self.record.base_model] if self.record is not None else [])
        for name in names:
            defaults = catalog.train_defaults(name)
            if defaults:
                return defaults
        return {}


def tiny_agent_dir() -> Path:
    """The `local/tiny-agent` folder, built on first use (the learning package owns it)."""
    return ensure_tiny_agent()


def _provider(name: str, prefix: str, where: str = "base_model") -> TrainBase:
    kind, key_env, base_env, default_base = PROVIDERS[prefix]
    remote = name[len(prefix) :].strip()
    if not remote:
        raise RolloutError(f"{where}: missing the model name after {prefix!r}")
    base = os.environ.get(base_env, "").strip() or default_base
    key = os.environ.get(key_env, "").strip() or None
    if key is None and base.rstrip("/") == default_base:
        raise RolloutError(
            f"{where}: fine-tuning {name!r} needs an API key: set {key_env} for the learner"
        )
    return TrainBase(name=name, kind=kind, remote_model=remote, base_url=base.rstrip("/"),
                      api_key=key)  # fmt: skip


def resolve_base(name: str, where: str = "base_model") -> TrainBase:
    """What `name` is as a base model; RolloutError (at `where`) saying which forms are trainable."""
    name = (name or "").strip()
    record = trained.find_trained(name) if name else None
    for prefix in PROVIDERS:
        if name.startswith(prefix) and record is None:
            return _provider(name, prefix, where)
    if record is not None:
        if record.kind != "hf":
            # A provider fine-tune trains further at the provider, from its fine-tuned model.
            return _provider(f"{record.kind}/{record.remote_model}", f"{record.kind}/", where)
        return TrainBase(name=name, kind="local", record=record)
    if catalog.local_model(name) is not None:
        return TrainBase(name=name, kind="local")
    hf_path = Path(name[3:].strip()).expanduser() if name.startswith("hf:") else None
    if name == "hf:" or (hf_path is not None and not name[3:].strip()):
        raise RolloutError(f"{where}: missing the model directory after 'hf:'")
    if hf_path is not None and hf_path.exists():
        return TrainBase(name=name, kind="local", path=hf_path)
    if name.startswith(trained.JOB_PREFIX):
        raise RolloutError(f"{where}: no finished job {name!r} produced a model")
    if names.split_trained_name(name) is not None:
        raise RolloutError(
            f"{where}: no trained model {name!r}",
            problems=["see `rollout jobs` for the model names finished jobs produced"],
        )
    if hf_path is not None:
        return TrainBase(name=name, kind="local", path=hf_path)  # validation names the problem
    raise RolloutError(
        f"{where}: cannot fine-tune {name!r}",
        problems=[
            f"local training takes {LOCAL_FORMS}",
            "provider fine-tuning: openai/..., together/...",
        ],
    )


def check_loadable(path: Path, where: str = "base_model") -> None:
    """Fail fast (before a job exists) when a folder holds no trainable causal LM."""
    where = f"{where}: hf:{path}"
    if not path.is_dir():
        raise RolloutError(f"{where}: no model directory at {path}")
    try:
        from transformers import AutoConfig, AutoTokenizer
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError as exc:
        raise RolloutError(
            f"{where}: local training needs torch, transformers and trl: {exc}"
        ) from None
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises many types for a bad folder: name it
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RolloutError(f"{where}: cannot load a model config and tokenizer: {first}") from None
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise RolloutError(f"{where}: {config.model_type!r} is not a causal language model")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise RolloutError(f"{where}: no weights (*.safetensors or *.bin) in {path}")
    if not getattr(tokenizer, "chat_template", None):
        raise RolloutError(f"{where}: the tokenizer has no chat template")


def validate_local(base: TrainBase, where: str = "base_model") -> None:
    """Check a local base is loadable now (trained policies and the tiny agent are by design)."""
    if base.path is not None:
        check_loadable(base.path, where)


async def local_dir(base: TrainBase) -> Path:
    """The folder to train from: the path, the fetched trained policy, or a local model's."""
    import asyncio

    if base.record is not None:
        return await trained.materialize(base.record)
    if base.path is not None:
        return base.path
    if base.name == TINY_AGENT:
        return await asyncio.to_thread(tiny_agent_dir)
    return await asyncio.to_thread(catalog.ensure, base.name)
