"""Experiment plans against real services: refs resolved against the registry, stages run
through the tracker/actors/verifier, the plan's events followed, replayed and resumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_platform import rollout

from rollout.comparison import comparison
from rollout.errors import RolloutError
from rollout.plans import check_plan, load_plan_state
from rollout.shared.contracts import requests as rq
from rollout.shared.contracts.envelope import deterministic_id
from rollout.shared.stats import format_interval


def refund_env_file(tmp_path: Path, tasks: int, name: str = "Refunds") -> Path:
    from kit import refund_env

    env = refund_env(tasks=tasks) | {"name": name}
    path = tmp_path / "refunds_env.py"
    path.write_text(f"from rollout import Environment\n\nenv = Environment.from_spec({env!r})\n")
    return path


def plan_text(model: str, env: str = 'file = "refunds_env.py"') -> str:
    return f"""
name = "scripted"
seed = 5
[envs.refunds]
{env}
[models]
agent = "{model}"
[resources]
replicas = 2
[[stages]]
name = "baseline"
run = {{ env = "refunds", model = "agent", n = 2, split = "train", temperature = 0.0 }}
[[stages]]
name = "heldout"
evaluate = {{ env = "refunds", model = "agent", n = 2, split = "test", temperature = 0.0 }}
[[stages]]
name = "delta"
compare = {{ base = "baseline", other = "heldout" }}
"""


async def test_env_refs_resolve_against_the_registry(client, settings, tmp_path) -> None:
    from kit import refund_env

    await client.push_environment(refund_env(tasks=2))
    await client.push_environment(refund_env(tasks=3))  # v2
    path = tmp_path / "p.toml"
    path.write_text(plan_text("openai/x", env='ref = "refunds@9"'))
    result = await check_plan(path, client=client)
    assert "envs.refunds.ref: no version 9 of refunds (have 1, 2)" in result.problems
    path.write_text(plan_text("openai/x", env='ref = "refundz"'))
    result = await check_plan(path, client=client)
    assert result.problems == [
        "envs.refunds.ref: no environment 'refundz' in the registry (push it, or give a `file`)"
    ]
    # Unversioned, it is pinned to the newest version and its spec hash.
    path.write_text(plan_text("openai/x", env='ref = "refunds"'))
    result = await check_plan(path, client=client)
    assert result.ok, result.problems
    newest = await client.get_environment("refunds")
    assert result.canonical["envs"]["refunds"] == {
        "ref": "refunds", "source": "registry", "slug": "refunds", "version": 2,
        "specHash": newest["spec_hash"],
    }  # fmt: skip
    # The same file and registry: the same plan; a new version of the env: another plan.
    again = await check_plan(path, client=client)
    assert again.hash == result.hash
    await client.push_environment(refund_env(tasks=4))
    assert (await check_plan(path, client=client)).hash != result.hash


async def test_tracker_appends_plan_events_in_order_only(client) -> None:
    def record(version: int, type_: str = "plan.failed", **payload) -> rq.RecordPlanEvent:
        return rq.RecordPlanEvent(
            plan_id="p-1", type=type_, payload={"reason": "x", **payload}, expected_version=version
        )

    first = await client.request("tracker", "record_plan_event", record(0))
    assert first["seq"] > 0 and not first["duplicate"]
    # The same request again (a resend) is the same event; a stale one is refused.
    again = await client.request("tracker", "record_plan_event", record(0))
    assert (again["id"], again["seq"], again["duplicate"]) == (first["id"], first["seq"], True)
    with pytest.raises(RolloutError, match="moved on"):
        await client.request("tracker", "record_plan_event", record(0, reason="other"))
    with pytest.raises(RolloutError, match="is not a plan event"):
        await client.request("tracker", "record_plan_event", record(first["seq"], "run.failed"))
    with pytest.raises(RolloutError, match="payload.plan_id"):
        await client.request("tracker", "record_plan_event", record(first["seq"], plan_id="q"))


async def test_plan_runs_stage_by_stage_as_events(client, agent_server, settings, tmp_path) -> None:
    refund_env_file(tmp_path, tasks=3)
    path = tmp_path / "plan.toml"
    path.write_text(plan_text(f"{agent_server.base_url}#scripted"))

    code, out, err = await rollout(settings, "plan", str(path), "--json")
    assert code == 0, (out, err)
    planned = json.loads(out)
    plan_id = planned["planId"]

    code, out, err = await rollout(settings, "run", "--config", str(path), "--json")
    assert code == 0, (out, err)
    done = json.loads(out)
    assert done["planId"] == plan_id and done["status"] == "completed"
    stages = {s["name"]: s for s in done["stages"]}
    assert [s["status"] for s in done["stages"]] == ["completed"] * 3
    baseline, heldout = stages["baseline"]["outputs"], stages["heldout"]["outputs"]
    # Tasks 1, 2 are train, task 0 is test; n=2 each; the scripted agent fails seeds % 4 == 0.
    assert (baseline["scored"], heldout["scored"]) == (4, 2)
    assert baseline["split"] == "train" and heldout["split"] == "test"
    run = await client.get_run(baseline["runId"])
    assert run["split"] == "train" and run["model"] == f"{agent_server.base_url}#scripted"
    delta = stages["delta"]["outputs"]
    assert delta["baseRunId"] == baseline["runId"] and delta["otherRunId"] == heldout["runId"]
    assert delta["deltaPassRate"] == pytest.approx(heldout["passRate"] - baseline["passRate"])

    # The plan and each stage are events on the log: `rollout events --plan` shows them.
    code, out, err = await rollout(settings, "events", "--plan", plan_id, "--json")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["type"] for e in events] == [
        "plan.started",
        *["plan.stage_started", "plan.stage_completed"] * 3,
        "plan.completed",
    ]
    started = events[0]["payload"]
    assert started["plan_hash"] == planned["hash"] and started["env_versions"] == {"refunds": 1}
    assert started["plan"] == planned["plan"]

    # `rollout replay --plan` rebuilds the stages and their outcomes from those events.
    code, out, err = await rollout(settings, "replay", "--plan", plan_id, "--json")
    assert code == 0, err
    replayed = json.loads(out)
    assert replayed["plan"]["stages"] == done["stages"]
    assert replayed["canonical"] == planned["plan"]

    # Running it again finds it complete: nothing new starts.
    runs_before = len(await client.list_runs(100))
    code, out, err = await rollout(settings, "run", "--config", str(path))
    assert code == 0 and "already completed" in out, (out, err)
    assert len(await client.list_runs(100)) == runs_before
    # Every pass rate and delta it prints carries its 95% interval, as `rollout show` and
    # `rollout compare` give them (it printed a bare "passRate 0.75" and "deltaPassRate 0").
    for outputs in (baseline, heldout):
        interval = outputs["passRateInterval"]
        run = await client.get_run(outputs["runId"])
        assert interval == comparison(run, run)["base"]["passRateInterval"]
        assert f"passRate {outputs['passRate']:.0%} {format_interval(interval)}" in out, out
    shown = delta["deltaPassRatePairedInterval"] or delta["deltaPassRateInterval"]
    assert (
        f"deltaPassRate {delta['deltaPassRate']:+.0%} {format_interval(shown, signed=True)}" in out
    )


async def test_a_killed_plan_resumes_without_repeating_a_stage(
    client, agent_server, settings, tmp_path
) -> None:
    refund_env_file(tmp_path, tasks=3)
    path = tmp_path / "plan.toml"
    path.write_text(plan_text(f"{agent_server.base_url}#scripted"))
    check = await check_plan(path, client=client)
    assert check.ok, check.problems
    plan_id = check.plan_id
    # What a CLI killed during stage 0 leaves behind: the plan and the stage started, its run
    # requested (with the plan's request id for that stage), nothing completed.
    pushed = await client.push_environment(refund_env_file_spec(tmp_path))
    seq = 0
    for type_, payload in (
        ("plan.started", {"name": "scripted", "plan_hash": check.hash, "plan": check.canonical,
                          "stages": ["baseline", "heldout", "delta"],
                          "env_versions": {"refunds": pushed["version"]}}),
        ("plan.stage_started", {"stage": "baseline", "kind": "run", "index": 0}),
    ):  # fmt: skip
        reply = await client.request(
            "tracker",
            "record_plan_event",
            rq.RecordPlanEvent(plan_id=plan_id, type=type_, payload=payload, expected_version=seq),
        )
        seq = reply["seq"]
    orphan = await client.create_run(
        "refunds", f"{agent_server.base_url}#scripted", 2, temperature=0.0, max_tokens=512,
        max_tool_calls=16, seed=5, name="scripted/baseline", split="train", batch_size=2,
        deadline_s=3600.0, env_version=pushed["version"],
        client_request_id=deterministic_id("plan", plan_id, "baseline", 0),
    )  # fmt: skip

    code, out, err = await rollout(settings, "run", "--config", str(path), "--json")
    assert code == 0, (out, err)
    done = json.loads(out)
    assert done["status"] == "completed"
    # The stage re-attached to the run it had started: no second baseline run.
    assert done["stages"][0]["outputs"]["runId"] == orphan["runId"]
    assert len(await client.list_runs(100)) == 2
    state = await load_plan_state(await client.jetstream(), plan_id)
    assert state.status == "completed" and state.stages == ["baseline", "heldout", "delta"]


def refund_env_file_spec(tmp_path: Path) -> dict:
    from kit import refund_env

    return refund_env(tasks=3) | {"name": "Refunds"}
