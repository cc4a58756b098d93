"""`rollout improve` refuses flags its method ignores or that contradict each other, naming the
flag, before a job exists; a job's lineage never names an env it did not train on."""

from __future__ import annotations

import json

from pipeline.kit import refund_env
from pipeline.test_cli_platform import rollout

from rollout.shared import subjects
from rollout.shared.bus.reader import read_events


async def job_events(client) -> list:
    """Every event on the job stream (none: no job was requested)."""
    return [
        m async for m in read_events(await client.jetstream(), subjects.aggregate_events("job"))
    ]


async def test_improve_refuses_what_it_would_ignore_or_record_falsely(
    client, agent_server, settings, tmp_path
) -> None:
    await client.push_environment(refund_env(tasks=2))
    await client.push_environment(refund_env(tasks=1, slug="other-env"))
    run = await client.create_run("refunds", f"{agent_server.base_url}#m", n=1)
    run = await client.wait_for_run(run["runId"], timeout_s=120)
    run_id, base = run["runId"], "local/tiny-agent"

    cases = [
        # An offline job trains on the run's env: --env naming another would be false lineage.
        (["--run", run_id, "--env", "other-env", "--method", "sft"],
         f"error: --env other-env: run {run_id} is of refunds"),
        # Online methods sample their own rollouts: a --run would be ignored, yet recorded.
        (["--env", "refunds", "--run", run_id, "--method", "grpo", "--steps", "1"],
         "error: --run: --method grpo trains online on --env"),
        (["--run", run_id, "--lora", "--full-finetune"],
         "error: --lora and --full-finetune contradict each other"),
        (["--run", run_id, "--steps", "3", "--epochs", "2"],
         "error: --steps and --epochs contradict each other"),
        (["--run", run_id, "--group-size", "4"],
         "error: --group-size: --method sft trains offline"),
        (["--env", "refunds", "--method", "grpo", "--steps", "1", "--epochs", "2"],
         "error: --epochs: --method grpo trains online on --env; it has no epochs"),
        (["--run", "nope", "--env", "refunds"], "error: --run nope: no run 'nope'"),
        # Online jobs sample train tasks only: the flag was recorded in job.requested, unheeded.
        (["--env", "refunds", "--method", "grpo", "--steps", "1", "--include-held-out"],
         "error: --include-held-out: --method grpo trains online on --env's train tasks"),
        # JSON has no NaN or infinity (they reached the learner as null: "got None"), and the
        # learner reads at most 64-bit integers ("exceeded maximum size"): named by flag.
        (["--run", run_id, "--learning-rate", "nan"],
         "error: --learning-rate: must be a finite number, got nan"),
        (["--run", run_id, "--batch-size", str(10**20)],
         f"error: --batch-size: {10**20} is out of range (a 64-bit integer at most)"),
        (["--run", run_id, "--set", "max_steps=1e999"],
         "error: --set max_steps: must be a finite number, got inf"),
    ]  # fmt: skip
    for flags, message in cases:
        code, out, err = await rollout(settings, "improve", "--model", base, *flags)
        assert code == 1 and err.startswith(message), (flags, err)
        assert "Traceback" not in err
    # A dataset's rows name their env: --env may not name another.
    row = {
        "format": "rollout.snapshot/1", "rollout_id": "r1", "run_id": "run", "task_index": 0,
        "sample_index": 0, "model": "m", "policy_version": 0, "env_slug": "refunds",
        "env_version": 1, "env_hash": "h", "score": 1.0, "passed": True, "outcome": "passed",
        "primitives": "[]",
        "trajectory": json.dumps({"messages": [{"role": "user", "content": "hi"},
                                               {"role": "assistant", "content": "yo"}]}),
    }  # fmt: skip
    dataset = tmp_path / "snap.jsonl"
    dataset.write_text(json.dumps(row) + "\n")
    code, out, err = await rollout(
        settings, "improve", "--model", base, "--dataset", str(dataset), "--env", "other-env"
    )
    assert code == 1 and "env_slug (--env other-env): the dataset's rows ran on refunds" in err
    assert await job_events(client) == []

    # The same flags that agree get past every check to the learner (none runs here).
    for flags in (["--run", run_id, "--env", "refunds"], ["--run", run_id, "--steps", "2"]):
        code, out, err = await rollout(settings, "improve", "--model", base, *flags)
        assert code == 1 and "no service answers" in err, (flags, err)
