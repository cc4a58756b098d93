"""Scoring conversations with a trained reward model (what the `reward_model` primitive runs)."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout.shared.errors import RolloutError
from rollout.shared.learning.rm import RM_MARKER, classifier_from

# Conversations scored per forward pass.
SCORE_BATCH = 8


class RewardScorer:
    """A reward model loaded once; `score(conversations)` gives one float per conversation."""

    def __init__(self, model_dir: Path, *, max_len: int = 2048) -> None:
        from transformers import AutoTokenizer

        self.model_dir = Path(model_dir)
        if not (self.model_dir / RM_MARKER).is_file():
            raise RolloutError(
                f"{self.model_dir}: not a reward model (train one with `rollout improve "
                "--method rm`)"
            )
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir), local_files_only=True)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = classifier_from(self.model_dir, self.tokenizer).eval()
        self.max_len = max_len
        self._lock = threading.Lock()

    def score(
        self, conversations: Sequence[list[dict[str, Any]]], *, tools: Any = None
    ) -> list[float]:
        """The model's scalar reward of each conversation (rendered by its chat template)."""
        import torch

        tools = json.loads(tools) if isinstance(tools, str) else (tools or None)
        texts = [
            self.tokenizer.apply_chat_template(list(c), tools=tools, tokenize=False)
            for c in conversations
        ]
        out: list[float] = []
        with self._lock, torch.no_grad():
            for start in range(0, len(texts), SCORE_BATCH):
                batch = self.tokenizer(
                    texts[start : start + SCORE_BATCH],
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=self.max_len,
                    add_special_tokens=False,
                )
                logits = self.model(**batch).logits
                out.extend(float(v) for v in logits[:, 0])
        return out


_CACHE: dict[tuple[Path, int], RewardScorer] = {}
_CACHE_LOCK = threading.Lock()


def scorer_for(model_dir: Path, *, max_len: int = 2048) -> RewardScorer:
    """The process's scorer of `model_dir` (loaded on first use, then shared)."""
    key = (Path(model_dir).resolve(), max_len)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = RewardScorer(key[0], max_len=max_len)
        return _CACHE[key]


def drop_scorer(model_dir: Path) -> None:
    """Free the process's scorers of `model_dir` (a reward model replaced by a newer version)."""
    path = Path(model_dir).resolve()
    with _CACHE_LOCK:
        for key in [k for k in _CACHE if k[0] == path]:
            del _CACHE[key]
