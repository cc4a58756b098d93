"""Two runs compared: pass-rate and score deltas with 95% intervals, per task, with warnings."""

from __future__ import annotations

from typing import Any

from pydantic.alias_generators import to_snake

from rollout.shared.stats import (
    design_effect,
    newcombe_interval,
    paired_difference_interval,
    wilson_interval,
)

_SUMMARY_KEYS = ("runId", "model", "envSlug", "envVersion", "split", "passRate", "meanScore",
                 "passed", "scored", "errored")  # fmt: skip
# Past this share of errored rollouts a run's pass rate measures its errors (a model server
# that is down, a mistyped name), not the model: compare refuses to call a delta a measurement.
MOSTLY_ERRORED = 0.5


def judged(run: dict[str, Any]) -> int:
    """Rollouts with a verdict (passed or failed): `scored` counts errored ones too."""
    return (run.get("scored") or 0) - (run.get("errored") or 0)


def error_summary(
    run: dict[str, Any], errored_rollouts: list[dict[str, Any]] | None = None
) -> dict[str, Any] | None:
    """Why the run's rollouts errored: per error kind a count and one message; None if none did.

    `errored_rollouts` are the run's errored rollouts (`Client.errored_rollouts`); without them
    only the counts are known. `complete` says whether every errored rollout was read.
    """
    errored = run.get("errored") or 0
    if not errored:
        return None
    ended = run.get("scored") or 0  # rollouts with an outcome, errored ones included
    rollouts = errored_rollouts or []
    kinds: dict[str, dict[str, Any]] = {}
    for r in rollouts:
        kind = r.get("errorKind") or "unknown"
        entry = kinds.setdefault(
            kind, {"kind": kind, "count": 0, "sample": r.get("error") or "(no message)"}
        )
        entry["count"] += 1
    first = rollouts[0] if rollouts else None
    return {
        "errored": errored,
        "outOf": ended,
        "allErrored": errored >= ended,
        "mostlyErrored": errored > MOSTLY_ERRORED * ended,
        "kinds": sorted(kinds.values(), key=lambda k: (-k["count"], k["kind"])),
        "firstError": None
        if first is None
        else {
            "rolloutId": first.get("rolloutId"),
            "taskIndex": first.get("taskIndex"),
            "kind": first.get("errorKind") or "unknown",
            "message": first.get("error") or "(no message)",
        },
        "complete": len(rollouts) >= errored,
    }


def first_line(text: str, limit: int = 200) -> str:
    """A message's first line, cut to `limit` characters (tracebacks stay readable)."""
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[: limit - 3] + "..."


def error_line(summary: dict[str, Any]) -> str:
    """`2 of 2 rollouts errored (model 2): cannot reach ...` for a warning or an error."""
    kinds = ", ".join(f"{k['kind']} {k['count']}" for k in summary["kinds"])
    first = summary.get("firstError")
    cause = f": {first_line(first['message'])}" if first else ""
    return (
        f"{summary['errored']} of {summary['outOf']} rollouts errored"
        f"{f' ({kinds})' if kinds else ''}{cause}"
    )


def comparison(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Headline and per-task deltas of OTHER against BASE, with 95% intervals and warnings.

    Pass-rate intervals are Wilson score intervals over the scored rollouts; the difference's
    is Newcombe's hybrid score interval (independent runs). With n > 1 samples per task, the
    samples of a task are not independent trials: the counts are divided by the run's design
    effect over its tasks (`designEffect`), so eight samples of a task the model always solves
    weigh about as one. When both
    runs scored one rollout of each of the same tasks of the same env version (two greedy
    evaluations of a test split), the tasks are pairs and the paired interval is given too.
    Errored rollouts have no verdict and are no trials: each side's errors are a warning, and
    `measured` is False when a side mostly errored (its pass rate then measures the errors).
    """
    tasks_b = {t["taskIndex"]: t for t in base.get("tasks", [])}
    tasks_o = {t["taskIndex"]: t for t in other.get("tasks", [])}
    rows = []
    for index in sorted(set(tasks_b) | set(tasks_o)):
        # A task whose every rollout errored has no verdict: its rate is unknown, not 0%.
        b, o = _judged_task(tasks_b.get(index)), _judged_task(tasks_o.get(index))
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

    effects = {"base": run_design_effect(base), "other": run_design_effect(other)}

    def trials(run: dict[str, Any], side: str) -> tuple[float, float]:
        # Over the verdicts, as the pass rate is (errored rollouts are no trials), and as many
        # independent trials as the task clustering leaves (`design_effect`).
        effect = effects[side] or 1.0
        return run["passed"] / effect, judged(run) / effect

    def summary(run: dict[str, Any], side: str) -> dict[str, Any]:
        out = {k: run.get(k) for k in _SUMMARY_KEYS}
        out["errored"] = out["errored"] or 0
        out["judged"] = judged(run)
        # None where the verdicts judged nothing (`noVerdict`: a prompts file without answers).
        counted = not run.get("noVerdict")
        out["passRateInterval"] = list(wilson_interval(*trials(run, side))) if counted else None
        out["designEffect"] = effects[side]
        out["errorSummary"] = run.get("errorSummary") or error_summary(run)
        return out

    delta = newcombe_interval(*trials(base, "base"), *trials(other, "other"))
    warnings = comparison_warnings(base, other, set(tasks_b), set(tasks_o))
    unclustered = [
        f"{side} {run.get('runId')}" for side, run in (("base", base), ("other", other))
        if effects[side] is None
    ]  # fmt: skip
    if unclustered:
        warnings.append(
            f"{' and '.join(unclustered)}: several samples per task, but not every task's "
            "counts were read, so the intervals count them as independent trials (too narrow)"
        )
    paired = _paired_interval(base, other, tasks_b, tasks_o, warnings)
    # After the pairing: other settings on the same tasks still make pairs; they only make
    # the delta a measure of model and settings together, which the reader must be told.
    warnings += settings_warnings(base, other)
    sides = {"base": summary(base, "base"), "other": summary(other, "other")}
    mostly, unscored = [], []
    for side, s in sides.items():
        run = base if side == "base" else other
        if run.get("noVerdict"):
            # Its verdicts judged nothing (a prompts file without answers): its 100% is no rate.
            unscored.append(side)
            s["noVerdict"] = run["noVerdict"]
            warnings.append(f"{side} {s['runId']}: {s['noVerdict']}")
        elif (errors := s["errorSummary"]) is not None:
            warnings.append(f"{side} {s['runId']}: {error_line(errors)}")
            if errors["mostlyErrored"]:
                mostly.append(side)
        elif s["judged"] <= 0:
            # Nothing scored yet, or cancelled first: its 0% is no rate (and no -100% delta).
            unscored.append(side)
            s["noVerdict"] = _unscored_line(run)
            warnings.append(f"{side} {s['runId']}: {s['noVerdict']}")
        elif (status := _under_way(run)) is not None:
            warnings.append(
                f"{side} {s['runId']} is still {status}: {s['judged']} of {run.get('total')} "
                "rollouts scored so far, so its numbers are partial"
            )
    # A side with no verdict has no pass rate, so there is no difference to give.
    known = not unscored and all(s["judged"] > 0 for s in sides.values())
    return {
        **sides,
        "deltaPassRate": other["passRate"] - base["passRate"] if known else None,
        "deltaPassRateInterval": list(delta) if known else None,
        "deltaPassRatePairedInterval": paired if known else None,
        "deltaScore": other["meanScore"] - base["meanScore"] if known else None,
        "confidence": 0.95,
        # False when a side's rollouts mostly errored (the delta would measure the errors) or
        # a side has no verdict at all.
        "measured": not mostly and not unscored,
        "mostlyErrored": mostly,
        "unscored": unscored,
        "warnings": warnings,
        "tasks": rows,
    }


def _under_way(run: dict[str, Any]) -> str | None:
    """`running`, `queued` or `waiting` for a run that has not ended; None once it has."""
    if run.get("waiting"):
        return "waiting"
    status = run.get("status")
    return status if status in ("queued", "running") else None


def _unscored_line(run: dict[str, Any]) -> str:
    """Why a run with no verdict has none: still to come, or it ended first."""
    total = run.get("total")
    if (status := _under_way(run)) is not None:
        return f"no rollout scored yet (it is {status}, 0 of {total}): wait for it to score some"
    reason = f": {first_line(run['reason'])}" if run.get("reason") else ""
    return f"no rollout was scored (it {run.get('status') or 'ended'}{reason})"


def pass_rate_interval(run: dict[str, Any]) -> list[float] | None:
    """The run's 95% Wilson interval over its verdicts, counted as `comparison` counts them."""
    if judged(run) <= 0:
        return None
    effect = run_design_effect(run) or 1.0
    return list(wilson_interval(run["passed"] / effect, judged(run) / effect))


def run_design_effect(run: dict[str, Any]) -> float | None:
    """The run's design effect over its tasks (shared.stats.design_effect); None when it has
    several samples per task but its task table is partial (not every task's counts known)."""
    tasks = run.get("tasks") or []
    if not tasks and run.get("designEffect") is not None:
        # A listed run (`rollout runs`): the tracker counted its tasks, as below.
        return float(run["designEffect"])
    if run.get("tasksCursor") is not None or not tasks:
        return None if (run.get("n") or 1) > 1 else 1.0
    counts = [
        (t.get("passed") or 0, (t.get("scored") or 0) - (t.get("errored") or 0)) for t in tasks
    ]
    return design_effect(counts)


def _judged_task(task: dict[str, Any] | None) -> dict[str, Any] | None:
    """The task row, or None when it has no verdict (every rollout of it errored)."""
    if task is None:
        return None
    errored, scored = task.get("errored") or 0, task.get("scored")
    if errored and scored is not None and errored >= scored:
        return None
    return task


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
    """Why the two runs may not be comparable: another env, env version, split or task set, or
    rewards imported rather than verified here."""
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
    sides = (base,) if base.get("runId") == other.get("runId") else (base, other)
    for side in sides:
        if side.get("source"):
            # An importer's rewards were decided elsewhere, by code this platform never ran.
            warnings.append(
                f"run {side.get('runId')}'s rewards were imported from {side['source']} (recorded "
                f"there, not verified here); `rollout replay {side.get('runId')} --reverify` "
                "re-scores them with the env's verifier"
            )
    return warnings


# How the settings warnings end: a delta between runs sampled differently measures both.
_SETTINGS_CAVEAT = "(the delta may come from the settings, not the model)"
# Sampling fields worth a warning; not the seed: another seed is another draw of the same
# sampling, which the intervals already allow for.
_SAMPLING_KEYS = ("temperature", "top_p", "max_tokens")


def settings_warnings(base: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """Why a delta may not be the model's: other sampling, max tool calls or budgets."""
    warnings = []
    sampling_b, sampling_o = base.get("sampling") or {}, other.get("sampling") or {}
    # A value one side does not report (an older run, a partial summary) is unknown, not
    # different: only values both runs carry are compared.
    diffs = [
        f"{key} {sampling_b[key]} vs {sampling_o[key]}"
        for key in _SAMPLING_KEYS
        if sampling_b.get(key) is not None
        and sampling_o.get(key) is not None
        and sampling_b[key] != sampling_o[key]
    ]
    if diffs:
        warnings.append(f"sampling differs: {', '.join(diffs)} {_SETTINGS_CAVEAT}")
    calls_b, calls_o = base.get("maxToolCalls"), other.get("maxToolCalls")
    if calls_b is not None and calls_o is not None and calls_b != calls_o:
        warnings.append(f"max tool calls differ: {calls_b} vs {calls_o} {_SETTINGS_CAVEAT}")
    # Budgets are a run's overrides (unset: the env's): compared only when both runs carry
    # them, since a summary without the key says nothing about what the run used.
    if "budgets" in base and "budgets" in other:
        budgets_b, budgets_o = _budgets(base["budgets"]), _budgets(other["budgets"])
        diffs = [
            f"{key} {budgets_b.get(key, 'env default')} vs {budgets_o.get(key, 'env default')}"
            for key in sorted(set(budgets_b) | set(budgets_o))
            if budgets_b.get(key) != budgets_o.get(key)
        ]
        if diffs:
            warnings.append(f"budgets differ: {', '.join(diffs)} {_SETTINGS_CAVEAT}")
    return warnings


def _budgets(value: dict[str, Any] | None) -> dict[str, Any]:
    """A run's budget overrides by snake_case name, unset ones left out."""
    return {to_snake(k): v for k, v in (value or {}).items() if v is not None}


def _indices(values: list[int], limit: int = 8) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (", ..." if len(values) > limit else "")
