"""`local/tiny-agent`: scripted train-split demonstrations, a cached build, a registered name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.errors import RolloutError
from rollout.shared.learning import examples as example_envs
from rollout.shared.learning import tiny_agent
from rollout.shared.models.catalog import resolve_backend
from rollout.shared.models.hf import HFBackend


def test_tiny_agent_builds_once_and_resolves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real recipe trains for ~1-2 minutes; a few steps exercise the same path here.
    monkeypatch.setattr(tiny_agent, "TRAINING", {**tiny_agent.TRAINING, "max_steps": 3})
    monkeypatch.setenv("ROLLOUT_HOME", str(tmp_path / "home"))

    backend = resolve_backend("local/tiny-agent")
    assert isinstance(backend, HFBackend)
    model_dir = tmp_path / "home" / "models" / "tiny-agent"
    assert Path(backend.path) == model_dir
    stamp = json.loads((model_dir / tiny_agent.STAMP).read_text())
    # Every example env's train split has a verified demonstration; no test task is used.
    demos = stamp["demonstrations"]
    # A few per env, each verified: the rest of every train split is left to learn from.
    cap = tiny_agent.MAX_DEMOS_PER_ENV
    assert demos and all(c["passed"] == min(c["tasks"], cap) > 0 for c in demos.values()), demos
    assert demos["ticket-routing"]["tasks"] > cap
    assert stamp["training"]["max_steps"] == 3

    messages: list[str] = []
    assert tiny_agent.build_tiny_agent(model_dir, progress=messages.append) == model_dir
    assert messages == []  # cached: same code, data and seed
    # Another seed, recipe or example file is another build.
    examples = example_envs.examples_dir()
    recipe = tiny_agent.TRAINING
    assert stamp["hash"] == tiny_agent._digest(examples, 0, recipe)
    assert tiny_agent._digest(examples, 1, recipe) != stamp["hash"]
    assert tiny_agent._digest(examples, 0, {**recipe, "epochs": 2.0}) != stamp["hash"]


def test_tiny_agent_name_is_exact() -> None:
    with pytest.raises(RolloutError, match="did you mean 'local/tiny-agent'"):
        resolve_backend("local/tiny-agent-xl")


@pytest.mark.parametrize("base", ["local/tiny-agent", "local/smollm2-135m"])
def test_a_trained_name_no_job_published_is_named_as_such(
    base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `serve-model` and `rollout test` said "did you mean BASE?" for a typo'd suffix, as if
    # the user had meant the untrained base.
    monkeypatch.setenv("ROLLOUT_HOME", str(tmp_path))
    with pytest.raises(RolloutError) as caught:
        resolve_backend(f"{base}:typo")
    assert str(caught.value) == (
        f"no trained model '{base}:typo'\n"
        "  - see `rollout jobs` for finished jobs and the model names they produced"
    )


def test_a_job_that_published_no_model_says_why_there_may_be_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `serve-model job-<cancelled>` said "no trained model", as if the id were mistyped.
    monkeypatch.setenv("ROLLOUT_HOME", str(tmp_path))
    with pytest.raises(RolloutError) as caught:
        resolve_backend("job-0123456789abcdef")
    assert str(caught.value) == (
        "job 'job-0123456789abcdef' has published no model\n"
        "  - a job publishes its model when it completes; one that is still running, failed "
        "or was cancelled has none: see `rollout job job-0123456789abcdef`"
    )


@pytest.mark.parametrize(
    "order",
    [
        ("rollout.shared.models.trained", "rollout.shared.learning.tiny_agent"),
        ("rollout.shared.learning.tiny_agent", "rollout.shared.models.trained"),
    ],
)
def test_trained_tiny_agent_names_resolve_whatever_the_import_order(order: tuple) -> None:
    # A fresh interpreter: the registry is process state.
    code = (
        "import importlib, sys\n"
        f"for name in {list(order)!r}: importlib.import_module(name)\n"
        "from rollout.shared.models.catalog import backend_forms, name_resolvers\n"
        "from rollout.shared.models.trained import resolve_trained_name\n"
        "assert any(f.prefix == 'local/tiny-agent' for f in backend_forms())\n"
        "sys.exit(0 if resolve_trained_name in name_resolvers() else 3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


async def test_first_use_from_inside_an_event_loop_builds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An actor resolves the model in its loop: the build's own asyncio.run() must not clash."""
    monkeypatch.setattr(tiny_agent, "TRAINING", {**tiny_agent.TRAINING, "max_steps": 1})
    monkeypatch.setenv("ROLLOUT_HOME", str(tmp_path / "home"))
    backend = resolve_backend("local/tiny-agent")
    assert isinstance(backend, HFBackend)
    assert (Path(backend.path) / tiny_agent.STAMP).is_file()
