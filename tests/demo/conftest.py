"""Fixtures: the whole platform (learner and buffer included) in this test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pipeline.kit import SERVICES, Platform

from rollout.shared.settings import Settings

EXAMPLES = Path(__file__).parent / "demo_examples"


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
async def stack(demo_env: Settings) -> AsyncIterator[Platform]:
    """The platform's services, started; stopped after the test."""
    platform = Platform(demo_env)
    for name in SERVICES:
        platform.start(name)
    yield platform
    platform.check()
    await platform.stop_all()
