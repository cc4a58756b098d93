"""Rollouts/s with one and with two tracker replicas, and how long a SIGKILLed leader's
failover takes.

Trackers run as their own processes (`rollout serve`, as a deployment runs them); the
registry, actors and verifier run in this process with the instant scripted model of
benchmarks/pipeline.py, on a real nats-server and Postgres. Runs alternate between one and
two trackers so both see the same machine load. Then, with two trackers, the leader is
SIGKILLed mid-run: the script reports when the standby held the lease, when the run's
scored count moved again, and that the run still completed with every rollout scored once.

    python benchmarks/tracker_replicas.py [--rollouts 256] [--batch 16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import nats.js.errors
from pipeline import TASKS, InstantAgent, embedded_servers, env_spec, through_platform

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.services.tracker.leader import LEASE_NAME, LEASE_TTL_ENV
from rollout.services.tracker.main import serve as serve_tracker_replica
from rollout.shared.bus.lease import BUCKET, DEFAULT_TTL_S, current_holder
from rollout.shared.models.catalog import register_backend
from rollout.shared.observability import configure_logging
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.process import die_with_parent

IN_PROCESS = {
    "env-registry": "rollout.services.env_registry.main",
    "actor": "rollout.services.actor.main",
    "verifier": "rollout.services.verifier.main",
}
# `rollout serve bench-tracker` runs the tracker with the scripted model's name accepted.
TRACKER_SERVICE = "bench-tracker"


def register_instant() -> None:
    """The scripted model's backend (run creation checks the model name's form)."""
    register_backend("bench-scripted:", lambda name: InstantAgent(), example="bench-scripted:x")


async def serve_tracker(settings: Settings) -> None:
    """A tracker replica for this benchmark (the entry `rollout serve` loads in a child)."""
    register_instant()
    await serve_tracker_replica(settings)


async def started(home: Path, name: str) -> bool:
    """True once tracker `name` is past its start-up (its log says it runs for the lease)."""
    path = home / f"{name}.log"
    return path.exists() and '"event": "tracker started"' in path.read_text(errors="replace")


def tracker_process(settings: Settings, home: Path, name: str) -> subprocess.Popen[bytes]:
    """One tracker replica as its own process."""
    here = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "ROLLOUT_HOME": str(home),
        "ROLLOUT_NATS_URL": settings.nats_url,
        "ROLLOUT_NATS_USER": settings.nats_user or "",
        "ROLLOUT_NATS_PASSWORD": settings.nats_password or "",
        "ROLLOUT_DATABASE_URL": settings.database_url or "",
        "ROLLOUT_EXTRA_SERVICES": f"{TRACKER_SERVICE}=tracker_replicas:serve_tracker",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(here), os.environ.get("PYTHONPATH")])),
        LEASE_TTL_ENV: str(DEFAULT_TTL_S),
    }
    log = (home / f"{name}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "rollout.cli", "serve", TRACKER_SERVICE, "--replica-id", name],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent,
    )


async def lease_holder(settings: Settings) -> str | None:
    """The tracker lease's holder now."""
    nc = await connect_nats(settings)
    try:
        try:
            kv = await nc.jetstream().key_value(BUCKET)
        except nats.js.errors.BucketNotFoundError:
            return None
        return await current_holder(kv, LEASE_NAME)
    finally:
        await nc.close()


async def until(predicate, limit_s: float, what: str) -> float:  # type: ignore[no-untyped-def]
    """Seconds until the async predicate holds (polled every 20 ms)."""
    start = time.perf_counter()
    while not await predicate():
        if time.perf_counter() - start > limit_s:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
    return time.perf_counter() - start


async def scored(client: AsyncClient, run_id: str) -> int:
    """The run's scored count (0 before the read model has it, or while nobody answers)."""
    try:
        return int((await client.get_run(run_id))["scored"])
    except RolloutError:
        return 0


async def failover(
    settings: Settings, client: AsyncClient, trackers: list[subprocess.Popen[bytes]], n: int
) -> dict[str, float]:
    """SIGKILL the leading tracker mid-run; time the takeover and the run's recovery."""
    rollouts = n * TASKS
    start = time.perf_counter()
    run = await client.create_run("bench-refunds", "bench-scripted:instant", n=n, batch_size=2)
    run_id = run["runId"]

    async def a_third() -> bool:
        return await scored(client, run_id) >= rollouts // 3

    await until(a_third, 120, "a third of the run scored")
    holder = await lease_holder(settings)
    assert holder is not None
    pid = int(holder.rsplit("-", 2)[1])
    victim = next(p for p in trackers if p.pid == pid)
    at_kill = await scored(client, run_id)
    victim.send_signal(signal.SIGKILL)
    killed = time.perf_counter()
    victim.wait()

    async def new_leader() -> bool:
        now = await lease_holder(settings)
        return now is not None and now != holder

    takeover = await until(new_leader, 30, "the standby to take the lease")

    async def moved() -> bool:
        return await scored(client, run_id) > at_kill

    resumed = await until(moved, 60, "the run to move after the failover") + takeover
    done = await client.wait_for_run(run_id, timeout_s=300)
    total = time.perf_counter() - start
    if (done["status"], done["scored"], done["total"]) != ("completed", rollouts, rollouts):
        raise RuntimeError(f"the run did not complete once per rollout: {done}")
    full = await client.get_run(run_id, include_rollouts=True)
    unique = len({(r["taskIndex"], r["sampleIndex"]) for r in full["rollouts"]})
    if unique != rollouts:
        raise RuntimeError(f"{unique} distinct rollouts, expected {rollouts}")
    return {
        "takeover_s": takeover,
        "resumed_s": resumed,
        "run_s": total,
        "after_kill_s": time.perf_counter() - killed,
        "rollouts": rollouts,
    }


async def main(rollouts: int, batch: int, repeats: int) -> None:
    configure_logging("bench", level="WARNING")
    register_instant()
    settings, nats_server, pg = embedded_servers("rollout-bench-replicas-")
    home = settings.home
    tasks = [
        asyncio.create_task(importlib.import_module(m).serve(settings)) for m in IN_PROCESS.values()
    ]
    trackers = [tracker_process(settings, home, "tracker-1")]
    names = iter(f"tracker-{i}" for i in range(2, 100))
    client = AsyncClient(settings)
    rates: dict[int, list[float]] = {1: [], 2: []}
    try:

        async def answering() -> bool:
            try:
                await client.list_runs()
                await client.list_environments()
            except RolloutError:
                return False
            return True

        await until(answering, 120, "the registry and the tracker")
        await client.push_environment(env_spec())
        await through_platform(client, TASKS, 1)  # warm-up: caches, consumers, connections
        for _ in range(repeats):
            rates[1].append(await through_platform(client, rollouts, batch))
            name = next(names)
            trackers.append(tracker_process(settings, home, name))
            await until(lambda name=name: started(home, name), 120, "the second tracker")
            rates[2].append(await through_platform(client, rollouts, batch))
            # Back to one: stop the standby (a clean stop; the leader goes on leading).
            leader = await lease_holder(settings)
            standby = next(p for p in trackers if leader and f"-{p.pid}-" not in leader)
            standby.terminate()
            standby.wait(timeout=30)
            trackers.remove(standby)
        name = next(names)
        trackers.append(tracker_process(settings, home, name))
        await until(lambda: started(home, name), 120, "the standby tracker")
        chaos = await failover(settings, client, trackers, n=max(rollouts // TASKS, 8))
    finally:
        await client.close()
        for p in trackers:
            if p.poll() is None:
                p.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=30)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, asyncpg.PostgresError):
                await t
        pg.stop()
        nats_server.stop()
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    print(
        f"rollouts per run: {rollouts} ({TASKS} tasks), batch {batch}, instant scripted model,"
        f" trackers as processes, {repeats} run(s) each, alternating"
    )
    print(f"{'trackers':>8} {'rollouts/s (median)':>20} {'runs':>30}")
    for count, values in rates.items():
        runs = " ".join(f"{v:.1f}" for v in values)
        print(f"{count:>8} {statistics.median(values):>20.1f} {runs:>30}")
    print(f"ratio 2 trackers / 1 tracker: {two / one:.3f}")
    print(
        f"failover (lease TTL {DEFAULT_TTL_S:g}s, SIGKILL of the leader a third into a run of"
        f" {chaos['rollouts']:.0f}): standby leads after {chaos['takeover_s']:.2f}s, the run's"
        f" scored count moves after {chaos['resumed_s']:.2f}s, run completed once per rollout"
        f" {chaos['after_kill_s']:.1f}s after the kill ({chaos['run_s']:.1f}s in all)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=256, help="a multiple of 8")
    parser.add_argument("--batch", type=int, default=16, help="rollouts per work item")
    parser.add_argument("--repeats", type=int, default=2, help="runs per tracker count")
    args = parser.parse_args()
    asyncio.run(main(args.rollouts, args.batch, args.repeats))
