"""Starting an env's episodes at plan time: the tools they offer, and the tasks that cannot start.

A plugin's own code runs when an episode starts (reset() with the task): one that raises there
fails each rollout of that task. `rollout plan`, `rollout push` and the registry's push start
every task's episode of a plugin env (milliseconds each, in a host kept warm) and refuse it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class StartCheck:
    """What starting a plugin env's episodes found: problems, and how many tasks it reached."""

    problems: list[str]
    checked: int
    total: int
    budget_s: float

    @property
    def warnings(self) -> list[str]:
        """One warning when the time ran out before every task's episode was started."""
        if self.checked >= self.total:
            return []
        left = self.total - self.checked
        return [
            f"tasks: started the episodes of {self.checked} of {self.total} tasks; the other "
            f"{left} were not checked: starting them ran past the {self.budget_s:g} s the "
            "check may take (the plugin's reset() is slow), so a task among them whose episode "
            "cannot start would error each of its rollouts"
        ]


def check_starts(spec: Any, budget_s: float | None = None) -> StartCheck:
    """Start each task's episode of a plugin env (for up to budget_s, START_CHECK_S by default):
    one problem per distinct reason at the first task it stops, and how many tasks were started.
    Any other template: nothing to start."""
    total = len(spec.tasks)
    budget = START_CHECK_S if budget_s is None else budget_s
    if spec.template != "plugin":
        return StartCheck([], total, total, budget)
    failed: dict[str, list[int]] = {}  # reason -> the tasks it stops
    deadline = time.monotonic() + budget
    checked = 0
    for index in range(total):
        # A plugin reading each task's input (int(task["input"]["target"])) may fail only on
        # some: tasks[0] starting proves nothing about the others.
        failure = tools_of(spec, index)[1]
        checked += 1
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
    return StartCheck(problems, checked, total, budget)


def start_problems(spec: Any, budget_s: float | None = None) -> list[str]:
    """Why a plugin env's episodes cannot start (its own code would fail each of their rollouts);
    [] for any other template. `rollout plan` and `rollout push` say the same."""
    return check_starts(spec, budget_s).problems
