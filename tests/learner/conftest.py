"""Fixtures: the platform with a learner in-process, a tiny base model, scripted agents."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fakes.openai_server import FakeOpenAI
from learner_kit import SHORT_RM_POSITIONS, Platform, ready_client, refund_agent

from rollout.client import AsyncClient
from rollout.shared.settings import Settings

# The learner resolves trained names in this process too (`BASE:SUFFIX`, job ids).
import rollout.shared.models.trained  # noqa: F401, E402  isort: skip


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny Llama with a tool-aware chat template (built once per session)."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    from rollout.shared.models.tiny import build_tiny_model

    corpus = ["Refund order O-1 in full", '{"order_id": "O-1", "amount": 10}', "refunded"]
    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny", corpus=corpus, seed=0)
    # An untrained model babbles every byte, NUL included, and Postgres jsonb cannot hold
    # "\u0000": the tracker's projection then retries that batch forever (a platform issue,
    # reported). Marking the NUL byte's token special makes decoding drop it.
    tokenizer = AutoTokenizer.from_pretrained(path)
    nul = tokenizer.convert_ids_to_tokens(tokenizer("\x00", add_special_tokens=False)["input_ids"])
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in nul])
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def short_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained one-score reward model with SHORT_RM_POSITIONS positions (no training:
    what is checked is its config.json, and that a conversation past it is never scored)."""
    from transformers import AutoTokenizer

    from rollout.shared.learning.rm import RM_MARKER, classifier_from
    from rollout.shared.models.tiny import build_tiny_model

    corpus = ["Refund order O-1 in full", '{"order_id": "O-1", "amount": 10}', "refunded"]
    base = tmp_path_factory.mktemp("short") / "base"
    build_tiny_model(base, corpus=corpus, seed=0, max_positions=SHORT_RM_POSITIONS)
    tokenizer = AutoTokenizer.from_pretrained(base)
    out = base.parent / "rm"
    classifier_from(base, tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / RM_MARKER).write_text('{"kind": "reward_model", "num_labels": 1}\n')
    return out


@pytest.fixture
def learner_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """This process resolves trained models from the test's home and object store."""
    monkeypatch.setenv("ROLLOUT_HOME", str(settings.home))
    monkeypatch.delenv("ROLLOUT_OBJECT_STORE_URL", raising=False)
    # Tiny models on shared cores: one intra-op thread is many times faster.
    monkeypatch.setenv("ROLLOUT_HF_THREADS", "1")
    return settings


@pytest.fixture
async def platform(learner_env: Settings) -> AsyncIterator[Platform]:
    """Registry, tracker, an actor, a verifier, the buffer and a learner in this test's loop."""
    p = Platform(learner_env)
    for name in ("env-registry", "tracker", "verifier", "actor", "buffer", "learner"):
        p.start(name)
    yield p
    p.check()
    await p.stop_all()


@pytest.fixture
async def client(learner_env: Settings, platform: Platform) -> AsyncIterator[AsyncClient]:
    """A client of the in-process platform."""
    c = await ready_client(learner_env, platform.check)
    yield c
    await c.close()


@pytest.fixture
def agent_server() -> Iterator[FakeOpenAI]:
    """The scripted refund agent over real HTTP."""
    with FakeOpenAI(refund_agent) as server:
        yield server
