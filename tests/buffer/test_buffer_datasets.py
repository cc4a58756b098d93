"""Building training sets from scored rows: what is kept, what is dropped and why."""

from __future__ import annotations

from typing import Any

import pytest

from rollout.errors import RolloutError
from rollout.services.buffer.projection import INLINE_BYTES_ENV, inline_bytes_from_env
from rollout.shared.contracts.buffer import GrpoGroupsQuery, SftSetQuery
from rollout.shared.learning import datasets
from rollout.shared.objectstore import DEFAULT_INLINE_LIMIT

PROMPT = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


def row(i: int, score: float, *, task: int = 0, **extra: Any) -> dict[str, Any]:
    """One scored rollout with a two-turn conversation."""
    trajectory = {
        "messages": [*PROMPT, {"role": "assistant", "content": f"answer {i}"}],
        "token_ids": [[i]],
        "logprobs": [[-0.1]],
    }
    return {
        "rollout_id": f"r{i}",
        "run_id": "run",
        "env_hash": "h",
        "task_index": task,
        "sample_index": i,
        "policy_version": 0,
        "score": score,
        "passed": score >= 1.0,
        "error": None,
        "trajectory": trajectory,
        "tools": [{"type": "function", "function": {"name": "t"}}],
        **extra,
    }


def test_sft_keeps_passing_rollouts_with_a_model_turn_and_no_error() -> None:
    no_turn = row(3, 1.0)
    no_turn["trajectory"]["messages"] = PROMPT
    rows = [row(0, 1.0), row(1, 0.5), row(2, 1.0, error="verifier raised"), no_turn]
    items, meta, stats = datasets.sft_set(rows)
    assert [m["rollout_id"] for m in meta] == ["r0"]
    assert items == [{"messages": rows[0]["trajectory"]["messages"], "tools": rows[0]["tools"]}]
    assert stats == {"examples": 1, "skipped": 3}


def test_dpo_needs_a_strict_preference_and_prefers_the_stable_tie_break() -> None:
    rows = [row(0, 0.5), row(1, 0.5), row(2, 0.5, task=1), row(3, 0.9, task=1), row(4, 0.9, task=1)]
    items, meta, stats = datasets.dpo_pairs(rows, 0.0)
    assert [(m["chosen_rollout_id"], m["rejected_rollout_id"]) for m in meta] == [("r3", "r2")]
    assert items[0]["prompt"] == PROMPT
    assert items[0]["chosen"] == [{"role": "assistant", "content": "answer 3"}]
    assert stats == {"groups": 2, "pairs": 1, "below_margin": 1}


def test_grpo_drops_stale_newer_tokenless_and_small_groups() -> None:
    rows = [
        row(0, 1.0, policy_version=5),
        row(1, 0.0, policy_version=4),
        row(2, 0.0, policy_version=2),  # stale with max_staleness 1
        row(3, 1.0, policy_version=6),  # newer than the learner
        row(4, 1.0, task=1, policy_version=5),  # a group of one
    ]
    rows[1]["trajectory"]["token_ids"] = None
    query = GrpoGroupsQuery(
        run_ids=["run"], max_staleness=1, current_policy_version=5, min_group_size=1
    )
    items, meta, stats = datasets.grpo_groups(rows, query)
    assert [(g["task_index"], [c["rollout_id"] for c in g["completions"]]) for g in items] == [
        (0, ["r0"]),
        (1, ["r4"]),
    ]
    assert stats["stale_dropped"] == 1 and stats["newer_dropped"] == 1
    assert stats["no_tokens_dropped"] == 1
    strict = query.model_copy(update={"min_group_size": 2})
    assert datasets.grpo_groups(rows, strict)[2]["small_groups_dropped"] == 2


def test_queries_and_settings_are_validated_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="give run_id or rollout_ids"):
        SftSetQuery()
    with pytest.raises(ValueError, match="inline_limit"):
        SftSetQuery(run_id="r", inline_limit=10)
    # The buffer keeps the platform's one claim-check threshold unless told otherwise.
    assert inline_bytes_from_env({}) == DEFAULT_INLINE_LIMIT == 256 * 1024
    assert inline_bytes_from_env({INLINE_BYTES_ENV: "0"}) == 0
    with pytest.raises(
        RolloutError, match=f"{INLINE_BYTES_ENV} must be a whole number of bytes, got 'lots'"
    ):
        inline_bytes_from_env({INLINE_BYTES_ENV: "lots"})


async def test_a_buffer_behind_the_asked_position_says_so_after_a_bounded_wait() -> None:
    from rollout.services.buffer.queries import BufferQueries

    async def applied() -> int:
        return 4  # a buffer stuck at sequence 4 (nothing else is reached before the wait)

    queries = BufferQueries(None, None, None, applied, catch_up_s=0.2)  # type: ignore[arg-type]
    with pytest.raises(RolloutError, match="applied events up to sequence 4, this request needs 9"):
        await queries.sft_set(SftSetQuery(run_id="r", after_seq=9))
