"""The weights digest: what it covers, and one rollout's digest from its turns'."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.shared.errors import RolloutError
from rollout.shared.models.weights_proof import MIXED_PREFIX, rollout_digest, weights_digest

A, B = "a" * 64, "b" * 64


def test_the_digest_covers_weights_and_adapter_config_only(tmp_path: Path) -> None:
    (tmp_path / "adapter_model.safetensors").write_bytes(b"weights")
    (tmp_path / "adapter_config.json").write_text('{"r": 8}')
    first = weights_digest(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "optimizer.pt").write_bytes(b"state")
    assert weights_digest(tmp_path) == first
    (tmp_path / "adapter_config.json").write_text('{"r": 16}')
    assert weights_digest(tmp_path) != first
    # A renamed file is another model too: names are part of the digest.
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "model.safetensors").write_bytes(b"weights")
    (moved / "adapter_config.json").write_text('{"r": 16}')
    assert weights_digest(moved) != weights_digest(tmp_path)


def test_a_folder_without_weights_has_no_digest(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(RolloutError, match="no weights"):
        weights_digest(tmp_path)


def test_a_rollouts_digest_is_its_turns_common_one() -> None:
    assert rollout_digest([A, A, A]) == A
    assert rollout_digest([]) is None and rollout_digest([None, None]) is None
    # Turns from different weights (a version switched mid-rollout) or without proof: mixed,
    # which no version's digest equals.
    assert rollout_digest([A, B]) == f"{MIXED_PREFIX}{A},{B}"
    assert rollout_digest([A, None]) == f"{MIXED_PREFIX}{A},none"
