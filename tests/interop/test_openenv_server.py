"""`rollout env serve`: rollout envs as OpenEnv servers, driven by openenv-core's own client."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient
from servers import free_port, serving
from waiting import wait_until_sync

from rollout.errors import RolloutError
from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.interop.openenv_server import create_app

REFUND = {
    "slug": "refund-agent",
    "template": "workflow",
    "description": "Refund workflow",
    "config": {
        "tools": [
            {
                "name": "lookup_order",
                "kind": "lookup",
                "fixturePath": "orders.${args.order_id}",
                "paramsSchema": {"order_id": "string"},
            },
            {
                "name": "refund",
                "kind": "action",
                "appendTo": "refunds",
                "value": {"order_id": "${args.order_id}", "amount": "${args.amount}"},
            },
        ],
        "fixtures": {"orders": {"O-1": {"customer": "Alice", "amount": 100}}},
        "initialMutableState": {"refunds": []},
    },
    "tasks": [
        {
            "instruction": "Refund order O-1 for $100",
            "hiddenGroundTruth": {"refunds": [{"order_id": "O-1", "amount": 100.0}]},
        },
        {"instruction": "Do nothing", "id": "noop", "hiddenGroundTruth": {"refunds": []}},
    ],
}


@pytest.fixture
def refund_server():
    with serving(create_app(EnvironmentSpec.model_validate(REFUND))) as url:
        yield url


async def test_an_episode_over_the_websocket_is_scored_by_our_verifier(refund_server) -> None:
    async with GenericEnvClient(base_url=refund_server) as env:
        first = await env.reset(task=0)
        assert first.observation["instruction"] == "Refund order O-1 for $100"
        assert [t["name"] for t in first.observation["tools"]] == ["lookup_order", "refund"]
        looked = await env.step({"tool": "lookup_order", "arguments": {"order_id": "O-1"}})
        assert looked.observation["result"] == {"customer": "Alice", "amount": 100}
        assert looked.done is False and looked.reward is None
        await env.step({"tool": "refund", "arguments": {"order_id": "O-1", "amount": 100}})
        state = await env.state()
        assert state["env_state"]["refunds"] == [{"order_id": "O-1", "amount": 100.0}]
        assert state["step_count"] == 2
        done = await env.step({"answer": "refunded"})
        assert done.done is True and done.reward == 1.0
        assert done.observation["verifier"]["passed"] is True

        # A second episode in the same session, the wrong thing done: our verifier says so.
        again = await env.reset(task="noop")
        assert again.observation["task_id"] == "noop"
        await env.step({"tool": "refund", "arguments": {"order_id": "O-9", "amount": 5}})
        failed = await env.step({"answer": "done"})
        assert failed.done is True and failed.reward == 0.0
        assert failed.observation["verifier"]["passed"] is False


async def test_tool_errors_reach_the_agent_and_sessions_are_isolated(refund_server) -> None:
    async with (
        GenericEnvClient(base_url=refund_server) as a,
        GenericEnvClient(base_url=refund_server) as b,
    ):
        await a.reset(task=0)
        await b.reset(task=0)
        bad = await a.step({"tool": "nope", "arguments": {}})
        assert "unknown tool 'nope'" in bad.observation["error"]
        await a.step({"tool": "refund", "arguments": {"order_id": "O-1", "amount": 100}})
        assert (await b.state())["env_state"]["refunds"] == []


def test_http_routes(refund_server) -> None:
    with httpx.Client(base_url=refund_server, timeout=10) as http:
        assert http.get("/health").json()["status"] == "healthy"
        meta = http.get("/metadata").json()
        assert meta["name"] == "refund-agent" and meta["description"] == "Refund workflow"
        schema = http.get("/schema").json()
        assert set(schema["action"]["properties"]) >= {"tool", "arguments", "answer"}
        reset = http.post("/reset", json={"task": 1}).json()
        assert reset["observation"]["instruction"] == "Do nothing"
        # OpenEnv's HTTP /step is stateless (a fresh env per request): it says to use /ws.
        step = http.post("/step", json={"action": {"tool": "refund", "arguments": {}}}).json()
        assert step["done"] is True and "play episodes over /ws" in step["observation"]["error"]
        bad = http.post("/step", json={"action": {"tool": "x", "smuggled": 1}})
        assert bad.status_code == 422
        assert http.get("/state").json()["step_count"] == 0


def test_max_steps_ends_and_scores_the_episode() -> None:
    spec = EnvironmentSpec.model_validate(REFUND)
    with serving(create_app(spec, max_steps=1)) as url:
        client = GenericEnvClient(base_url=url).sync()
        with client:
            client.reset(task=1)
            last = client.step({"tool": "lookup_order", "arguments": {"order_id": "O-1"}})
            assert last.done is True and last.reward == 1.0  # nothing refunded: noop passes
            assert last.observation["result"] == {"customer": "Alice", "amount": 100}


def test_an_invalid_env_is_refused_before_serving() -> None:
    bad = {**REFUND, "config": {"tools": [{"name": "x", "kind": "teleport"}]}}
    with pytest.raises(RolloutError, match="is invalid"):
        create_app(EnvironmentSpec.model_validate(bad))


def test_cli_serves_a_plugin_env_file(tmp_path) -> None:
    (tmp_path / "counter_plugin.py").write_text(
        textwrap.dedent(
            """
            class Counter:
                def __init__(self, options):
                    self.value = 0
                def tools(self):
                    return [{"name": "inc", "description": "add one", "parameters": {}}]
                def reset(self, task):
                    self.value = 0
                def step(self, name, arguments):
                    self.value += 1
                    return self.value
                def state(self):
                    return {"value": self.value}

            def make(options):
                return Counter(options)
            """
        )
    )
    (tmp_path / "envs.py").write_text(
        textwrap.dedent(
            """
            from rollout import Environment, Task
            env = Environment(slug="counter", template="plugin",
                              config={"entrypoint": "counter_plugin:make"},
                              tasks=[Task(instruction="count to 2",
                                          hidden_ground_truth={"value": 2})])
            """
        )
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollout.cli", "env", "serve", "envs.py", "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until_sync(up, "the server to come up", 60)
        with GenericEnvClient(base_url=url).sync() as env:
            env.reset()
            assert env.step({"tool": "inc"}).observation["result"] == 1
            assert env.step({"tool": "inc"}).observation["result"] == 2
            done = env.step({"answer": "2"})
            assert done.done is True and done.reward == 1.0
    finally:
        proc.terminate()
        proc.wait(10)


def test_cli_names_a_missing_file() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "rollout.cli", "env", "serve", "nope.py"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    assert "nope.py" in run.stderr and "Traceback" not in run.stderr
