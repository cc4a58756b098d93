"""What a run request may ask for, whatever its environment: checked by the tracker before it
plans a run, and by the CLI before it writes or pushes anything for one."""

from __future__ import annotations

import math

from rollout.shared.contracts.requests import CreateRun

# Rollouts per task, and rollouts per work item.
MAX_N = 10_000
MAX_BATCH = 1_024
# Rollouts in one run (tasks x n): past this a typo'd -n would queue hours of work ahead of
# every later run; bigger sweeps are several runs.
MAX_ROLLOUTS = 100_000
# Tokens sampled per model turn (as an experiment plan allows).
MAX_TOKENS = 131_072
# Tool calls per episode (as a plan's run stage and a training config allow); the read model
# keeps it in an int column, where a larger number stopped the run's projection.
MAX_TOOL_CALLS = 1_024
# A run's deadline: 30 days. The tracker adds it to a timestamp in SQL, and a larger one would
# overflow that sum and break the deadline sweep for every run.
MAX_DEADLINE_S = 30 * 86_400.0
# A seed travels as a JSON number that the services read as a 64-bit integer.
SEED_RANGE = (-(2**63), 2**63 - 1)
# Versions are int columns.
MAX_VERSION = 2**31 - 1
# What a refused run request says, so a client can tell a refusal (no run exists) from a
# request whose answer was lost (the run may exist).
REFUSED = "invalid run request"


def option_problems(cmd: CreateRun) -> list[str]:
    """Every option of `cmd` out of range, by field (the environment is not consulted)."""
    problems: list[str] = []
    if cmd.n < 1 or cmd.n > MAX_N:
        problems.append(f"n: must be between 1 and {MAX_N}, got {cmd.n}")
    if not 1 <= cmd.batch_size <= MAX_BATCH:
        problems.append(f"batch_size: must be between 1 and {MAX_BATCH}, got {cmd.batch_size}")
    if not 1 <= cmd.max_tokens <= MAX_TOKENS:
        problems.append(f"max_tokens: must be between 1 and {MAX_TOKENS}, got {cmd.max_tokens}")
    if not 0 <= cmd.max_tool_calls <= MAX_TOOL_CALLS:
        problems.append(
            f"max_tool_calls: must be between 0 and {MAX_TOOL_CALLS}, got {cmd.max_tool_calls}"
        )
    if not 0 <= cmd.temperature <= 2:  # false for NaN too
        problems.append(f"temperature: must be between 0 and 2, got {cmd.temperature}")
    if not 0 < cmd.top_p <= 1:
        problems.append(f"top_p: must be over 0 and at most 1, got {cmd.top_p}")
    if not (math.isfinite(cmd.deadline_s) and 0 < cmd.deadline_s <= MAX_DEADLINE_S):
        problems.append(
            f"deadline_s: must be a positive number of seconds up to {MAX_DEADLINE_S:.0f}"
            f" (30 days), got {cmd.deadline_s}"
        )
    if cmd.seed is not None and not SEED_RANGE[0] <= cmd.seed <= SEED_RANGE[1]:
        problems.append(f"seed: must be a 64-bit integer (at most {SEED_RANGE[1]}), got {cmd.seed}")
    if cmd.env_version is not None and cmd.env_version > MAX_VERSION:
        problems.append(f"env_version: no environment has version {cmd.env_version}")
    # Postgres text cannot hold NUL: such a run would be appended and then never projected.
    for field in ("name", "split", "parent_run_id", "model"):
        value = getattr(cmd, field)
        if isinstance(value, str) and "\x00" in value:
            problems.append(f"{field}: must not contain NUL characters")
    return problems


def total_problem(tasks: int, n: int) -> str | None:
    """The run's size when it is over MAX_ROLLOUTS (tasks x n), else None."""
    total = tasks * n
    if total <= MAX_ROLLOUTS:
        return None
    return (
        f"n: {tasks} task(s) x {n} = {total:,} rollouts, over the {MAX_ROLLOUTS:,} one run may "
        "ask for; lower -n, pick a --split, or split the work into several runs"
    )
