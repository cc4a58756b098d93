"""A small run queued behind a big one: its latency, and the big run's rate, with and without
the tracker's run window (ROLLOUT_RUN_WINDOW), on the same servers in one process.

The services run as their own processes (as deployed) on a real nats-server and Postgres, with
pipeline.py's instant scripted model, so the numbers measure queueing, not a model. Each round
starts the services with one window, times a big run alone (its rollouts/s), then starts the
big run again (or `--big-runs` of them, one user's) and, at once, a small one (another user's
quick check), and times the small run from its request to its completion. Rounds alternate between "no window" (ROLLOUT_RUN_WINDOW=0,
first come first served, the behaviour before windows) and the window asked for (default 256
rollouts); the best of each is kept.

With `--cap N`, rounds alternate between no cap on one key's runs under way
(ROLLOUT_RUNS_PER_OWNER=0) and N, both with the window: one user starting many runs at once
(`--big-runs 512 --big 8`) against another's small run.

    python benchmarks/run_window.py [--big 2048] [--batch 1] [--window 256] [--repeat 2]
        [--big-runs 1] [--cap N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from contextlib import aclosing
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipeline import (  # noqa: E402 (the sibling benchmark's services and model)
    PROCESSES,
    TASKS,
    embedded_servers,
    env_spec,
    register_instant,
    service_process,
    stop_processes,
    tracebacks,
    wait_answering,
)

from rollout.client import AsyncClient  # noqa: E402
from rollout.services.tracker.runs import RUN_WINDOW_ENV, RUNS_PER_OWNER_ENV  # noqa: E402
from rollout.shared import subjects  # noqa: E402
from rollout.shared.bus.reader import read_events  # noqa: E402
from rollout.shared.contracts.envelope import EventEnvelope  # noqa: E402
from rollout.shared.observability import configure_logging  # noqa: E402
from rollout.shared.settings import Settings  # noqa: E402

MODEL = "bench-scripted:instant"
SMALL = 8  # one rollout per task, one work item


async def _run(
    client: AsyncClient, n: int, batch: int, owner: str | None = None
) -> tuple[str, float]:
    start = time.perf_counter()
    run = await client.create_run("bench-refunds", MODEL, n=n, batch_size=batch, owner=owner)
    return run["runId"], start


async def _started(
    client: AsyncClient, gate: asyncio.Semaphore, n: int, batch: int, owner: str
) -> str:
    async with gate:
        return (await _run(client, n, batch, owner))[0]


async def _finished(client: AsyncClient, run_id: str, rollouts: int) -> float:
    done = await client.wait_for_run(run_id, timeout_s=900)
    if done["scored"] != rollouts or done["passed"] != rollouts:
        raise RuntimeError(f"unexpected run result: {done}")
    return time.perf_counter()


async def _all_finished(client: AsyncClient, run_ids: list[str], rollouts: int) -> None:
    """Wait for many runs with one reader of the runs' endings (a reader per run would poll
    the events stream once per run)."""
    left = set(run_ids)
    js = await client.jetstream()
    endings = [subjects.event_filter("run", t) for t in ("run.completed", "run.failed")]
    reader = read_events(js, endings, follow=True)
    async with aclosing(reader) as events:
        async for msg in events:
            left.discard(EventEnvelope.from_bytes(msg.data).run_id or "")
            if not left:
                break
    for run_id in run_ids:
        done = await client.get_run(run_id)  # the read model may trail the ending a moment
        while done["status"] not in ("completed", "failed"):
            done = await client.get_run(run_id)
        if done["scored"] != rollouts or done["passed"] != rollouts:
            raise RuntimeError(f"unexpected run result: {done}")


async def one_round(
    settings: Settings, window: int, cap: int, big: int, batch: int, runs: int
) -> tuple[float, float]:
    """(the big run's rollouts/s alone, the small run's seconds behind `runs` big ones) with
    `window` and `cap`; the big runs are one user's (alice), the small one another's (bob)."""
    # The tracker process reads them at fan-out.
    os.environ[RUN_WINDOW_ENV], os.environ[RUNS_PER_OWNER_ENV] = str(window), str(cap)
    procs = {name: service_process(settings, name) for name in PROCESSES.values()}
    client = AsyncClient(settings)
    try:
        await wait_answering(client)
        await client.push_environment(env_spec())
        run_id, start = await _run(client, 1, 1)  # warm-up: caches, consumers, connections
        await _finished(client, run_id, TASKS)
        run_id, start = await _run(client, big // TASKS, batch)
        rate = big / (await _finished(client, run_id, big) - start)
        # Requested together (at most 64 requests in flight), as a script starting a sweep.
        gate = asyncio.Semaphore(64)
        big_ids = list(
            await asyncio.gather(
                *[_started(client, gate, big // TASKS, batch, "alice") for _ in range(runs)]
            )
        )
        small_id, small_start = await _run(client, SMALL // TASKS, SMALL, "bob")
        waited = await _finished(client, small_id, SMALL) - small_start
        await _all_finished(client, big_ids, big)
        return rate, waited
    finally:
        await client.close()
        stop_processes(list(procs.values()))


async def main(big: int, batch: int, window: int, repeat: int, runs: int, cap: int) -> None:
    configure_logging("bench", level="WARNING")
    register_instant()
    settings, nats_server, pg = embedded_servers("rollout-bench-window-")
    # (window, cap) of the baseline and of the setting compared with it.
    rounds = [(0, 0), (window, 0)] if not cap else [(window, 0), (window, cap)]
    best: dict[tuple[int, int], tuple[float, float]] = {}
    try:
        for _ in range(repeat):
            for w, c in rounds:  # alternating: a neighbour's burst lands on both sides
                rate, waited = await one_round(settings, w, c, big, batch, runs)
                old = best.get((w, c), (0.0, float("inf")))
                best[(w, c)] = (max(old[0], rate), min(old[1], waited))
    finally:
        pg.stop()
        nats_server.stop()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"big run: {big} rollouts in items of {batch}; small run (another user's, behind"
        f" {runs} big run(s) of one user): {SMALL} rollouts in one item; instant scripted model;"
        f" {cores} cores; best of {repeat} rounds each"
    )
    print(f"{'window':>14} {'runs per key':>12} {'big run r/s':>12} {'small run waited s':>19}")
    for (w, c), (rate, waited) in best.items():
        label = "none (before)" if w == 0 else f"{w} rollouts"
        print(f"{label:>14} {c or 'no cap':>12} {rate:>12,.1f} {waited:>19.2f}")
    (base_rate, base_wait), (rate, wait) = best[rounds[0]], best[rounds[1]]
    what = "cap" if cap else "window"
    print(
        f"small run's wait, none / {what}: {base_wait / wait:.1f}x shorter; "
        f"big run's rate, {what} / none: {rate / base_rate:.2f}"
    )
    print(f"tracebacks in the service processes' logs: {tracebacks(settings.home)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", type=int, default=2048, help="the big run's rollouts (x8)")
    parser.add_argument("--batch", type=int, default=1, help="the big run's work-item size")
    parser.add_argument("--window", type=int, default=256, help="ROLLOUT_RUN_WINDOW to compare")
    parser.add_argument("--repeat", type=int, default=2, help="rounds per window (best kept)")
    parser.add_argument(
        "--big-runs", type=int, default=1, help="big runs one user starts before the small run"
    )
    parser.add_argument(
        "--cap", type=int, default=0, help="compare ROLLOUT_RUNS_PER_OWNER=N with no cap"
    )
    args = parser.parse_args()
    if args.big % TASKS or args.window < 1 or args.cap < 0:
        parser.error(f"--big must be a multiple of {TASKS}, --window at least 1, --cap >= 0")
    asyncio.run(main(args.big, args.batch, args.window, args.repeat, args.big_runs, args.cap))
