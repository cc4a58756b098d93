"""`rollout cancel`: a run ends at once as cancelled, and its generation stops with it.

The model server (the one faked edge) holds every request while the run is cancelled: the
work items under way are stopped mid-rollout, the rest of the queue is skipped by the actors,
nothing is left queued, and the model is asked nothing more.
"""

from __future__ import annotations

import json
from typing import Any

from fakes.openai_server import FakeOpenAI
from pipeline.kit import refund_agent, refund_env
from pipeline.test_cli_platform import rollout
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.shared import subjects
from rollout.shared.auth.ownership import describe as describe_user
from rollout.shared.replay import replay_run
from rollout.shared.settings import Settings

TASKS, N, BATCH = 8, 4, 2  # 32 rollouts in 16 work items; two actors hold at most 8 at once


async def _run_if(client: AsyncClient, run_id: str, status: str) -> dict[str, Any] | None:
    """The run from the read model once it shows `status` (None before)."""
    run = await client.get_run(run_id)
    return run if run["status"] == status else None


async def test_a_cancelled_run_ends_now_and_its_queued_work_is_skipped(
    client: AsyncClient, settings: Settings
) -> None:
    await client.push_environment(refund_env(tasks=TASKS))
    js = await client.jetstream()

    async def queue() -> tuple[int, int]:
        info = await js.consumer_info(subjects.WORK_STREAM, "actors")
        return info.num_pending, info.num_ack_pending

    with FakeOpenAI(refund_agent) as server:
        server.hold()
        run = await client.create_run(
            "refunds", f"{server.base_url}#agent", n=N, batch_size=BATCH, temperature=0.0
        )
        run_id = run["runId"]

        async def actors_busy() -> bool:
            # Every work item the actors hold waits on the model with both of its rollouts.
            _, held = await queue()
            return held > 0 and len(server.held_ports) == BATCH * held

        await wait_until(actors_busy, "the actors holding work items at the model", 60)
        asked = len(server.chat_bodies)
        ended = await client.cancel_run(run_id, reason="wrong model")
        assert ended["status"] == "failed"
        assert ended["reason"] == f"cancelled: wrong model (0/{TASKS * N} rollouts scored)"

        async def drained() -> bool:
            return await queue() == (0, 0)

        # While the model still holds every answer: the items under way are stopped and every
        # other one is taken and skipped, none left queued.
        await wait_until(drained, "the run's work items all taken off the queue", 60)
        server.release()
        # Nothing asked the model again: no rollout went on to a second turn, none started.
        assert len(server.chat_bodies) == asked
        assert all(all(m["role"] != "assistant" for m in b["messages"]) for b in server.chat_bodies)

    # The cancel's answer comes once its event is on the log; the read model follows it.
    done = await wait_until(lambda: _run_if(client, run_id, "failed"), "the cancel projected", 30)
    assert done["status"] == "failed" and done["reason"] == ended["reason"], done
    assert done["generated"] == 0 and done["scored"] == 0, done
    replayed = await replay_run(js, run_id)
    assert not replayed.generated  # nothing of the cancelled run reached the log

    # A run that has ended cannot be cancelled again, nor can one that does not exist.
    code, out, err = await rollout(settings, "cancel", run_id)
    assert code == 1 and err.startswith(f"error: run {run_id} already failed (cancelled: wrong")
    # A reason is one printable line: it is shown to whoever reads the run.
    code, out, err = await rollout(settings, "cancel", "no-such-run", "--reason", "a\x1b[2Jb")
    assert code == 1 and "reason: must be one line, without control characters" in err, err
    code, out, err = await rollout(settings, "cancel", "no-such-run")
    assert code == 1 and err.startswith("error: run_id: no run 'no-such-run'"), err
    assert "Traceback" not in err


async def test_cancel_from_the_cli_and_a_completed_run_keeps_its_result(
    client: AsyncClient, agent_server: FakeOpenAI, settings: Settings
) -> None:
    await client.push_environment(refund_env(tasks=2))
    run = await client.create_run("refunds", f"{agent_server.base_url}#agent", n=1)
    done = await client.wait_for_run(run["runId"], timeout_s=120)
    code, out, err = await rollout(settings, "cancel", run["runId"], "--reason", "too late")
    assert code == 1 and err.startswith(f"error: run {run['runId']} already completed"), err
    assert (await client.get_run(run["runId"]))["status"] == done["status"] == "completed"

    with FakeOpenAI(refund_agent) as server:
        server.hold()  # nothing finishes before the cancel
        run = await client.create_run("refunds", f"{server.base_url}#agent", n=2)
        # Compared before it scored anything: its "0%" is no rate, and no -100 point delta.
        await wait_until(lambda: bool(server.held_ports), "the actors asking the model", 60)
        code, out, err = await rollout(settings, "compare", done["runId"], run["runId"])
        assert code == 1 and "pass rate" not in out, out
        assert f"error: not comparable: other {run['runId']}: no rollout scored yet (it is " in err
        assert "0 of 4): wait for it to score some" in err and "Traceback" not in err
        code, out, err = await rollout(settings, "cancel", run["runId"], "--reason", "oops")
        assert code == 0, err
        assert out.splitlines()[0] == f"run {run['runId']} cancelled: oops (0/4 rollouts scored)"
        server.release()
    await wait_until(lambda: _run_if(client, run["runId"], "failed"), "the cancel projected", 30)
    # Cancelled before anything was scored, it never gets a rate, --allow-errored or not.
    for flags in ((), ("--allow-errored",)):
        code, out, err = await rollout(settings, "compare", done["runId"], run["runId"], *flags)
        assert code == 1 and "pass rate" not in out, out
        assert (
            f"error: not comparable: other {run['runId']}: no rollout was scored (it failed:"
            " cancelled: oops (0/4 rollouts scored))" in err
        ), err
    code, out, err = await rollout(settings, "compare", done["runId"], run["runId"], "--json")
    result = json.loads(out)
    assert (result["measured"], result["unscored"], result["deltaPassRate"]) == (
        False, ["other"], None,
    )  # fmt: skip
    assert (await client.get_run(run["runId"]))["status"] == "failed"
    # Listed as cancelled, not as a failure (`--json` keeps status failed, with the reason).
    code, out, err = await rollout(settings, "runs")
    [line] = [line for line in out.splitlines() if line.startswith(run["runId"])]
    assert line.split()[3] == "cancelled", line
    # ...with who started it; `--mine` lists it too (this test's user started it).
    assert line.endswith(f"  {describe_user(subjects.caller_token(settings.nats_user))}"), line
    code, out, err = await rollout(settings, "runs", "--mine")
    assert code == 0 and run["runId"] in out, (out, err)
