"""Training sets from scored rollouts: SFT examples, DPO pairs, GRPO groups (pure functions).

A `row` is one scored rollout: rollout_id, run_id, env_hash, task_index, sample_index,
policy_version, score, passed, error, trajectory (a Trajectory dict) and tools (OpenAI shape).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from rollout.shared.contracts.buffer import (
    DpoPair,
    GrpoCompletion,
    GrpoGroup,
    GrpoGroupsQuery,
    SftExample,
)

Row = dict[str, Any]
_EPSILON = 1e-9
Built = tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, float]]


def split_prompt(messages: list[dict[str, Any]]) -> tuple[list[dict], list[dict]] | None:
    """(prompt, completion): everything before the first assistant turn, and the rest."""
    for i, message in enumerate(messages):
        if message.get("role") == "assistant":
            return messages[:i], messages[i:]
    return None


def _messages(row: Row) -> list[dict[str, Any]]:
    return list((row.get("trajectory") or {}).get("messages") or [])


def _usable(row: Row) -> bool:
    """A verdict that is a real reward: scored, no error, a conversation with a model turn."""
    return (
        row.get("error") is None
        and row.get("score") is not None
        and bool(split_prompt(_messages(row)))
    )


def _meta(row: Row, **extra: Any) -> dict[str, Any]:
    return {
        "rollout_id": row["rollout_id"],
        "run_id": row["run_id"],
        "task_index": row["task_index"],
        "sample_index": row["sample_index"],
        "policy_version": row["policy_version"],
        "score": row["score"],
        **extra,
    }


def sft_set(rows: Iterable[Row]) -> Built:
    """Every passing rollout as one chat example, tool calls and tool results intact."""
    items, meta = [], []
    skipped = 0
    for row in rows:
        if not (row.get("passed") and _usable(row)):
            skipped += 1
            continue
        items.append(SftExample(messages=_messages(row), tools=row.get("tools") or []).model_dump())
        meta.append(_meta(row))
    return items, meta, {"examples": len(items), "skipped": skipped}


def _best_first(row: Row) -> tuple:
    return (-row["score"], not row.get("passed"), row["rollout_id"])


def _worst_first(row: Row) -> tuple:
    return (row["score"], bool(row.get("passed")), row["rollout_id"])


def dpo_pairs(rows: Iterable[Row], min_margin: float) -> Built:
    """Best vs worst of each task's group (same env content, same task), margin >= min_margin.

    A group whose best and worst score the same gives no pair whatever the margin asked for:
    there is no preference to learn from it.
    """
    groups: dict[tuple[str, int], list[Row]] = defaultdict(list)
    for row in rows:
        if _usable(row):
            groups[(row["env_hash"], row["task_index"])].append(row)
    items, meta = [], []
    below = 0
    for key in sorted(groups):
        group = groups[key]
        best = min(group, key=_best_first)
        worst = min(group, key=_worst_first)
        margin = best["score"] - worst["score"]
        # Scores are floats (0.7 - 0.4 < 0.3): a margin equal to the minimum up to rounding counts.
        if margin <= 0 or margin < min_margin - _EPSILON:
            below += 1
            continue
        prompt, chosen = split_prompt(_messages(best))  # type: ignore[misc]
        _, rejected = split_prompt(_messages(worst))  # type: ignore[misc]
        items.append(
            DpoPair(
                prompt=prompt, chosen=chosen, rejected=rejected, tools=best.get("tools") or []
            ).model_dump()
        )
        meta.append(
            {
                "task_index": best["task_index"],
                "env_hash": best["env_hash"],
                "group_size": len(group),
                "chosen_rollout_id": best["rollout_id"],
                "rejected_rollout_id": worst["rollout_id"],
                "chosen_score": best["score"],
                "rejected_score": worst["score"],
                "margin": margin,
            }
        )
    stats = {"groups": len(groups), "pairs": len(items), "below_margin": below}
    return items, meta, stats


def grpo_groups(rows: Iterable[Row], query: GrpoGroupsQuery) -> Built:
    """Groups by (run, task) with tokens, logprobs, rewards and versions; stale ones dropped."""
    rows = list(rows)
    candidates = [row for row in rows if _usable(row)]
    stale = 0
    no_tokens = 0
    versions = [row["policy_version"] for row in candidates]
    current = query.current_policy_version
    if current is None:
        current = max(versions, default=0)
    oldest = None if query.max_staleness is None else current - query.max_staleness
    groups: dict[tuple[str, int], list[Row]] = defaultdict(list)
    future = 0
    for row in candidates:
        if oldest is not None and row["policy_version"] < oldest:
            stale += 1
            continue
        if row["policy_version"] > current:
            # Sampled by a policy newer than the learner's: not data the learner can step on.
            future += 1
            continue
        trajectory = row["trajectory"]
        if query.require_tokens and not (
            trajectory.get("token_ids") and trajectory.get("logprobs")
        ):
            no_tokens += 1
            continue
        groups[(row["run_id"], row["task_index"])].append(row)
    items, meta = [], []
    small = 0
    for key in sorted(groups):
        group = sorted(groups[key], key=lambda r: (r["sample_index"], r["rollout_id"]))
        if len(group) < query.min_group_size:
            small += 1
            continue
        prompt, _ = split_prompt(_messages(group[0]))  # type: ignore[misc]
        completions = []
        for row in group:
            _, turns = split_prompt(_messages(row))  # type: ignore[misc]
            trajectory = row["trajectory"]
            completions.append(
                GrpoCompletion(
                    rollout_id=row["rollout_id"],
                    token_ids=trajectory.get("token_ids"),
                    logprobs=trajectory.get("logprobs"),
                    messages=turns,
                    reward=float(row["score"]),
                    passed=bool(row.get("passed")),
                    policy_version=row["policy_version"],
                    weights_sha256=trajectory.get("weights_sha256"),
                )
            )
        items.append(
            GrpoGroup(
                run_id=key[0],
                task_index=key[1],
                prompt=prompt,
                tools=group[0].get("tools") or [],
                completions=completions,
            ).model_dump()
        )
        meta.append(
            {
                "run_id": key[0],
                "task_index": key[1],
                "size": len(completions),
                "mean_reward": sum(c.reward for c in completions) / len(completions),
            }
        )
    stats = {
        "groups": len(items),
        "completions": sum(m["size"] for m in meta),
        "current_policy_version": current,
        "unusable_dropped": len(rows) - len(candidates),
        "stale_dropped": stale,
        "newer_dropped": future,
        "no_tokens_dropped": no_tokens,
        "small_groups_dropped": small,
    }
    return items, meta, stats
