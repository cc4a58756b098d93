"""What a run request may ask for, whatever its environment: checked by the tracker before it
plans a run, and by the CLI before it writes or pushes anything for one."""

from __future__ import annotations

import math

from rollout.shared.contracts.requests import CreateRun

# Rollouts per task, and rollouts per work item.
MAX_N = 10_000
MAX_BATCH = 1_024


def option_problems(cmd: CreateRun) -> list[str]:
    """Every option of `cmd` out of range, by field (the environment is not consulted)."""
    problems: list[str] = []
    if cmd.n < 1 or cmd.n > MAX_N:
        problems.append(f"n: must be between 1 and {MAX_N}, got {cmd.n}")
    if not 1 <= cmd.batch_size <= MAX_BATCH:
        problems.append(f"batch_size: must be between 1 and {MAX_BATCH}, got {cmd.batch_size}")
    if cmd.max_tool_calls < 0:
        problems.append(f"max_tool_calls: must be >= 0, got {cmd.max_tool_calls}")
    if not 0 <= cmd.temperature <= 2:  # false for NaN too
        problems.append(f"temperature: must be between 0 and 2, got {cmd.temperature}")
    if not (math.isfinite(cmd.deadline_s) and cmd.deadline_s > 0):
        problems.append(f"deadline_s: must be a positive number of seconds, got {cmd.deadline_s}")
    # Postgres text cannot hold NUL: such a run would be appended and then never projected.
    for field in ("name", "split", "parent_run_id", "model"):
        value = getattr(cmd, field)
        if isinstance(value, str) and "\x00" in value:
            problems.append(f"{field}: must not contain NUL characters")
    return problems
