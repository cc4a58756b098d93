"""`rollout generate` says when the rows it read from the read models may be stale: the
trajectories the object store does not give come from the tracker at the end, and a stalled
projector leaves them out (real NATS, Postgres, tracker and registry; the test stands in for
the actors and the verifier by publishing their events)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pipeline.kit import wait_for_platform
from store.test_projection_lag import REFUSE_WRITES, stalls_in_a_second
from waiting import wait_until

from rollout.cli import main as cli_main
from rollout.client import AsyncClient
from rollout.shared import stale
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import events as ev
from rollout.shared.contracts import new_id
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.settings import Settings
from rollout.shared.stack.serve import run_service
from rollout.shared.store.db import create_pool

DEADLINE_S = 30.0


async def test_generate_notes_stale_read_models_where_it_read_trajectories_from_them(
    settings: Settings,
    nats_client,  # noqa: ANN001
    pg_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    stalls_in_a_second(monkeypatch, settings, pg_dsn)
    # Stale after 1 s, not 5 (the tracker runs in this process): a shorter test.
    monkeypatch.setattr(stale, "STALE_AFTER_S", 1.0)
    js = nats_client.jetstream()
    await ensure_streams(js)
    tracker = asyncio.create_task(run_service("tracker", settings, replica_id="t-1", interval=0.2))
    registry = asyncio.create_task(run_service("env-registry", settings, replica_id="r-1"))
    client = AsyncClient(settings)
    pool = await create_pool(pg_dsn)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "say 7", "answer": "7"}) + "\n")
    out = tmp_path / "rows.jsonl"
    argv = ["generate", "--prompts", str(prompts), "--model", "http://127.0.0.1:9/v1#m",
            "--out", str(out), "--json"]  # fmt: skip
    await wait_for_platform(client)
    generate = asyncio.create_task(asyncio.to_thread(cli_main, argv))
    try:
        found: dict[str, str] = {}

        async def run_recorded() -> bool:
            for task in (tracker, registry):
                if task.done():
                    task.result()
            assert not generate.done(), capsys.readouterr().err
            runs = await client.list_runs()
            found.update({"run": runs[0]["runId"]} if runs else {})
            return bool(runs)

        await wait_until(run_recorded, "the generate's run in the read models", DEADLINE_S)
        run_id = found["run"]
        # Postgres refuses the projection's writes: the rollout below is never applied.
        await pool.execute(REFUSE_WRITES)
        rollout_id = new_id()
        # Its trajectory's claim check names an object that is gone: generate asks the
        # tracker for it at the end, from the read models.
        gone = (settings.home / "objects").resolve().as_uri() + f"/trajectories/{'0' * 64}.json"
        generated = ev.RolloutsGenerated(run_id=run_id, work_item_id="w0", rollouts=[
            ev.GeneratedRollout(rollout_id=rollout_id, task_index=0, sample_index=0, model="m",
                                trajectory_uri=gone, trajectory_sha256="0" * 64),
        ])  # fmt: skip
        scored = ev.RolloutsScored(run_id=run_id, work_item_id="w0", rollouts=[
            ev.ScoredRollout(rollout_id=rollout_id, task_index=0, sample_index=0, score=1.0,
                             passed=True),
        ])  # fmt: skip
        await EventPublisher(js).publish_batch(
            [
                EventEnvelope.new(body, aggregate_id=run_id, id_parts=(run_id, name), run_id=run_id)
                for name, body in (("gen", generated), ("score", scored))
            ]
        )

        async def stalled() -> bool:
            return bool(((await client.get_run(run_id)).get("readModels") or {}).get("stale"))

        await wait_until(stalled, "the tracker's read models stale", DEADLINE_S, interval_s=0.1)
        capsys.readouterr()
        done = ev.RunCompleted(run_id=run_id, total=1, passed=1, pass_rate=1.0, mean_score=1.0)
        await EventPublisher(js).publish(
            EventEnvelope.new(done, aggregate_id=run_id, id_parts=(run_id, "done"), run_id=run_id)
        )
        assert await asyncio.wait_for(generate, DEADLINE_S) == 0
        said = capsys.readouterr()
        result = json.loads(said.out)
        assert result["status"] == "completed" and result["rows"] == 1
        assert result["readModels"]["stale"] and result["readModels"]["behind"] > 0
        # (The in-process tracker logs its failed writes on the same stderr.)
        notes = [line for line in said.err.splitlines() if line.startswith("note: the read")]
        assert len(notes) == 1 and "may be stale" in notes[0], said.err
    finally:
        if not generate.done():
            generate.cancel()
        await client.close()
        await pool.close()
        tracker.cancel()
        registry.cancel()
        await asyncio.gather(tracker, registry, return_exceptions=True)
