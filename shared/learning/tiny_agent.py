"""`local/tiny-agent`: a few-MB tool-using model this repo trains itself, offline, reproducibly.

No weights can be downloaded here, so the first real model a user runs is built from code:
the tiny Llama of `rollout.shared.models.tiny` (fresh random init, seeded) is fine-tuned with
our own `train_sft` on scripted, verifier-checked demonstrations of the example environments'
**train** split (never the test split). The result is cached under
`$ROLLOUT_HOME/models/tiny-agent`, keyed by a content hash of (code, data, seed, library
versions): an unchanged build is reused, a changed one is rebuilt.

Importing this module registers the model-name form `local/tiny-agent` (an HFBackend of the
built dir, building it on first use). `python -m rollout.shared.learning.tiny_agent` builds it
and prints its pass rate on the examples' test split.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import structlog

from rollout.shared.agent.loop import Episode, SamplingParams, run_episodes
from rollout.shared.contracts.budgets import resolve_budgets
from rollout.shared.envs.engine import build_runtime, score
from rollout.shared.envs.loader import load_environments
from rollout.shared.errors import RolloutError
from rollout.shared.learning.config import TrainConfig
from rollout.shared.learning.data import sft_examples
from rollout.shared.learning.examples import example_files
from rollout.shared.learning.scripted import scripted_rollouts
from rollout.shared.learning.sft import train_sft
from rollout.shared.models import tiny
from rollout.shared.models.hf import HFBackend
from rollout.shared.models.local_models import LocalModel, ProgressHook, register_local_model
from rollout.shared.models.names import unknown_local
from rollout.shared.models.registry import register_backend
from rollout.shared.models.tiny import build_tiny_model
from rollout.shared.settings import default_home

log = structlog.get_logger(__name__)

NAME = "local/tiny-agent"
STAMP = "rollout_tiny_agent.json"
# Bump when the recipe changes in a way the hashed sources do not show.
RECIPE_VERSION = 1
MODEL_SHAPE: dict[str, int] = {"hidden_size": 64, "layers": 2, "heads": 4, "vocab_size": 1024}
TRAINING: dict[str, Any] = {
    "method": "sft",
    "epochs": 30.0,
    "learning_rate": 5e-3,
    "batch_size": 4,
    "save_every": 10_000,
    "max_seq_len": 2048,
    "threads": 1,
}
# At most this many demonstrations per environment (the first train tasks): the tiny agent is
# built from a few examples of each env, so a generated env with many train tasks (ticket-routing)
# leaves it something to learn in `rollout demo` from its own passing rollouts.
MAX_DEMOS_PER_ENV = 6
_HASHED_MODULES = ("tiny_agent", "scripted", "sft", "trl_job", "data", "config")


def default_dir() -> Path:
    """Where the built model lives: `$ROLLOUT_HOME/models/tiny-agent`."""
    home = os.environ.get("ROLLOUT_HOME")
    return (Path(home).expanduser() if home else default_home()) / "models" / "tiny-agent"


def _run_to_end(make: Callable[[], Any]) -> Any:
    """Run the coroutine `make()` returns to its end, from sync code with or without a loop.

    An actor prepares the model on first use from inside its event loop, where asyncio.run()
    refuses to start: the coroutine then gets a loop of its own on a worker thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tiny-agent") as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def build_tiny_agent(
    directory: str | Path | None = None,
    *,
    seed: int = 0,
    force: bool = False,
    examples: Path | None = None,
    training: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Build (or reuse the cached) tiny agent at `directory`; returns the model dir."""
    say = progress or (lambda message: log.info(message, model=NAME))
    target = Path(directory).expanduser() if directory else default_dir()
    files = example_files(examples)
    recipe = {**TRAINING, **(training or {})}
    digest = _digest(files[0].parent, seed, recipe)
    with _lock(target):
        if not force and _stamp(target).get("hash") == digest:
            return target
        say(f"building {NAME} (first use): scripting train-split demonstrations")
        rollouts, counts = _run_to_end(lambda: _demonstrations(files))
        if not rollouts:
            raise RolloutError(f"{NAME}: no scripted demonstrations passed their verifiers")
        say(
            f"{NAME}: training a tiny model from scratch on {len(rollouts)} scripted "
            f"train-split demonstrations ({_summary(counts)}); takes about 2 minutes on 2 CPU "
            f"cores, once"
        )
        started = time.monotonic()
        model_dir = _train(target, rollouts, seed, recipe, say)
        stamp = {
            "name": NAME,
            "hash": digest,
            "seed": seed,
            "recipe_version": RECIPE_VERSION,
            "training": recipe,
            "model_shape": MODEL_SHAPE,
            "demonstrations": counts,
            "build_seconds": round(time.monotonic() - started, 1),
        }
        (model_dir / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        _replace(model_dir, target)
        say(f"built {NAME} at {target} in {stamp['build_seconds']}s")
    return target


async def _demonstrations(files: list[Path]) -> tuple[list[dict], dict]:
    return await scripted_rollouts(files, split="train", per_env=MAX_DEMOS_PER_ENV)


def _summary(counts: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{slug} {c['passed']}/{c['tasks']}" for slug, c in sorted(counts.items()))


def _digest(examples: Path, seed: int, recipe: dict[str, Any]) -> str:
    # The demonstrations are a pure function of the example files and this code, so hashing
    # those (cheap) stands in for hashing the data (seconds: it runs every environment).
    import tokenizers
    import torch
    import transformers
    import trl

    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    sources = [here / f"{name}.py" for name in _HASHED_MODULES] + [Path(tiny.__file__)]
    data = sorted(
        p
        for p in examples.rglob("*")
        if p.is_file() and p.suffix in {".py", ".jsonl", ".json"} and "__pycache__" not in p.parts
    )
    for source in sources + data:
        h.update(str(source.relative_to(source.parents[1])).encode())
        h.update(source.read_bytes())
    versions = [
        torch.__version__,
        transformers.__version__,
        trl.__version__,
        tokenizers.__version__,
    ]
    meta = {
        "seed": seed,
        "recipe": recipe,
        "shape": MODEL_SHAPE,
        "versions": versions,
        "recipe_version": RECIPE_VERSION,
        "max_demos_per_env": MAX_DEMOS_PER_ENV,
    }
    h.update(json.dumps(meta, sort_keys=True).encode())
    return h.hexdigest()


def _train(
    target: Path, rollouts: list[dict], seed: int, recipe: dict[str, Any], say: Callable
) -> Path:
    work = target.with_name(target.name + ".build")
    shutil.rmtree(work, ignore_errors=True)
    examples = sft_examples(rollouts)
    corpus = [_render(example) for example in examples]
    base = build_tiny_model(
        work / "base",
        seed=seed,
        corpus=corpus,
        vocab_size=MODEL_SHAPE["vocab_size"],
        hidden_size=MODEL_SHAPE["hidden_size"],
        layers=MODEL_SHAPE["layers"],
        heads=MODEL_SHAPE["heads"],
    )
    config = TrainConfig(**recipe, seed=seed)
    last = {"t": 0.0}

    def on_progress(p: Any) -> None:
        now = time.monotonic()
        if now - last["t"] >= 15 or p.step == p.total_steps:
            last["t"] = now
            eta = f", ~{p.eta_s:.0f}s left" if p.eta_s is not None else ""
            say(f"{NAME}: step {p.step}/{p.total_steps}, loss {p.loss:.3f}{eta}")

    result = train_sft(
        base, examples, work / "train", config, on_progress=on_progress, resume=False
    )
    return result.model_dir


def _render(example: dict[str, Any]) -> str:
    # Rendered conversations as tokenizer corpus: JSON and tool names get their own merges.
    lines = [json.dumps(example.get("tools") or "")]
    for message in example["messages"]:
        lines.append(str(message.get("content") or ""))
        for call in message.get("tool_calls") or []:
            lines.append(json.dumps(call["function"]))
    return "\n".join(lines)


def _stamp(directory: Path) -> dict[str, Any]:
    try:
        return json.loads((directory / STAMP).read_text())
    except (OSError, ValueError):
        return {}


def _replace(built: Path, target: Path) -> None:
    staging = target.with_name(target.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(built, staging)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    shutil.rmtree(target.with_name(target.name + ".build"), ignore_errors=True)


@contextlib.contextmanager
def _lock(target: Path) -> Iterator[None]:
    # Two processes (an actor and the CLI) may both ask for the model first: build once.
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_tiny_agent(progress: Callable[[str], None] | None = None) -> Path:
    """The built model dir, building it first when missing or stale (the check is cheap)."""
    return build_tiny_agent(default_dir(), progress=progress)


def _backend(rest: str) -> Any:
    if rest.strip():
        raise unknown_local(NAME, rest)
    return HFBackend(ensure_tiny_agent())


def _local_model() -> LocalModel:
    def prepared() -> bool:
        return bool(_stamp(default_dir()).get("hash"))

    def prepare(progress: ProgressHook | None) -> Path:
        say = (lambda m: progress(m, 0, 1)) if progress else None
        return ensure_tiny_agent(progress=say)

    return LocalModel(
        name=NAME,
        description="a few-MB model trained here from scripted demonstrations (fast tests)",
        directory=default_dir,
        prepared=prepared,
        prepare=prepare,
        threads=1,
    )


def register() -> None:
    """Make `local/tiny-agent` a local model, resolvable through the model registry."""
    register_local_model(NAME, _local_model)
    register_backend(NAME, _backend, example=NAME)


async def evaluate(
    model_dir: Path, *, split: str = "test", examples: Path | None = None
) -> dict[str, Any]:
    """Greedy pass rate of a model on every example env's `split` tasks (per env and total)."""
    backend = HFBackend(model_dir, max_new_tokens=256)
    per_env: dict[str, dict[str, int]] = {}
    for file in example_files(examples):
        for env in load_environments(file):
            spec = env.to_spec()
            tasks = [t for t in spec.tasks if t.split == split]
            if not tasks:
                continue
            runtimes = [build_runtime(spec, t) for t in tasks]
            try:
                episodes = [
                    Episode(rt, t.instruction) for rt, t in zip(runtimes, tasks, strict=True)
                ]
                trajectories = await run_episodes(
                    episodes,
                    backend,
                    max_tool_calls=12,
                    sampling=SamplingParams(temperature=0.0, max_tokens=256),
                    budgets=resolve_budgets(spec.budgets, None),
                )
            finally:
                for rt in runtimes:
                    await rt.close()
            results = [await score(spec, t, tr) for t, tr in zip(tasks, trajectories, strict=True)]
            per_env[spec.slug] = {"tasks": len(tasks), "passed": sum(r.passed for r in results)}
    total = sum(v["tasks"] for v in per_env.values())
    passed = sum(v["passed"] for v in per_env.values())
    return {
        "split": split,
        "tasks": total,
        "passed": passed,
        "pass_rate": passed / total if total else 0.0,
        "per_env": per_env,
    }


register()


def main() -> None:
    """Build the tiny agent and print its pass rate on the examples' test split."""
    path = build_tiny_agent(progress=lambda m: print(m, flush=True))  # noqa: T201 - CLI entry
    report = asyncio.run(evaluate(path))
    print(json.dumps(report, indent=2))  # noqa: T201


if __name__ == "__main__":
    main()
