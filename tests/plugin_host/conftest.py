"""Fixtures: a plugin-host pool with short deadlines, installed as this process's pool."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from host_plugins import STEP_TIMEOUT_S

from rollout.shared.envs.plugin_host import client
from rollout.shared.envs.plugin_host.client import HostPool, HostSettings

# The in-process platform kit of the pipeline tests (registry service on real NATS).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostPool]:
    """Every plugin runtime and validation of this test uses this pool (2 s deadlines)."""
    fresh = HostPool(HostSettings(step_timeout_s=STEP_TIMEOUT_S, start_timeout_s=5.0))
    monkeypatch.setattr(client, "_pool", fresh)
    yield fresh
    fresh.close()
