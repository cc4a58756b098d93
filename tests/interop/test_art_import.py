"""ART trajectories into the buffer as an imported run (real NATS, Postgres, tracker, verifier,
buffer and learner; openpipe-art's own classes): checked row by row, recorded through the
tracker's event-sourced path, shown as a completed run, trained on by run id, exactly once."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from buffer.buffer_kit import ask
from openai.types.chat.chat_completion import Choice
from pipeline.kit import Platform, refund_env, wait_for_platform
from waiting import wait_until

from rollout.cli import main
from rollout.client import AsyncClient
from rollout.comparison import comparison
from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.buffer import GrpoGroupsQuery, SftSetQuery
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.requests import ImportedRollout, ImportRun
from rollout.shared.interop.art import art, import_request, import_run, write_groups
from rollout.shared.settings import Settings


def _choice(content: str, tokens: list[int]) -> Choice:
    return Choice.model_validate(
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": content},
            "logprobs": {
                "content": [
                    {"token": f"token_id:{t}", "logprob": -0.5, "top_logprobs": []} for t in tokens
                ]
            },
        }
    )


def _groups() -> list[Any]:
    """Two tasks of the refund env, two samples each: one good (reward 1), one not."""
    groups = []
    for task in (1, 2):
        prompt = f"Refund order O-{task} in full"
        samples = [(f"refunded O-{task}", 1.0, [5, 6]), ("I cannot help", 0.0, [7])]
        groups.append(
            art.TrajectoryGroup(
                [
                    art.Trajectory(
                        messages_and_choices=[
                            {"role": "user", "content": prompt},
                            _choice(text, tokens),
                        ],
                        reward=reward,
                        metrics={"passed": reward == 1.0},
                    )
                    for text, reward, tokens in samples
                ],
                metadata={"task_index": task},
            )
        )
    return groups


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    from rollout.shared.models.tiny import build_tiny_model

    return build_tiny_model(
        tmp_path / "tiny", corpus=["Refund order O-1 in full", "refunded O-1"], seed=0
    )


@pytest.fixture
async def client(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[AsyncClient]:
    monkeypatch.setenv("ROLLOUT_HOME", str(settings.home))
    monkeypatch.delenv("ROLLOUT_OBJECT_STORE_URL", raising=False)
    monkeypatch.setenv("ROLLOUT_HF_THREADS", "1")
    platform = Platform(settings)
    for name in ("env-registry", "tracker", "verifier", "buffer", "learner"):
        platform.start(name)
    c = AsyncClient(settings, timeout_s=20)
    await wait_for_platform(c, platform)
    yield c
    await c.close()
    platform.check()
    await platform.stop_all()


async def _events(client: AsyncClient, run_id: str, name: str) -> list[EventEnvelope]:
    js = await client.jetstream()
    subject = subjects.event("run", run_id, subjects.event_name(name))
    out = []
    async for msg in read_events(js, [subject]):
        out.append(EventEnvelope.from_bytes(msg.data))
    return out


async def test_art_groups_import_as_a_completed_run_the_buffer_and_learner_use_exactly_once(
    client, settings, tmp_path, tiny_model
) -> None:
    await client.push_environment(refund_env(tasks=3))
    path = write_groups(_groups(), tmp_path / "groups.jsonl")

    # One bad trajectory at the end of a file: refused by where it is, nothing recorded.
    bad = tmp_path / "bad.jsonl"
    lines = path.read_text().splitlines()
    last = json.loads(lines[-1])
    last["trajectories"][-1]["smuggled"] = {"payload": "x"}
    bad.write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    with pytest.raises(RolloutError, match=r"bad.jsonl:2: group 1 trajectory 1: field 'smuggled'"):
        await import_run(client, bad, "refunds")
    assert await client.list_runs() == []

    result = await import_run(client, path, "refunds", name="from ART")
    run_id = result["runId"]
    assert result["duplicate"] is False and result["rollouts"] == 4
    done = await client.wait_for_run(run_id, timeout_s=60)
    assert done["status"] == "completed", done
    assert (done["total"], done["passed"]) == (4, 2)
    # The importer's user is the run's owner.
    assert done["owner"] == subjects.caller_token(client.settings.nats_user)
    assert [r["runId"] for r in await client.list_runs()] == [run_id]  # `rollout runs`
    rollouts = await client.get_rollouts(run_id)
    assert sorted((r["taskIndex"], r["sampleIndex"], r["score"]) for r in rollouts) == [
        (1, 0, 1.0), (1, 1, 0.0), (2, 0, 1.0), (2, 1, 0.0)
    ]  # fmt: skip
    assert {p["type"] for r in rollouts for p in r["primitives"]} == {"imported"}
    # `rollout compare`: per task, as for any run of the env.
    compared = comparison(done, await client.get_run(run_id))
    assert [(t["taskIndex"], t["basePassRate"]) for t in compared["tasks"]] == [(1, 0.5), (2, 0.5)]
    assert compared["deltaPassRate"] == 0.0
    # Its rewards were ART's, never verified here: said wherever it is compared.
    assert done["source"] == "art"
    assert compared["warnings"] == [
        f"run {run_id}'s rewards were imported from art (recorded there, not verified here); "
        f"`rollout replay {run_id} --reverify` re-scores them with the env's verifier"
    ]

    # The buffer holds them, with ART's sampled tokens, for SFT and GRPO alike.
    async def buffered() -> bool:
        try:
            found = await ask(settings, "sft_set", SftSetQuery(run_id=run_id))
        except RolloutError:  # the buffer has not applied the run's events yet
            return False
        return found.count == 2

    await wait_until(buffered, "the buffer to hold the imported run")
    sft = await ask(settings, "sft_set", SftSetQuery(run_id=run_id))
    assert sorted(i["messages"][-1]["content"] for i in sft.items) == [
        "refunded O-1",
        "refunded O-2",
    ]
    assert all(i["tools"] for i in sft.items)  # the env's tools for the task, as for any run
    grpo = await ask(settings, "grpo_groups", GrpoGroupsQuery(run_ids=[run_id]))
    assert grpo.count == 2
    for group in grpo.items:
        assert [c["reward"] for c in group["completions"]] == [1.0, 0.0]
        assert [c["token_ids"] for c in group["completions"]] == [[[5, 6]], [[7]]]

    # `rollout improve --run IMPORTED`: the learner trains on the buffer's imported rows.
    jobs = []
    for method, extra in (("sft", {}), ("dpo", {"min_margin": 0.5})):
        job = await client.create_training_job(
            base_model=f"hf:{tiny_model}",
            method=method,
            source_run_id=run_id,
            hyperparams={"max_steps": 1, "save_every": 1, "batch_size": 2, **extra},
        )
        jobs.append(job)
    assert jobs[0]["trainingRows"] == 2 and jobs[1]["pairs"] == 2

    async def trained() -> bool:
        try:
            states = [(await client.get_training_job(j["id"]))["status"] for j in jobs]
        except RolloutError:  # the tracker has not projected the job yet
            return False
        assert "failed" not in states, states
        return states == ["completed", "completed"]

    await wait_until(trained, "the SFT and DPO jobs on the imported run", limit_s=240)

    # The verifier left the imported rollouts alone: one verdict batch, the import's.
    js = await client.jetstream()

    async def verifier_idle() -> bool:
        info = await js.consumer_info(subjects.EVENTS_STREAM, "verifier")
        return info.num_pending == 0 and info.num_ack_pending == 0

    await wait_until(verifier_idle, "the verifier to go through the imported batch")
    assert len(await _events(client, run_id, "rollout.scored")) == 1

    # Exactly once: the same file again names the same run and appends nothing.
    again = await import_run(client, path, "refunds", name="from ART")
    assert (again["runId"], again["duplicate"]) == (run_id, True)
    for name in ("run.requested", "run.started", "rollout.generated", "rollout.scored"):
        assert len(await _events(client, run_id, name)) == 1, name
    assert len(await client.get_rollouts(run_id)) == 4

    # The tracker checks again what a client could send past the bridge.
    stray = ImportRun(
        env_slug="refunds",
        rollouts=[
            ImportedRollout(
                task_index=7, sample_index=0, trajectory={"messages": []}, score=1, passed=True
            )
        ],
    )
    with pytest.raises(RolloutError) as refused:
        await client.import_run(stray)
    assert "rollouts[0].task_index: 7 is not a task of 'refunds'" in str(refused.value)


def _file(tmp_path: Path, mutate: Any) -> Path:
    path = write_groups(_groups(), tmp_path / "in.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    mutate(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda rows: rows[0]["trajectories"][0].update(smuggled=[1, 2]),
            r"in.jsonl:1: group 0 trajectory 0: field 'smuggled' is not an ART Trajectory",
        ),
        (
            lambda rows: rows[1].update(payload="x"),
            r"in.jsonl:2: group 1: field 'payload' is not an ART TrajectoryGroup field",
        ),
        (
            lambda rows: rows[0]["trajectories"][1]["messages_and_choices"][0].update(
                content=[{"type": "text", "text": "hi"}]
            ),
            r"group 0 trajectory 1.messages_and_choices\[0\].content: must be a string, got list",
        ),
        (
            lambda rows: rows[0]["trajectories"][0]["messages_and_choices"][0].update(smuggled="x"),
            r"messages_and_choices\[0\]: field 'smuggled' is not a chat message field",
        ),
        (
            lambda rows: rows[1]["trajectories"][0].update(reward=1.5),
            r"group 1 trajectory 0.reward: 1.5 is not a score in \[0, 1\]",
        ),
        (
            lambda rows: rows[1]["trajectories"][1].update(reward=math.nan),
            r"group 1 trajectory 1.reward: nan is not a score",
        ),
        (
            lambda rows: rows[0]["trajectories"][0]["messages_and_choices"][0].update(
                content="x" * (1024 * 1024 + 1)
            ),
            r"group 0 trajectory 0: \d+ bytes, over the 1048576 bytes one may hold",
        ),
        (
            lambda rows: rows[1]["metadata"].update(task_index=9),
            r"group 1: task 9 is not a task of 'refunds' \(it has 3\)",
        ),
        (
            lambda rows: rows[0]["trajectories"][0]["metrics"].update(passed="yes"),
            r"trajectory 0.metrics.passed: must be true or false",
        ),
    ],
)
def test_hostile_art_files_are_refused_naming_where(tmp_path, mutate, expected) -> None:
    path = _file(tmp_path, mutate)
    with pytest.raises(RolloutError, match=expected):
        import_request(path, "refunds", task_count=3)


def test_art_models_in_memory_import_too_and_the_cli_refuses_before_connecting(
    tmp_path, capsys
) -> None:
    request = import_request(_groups(), "refunds", task_count=3)
    assert [(r.task_index, r.sample_index, r.passed) for r in request.rollouts] == [
        (1, 0, True), (1, 1, False), (2, 0, True), (2, 1, False)
    ]  # fmt: skip
    assert request.rollouts[0].trajectory["token_ids"] == [[5, 6]]
    path = _file(tmp_path, lambda rows: rows[0]["trajectories"][0].update(reward=-1))
    # No stack is running: the file's problem is what the user hears, not a connection error.
    assert main(["art", "import", str(path), "--env", "refunds"]) == 1
    assert "group 0 trajectory 0.reward: -1" in capsys.readouterr().err


async def test_hostile_imports_are_refused_and_stored_trajectories_are_the_checked_ones(
    client, settings, tmp_path
) -> None:
    from rollout.services.tracker.imports import MAX_PLANNED
    from rollout.shared.aggregates.run_options import MAX_N
    from rollout.shared.contracts.requests import MAX_IMPORTED_SAMPLES

    assert MAX_IMPORTED_SAMPLES == MAX_N  # an import's n fits where create_run's would
    await client.push_environment(refund_env(tasks=12))

    def rollout(task: int, sample: int, **trajectory: Any) -> ImportedRollout:
        # Built unchecked: what a runner key could send past the client's own checks.
        return ImportedRollout.model_construct(
            task_index=task,
            sample_index=sample,
            trajectory={"messages": [{"role": "user", "content": "hi"}], **trajectory},
            score=1.0,
            passed=True,
            reason="",
            model=None,
        )

    # A huge sample index would make run.requested.n overflow the read models' columns.
    huge = ImportRun.model_construct(
        env_slug="refunds", env_version=None, source="art", model="imported/art", name=None,
        rollouts=[rollout(0, 2**40)],
    )  # fmt: skip
    with pytest.raises(RolloutError) as refused:
        await client.import_run(huge)
    assert "sample_index" in str(refused.value) and "9999" in str(refused.value)
    # In bounds one by one, but n x tasks plans more slots than one run may hold.
    sparse = ImportRun(env_slug="refunds", rollouts=[rollout(t, MAX_N - 1) for t in range(12)])
    with pytest.raises(RolloutError) as refused:
        await client.import_run(sparse)
    assert f"over the {MAX_PLANNED} one run may plan" in str(refused.value)
    assert await client.list_runs() == []

    # Keys a Trajectory does not know are dropped before anything is stored.
    ok = ImportRun(env_slug="refunds", rollouts=[rollout(1, 0, smuggled={"payload": "x"})])
    run_id = (await client.import_run(ok))["runId"]
    done = await client.wait_for_run(run_id, timeout_s=60)  # the tracker is not stalled
    assert done["status"] == "completed", done
    (generated,) = await _events(client, run_id, "rollout.generated")
    # Stored once, in the object store: the event carries its claim check.
    (event_rollout,) = generated.payload["rollouts"]
    assert event_rollout["trajectory"] is None and len(event_rollout["trajectory_sha256"]) == 64
    full = await client.get_run(run_id, include_rollouts=True, include_trajectories=True)
    (stored,) = full["rollouts"]
    assert stored["trajectoryUri"] == event_rollout["trajectory_uri"]
    assert "smuggled" not in stored["trajectory"]
    assert stored["trajectory"]["messages"] == [{"role": "user", "content": "hi"}]
    (row,) = await client.get_rollouts(run_id)
    assert "smuggled" not in json.dumps(row)

    # Provenance: the buffer knows the run's rewards were imported, not verified here.
    from rollout.shared.contracts.buffer import RolloutsQuery
    from rollout.snapshots import export_buffer_rows, export_rows, lineage

    async def in_buffer() -> bool:
        try:
            found = await ask(settings, "rollouts", RolloutsQuery(run_ids=[run_id]))
        except RolloutError:  # the buffer has not applied the run's events yet
            return False
        return found.count == 1

    await wait_until(in_buffer, "the buffer to hold the imported run")
    # A broad `export --buffer` leaves imported runs out; --include-imported keeps them.
    with pytest.raises(RolloutError, match="the buffer holds no scored rollouts that match"):
        await export_buffer_rows(client, RolloutsQuery(env_slug="refunds"))
    rows, _ = await export_buffer_rows(client, RolloutsQuery(include_imported=True))
    assert [(r["run_id"], r["source"]) for r in rows] == [(run_id, "art")]
    assert lineage(rows)["sources"] == {"art": 1}
    # Named explicitly, an imported run is exported, its rows still saying where they came from.
    (named,) = (await export_buffer_rows(client, RolloutsQuery(run_ids=[run_id])))[0]
    assert named["source"] == "art"
    (row,) = await export_rows(client, run_ids=[run_id])
    assert row["source"] == "art" and lineage([row])["sources"] == {"art": 1}
    # `improve --dataset` reads the export back: its lineage still names the source.
    from rollout.shared.contracts.snapshot import lineage_of
    from rollout.snapshots import read_snapshot, write_snapshot

    back = read_snapshot(write_snapshot([row], tmp_path / "imported.jsonl", "jsonl"))
    assert [r.source for r in back] == ["art"] and lineage_of(back).sources == {"art": 1}


def test_include_imported_selects_from_the_buffer_only(tmp_path, capsys) -> None:
    out = str(tmp_path / "x.jsonl")
    assert main(["export", "--run", "r1", "--include-imported", "--out", out]) == 1
    assert "--include-imported: select from the buffer; add --buffer" in capsys.readouterr().err
