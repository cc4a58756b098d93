"""Starting an env's episodes at plan time: the tools they offer, and the tasks that cannot start.

A plugin's own code runs when an episode starts (reset() with the task): one that raises there
fails each rollout of that task. `rollout plan`, `rollout push` and the registry's push start
every task's episode of a plugin env (milliseconds each, in a host kept warm) and refuse it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rollout.shared.envs.runtimes import build_runtime
from rollout.shared.errors import RolloutError


def tools_of(spec: Any, index: int = 0) -> tuple[list[str], str | None]:
    """The tools of a task's episode (the first's by default), or why it could not start."""
    if not spec.tasks:
        return [], None
    runtime = None
    try:
        runtime = build_runtime(spec, index)
        return [t.name for t in runtime.tool_specs()], None
    except RolloutError as exc:
        return [], exc.message
    finally:
        if runtime is not None:  # a remote env's session, a plugin's host: give them back
            asyncio.run(runtime.close())


# Seconds `start_problems` spends starting a plugin's episodes (each start is a reset() in a
# host kept warm: milliseconds, unless the plugin's reset is slow).
START_CHECK_S = 20.0


def start_problems(spec: Any, budget_s: float = START_CHECK_S) -> list[str]:
    """Why a plugin env's episodes cannot start (its own code would fail each of their rollouts),
    one problem per distinct reason at the first task it stops; [] for any other template.
    `rollout plan` and `rollout push` say the same."""
    if spec.template != "plugin":
        return []
    failed: dict[str, list[int]] = {}  # reason -> the tasks it stops
    deadline = time.monotonic() + budget_s
    for index in range(len(spec.tasks)):
        # A plugin reading each task's input (int(task["input"]["target"])) may fail only on
        # some: tasks[0] starting proves nothing about the others.
        failure = tools_of(spec, index)[1]
        if failure is not None:
            failed.setdefault(failure, []).append(index)
        if time.monotonic() > deadline:
            break
    problems = []
    for reason, indices in failed.items():
        more = f" (also tasks {', '.join(map(str, indices[1:6]))}" if len(indices) > 1 else ""
        if more:
            more += f" and {len(indices) - 6} more)" if len(indices) > 6 else ")"
        problems.append(f"tasks[{indices[0]}]: the environment cannot start: {reason}{more}")
    return problems
