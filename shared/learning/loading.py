"""Loading a base model for training, with errors users can act on, and the torch setup."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rollout.shared.errors import RolloutError
from rollout.shared.models.local_models import adapter_base, base_dir, base_ref_of, is_adapter

# Below this many parameters a CPU model trains fastest on one intra-op thread: OpenMP threads
# of a model this small spend most of their time waiting on each other.
_SMALL_MODEL_PARAMS = 50_000_000

# What ROLLOUT_TRAIN_PRECISION may say; `precision()` resolves auto.
PRECISIONS = ("auto", "fp32", "bf16")


def device() -> str:
    """Where training runs: `ROLLOUT_TRAIN_DEVICE`, else cuda when available, else cpu."""
    chosen = os.environ.get("ROLLOUT_TRAIN_DEVICE", "").strip()
    if chosen:
        return chosen
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def precision() -> str:
    """How training computes: `ROLLOUT_TRAIN_PRECISION` (auto, fp32 or bf16), auto resolved.

    auto is bf16 on a CUDA device with native bf16 (Ampere or newer), fp32 everywhere else;
    bf16 asked for on a CUDA device without it is refused, on the CPU it is allowed (torch
    autocasts there too, slower than fp32 but the same code path, so it is testable).
    """
    chosen = os.environ.get("ROLLOUT_TRAIN_PRECISION", "").strip().lower() or "auto"
    if chosen not in PRECISIONS:
        raise RolloutError(
            f"ROLLOUT_TRAIN_PRECISION: {chosen!r} is not one of {', '.join(PRECISIONS)}"
        )
    if chosen == "fp32":
        return "fp32"
    where = device()
    if not where.startswith("cuda"):
        return "fp32" if chosen == "auto" else "bf16"
    if _cuda_bf16(where):
        return "bf16"
    if chosen == "auto":
        return "fp32"
    raise RolloutError(
        f"ROLLOUT_TRAIN_PRECISION: bf16 asked for, but the training device {where} has no "
        "native bf16 support; use fp32 or auto"
    )


def _cuda_bf16(where: str) -> bool:
    import torch

    if not torch.cuda.is_available():
        return False
    # Native bf16 only: emulated bf16 (pre-Ampere GPUs) is slower than fp32.
    with torch.cuda.device(torch.device(where)):
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))


def autocast(precision: str, where: str) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on `where`'s device type for bf16, else a no-op (fp32 runs as before)."""
    if precision != "bf16":
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device_type=torch.device(where).type, dtype=torch.bfloat16)


def load_base(base_model: str | Path, *, where: str = "base_model") -> tuple[Any, Any]:
    """(tokenizer, model) from a local directory; RolloutError naming the problem otherwise."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(str(base_model)).expanduser()
    if not path.is_dir():
        raise RolloutError(f"{where}: no model directory at {path}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, dtype=torch.float32
        )
    except Exception as exc:  # transformers raises OSError/ValueError/KeyError/...: name it
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RolloutError(
            f"{where}: cannot load a causal LM and tokenizer from {path}: {first}"
        ) from None
    if not getattr(tokenizer, "chat_template", None):
        raise RolloutError(f"{where}: the tokenizer at {path} has no chat template")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model


def load_policy(
    base_model: str | Path, *, lora: bool, where: str = "base_model"
) -> tuple[Any, Any, str]:
    """(tokenizer, model, base reference) to train from `base_model`.

    A folder with a LoRA adapter loads onto the base it recorded: with `lora` the adapter
    trains on (a PeftModel with only its weights trainable), without it the adapter is merged
    and everything trains. The base reference is what a new adapter records as its base.
    """
    path = Path(str(base_model)).expanduser()
    if not is_adapter(path):
        tokenizer, model = load_base(path, where=where)
        return tokenizer, model, base_ref_of(path)
    from peft import PeftModel

    ref = adapter_base(path)
    _, model = load_base(base_dir(ref), where=where)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = PeftModel.from_pretrained(model, str(path), is_trainable=lora)
    if not lora:
        model = model.merge_and_unload()
    return tokenizer, model, ref


def is_peft(model: Any) -> bool:
    """True when `model` is a peft model (it carries adapters)."""
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


@contextlib.contextmanager
def torch_threads(threads: int | None, model: Any) -> Iterator[int]:
    """Use `threads` intra-op threads (None: 1 for small CPU models) and restore afterwards."""
    import torch

    before = torch.get_num_threads()
    if threads is None:
        params = sum(p.numel() for p in model.parameters())
        threads = 1 if device() == "cpu" and params < _SMALL_MODEL_PARAMS else before
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


def quiet_libraries() -> None:
    """No progress bars from datasets/transformers in service logs and CLI output."""
    import datasets
    from transformers.utils import logging as hf_logging

    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
