"""Every environment code example of the seed README runs unchanged and behaves as documented."""

from __future__ import annotations

from pathlib import Path

from rollout.shared.envs import load_environments, run_tool_script, score, validate_environment

SEEDS = Path(__file__).parent / "seed_examples"


async def test_readme_refund_agent() -> None:
    (env,) = load_environments(SEEDS / "refund_agent.py")
    assert validate_environment(env) == []
    spec = env.to_dict()
    assert spec["config"]["initialMutableState"] == {"refunds": []}
    assert spec["tasks"][0]["hiddenGroundTruth"] == {
        "refunds": [{"order_id": "O-1", "amount": 100.0}]
    }
    traj = await run_tool_script(
        env,
        0,
        [("lookup_order", {"order_id": "O-1"}), ("refund", {"order_id": "O-1", "amount": 100})],
    )
    assert traj.tool_calls[0].result == {"customer": "Alice", "amount": 100, "status": "shipped"}
    # "${args.amount}" keeps the number type: 100 matches the ground truth's 100.0.
    assert traj.final_state == {"refunds": [{"order_id": "O-1", "amount": 100}]}
    result = await score(env, 0, traj)
    assert result.passed and result.score == 1.0
    wrong = await run_tool_script(env, 0, [("refund", {"order_id": "O-1", "amount": "100"})])
    assert not (await score(env, 0, wrong)).passed


async def test_readme_jsonl_tasks() -> None:
    (env,) = load_environments(SEEDS / "jsonl_tasks.py")
    assert [t.split for t in env.tasks] == ["dev", "train"]
    assert env.tasks[1].hidden_ground_truth == {"refunds": [{"order_id": "O-2", "amount": 40.0}]}
    assert validate_environment(env) == []
    traj = await run_tool_script(env, 1, [("refund", {"order_id": "O-2", "amount": 40})])
    assert (await score(env, 1, traj)).passed


async def test_readme_template_helpers() -> None:
    (env,) = load_environments(SEEDS / "helpers_env.py")
    assert validate_environment(env) == []
    payload = env.to_dict()
    tool = payload["config"]["tools"][0]
    assert tool == {
        "name": "get_order",
        "kind": "lookup",
        "description": "Read an order.",
        "paramsSchema": {"id": "string"},
        "fromArray": "orders",
        "matchField": "id",
    }
    assert payload["config"]["tools"][1]["stateArray"] == "refunds"
    assert [p["type"] for p in payload["verifier"]["primitives"]] == [
        "tool_was_called",
        "state_match",
        "no_tool_errors",
    ]
    traj = await run_tool_script(
        env, 0, [("get_order", {"id": "O-1"}), ("refund", {"order_id": "O-1", "amount": 100})]
    )
    assert traj.final_state == {"refunds": [{"order_id": "O-1", "amount": 100}]}
    result = await score(env, 0, traj)
    assert result.passed, result
    assert [(p.name, p.weight) for p in result.primitives] == [
        ("called_lookup", 1.0),
        ("refunds_count", 2.0),
        ("no_errors", 1.0),
    ]
    # Without the lookup the weighted score is 3/4 and the rollout fails.
    skipped = await run_tool_script(env, 0, [("refund", {"order_id": "O-1", "amount": 100})])
    result = await score(env, 0, skipped)
    assert not result.passed and result.score == 0.75
