"""Two runs compared: pass-rate and score deltas with 95% intervals, per task, with warnings."""

from __future__ import annotations

from typing import Any

from rollout.shared.stats import newcombe_interval, paired_difference_interval, wilson_interval

_SUMMARY_KEYS = ("runId", "model", "envSlug", "envVersion", "split", "passRate", "meanScore",
                 "passed", "scored")  # fmt: skip


def comparison(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Headline and per-task deltas of OTHER against BASE, with 95% intervals and warnings.

    Pass-rate intervals are Wilson score intervals over the scored rollouts; the difference's
    is Newcombe's hybrid score interval (independent runs). Rollouts of one task are counted as
    independent trials, so with n > 1 per task the intervals are on the narrow side. When both
    runs scored one rollout of each of the same tasks of the same env version (two greedy
    evaluations of a test split), the tasks are pairs and the paired interval is given too.
    """
    tasks_b = {t["taskIndex"]: t for t in base.get("tasks", [])}
    tasks_o = {t["taskIndex"]: t for t in other.get("tasks", [])}
    rows = []
    for index in sorted(set(tasks_b) | set(tasks_o)):
        b, o = tasks_b.get(index), tasks_o.get(index)
        rows.append(
            {
                "taskIndex": index,
                "basePassRate": b["passRate"] if b else None,
                "otherPassRate": o["passRate"] if o else None,
                "deltaPassRate": (o["passRate"] - b["passRate"]) if b and o else None,
                "baseScore": b["meanScore"] if b else None,
                "otherScore": o["meanScore"] if o else None,
                "deltaScore": (o["meanScore"] - b["meanScore"]) if b and o else None,
            }
        )

    def summary(run: dict[str, Any]) -> dict[str, Any]:
        out = {k: run.get(k) for k in _SUMMARY_KEYS}
        out["passRateInterval"] = list(wilson_interval(run["passed"], run["scored"]))
        return out

    delta = newcombe_interval(base["passed"], base["scored"], other["passed"], other["scored"])
    warnings = comparison_warnings(base, other, set(tasks_b), set(tasks_o))
    return {
        "base": summary(base),
        "other": summary(other),
        "deltaPassRate": other["passRate"] - base["passRate"],
        "deltaPassRateInterval": list(delta),
        "deltaPassRatePairedInterval": _paired_interval(base, other, tasks_b, tasks_o, warnings),
        "deltaScore": other["meanScore"] - base["meanScore"],
        "confidence": 0.95,
        "warnings": warnings,
        "tasks": rows,
    }


def _paired_interval(
    base: dict[str, Any],
    other: dict[str, Any],
    tasks_b: dict[int, dict[str, Any]],
    tasks_o: dict[int, dict[str, Any]],
    warnings: list[str],
) -> list[float] | None:
    """Newcombe's paired interval of the difference, when each task is one pair; else None.

    Pairs need the same tasks of the same env version (no warning), a whole task table in both
    runs, and every task sampled and scored once, with no error.
    """
    if warnings or not tasks_b or set(tasks_b) != set(tasks_o):
        return None
    if base.get("tasksCursor") is not None or other.get("tasksCursor") is not None:
        return None  # a partial task table: not every pair is known
    order = sorted(tasks_b)
    outcomes: list[list[bool]] = [[], []]
    for side, tasks in zip(outcomes, (tasks_b, tasks_o), strict=True):
        for index in order:
            task = tasks[index]
            if task.get("n") != 1 or task.get("errored", 0) or task.get("scored") != 1:
                return None
            side.append(bool(task.get("passed")))
    _, low, high = paired_difference_interval(outcomes[0], outcomes[1])
    return [low, high]


def comparison_warnings(
    base: dict[str, Any], other: dict[str, Any], base_tasks: set[int], other_tasks: set[int]
) -> list[str]:
    """Why the two runs may not be comparable: another env, env version, split or task set."""
    warnings = []
    if base.get("envSlug") != other.get("envSlug"):
        warnings.append(
            f"the runs are of different environments ({base.get('envSlug')} vs "
            f"{other.get('envSlug')})"
        )
    elif base.get("envVersion") != other.get("envVersion") or (
        base.get("envHash") and other.get("envHash") and base["envHash"] != other["envHash"]
    ):
        warnings.append(
            f"the runs used different versions of {base.get('envSlug')} "
            f"(v{base.get('envVersion')} vs v{other.get('envVersion')}): tasks may differ"
        )
    if base.get("split") != other.get("split"):
        warnings.append(
            f"the runs are of different splits ({base.get('split') or 'all tasks'} vs "
            f"{other.get('split') or 'all tasks'})"
        )
    if base_tasks != other_tasks:
        only_b, only_o = sorted(base_tasks - other_tasks), sorted(other_tasks - base_tasks)
        warnings.append(
            f"the runs scored different task sets ({len(only_b)} only in base"
            f"{': ' + _indices(only_b) if only_b else ''}, {len(only_o)} only in other"
            f"{': ' + _indices(only_o) if only_o else ''})"
        )
    return warnings


def _indices(values: list[int], limit: int = 8) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (", ..." if len(values) > limit else "")
