"""A job trained on a run leaves out the run's held-out tasks: a later test run measures tasks
the model never trained on. Choosing held-out rollouts by id is refused; the flag overrides."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from learner_kit import scripted_run
from pipeline.kit import refund_env

from rollout.cli import main
from rollout.errors import RolloutError
from rollout.shared.aggregates.run import rollout_id
from rollout.shared.contracts.buffer import RolloutsQuery
from rollout.snapshots import export_buffer_rows, write_snapshot

# A structlog console line: `2026-01-02 03:04:05 [info     ] ...`.
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")

SFT = {"max_steps": 1, "batch_size": 2}


async def test_held_out_tasks_are_left_out_of_training(
    client, agent_server, tiny_model: Path, learner_env
) -> None:
    # Every task, the held-out one (task 0, split test) included: the run a user makes first.
    # The scripted agent fails a sample whose seed is divisible by 4: six samples per task make
    # a task with no passing sample a 1-in-4096 chance.
    run = await scripted_run(client, agent_server, n=6, tasks=3, split=None)
    assert run["total"] == 18, run
    assert refund_env(tasks=3)["tasks"][0]["split"] == "test"
    passing = set(await client.passing_rollout_ids(run["runId"]))
    held_out = {rollout_id(run["runId"], 0, s) for s in range(6)}
    assert passing - held_out and passing & held_out, "both splits must have passing rollouts"
    base = f"hf:{tiny_model}"

    job = await client.create_training_job(
        base_model=base, method="sft", source_run_id=run["runId"], hyperparams=SFT
    )
    assert job["trainingRows"] == len(passing - held_out), job
    assert job["heldOutTasksExcluded"] == 1, job

    held = sorted(passing & held_out)[0]
    with pytest.raises(RolloutError) as caught:
        await client.create_training_job(
            base_model=base, method="sft", source_run_id=run["runId"], hyperparams=SFT,
            rollout_ids=[*sorted(passing - held_out), held],
        )  # fmt: skip
    assert str(caught.value).startswith(
        f"rollout_ids: 1 of the given rollouts are of held-out tasks (split test), e.g. {held}"
    ), caught.value
    assert "--include-held-out" in str(caught.value)

    both = await client.create_training_job(
        base_model=base, method="sft", source_run_id=run["runId"], hyperparams=SFT,
        include_held_out=True,
    )  # fmt: skip
    assert both["trainingRows"] == len(passing) and both["heldOutTasksExcluded"] == 0, both


async def test_a_run_of_held_out_tasks_alone_is_refused_for_training(
    client, agent_server, tiny_model: Path, learner_env
) -> None:
    run = await scripted_run(client, agent_server, n=8, tasks=3, split="test")
    assert await client.passing_rollout_ids(run["runId"]), "nothing would be left out"
    with pytest.raises(RolloutError) as caught:
        await client.create_training_job(
            base_model=f"hf:{tiny_model}", method="sft", source_run_id=run["runId"]
        )
    assert str(caught.value).startswith(
        f"run {run['runId']} has nothing to train on outside its held-out tasks (split test)"
    ), caught.value


async def test_a_dataset_snapshot_leaves_out_its_held_out_tasks_too(
    client,
    agent_server,
    tiny_model: Path,
    learner_env,
    tmp_path: Path,
    capsys,
    settings,
    monkeypatch,
) -> None:
    """An export of a run on every task carries the held-out task's rows; each row names its
    env version and task, so a job on the snapshot leaves them out as a job on the run does."""
    run = await scripted_run(client, agent_server, n=6, tasks=3, split=None)
    rows, skipped = await export_buffer_rows(client, RolloutsQuery(run_ids=[run["runId"]]))
    assert skipped == 0 and {r["task_index"] for r in rows} == {0, 1, 2}
    passing = {r["rollout_id"] for r in rows if r["outcome"] == "passed"}
    held_out = {r["rollout_id"] for r in rows if r["task_index"] == 0}
    assert passing - held_out and passing & held_out, "both splits must have passing rollouts"
    snapshot = write_snapshot(rows, tmp_path / "all.jsonl", "jsonl")
    base = f"hf:{tiny_model}"

    job = await client.create_training_job(
        base_model=base, method="sft", dataset=snapshot, hyperparams=SFT
    )
    assert job["trainingRows"] == len(passing - held_out), job
    assert job["heldOutTasksExcluded"] == 1, job
    both = await client.create_training_job(
        base_model=base, method="sft", dataset=snapshot, hyperparams=SFT, include_held_out=True
    )
    assert both["trainingRows"] == len(passing) and both["heldOutTasksExcluded"] == 0, both
    # The CLI names the dataset it left them out of (it said "run None" and "env None").
    for name, value in (
        ("ROLLOUT_HOME", str(settings.home)), ("ROLLOUT_NATS_URL", settings.nats_url),
        ("ROLLOUT_NATS_USER", settings.nats_user or ""),
        ("ROLLOUT_NATS_PASSWORD", settings.nats_password or ""),
    ):  # fmt: skip
        monkeypatch.setenv(name, value)
    args = ["improve", "--model", base, "--dataset", str(snapshot), "--steps", "1"]
    assert await asyncio.to_thread(main, args) == 0
    # The CLI's own lines: the in-process services' logs share stdout (the learner logs
    # `resumed_from=None` as it starts an earlier job).
    out = "\n".join(
        line for line in capsys.readouterr().out.splitlines() if not LOG_LINE.match(line)
    )
    assert f"left out 1 held-out task(s) of dataset {snapshot} (" in out, out
    assert f"of {base} on dataset {snapshot}\n" in out and "None" not in out, out

    only_test = write_snapshot(
        [r for r in rows if r["task_index"] == 0], tmp_path / "test.jsonl", "jsonl"
    )
    with pytest.raises(RolloutError) as caught:
        await client.create_training_job(
            base_model=base, method="sft", dataset=only_test, hyperparams=SFT
        )
    assert "has nothing to train on outside its held-out tasks (split test)" in str(caught.value), (
        caught.value
    )


async def test_ctrl_c_while_following_a_job_says_the_job_goes_on(
    client, agent_server, tiny_model: Path, learner_env, settings
) -> None:
    run = await scripted_run(client, agent_server, n=2, tasks=3, split="train")
    env = {
        **os.environ,
        "ROLLOUT_HOME": str(settings.home),
        "ROLLOUT_NATS_URL": settings.nats_url,
        "ROLLOUT_NATS_USER": settings.nats_user or "",
        "ROLLOUT_NATS_PASSWORD": settings.nats_password or "",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rollout.cli", "improve", "--run", run["runId"], "--model",
        f"hf:{tiny_model}", "--steps", "100000", "--follow",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
    assert line.startswith("job job-"), line  # created, and followed from here
    job_id = line.split()[1].rstrip(":")
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 130
    text = err.decode()
    assert f"interrupted: job {job_id} goes on" in text and "Traceback" not in text, text
    assert f"`rollout cancel {job_id}` stops it" in text
    await client.cancel_training_job(job_id, "test over")
