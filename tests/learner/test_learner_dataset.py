"""`rollout improve --dataset`: a job that trains on an exported dataset snapshot, not a run.

A run's scored rollouts are exported from the buffer (as `rollout export --buffer` does), and
SFT, KTO and DPO jobs train the tiny model on that export through the real learner: weights
change, checkpoints and policy.updated as for --run jobs, and the job's events record the
dataset's hash and lineage. A bad dataset starts nothing; a SIGKILLed job resumes with no step
done twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest
from learner_kit import (
    Platform,
    job_events,
    kill,
    ready_client,
    scripted_run,
    shut_down,
    start_learner,
    wait_for_event,
)

from rollout.cli import main
from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.buffer import RolloutsQuery
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.snapshot import canonical_jsonl
from rollout.shared.learning.checkpoints import FINAL_MODEL, read_step_log
from rollout.snapshots import export_buffer_rows, read_snapshot, training_sets, write_snapshot

pytestmark = pytest.mark.slow


def _weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    [path] = list(model_dir.glob("*.safetensors"))
    return load_file(str(path))


def _changed(base: Path, trained: Path) -> bool:
    before, after = _weights(base), _weights(trained)
    shared = [k for k in before if k in after and before[k].shape == after[k].shape]
    assert shared, "no weights in common with the base"
    return any(not before[k].equal(after[k]) for k in shared)


async def _export(client, run_id: str, out: Path, fmt: str) -> Path:
    rows, skipped = await export_buffer_rows(client, RolloutsQuery(run_ids=[run_id]))
    assert skipped == 0 and rows
    return write_snapshot(rows, out, fmt)


async def test_dataset_jobs_train_checkpoint_publish_and_record_the_datasets_hash(
    client, agent_server, tiny_model: Path, learner_env, tmp_path: Path
) -> None:
    run = await scripted_run(client, agent_server, n=8, seed=7)
    dataset = await _export(client, run["runId"], tmp_path / "snap_hf", "hf")
    rows = read_snapshot(dataset)
    digest = hashlib.sha256(canonical_jsonl(rows)).hexdigest()
    expected = training_sets(rows, min_margin=0.5)
    passed = sum(r.outcome == "passed" for r in rows)
    assert 0 < passed < len(rows) == run["scored"] and expected["dpo"]
    js = await client.jetstream()
    for version, (method, extra) in enumerate(
        (("sft", {}), ("kto", {}), ("dpo", {"min_margin": 0.5})), start=1
    ):
        job = await client.create_training_job(
            base_model=f"hf:{tiny_model}", method=method, dataset=dataset, suffix=method,
            hyperparams={"max_steps": 2, "save_every": 2, "batch_size": 2} | extra,
        )  # fmt: skip
        assert job["sourceDataset"] == digest and job["sourceRunId"] is None
        # SFT: the passing rollouts; DPO: the pairs; KTO: every rollout, grouped by task.
        groups = len({r.task_index for r in rows})
        assert (
            job["trainingRows"]
            == {"sft": passed, "dpo": len(expected["dpo"]), "kto": groups}[method]
        ), method
        done = await wait_for_event(js, job["id"], "job.completed", limit_s=300)
        metrics = done.payload["metrics"]
        assert metrics["steps"] == 2 and math.isfinite(metrics["final_loss"]), method
        events = await job_events(js, job["id"])
        assert [e.payload["step"] for e in events if e.type == "job.progress"] == [1, 2]
        assert [e.payload["step"] for e in events if e.type == "checkpoint.saved"] == [2]
        requested = next(e for e in events if e.type == "job.requested")
        source = requested.payload["source_dataset"]
        assert source["sha256"] == digest and source["name"] == str(dataset)
        assert source["lineage"]["run_ids"] == [run["runId"]]
        assert source["lineage"]["env_hashes"] == [run["envHash"]]
        assert source["lineage"]["policy_versions"] == [0]
        assert source["lineage"]["rows"] == len(rows)
        assert source["lineage"]["outcomes"] == {"failed": len(rows) - passed, "passed": passed}
        final = learner_env.home / "learner" / "jobs" / job["id"] / FINAL_MODEL
        assert _changed(tiny_model, final), method
        policies = [
            EventEnvelope.from_bytes(m.data)
            async for m in read_events(js, subjects.aggregate_events("policy"))
        ]
        assert policies[-1].payload["model"] == f"hf:{tiny_model}:{method}", method
        assert len(policies) == version


async def test_a_bad_dataset_is_refused_by_file_row_and_field_and_starts_nothing(
    client, tiny_model: Path, learner_env, tmp_path: Path, capsys
) -> None:
    good = {
        "format": "rollout.snapshot/1", "rollout_id": "r1", "run_id": "run", "task_index": 0,
        "sample_index": 0, "model": "m", "policy_version": 0, "env_slug": "e",
        "env_version": 1, "env_hash": "h", "score": 1.0, "passed": True, "outcome": "passed",
        "primitives": "[]",
        "trajectory": json.dumps({"messages": [{"role": "user", "content": "hi"},
                                               {"role": "assistant", "content": "yo"}]}),
    }  # fmt: skip
    path = tmp_path / "bad.jsonl"
    cases = [
        ([good, {**good, "rollout_id": "r2", "score": "high"}], f"{path}:2", "score"),
        ([good, {**good, "rollout_id": "r2", "trajectory": "{}"}], f"{path}:2", "trajectory"),
        ([{**good, "outcome": "maybe"}], f"{path}:1", "outcome"),
    ]
    for rows, where, field in cases:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.raises(RolloutError) as info:
            await client.create_training_job(
                base_model=f"hf:{tiny_model}", method="sft", dataset=path
            )
        text = str(info.value)
        assert where in text and field in text, text
    with pytest.raises(RolloutError, match="no such file or folder"):
        await client.create_training_job(
            base_model=f"hf:{tiny_model}", method="sft", dataset=tmp_path / "ghost.jsonl"
        )
    # A dataset whose rows all passed has nothing for KTO: refused before a job exists.
    path.write_text(json.dumps(good) + "\n")
    with pytest.raises(RolloutError, match=r"dataset .*bad.jsonl.* nothing for KTO"):
        await client.create_training_job(base_model=f"hf:{tiny_model}", method="kto", dataset=path)
    # The CLI says the same, without a traceback; and a dataset with --run or online is refused.
    path.write_text(json.dumps({**good, "outcome": "maybe"}) + "\n")
    args = ["improve", "--model", f"hf:{tiny_model}", "--dataset", str(path)]
    assert await asyncio.to_thread(main, args) == 1
    err = capsys.readouterr().err
    assert f"{path}:1" in err and "outcome" in err and "Traceback" not in err
    assert await asyncio.to_thread(main, [*args, "--run", "r"]) == 1
    assert "--dataset: --run names a run" in capsys.readouterr().err
    assert await asyncio.to_thread(main, [*args, "--method", "grpo", "--env", "e"]) == 1
    assert "--dataset: --method grpo trains online" in capsys.readouterr().err
    assert await client.list_training_jobs() == []
    js = await client.jetstream()
    assert [m async for m in read_events(js, subjects.aggregate_events("job"))] == []


STEPS = 40


async def test_a_sigkilled_dataset_job_resumes_with_no_step_done_twice(
    learner_env, agent_server, tiny_model: Path, tmp_path: Path
) -> None:
    platform = Platform(learner_env)
    for name in ("env-registry", "tracker", "verifier", "actor", "buffer"):
        platform.start(name)
    log = tmp_path / "learner.log"
    learner = start_learner(learner_env, log, ROLLOUT_LEARNER_ACK_WAIT_S="3")
    client = await ready_client(learner_env, platform.check)
    try:
        run = await scripted_run(client, agent_server, n=4, seed=7)
        dataset = await _export(client, run["runId"], tmp_path / "snap.parquet", "parquet")
        job = await client.create_training_job(
            base_model=f"hf:{tiny_model}", method="sft", dataset=dataset,
            hyperparams={"max_steps": STEPS, "save_every": 5, "batch_size": 2,
                         "learning_rate": 1e-3},
        )  # fmt: skip
        # The job reads its dataset from the object store, not from the file given.
        dataset.unlink()
        js = await client.jetstream()
        first = await wait_for_event(js, job["id"], "checkpoint.saved", limit_s=180)
        await kill(learner)
        before = await job_events(js, job["id"])
        assert "job.completed" not in {e.type for e in before}, "finished before the kill"
        out_dir = learner_env.home / "learner" / "jobs" / job["id"]
        shutil.rmtree(out_dir)
        learner = start_learner(learner_env, log, ROLLOUT_LEARNER_ACK_WAIT_S="3")
        done = await wait_for_event(js, job["id"], "job.completed", limit_s=300)
        events = await job_events(js, job["id"])
    finally:
        await shut_down(learner, client, platform)
    metrics = done.payload["metrics"]
    assert metrics["steps"] == STEPS, log.read_text()[-3000:]
    resumed = int(metrics["resumed_from_step"])
    assert first.payload["step"] <= resumed < STEPS
    steps = [e.payload["step"] for e in events if e.type == "job.progress"]
    assert steps == sorted(set(steps)) and steps[-1] == STEPS
    saved = [e.payload["step"] for e in events if e.type == "checkpoint.saved"]
    assert len(saved) == len(set(saved)) and saved[-1] == STEPS
    logged = [entry["step"] for entry in read_step_log(out_dir)]
    assert logged == list(range(resumed + 1, STEPS + 1))
