"""`rollout generate` never writes a row without its conversation: the trajectories the object
store does not give come from the tracker's read models at the end, and while a stalled
projector leaves them out their rows are not written, said by prompt, and the same command run
again writes them (real NATS, Postgres, tracker and registry; the test stands in for the actors
and the verifier by publishing their events)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pipeline.kit import wait_for_platform
from store.test_projection_lag import REFUSE_WRITES, stalls_in_a_second
from waiting import wait_until

from rollout import generate as generate_module
from rollout.cli import main as cli_main
from rollout.client import AsyncClient
from rollout.shared import stale
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import events as ev
from rollout.shared.contracts import new_id
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.objectstore.checksum import sha256_bytes
from rollout.shared.objectstore.claimcheck import content_key
from rollout.shared.settings import Settings
from rollout.shared.stack.serve import run_service
from rollout.shared.store.db import create_pool
from rollout.shared.store.trajectories import object_store

DEADLINE_S = 30.0


async def test_generate_writes_no_row_the_read_models_do_not_hold_and_a_rerun_resumes(
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
    # The read models are waited for 1 s, not 30: they stay stalled here.
    monkeypatch.setattr(generate_module, "READ_MODELS_WAIT_S", 1.0)
    # The trajectory is in the platform's store, which the tracker (started below) reads;
    # this generate's machine reaches another, empty one (as a laptop reaches no bucket).
    store = object_store(settings)
    trajectory = {
        "messages": [{"role": "user", "content": "say 7"}, {"role": "assistant", "content": "7"}],
        "final_output": "7",
    }
    data = json.dumps(trajectory).encode()
    claim = await store.put(content_key("trajectories", sha256_bytes(data)), data)
    await store.close()
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
    monkeypatch.setenv("ROLLOUT_OBJECT_STORE_URL", (tmp_path / "elsewhere").as_uri())
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
        generated = ev.RolloutsGenerated(run_id=run_id, work_item_id="w0", rollouts=[
            ev.GeneratedRollout(rollout_id=rollout_id, task_index=0, sample_index=0, model="m",
                                trajectory_uri=claim.uri, trajectory_sha256=claim.sha256),
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
        assert await asyncio.wait_for(generate, DEADLINE_S) == 1
        said = capsys.readouterr()
        result = json.loads(said.out)
        # No row with an empty conversation: none at all, and which prompt is missing.
        assert out.read_text() == "" and result["rows"] == 0, out.read_text()
        assert result["status"] == "completed" and result["readModels"]["stale"]
        assert [(m["id"], m["taskIndex"], m["prompt"]) for m in result["missing"]] == [
            ("0", 0, "say 7")
        ]
        assert "1 row(s) not written" in result["error"] and "within 1 s" in result["error"]
        assert result["problems"][0] == "0 (task 0, sample 0): 'say 7'"
        assert result["problems"][-1].startswith("run the same command again to resume")

        # The projector writes again and catches up: the same command writes the row, whole.
        await pool.execute("drop trigger refuse_writes on projection_tracking")

        async def caught_up() -> bool:
            run = await client.get_run(run_id, True, include_tasks=False)
            return [r["rolloutId"] for r in run["rollouts"]] == [rollout_id]

        await wait_until(caught_up, "the read models to hold the rollout", DEADLINE_S)
        assert await asyncio.to_thread(cli_main, argv) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["resumed"] and result["rows"] == 1 and result["missing"] == []
        [row] = [json.loads(line) for line in out.read_text().splitlines()]
        assert row["rollout_id"] == rollout_id and row["completion"] == "7"
        assert json.loads(row["messages"]) == trajectory["messages"]
    finally:
        if not generate.done():
            generate.cancel()
        await client.close()
        await pool.close()
        tracker.cancel()
        registry.cancel()
        await asyncio.gather(tracker, registry, return_exceptions=True)
