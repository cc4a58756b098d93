"""Time every page of `rollout ui` over a generated run of 10,000 rollouts (goal: < 300 ms each).

Rows are written straight into the tracker's read-model tables of a fresh database (two runs
of TASKS x SAMPLES rollouts, for the compare page), the first run's events and a training job's
progress go onto a real nats-server's events stream (the replay, provenance and training
pages read those), and the viewer answers over real HTTP from uvicorn. The baseline, measured
in the same process, is what a viewer without pagination would do: the tracker's own
`get_run` with every rollout and trajectory of the run.

    python benchmarks/ui.py [--tasks 500] [--samples 20] [--repeat 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from rollout.services.tracker.queries import get_run as tracker_get_run
from rollout.services.ui.app import create_app
from rollout.services.ui.auth import COOKIE
from rollout.services.ui.server import start_in_loop
from rollout.shared.auth.keys import KeyStore
from rollout.shared.auth.roles import Role
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import events as ev
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.requests import GetRun
from rollout.shared.observability import configure_logging
from rollout.shared.service.sockets import bind, url_of
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.nats import start_nats
from rollout.shared.stack.postgres import start_postgres
from rollout.shared.store.db import create_pool, migrate

GOAL_MS = 300.0
BATCH = 16
PRIMITIVES = ("refund_matches", "no_extra_refunds", "said_done")


def trajectory(task: int, sample: int) -> dict[str, Any]:
    """A refund episode of realistic size: four messages, two tool calls, token logprobs."""
    order = f"O-{task}"
    return {
        "messages": [
            {"role": "system", "content": "You are a support agent. " * 8},
            {"role": "user", "content": f"Refund order {order} in full"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {
                    "name": "lookup_order", "arguments": json.dumps({"order_id": order})}},
                {"id": "c2", "type": "function", "function": {
                    "name": "refund", "arguments": json.dumps({"order_id": order,
                                                               "amount": 10 * task})}}]},
            {"role": "tool", "content": json.dumps({"amount": 10 * task})},
            {"role": "tool", "content": "ok"},
            {"role": "assistant", "content": f"refunded {order}"},
        ],
        "tool_calls": [
            {"index": 0, "name": "lookup_order", "arguments": {"order_id": order},
             "result": {"amount": 10 * task}},
            {"index": 1, "name": "refund", "arguments": {"order_id": order, "amount": 10 * task},
             "result": "ok"},
        ],
        "final_output": f"refunded {order}",
        "final_state": {"refunds": [{"order_id": order, "amount": 10 * task}]},
        "finish_reason": "stop",
        "token_ids": [[100 + i for i in range(24)], [200 + i for i in range(6)]],
        "logprobs": [[-0.05 * (i % 7) for i in range(24)], [-0.3 * i for i in range(6)]],
    }  # fmt: skip


def verdict(task: int, sample: int, run_offset: int) -> tuple[float, bool, list[dict[str, Any]]]:
    """A deterministic mix of passes and failures (the second run fixes some tasks)."""
    ok = (task * 7 + sample * 3 + run_offset) % 5 != 0
    prims = [
        {"name": name, "type": "state_match", "weight": 1.0, "score": 1.0 if ok or i else 0.0,
         "passed": ok or i > 0, "reason": "" if ok or i else "refund amount differs"}
        for i, name in enumerate(PRIMITIVES)
    ]  # fmt: skip
    score = sum(p["score"] for p in prims) / len(prims)
    return score, ok, prims


async def seed_database(pool: Any, run_ids: list[str], tasks: int, samples: int) -> None:
    """Two runs of tasks x samples rollouts, a job with checkpoints and policy versions."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    async with pool.acquire() as conn:
        for offset, run_id in enumerate(run_ids):
            total = tasks * samples
            rows, passed, score_sum = [], 0, 0.0
            for t in range(tasks):
                for s in range(samples):
                    score, ok, prims = verdict(t, s, offset)
                    passed += ok
                    score_sum += score
                    rows.append((
                        f"{run_id}-{t}-{s}", run_id, t, s, "scored", "bench-model", 0,
                        t * 1000 + s, json.dumps(trajectory(t, s)), score, ok,
                        json.dumps(prims), start, start + timedelta(seconds=1),
                    ))  # fmt: skip
            await conn.copy_records_to_table(
                "rollouts",
                records=rows,
                columns=[
                    "rollout_id", "run_id", "task_index", "sample_index", "status", "model",
                    "policy_version", "seed", "trajectory", "score", "passed", "primitives",
                    "generated_at", "scored_at",
                ],
            )  # fmt: skip
            await conn.execute(
                "insert into runs(run_id, name, env_slug, env_version, env_hash, model, n,"
                " sampling, max_tool_calls, policy_version, status, total, generated, scored,"
                " passed, score_sum, created_at, started_at, finished_at, task_count)"
                " values ($1, $2, 'bench', 1, 'hash', 'bench-model', $3, '{}', 8, 0, 'completed',"
                " $4, $4, $4, $5, $6, $7, $7, $7, $8)",
                run_id, f"bench-{offset}", samples, total, passed, score_sum,
                start + timedelta(minutes=offset), tasks,
            )  # fmt: skip
        # The runs' env in the registry's read model: a `custom` one (the viewer reads those
        # envs' config and verifier to tell whether their verdicts judge anything), its spec as
        # large as its tasks make it.
        spec = {
            "slug": "bench", "name": "bench", "template": "custom", "config": {"tools": []},
            "tasks": [{"id": str(t), "instruction": f"Refund order O-{t} in full. " * 4,
                       "hiddenGroundTruth": {"answer": f"refunded O-{t}"}}
                      for t in range(tasks)],
            "verifier": {"primitives": [{"name": "answer", "type": "final_answer_match"}]},
        }  # fmt: skip
        await conn.execute(
            "insert into environments(slug, version, spec_hash, name, template, task_count,"
            " spec, registered_at) values ('bench', 1, 'hash', 'bench', 'custom', $1, $2::jsonb,"
            " $3)",
            tasks, json.dumps(spec), start,
        )  # fmt: skip
        # A history of other runs, so the runs list has pages to skip.
        await conn.executemany(
            "insert into runs(run_id, env_slug, env_version, env_hash, model, n, sampling,"
            " max_tool_calls, policy_version, status, total, scored, passed, created_at)"
            " values ($1, $2, 1, 'h', $3, 1, '{}', 4, 0, 'completed', 10, 10, 7, $4)",
            [(f"old-{i}", f"env-{i % 9}", f"model-{i % 5}", start - timedelta(minutes=i))
             for i in range(2000)],
        )  # fmt: skip
        await conn.execute(
            "insert into jobs(job_id, method, base_model, hyperparams, status, step, total_steps,"
            " loss, created_at, updated_at, model_id) values ('job-bench', 'grpo', 'tiny', '{}',"
            " 'completed', 1000, 1000, 0.1, $1, $1, 'tiny:bench')",
            start,
        )
        await conn.executemany(
            "insert into checkpoints(job_id, step, uri, sha256, size_bytes, saved_at)"
            " values ('job-bench', $1, $2, 'ab', 10, $3)",
            [(s, f"file:///ckpt/{s}", start) for s in range(100, 1001, 100)],
        )
        await conn.executemany(
            "insert into policies(model, version, checkpoint_uri, sha256, job_id, updated_at)"
            " values ('tiny:bench', $1, $2, 'ab', 'job-bench', $3)",
            [(v, f"file:///ckpt/{v * 100}", start) for v in range(1, 11)],
        )
        await conn.execute("analyze")


async def seed_events(settings: Settings, run_id: str, tasks: int, samples: int) -> None:
    """The first run's events and the job's 1,000 progress events, on the events stream."""
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        publisher = EventPublisher(js)

        def run_event(payload: Any, *parts: object) -> EventEnvelope:
            return EventEnvelope.new(payload, aggregate_id=run_id, id_parts=(run_id, *parts),
                                     run_id=run_id)  # fmt: skip

        envelopes = [run_event(ev.RunRequested(run_id=run_id, env_slug="bench", env_version=1,
                                               env_hash="hash", model="bench-model", n=samples))]  # fmt: skip
        keys = [(t, s) for t in range(tasks) for s in range(samples)]
        for i in range(0, len(keys), BATCH):
            chunk = keys[i : i + BATCH]
            item = f"w{i}"
            envelopes.append(run_event(ev.RolloutsGenerated(run_id=run_id, work_item_id=item, rollouts=[
                ev.GeneratedRollout(rollout_id=f"{run_id}-{t}-{s}", task_index=t, sample_index=s,
                                    trajectory=trajectory(t, s), model="bench-model",
                                    actor_id="bench-actor", env_hash="hash")
                for t, s in chunk]), "gen", item))  # fmt: skip
            envelopes.append(run_event(ev.RolloutsScored(run_id=run_id, work_item_id=item, rollouts=[
                ev.ScoredRollout(rollout_id=f"{run_id}-{t}-{s}", task_index=t, sample_index=s,
                                 score=verdict(t, s, 0)[0], passed=verdict(t, s, 0)[1])
                for t, s in chunk]), "score", item))  # fmt: skip
        for step in range(1, 1001):
            envelopes.append(EventEnvelope.new(ev.JobProgress(
                job_id="job-bench", step=step, total_steps=1000, loss=1 / step,
                reward=step / 1000, tokens_per_s=900.0 + step % 50),
                aggregate_id="job-bench", id_parts=("job-bench", step)))  # fmt: skip
        for i in range(0, len(envelopes), 256):
            await publisher.publish_batch(envelopes[i : i + 256])
    finally:
        await nc.close()


async def timed(http: httpx.AsyncClient, path: str, repeat: int) -> tuple[float, float, float, int]:
    """First, median and worst wall time in ms of GET `path`, and its size."""
    t0 = time.perf_counter()
    warm = await http.get(path)
    first = (time.perf_counter() - t0) * 1000
    if warm.status_code != 200:
        raise SystemExit(f"{path} answered {warm.status_code}: {warm.text[:300]}")
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        response = await http.get(path)
        times.append((time.perf_counter() - t0) * 1000)
        assert response.status_code == 200, path
    return first, statistics.median(times), max(times), len(warm.content)


async def main(tasks: int, samples: int, repeat: int) -> int:
    configure_logging("bench", level="WARNING")
    home = Path(tempfile.mkdtemp(prefix="rollout-bench-ui-"))
    nats_server = start_nats(home / "nats", port=0, monitor_port=0, attached=True)
    pg = start_postgres(home / "pg", port=0, attached=True, fast=True)
    settings = Settings(
        home=home, nats_url=nats_server.url, database_url=pg.dsn(),
        nats_user=nats_server.user, nats_password=nats_server.password,
    )  # fmt: skip
    runs = ["bench-a", "bench-b"]
    try:
        pool = await create_pool(pg.dsn())
        await migrate(pool)
        t0 = time.perf_counter()
        await seed_database(pool, runs, tasks, samples)
        await seed_events(settings, runs[0], tasks, samples)
        print(f"seeded {len(runs)} runs x {tasks * samples:,} rollouts"
              f" in {time.perf_counter() - t0:.1f}s")  # fmt: skip

        app = create_app(settings)
        sock = bind("127.0.0.1", 0)
        server, serving = await start_in_loop(app, sock)
        # A real viewer key and session, as logging in gives: the viewer refuses a cookie
        # whose session it did not open.
        _, key = KeyStore(nats_server.home).create(Role.VIEWER, "ui benchmark")
        nats_server.reload()
        auth = app.state.ui.auth
        viewer = auth.open_session(await auth.check_key(key.text), key.text)
        cookie = app.state.ui.signer.sign(viewer)
        last = f"{runs[0]}-{tasks - 1}-{samples - 1}"
        pages = {
            "runs": "/",
            "runs, filtered, page 3": "/?env=env-1&page=3",
            "run": f"/runs/{runs[0]}",
            "run, task page 5": f"/runs/{runs[0]}?page=5",
            "run, one task's samples": f"/runs/{runs[0]}?task={tasks // 2}",
            "trajectory": f"/rollouts/{last}",
            "trajectory provenance (event log)": f"/rollouts/{runs[0]}-0-0/provenance",
            "provenance of the last rollout": f"/rollouts/{last}/provenance",
            "compare": f"/compare?a={runs[0]}&b={runs[1]}",
            "compare, side by side": f"/compare?a={runs[0]}&b={runs[1]}&task=3&page=2",
            "training jobs": "/jobs",
            "training job (1,000 steps)": "/jobs/job-bench",
            "replay": f"/runs/{runs[0]}/replay",
            "replay, later page": f"/runs/{runs[0]}/replay?after=600",
        }
        results = {}
        async with httpx.AsyncClient(base_url=url_of(sock), cookies={COOKIE: cookie},
                                     timeout=60) as http:  # fmt: skip
            for name, path in pages.items():
                results[name] = await timed(http, path, repeat)
        # Baseline: the whole run at once, as an unpaginated viewer would read it.
        base = []
        for _ in range(3):
            t0 = time.perf_counter()
            whole = await tracker_get_run(
                pool, GetRun(run_id=runs[0], include_rollouts=True, include_trajectories=True)
            )
            base.append((time.perf_counter() - t0) * 1000)
        baseline = statistics.median(base)
        server.should_exit = True
        await serving
        await pool.close()
    finally:
        pg.stop()
        nats_server.stop()

    print(f"{tasks} tasks x {samples} samples = {tasks * samples:,} rollouts per run;"
          f" median of {repeat} (after a warm-up), over HTTP")  # fmt: skip
    print(f"baseline (tracker get_run, every rollout + trajectory, {len(whole['rollouts']):,}"
          f" rows): {baseline:,.1f} ms")  # fmt: skip
    print(
        f"{'page':<36} {'first ms':>9} {'median ms':>10} {'max ms':>8} {'KiB':>6}"
        f" {'vs baseline':>12} {'goal':>5}"
    )
    failed = 0
    for name, (first, median, worst, size) in results.items():
        ok = median < GOAL_MS
        failed += not ok
        print(f"{name:<36} {first:>9.1f} {median:>10.1f} {worst:>8.1f} {size / 1024:>6.0f}"
              f" {median / baseline:>12.3f} {'ok' if ok else 'SLOW':>5}")  # fmt: skip
    print(
        "first: the first request (cold caches: the job's curve and the run's provenance"
        " index are read from the events stream once per viewer process)"
    )
    print(f"{len(results) - failed}/{len(results)} pages under {GOAL_MS:.0f} ms")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    raise SystemExit(asyncio.run(main(args.tasks, args.samples, args.repeat)))
