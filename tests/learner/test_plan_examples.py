"""The shipped example plans run end to end through the services on CPU.

`distill-sft` runs with the session's tiny model standing in for its student. The online
examples (local-grpo, local-ppo, rlhf-rm-ppo) run on the real `local/tiny-agent`, as shipped:
GRPO skips a group whose samples all scored alike, and the built tiny agent's samples at
temperature 1.0 earn different partial credit from the env's weighted verifier, so its rounds
have groups to learn from. The agent is built once per code version (minutes) and kept in a
cache named by its content hash, so later sessions reuse it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from learner_kit import TESTS_DIR, job_events
from test_plan_training import cli

from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.learning import examples, tiny_agent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

EXAMPLES = TESTS_DIR.parent / "examples"
ONLINE = ("local-grpo", "local-ppo", "rlhf-rm-ppo")


@pytest.mark.parametrize(("name", "model"), [("distill-sft", "student")])
async def test_example_plan_runs(
    name: str, model: str, client, tiny_model: Path, learner_env
) -> None:
    ran = await cli(
        learner_env, "run", "--config", str(EXAMPLES / f"{name}.toml"),
        "--with", f"{model}=hf:{tiny_model}", "--json", limit_s=900,
    )  # fmt: skip
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    done = json.loads(ran.stdout)
    assert done["status"] == "completed"
    assert all(s["status"] == "completed" for s in done["stages"])
    train = next(s for s in done["stages"] if "jobId" in s["outputs"])
    job = await client.get_training_job(train["outputs"]["jobId"])
    assert job["status"] == "completed" and job["step"] == job["hyperparams"]["max_steps"]


@pytest.fixture(scope="session")
def built_tiny_agent() -> Path:
    """`local/tiny-agent` built by its own recipe, cached by its content hash across sessions."""
    digest = tiny_agent._digest(examples.examples_dir(), 0, tiny_agent.TRAINING)
    cache = Path(tempfile.gettempdir()) / f"rollout-tiny-agent-{digest[:16]}"
    return tiny_agent.build_tiny_agent(cache)


@pytest.fixture
def home_tiny_agent(built_tiny_agent: Path, learner_env) -> Path:
    """The built agent in this test's home, where `local/tiny-agent` resolves (stamp matches)."""
    target = tiny_agent.default_dir()
    shutil.copytree(built_tiny_agent, target)
    assert tiny_agent.ensure_tiny_agent() == target  # reused, not rebuilt
    return target


@pytest.mark.parametrize("name", ONLINE)
async def test_online_example_plan_runs_to_the_end(
    name: str, client, home_tiny_agent: Path, learner_env
) -> None:
    path = EXAMPLES / f"{name}.toml"
    ran = await cli(learner_env, "run", "--config", str(path), "--json", limit_s=1800)
    assert ran.returncode == 0, (ran.stdout, ran.stderr[-4000:])
    done = json.loads(ran.stdout)
    assert done["status"] == "completed", done
    assert all(s["status"] == "completed" for s in done["stages"]), done["stages"]
    out = {s["name"]: s["outputs"] for s in done["stages"]}
    online = [s for s in done["stages"] if s["outputs"].get("method") in ("grpo", "ppo")]
    assert len(online) == 1
    job = await client.get_training_job(online[0]["outputs"]["jobId"])
    steps = job["hyperparams"]["max_steps"]
    assert job["status"] == "completed" and job["step"] == steps, job
    assert job["baseModel"] == "local/tiny-agent"
    model = job["modelId"]
    assert out["trained"]["model"] == online[0]["outputs"]["model"] == model
    assert out["delta"]["otherRunId"] == out["trained"]["runId"]
    # Every step was a new policy version, announced to the actors, trained on fresh groups.
    js = await client.jetstream()
    versions = [
        p["version"]
        async for m in read_events(js, subjects.aggregate_events("policy"))
        if (p := EventEnvelope.from_bytes(m.data).payload)["model"] == model
    ]
    assert versions == list(range(steps + 1)), versions
    [completed] = [e for e in await job_events(js, job["id"]) if e.type == "job.completed"]
    metrics = completed.payload["metrics"]
    assert metrics["steps"] == steps and metrics["completions_used"] > 0, metrics
    if name == "rlhf-rm-ppo":
        # PPO learned from the reward model the plan trained, not from the verifier.
        assert job["hyperparams"]["reward_model"] == out["rm"]["model"]
        assert metrics["completions_rescored"] >= metrics["completions_used"], metrics

    # The plan and each stage are events; `rollout replay --plan` rebuilds the same outcome.
    plan_id = done["planId"]
    events = await cli(learner_env, "events", "--plan", plan_id, "--json")
    assert events.returncode == 0, events.stderr[-2000:]
    types = [json.loads(line)["type"] for line in events.stdout.splitlines()]
    assert types == [
        "plan.started",
        *["plan.stage_started", "plan.stage_completed"] * len(done["stages"]),
        "plan.completed",
    ]
    replayed = await cli(learner_env, "replay", "--plan", plan_id, "--json")
    assert replayed.returncode == 0, replayed.stderr[-2000:]
    assert json.loads(replayed.stdout)["plan"]["stages"] == done["stages"]
