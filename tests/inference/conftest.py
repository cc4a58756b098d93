"""Fixtures: `rollout serve-model` in this test's loop on a free loopback port, the official
`openai` client against it, and a tiny tool-aware model (CPU, one thread)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

# Test folders have no __init__.py: make tests/ importable (pipeline.kit, fakes).
if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout.services.inference.server import Running, serving  # noqa: E402
from rollout.shared.service.sockets import bind  # noqa: E402

TINY_CORPUS = ["Refund order O-1 in full", '{"order_id": "O-1", "amount": 10}', "refunded"]


@pytest.fixture(autouse=True)
def _cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite behaves the same on a GPU machine: sample on the CPU, one intra-op thread.
    monkeypatch.setenv("ROLLOUT_HF_DEVICE", "cpu")
    monkeypatch.setenv("ROLLOUT_HF_THREADS", "1")


def build_tiny(directory: Path, seed: int) -> Path:
    """A seeded, untrained tiny Llama with a tool-aware chat template."""
    from rollout.shared.models.tiny import build_tiny_model

    return build_tiny_model(directory, corpus=TINY_CORPUS, seed=seed)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny model per session (never modified)."""
    return build_tiny(tmp_path_factory.mktemp("serve") / "tiny", seed=0)


@pytest.fixture(scope="session")
def talker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model whose greedy reply is visible text that goes on ("UsUsUs..."), no EOS."""
    return build_tiny(tmp_path_factory.mktemp("talker") / "tiny", seed=1)


@pytest.fixture
def serve() -> Callable[..., AbstractAsyncContextManager[Running]]:
    """`serve(model, **options)`: the server on a free 127.0.0.1 port while inside the block."""

    def start(model: Any, host: str = "127.0.0.1", **options: Any):
        return serving(model, bind(host, 0), **options)

    return start


@pytest.fixture
async def scripted(serve) -> AsyncIterator[Running]:
    """`local/scripted` (plays the example envs' train tasks with tool calls) served."""
    async with serve("local/scripted") as running:
        yield running


def client_of(running: Running, api_key: str = "unused") -> Any:
    """The official async OpenAI client on a running server."""
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=running.base_url, api_key=api_key, max_retries=0, timeout=60)
