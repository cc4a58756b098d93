"""Fixtures for the training core: one seeded tiny base model per session, CPU, one thread."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Test folders have no __init__.py: make `learning_kit` (next to this file) importable.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly initialised tiny Llama + tokenizer (never modified by the tests)."""
    from learning_kit import corpus

    from rollout.shared.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", seed=0, corpus=corpus())


@pytest.fixture(autouse=True)
def _cpu_training(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite behaves the same on a GPU machine: train and sample on the CPU unless
    # ROLLOUT_TEST_DEVICE names another device (cuda: the GPU checks of the same tests).
    device = os.environ.get("ROLLOUT_TEST_DEVICE", "cpu")
    monkeypatch.setenv("ROLLOUT_TRAIN_DEVICE", device)
    monkeypatch.setenv("ROLLOUT_HF_DEVICE", device)
    # float32 on both sides, whatever the device: these tests compare the actor's logprobs
    # with the learner's to 1e-3 (bf16 is measured by benchmarks/gpu.py and the precision
    # tests, which set their own).
    monkeypatch.setenv("ROLLOUT_HF_DTYPE", "float32")
    monkeypatch.setenv("ROLLOUT_TRAIN_PRECISION", "fp32")
    monkeypatch.setenv("ROLLOUT_HF_THREADS", "1")
