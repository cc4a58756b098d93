"""Fixtures: the whole platform (learner and buffer included) in this test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollout.shared.settings import Settings

EXAMPLES = Path(__file__).parent / "demo_examples"
SERVICES = {
    "env-registry": "rollout.services.env_registry.main",
    "tracker": "rollout.services.tracker.main",
    "actor": "rollout.services.actor.main",
    "verifier": "rollout.services.verifier.main",
    "learner": "rollout.services.learner.main",
    "buffer": "rollout.services.buffer.main",
}


class Stack:
    """Every service as a task of this loop; `check` fails loudly if one crashed."""

    def __init__(self, settings: Settings) -> None:
        self.tasks = {
            name: asyncio.create_task(importlib.import_module(module).serve(settings), name=name)
            for name, module in SERVICES.items()
        }

    def check(self) -> None:
        """Raise if a service task ended with an error."""
        for name, task in self.tasks.items():
            if task.done() and not task.cancelled() and task.exception():
                raise AssertionError(f"service {name} crashed") from task.exception()

    async def stop(self) -> None:
        """Cancel every service and wait for them."""
        for task in self.tasks.values():
            task.cancel()
        for task in self.tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest.fixture
def demo_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The CLI in this process talks to the test's NATS, Postgres, home and example envs."""
    monkeypatch.setenv("ROLLOUT_HOME", str(settings.home))
    monkeypatch.setenv("ROLLOUT_NATS_URL", settings.nats_url)
    monkeypatch.setenv("ROLLOUT_NATS_USER", settings.nats_user or "")
    monkeypatch.setenv("ROLLOUT_NATS_PASSWORD", settings.nats_password or "")
    monkeypatch.setenv("ROLLOUT_DATABASE_URL", settings.database_url or "")
    monkeypatch.delenv("ROLLOUT_OBJECT_STORE_URL", raising=False)
    monkeypatch.setenv("ROLLOUT_EXAMPLES_DIR", str(EXAMPLES))
    # Tiny models on shared cores: one intra-op thread is many times faster.
    monkeypatch.setenv("ROLLOUT_HF_THREADS", "1")
    return settings


@pytest.fixture
async def stack(demo_env: Settings) -> AsyncIterator[Stack]:
    """The platform's services, started; stopped after the test."""
    s = Stack(demo_env)
    yield s
    s.check()
    await s.stop()
