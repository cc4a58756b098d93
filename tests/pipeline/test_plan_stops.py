"""A plan that must stop: Ctrl-C stops the runner at once (a re-run resumes it), and a stage
whose every rollout errored fails the plan with the first error instead of scoring 0%."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator

import pytest
from fakes.openai_server import FakeOpenAI, Reply
from kit import refund_agent
from test_cli_platform import rollout
from test_plan_pipeline import plan_text, refund_env_file
from waiting import wait_until

from rollout.plans import check_plan, load_plan_state
from rollout.services.tracker.servable import TIMEOUT_ENV
from rollout.shared.settings import Settings


class GatedAgent:
    """The scripted refund agent, holding every answer until `open()` (a stage that is still
    running when the test says so, however fast the machine)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.asked = threading.Event()

    def __call__(self, body: dict) -> Reply:
        self.asked.set()
        # Bounded: a test that fails before opening the gate must not hang the server.
        self.gate.wait(timeout=120)
        return refund_agent(body)

    def open(self) -> None:
        """Let every held and later request through."""
        self.gate.set()


@pytest.fixture
def gated() -> Iterator[tuple[GatedAgent, FakeOpenAI]]:
    agent = GatedAgent()
    with FakeOpenAI(agent) as server:
        try:
            yield agent, server
        finally:
            agent.open()


def cli_env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "ROLLOUT_HOME": str(settings.home),
        "ROLLOUT_NATS_URL": settings.nats_url,
        "ROLLOUT_NATS_USER": settings.nats_user or "",
        "ROLLOUT_NATS_PASSWORD": settings.nats_password or "",
    }


async def test_ctrl_c_stops_the_plan_at_once_and_a_rerun_resumes_it(
    client, gated, settings, tmp_path
) -> None:
    agent, server = gated
    refund_env_file(tmp_path, tasks=3)
    path = tmp_path / "plan.toml"
    path.write_text(plan_text(f"{server.base_url}#scripted"))
    check = await check_plan(path, client=client)
    assert check.ok, check.problems

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rollout.cli", "run", "--config", str(path),
        env=cli_env(settings), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:

        async def first_run() -> list[dict]:
            runs = await client.list_runs(100)
            # The run exists and its rollouts have reached the model: the stage is under way.
            return runs if runs and agent.asked.is_set() else []

        runs = await wait_until(first_run, "stage 1's run to start", 90)
        assert [r["name"] for r in runs] == ["scripted/baseline"]
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    out_text, err_text = out.decode(), err.decode()
    assert proc.returncode == 130, (out_text, err_text)
    assert "Traceback" not in err_text, err_text
    # It says what goes on without it, and how to resume.
    assert f"run {runs[0]['runId']} goes on in the services" in err_text, err_text
    assert f"rollout run --config {path}" in err_text, err_text

    # The stage's run is the services' business: it goes on and completes on its own.
    agent.open()
    baseline = runs[0]["runId"]
    done = await client.wait_for_run(baseline, timeout_s=90)
    assert done["status"] == "completed"
    # Nothing after the Ctrl-C started: no run for stage 2, no stage_started for it.
    assert [r["runId"] for r in await client.list_runs(100)] == [baseline]
    state = await load_plan_state(await client.jetstream(), check.plan_id)
    assert state.started == {"baseline"} and state.status == "running"

    # The same command again re-attaches to stage 1's run and completes the plan.
    code, out_text, err_text = await rollout(settings, "run", "--config", str(path), "--json")
    assert code == 0, (out_text, err_text)
    summary = json.loads(out_text)
    assert summary["status"] == "completed"
    assert summary["stages"][0]["outputs"]["runId"] == baseline
    runs = await client.list_runs(100)
    assert len(runs) == 2 and sorted(r["name"] for r in runs) == [
        "scripted/baseline",
        "scripted/heldout",
    ]


DEAD_PLAN = """
name = "dead-endpoint"
seed = 5
[envs.refunds]
file = "refunds_env.py"
[models]
agent = "{agent}"
# retries=0: the refused connection is the rollout's error at once, not after backoff.
down = "http://127.0.0.1:9/v1?retries=0#m"
[[stages]]
name = "baseline"
run = {{ env = "refunds", model = "agent", n = 1, split = "test", temperature = 0.0 }}
[[stages]]
name = "down"
evaluate = {{ env = "refunds", model = "down", n = 2, split = "test", temperature = 0.0 }}
[[stages]]
name = "delta"
compare = {{ base = "baseline", other = "down" }}
"""


async def run_dead_plan(settings, agent_server, tmp_path) -> dict:  # type: ignore[no-untyped-def]
    """The dead-endpoint plan run to its end (it fails): its JSON document."""
    refund_env_file(tmp_path, tasks=3)
    path = tmp_path / "plan.toml"
    path.write_text(DEAD_PLAN.format(agent=f"{agent_server.base_url}#scripted"))
    code, out, err = await rollout(settings, "run", "--config", str(path), "--json")
    assert code == 1, (out, err)
    done = json.loads(out)
    assert done["status"] == "failed"
    return done


async def test_a_stage_whose_every_rollout_errored_fails_the_plan_with_the_error(
    client, agent_server, settings, tmp_path, monkeypatch
) -> None:
    # The endpoint went down after its run was accepted: the actors' check at creation (see
    # the next test) is off, so the run starts and every rollout errors.
    monkeypatch.setenv(TIMEOUT_ENV, "0")
    done = await run_dead_plan(settings, agent_server, tmp_path)
    stages = {s["name"]: s for s in done["stages"]}
    assert stages["baseline"]["status"] == "completed"
    assert stages["baseline"]["outputs"]["errored"] == 0
    # The stage says why nothing was measured: the model server refused every connection.
    down = stages["down"]
    assert down["status"] == "failed", down
    assert "every rollout errored (2 of 2)" in down["reason"], down["reason"]
    assert "cannot reach http://127.0.0.1:9/v1" in down["reason"], down["reason"]
    assert done["reason"] == down["reason"]
    # The compare never ran against the dead endpoint's 0%.
    assert stages["delta"]["status"] == "pending"


async def test_a_stage_on_an_endpoint_that_is_down_fails_before_its_run_starts(
    client, agent_server, settings, tmp_path
) -> None:
    done = await run_dead_plan(settings, agent_server, tmp_path)
    stages = {s["name"]: s for s in done["stages"]}
    assert stages["baseline"]["status"] == "completed"
    down = stages["down"]
    assert down["status"] == "failed", down
    assert "the actors cannot generate with 'http://127.0.0.1:9/v1?retries=0#m'" in down["reason"]
    assert "cannot reach http://127.0.0.1:9/v1" in down["reason"], down["reason"]
    assert not down.get("outputs", {}).get("runId"), "no run was started on it"
    assert stages["delta"]["status"] == "pending"
