"""Scoring conversations with a trained reward model (the reward_model primitive; PPO too)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout.shared.errors import RolloutError
from rollout.shared.learning.rm import RM_MARKER, classifier_from

# Conversations scored per forward pass.
SCORE_BATCH = 8


def model_positions(model_dir: Path) -> int | None:
    """How many token positions the model at `model_dir` has (its config.json's
    max_position_embeddings, or n_positions); None when it does not say."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for key in ("max_position_embeddings", "n_positions"):
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def past_positions(max_len: int, name: str, model_dir: Path) -> str | None:
    """Why a length limit of `max_len` tokens is more than the reward model `name` (at
    `model_dir`) can read, or None when it is not."""
    positions = model_positions(model_dir)
    if positions is None or max_len <= positions:
        return None
    return (
        f"{max_len} is more tokens than reward model {name!r} reads: its config.json has "
        f"max_position_embeddings {positions}; set it to {positions} or less"
    )


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
        # Past its positions a model fails or silently reads garbage (RoPE extrapolates):
        # a conversation longer than either limit is never scored.
        self.positions = model_positions(self.model_dir)
        self.readable = min(max_len, self.positions or max_len)
        self.controls = control_tokens(self.tokenizer)
        self._lock = threading.Lock()

    def texts(
        self, conversations: Sequence[list[dict[str, Any]]], *, tools: Any = None
    ) -> list[str]:
        """Each conversation as the model reads it: its chat template's rendering, with every
        control-token text removed from what the messages hold first (see `neutralised`)."""
        tools = json.loads(tools) if isinstance(tools, str) else (tools or None)
        return [
            self.tokenizer.apply_chat_template(
                neutralised(list(c), self.controls), tools=tools, tokenize=False
            )
            for c in conversations
        ]

    def token_counts(
        self, conversations: Sequence[list[dict[str, Any]]], *, tools: Any = None
    ) -> list[int]:
        """How many tokens each conversation is, uncut (`score` reads at most `readable`)."""
        texts = self.texts(conversations, tools=tools)
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def score(
        self, conversations: Sequence[list[dict[str, Any]]], *, tools: Any = None
    ) -> list[float]:
        """The model's scalar reward of each conversation (rendered by its chat template).

        A conversation longer than max_len (or the model's positions) is refused
        (RolloutError), never cut: its score
        would be the score of a prefix the policy wrote, read at a token of its choosing, its
        end unseen. Callers check `token_counts` first and decide what such a one gets."""
        import torch

        texts = self.texts(conversations, tools=tools)
        out: list[float] = []
        with self._lock, torch.no_grad():
            for start in range(0, len(texts), SCORE_BATCH):
                batch = self.tokenizer(
                    texts[start : start + SCORE_BATCH],
                    return_tensors="pt",
                    padding=True,
                    add_special_tokens=False,
                )
                longest = int(batch["attention_mask"].sum(dim=1).max())
                if longest > self.readable:
                    raise RolloutError(
                        f"a conversation of {longest} tokens is longer than the reward model "
                        f"reads ({self.readable}): it is not scored on its start"
                    )
                logits = self.model(**batch).logits
                out.extend(float(v) for v in logits[:, 0])
        return out


def control_tokens(tokenizer: Any) -> list[str]:
    """The texts a tokenizer turns into control tokens (special and added), longest first."""
    texts = set(tokenizer.all_special_tokens) | set(tokenizer.get_added_vocab())
    return sorted((t for t in texts if t), key=len, reverse=True)


def neutralised(messages: list[dict[str, Any]], tokens: list[str]) -> list[dict[str, Any]]:
    """The messages with control-token texts removed from every string in them.

    The chat template renders content verbatim and the tokenizer turns `<|im_end|>` written
    in it into the real token, so an answer could otherwise close its turn and forge a
    transcript (a user verdict, a tool call) that the reward model reads as structure.
    """

    # Removed until none is left: one pass would turn `<|im_<|im_end|>end|>` into `<|im_end|>`.
    # Each pass is one regex scan; a pass only repeats when it removed something.
    pattern = re.compile("|".join(map(re.escape, tokens))) if tokens else None

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            while pattern is not None:
                value, removed = pattern.subn("", value)
                if not removed:
                    break
            return value
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return value

    return [clean(m) for m in messages]


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
