"""DAPO's dynamic sampling in the online job: flat groups are dropped and the step refilled."""

from __future__ import annotations

import pytest

from rollout.services.learner import online_jobs
from rollout.services.learner.online_jobs import OnlineJob, RoundRun, Timing


def _group(task: int, rewards: list[float]) -> dict:
    return {"task_index": task, "completions": [{"reward": r} for r in rewards]}


class _Options:
    tasks_per_step = 4


@pytest.mark.parametrize(("refills_needed", "expected_kept"), [(1, 4), (9, 1)])
async def test_flat_groups_are_dropped_and_refilled_up_to_a_bound(
    refills_needed: int, expected_kept: int
) -> None:
    job = object.__new__(OnlineJob)  # only the sampling logic: no broker, no learner
    job.options = _Options()
    job.timing = Timing()
    started: list[tuple[int, int, int]] = []

    async def start_run(step: int, attempt: int, tasks: list[int], count: int) -> RoundRun:
        started.append((step, attempt, count))
        return RoundRun(step, attempt, f"run-{attempt}")

    async def collect(run: RoundRun) -> list[dict]:
        # Each refill brings one group with a signal and one without, until refills_needed.
        n = len(started)
        if n < refills_needed:
            return [_group(10 + n, [1.0, 1.0])]
        return [_group(20 + n, [0.0, 1.0]), _group(30 + n, [0.5, 0.5])]

    job._start_run = start_run  # type: ignore[method-assign]
    job._collect = collect  # type: ignore[method-assign]
    first = [_group(0, [1.0, 0.0]), _group(1, [0.0, 0.0]), _group(2, [1.0, 1.0])]
    kept = await job._refilled(RoundRun(3, 0, "run-0"), first, list(range(12)))

    assert all(len({c["reward"] for c in g["completions"]}) > 1 for g in kept)
    assert len(kept) == expected_kept
    # Refills ask for exactly the groups still missing, under their own request ids.
    assert started[0] == (3, online_jobs.REFILL_ATTEMPT, 3)
    assert len({a for _, a, _ in started}) == len(started) <= online_jobs.MAX_REFILLS
    assert job.timing.refills == len(started)
    assert job.timing.flat_dropped == job.timing.flat_dropped_total >= 2
