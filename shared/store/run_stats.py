"""Statistics of runs read from the rollouts read model, shared by the tracker and the viewer."""

from __future__ import annotations

import asyncpg

from rollout.shared.stats import design_effect


async def design_effects(conn: asyncpg.Connection, rows: list[asyncpg.Record]) -> dict[str, float]:
    """The design effect of each run with several samples per task, from its tasks' counts.

    A listing's pass rate gets the interval `rollout show` gives it, so it needs what show
    reads, each task's verdicts; one grouped query over the listed runs (on the rollouts'
    (run_id, task_index) index) rather than a read-model column kept per task. With one
    sample per task the effect is 1, so those runs are not read.
    """
    clustered = [r["run_id"] for r in rows if (r["n"] or 1) > 1]
    if not clustered:
        return {}
    counts: dict[str, list[tuple[int, int]]] = {}
    # Counted as `get_run`'s task table counts them: verdicts only (errored rollouts have none).
    for t in await conn.fetch(
        "select run_id, count(*) filter (where passed and status = 'scored') as passed,"
        " count(*) filter (where status = 'scored') as judged from rollouts"
        " where run_id = any($1::text[]) group by run_id, task_index",
        clustered,
    ):
        counts.setdefault(t["run_id"], []).append((t["passed"], t["judged"]))
    return {run_id: design_effect(tasks) for run_id, tasks in counts.items()}
