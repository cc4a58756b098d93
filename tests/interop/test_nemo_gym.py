"""NeMo Gym both ways, tested against its documented wire protocol only (nemo-gym does not
install here): `rollout env serve --protocol nemo-gym` serving an env, and the `nemo_gym`
template consuming that server over real HTTP."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Response
from servers import free_port, serving
from test_openenv_server import REFUND
from waiting import wait_until_sync

from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.envs import build_runtime, run_tool_script, score, validate_environment
from rollout.shared.envs.runtime import EnvironmentFailed
from rollout.shared.interop.nemo_gym import create_app
from rollout.shared.interop.nemo_gym_wire import responses_payload


@pytest.fixture(scope="module")
def gym_server():
    with serving(create_app(EnvironmentSpec.model_validate(REFUND))) as url:
        yield url


def consumer(url: str, **config) -> dict:
    return {
        "slug": "gym-refund",
        "template": "nemo_gym",
        "config": {"url": url, **config},
        "tasks": [
            {"instruction": "Refund order O-1 for $100", "input": {"task": 0}},
            {"instruction": "Do nothing", "input": {"task": "noop"}},
        ],
    }


def test_the_wire_protocol_as_documented(gym_server) -> None:
    with httpx.Client(base_url=gym_server) as gym:  # one client = one cookie jar = one rollout
        seeded = gym.post("/seed_session", json={"task": 0})
        assert seeded.status_code == 200 and "rollout_gym_session" in seeded.cookies
        assert gym.post("/lookup_order", json={"order_id": "O-1"}).json() == {
            "customer": "Alice",
            "amount": 100,
        }
        assert gym.post("/refund", json={"order_id": "O-1", "amount": 100}).status_code == 200
        assert "error" in gym.post("/lookup_order", json={}).json()  # a tool error, not a 500
        # A client claiming tool calls it never made: the reward comes from the session.
        payload = responses_payload("Refund order O-1 for $100", [], [], "refunded")
        verified = gym.post("/verify", json=payload).json()
        assert verified["reward"] == 1.0 and verified["verifier"]["passed"] is True
        assert verified["response"]["output"][-1]["content"][0]["text"] == "refunded"
        # /verify ended the session.
        assert gym.post("/refund", json={"order_id": "O-1", "amount": 1}).status_code == 400
    with httpx.Client(base_url=gym_server) as other:
        other.post("/seed_session", json={"task": "noop"})
        assert other.post("/verify", json=payload).json()["reward"] == 1.0  # noop done right
    schema = httpx.get(f"{gym_server}/openapi.json").json()
    assert {"/seed_session", "/verify", "/lookup_order", "/refund"} <= set(schema["paths"])


def test_no_session_is_a_clear_400(gym_server) -> None:
    response = httpx.post(f"{gym_server}/refund", json={"order_id": "O-1", "amount": 1})
    assert response.status_code == 400 and "seed_session" in response.json()["detail"]


async def test_the_template_consumes_a_resources_server(gym_server) -> None:
    spec = consumer(gym_server)
    assert validate_environment(spec) == []
    runtime = build_runtime(spec, 0)
    try:  # tools discovered from /openapi.json, plus the answer tool
        assert [t.name for t in runtime.tool_specs()] == ["lookup_order", "refund", "submit_answer"]
    finally:
        await runtime.close()
    calls = [
        ("lookup_order", {"order_id": "O-1"}),
        ("refund", {"order_id": "O-1", "amount": 100}),
        ("submit_answer", {"answer": "refunded"}),
    ]
    trajectory = await run_tool_script(spec, 0, calls)
    assert trajectory.tool_calls[0].result == {"customer": "Alice", "amount": 100}
    state = trajectory.final_state
    assert state["reward"] == 1.0 and state["answer"] == "refunded"
    assert state["verify"]["verifier"]["passed"] is True
    verdict = await score(spec, 0, trajectory)  # default verifier: env_reward
    assert verdict.passed and verdict.primitives[0].type == "env_reward"
    wrong = await run_tool_script(spec, 1, calls)
    assert wrong.final_state["reward"] == 0.0
    assert not (await score(spec, 1, wrong)).passed
    # A tool error from the server reaches the model as a tool error.
    errored = await run_tool_script(spec, 0, [("lookup_order", {})])
    assert errored.tool_calls[0].error


async def test_declared_tools_and_our_primitives_alongside(gym_server) -> None:
    spec = consumer(
        gym_server,
        tools=[{"name": "refund", "parameters": {"type": "object", "properties": {}}}],
        answerTool=None,
    )
    spec["verifier"] = [
        {"name": "reward", "type": "env_reward"},
        {"name": "refunded", "type": "tool_was_called", "tool": "refund"},
    ]
    assert validate_environment(spec) == []
    trajectory = await run_tool_script(spec, 0, [("refund", {"order_id": "O-1", "amount": 100})])
    verdict = await score(spec, 0, trajectory)
    assert verdict.passed and [p.passed for p in verdict.primitives] == [True, True]


def test_plan_time_names_config_url() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    [problem] = validate_environment(consumer(dead))
    assert problem.startswith(f"config.url: the NeMo Gym server at {dead} did not answer")
    [creds] = validate_environment(consumer("http://u:p@127.0.0.1:1"))
    assert creds == "config.url: the URL must not carry credentials (user:password@)"


async def test_a_server_that_goes_away_ends_the_episode_as_errored() -> None:
    with serving(create_app(EnvironmentSpec.model_validate(REFUND))) as url:
        runtime = build_runtime(consumer(url), 0)
    try:
        with pytest.raises(EnvironmentFailed, match="nemo_gym http://127.0.0.1"):
            await runtime.call_tool("refund", {"order_id": "O-1", "amount": 1})
    finally:
        await runtime.close()


@pytest.mark.slow
def test_cli_serves_the_nemo_gym_protocol(tmp_path) -> None:
    (tmp_path / "envs.py").write_text(
        textwrap.dedent(
            f"""
            from rollout import Environment
            env = Environment.from_spec({REFUND!r})
            """
        )
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollout.cli", "env", "serve", "envs.py", "--port", str(port),
         "--protocol", "nemo-gym"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                return httpx.get(f"{url}/openapi.json", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        # a loaded machine imports slowly
        wait_until_sync(up, "the server to come up", 180)
        with httpx.Client(base_url=url) as gym:
            gym.post("/seed_session", json={"task": "noop"})
            assert gym.post("/verify", json={}).json()["reward"] == 1.0
    finally:
        proc.terminate()
        proc.wait(10)


def fragile_app(verify_fails_always: bool = False) -> Any:
    """A resources server written as many are: its handlers parse what they were sent, and
    what they cannot parse is an HTTP 500 (answered here rather than raised: uvicorn may reset
    the connection after an exception escapes, which would be a lost server)."""
    app = FastAPI()

    def failed(exc: Exception) -> Response:
        return Response(f"Internal Server Error: {exc!r}", status_code=500)

    @app.post("/seed_session")
    async def seed_session() -> dict:
        return {}

    @app.post("/add")
    async def add(body: dict[str, Any]) -> Any:
        try:
            return {"value": int(body["n"]) + 1}
        except ValueError as exc:  # "five"
            return failed(exc)

    @app.post("/busy")
    async def busy() -> Response:
        return Response("overloaded", status_code=503)

    @app.post("/verify")
    async def verify(body: dict[str, Any]) -> Any:
        if verify_fails_always:
            return failed(RuntimeError("the verifier is broken"))
        text = body["response"]["output"][-1]["content"][0]["text"]
        if len(text) > 100:  # as a request model with max_length would
            return Response('{"detail": "answer too long"}', status_code=422)
        try:
            return {"reward": float(int(text or 0) == 4)}
        except ValueError as exc:  # "four"
            return failed(exc)

    return app


def sums(url: str) -> dict:
    return {
        "slug": "gym-sum",
        "template": "nemo_gym",
        "config": {"url": url},
        "tasks": [{"instruction": "What is 2+2? Submit the number."}],
    }


async def test_what_the_server_cannot_parse_fails_the_episode_instead_of_erroring_it() -> None:
    # The handler's HTTP 500 ended the episode errored (no verdict): left out of pass rates and
    # GRPO's groups, so a model could escape a wrong answer by sending one the server cannot
    # parse, or a tool call's arguments it cannot.
    with serving(fragile_app()) as url:
        spec = sums(url)
        right = await run_tool_script(spec, 0, [("submit_answer", {"answer": "4"})])
        assert (await score(spec, 0, right)).passed
        junk = await run_tool_script(
            spec, 0, [("add", {"n": "five"}), ("add", {"n": 3}), ("submit_answer", {"answer": "5"})]
        )
        assert "the server failed on this call: add failed: HTTP 500" in junk.tool_calls[0].error
        assert junk.tool_calls[1].result == {"value": 4}  # the session went on
        assert not (await score(spec, 0, junk)).passed
        unparsable = await run_tool_script(spec, 0, [("submit_answer", {"answer": "four"})])
        state = unparsable.final_state
        assert (
            state["reward"] == 0.0
            and "the episode's answer is at fault" in (state["verify"]["verifyError"])
        )
        verdict = await score(spec, 0, unparsable)
        assert verdict.error is None and not verdict.passed and verdict.score == 0.0
        # An answer that does not fit the server's request model (422): the same.
        too_long = await run_tool_script(spec, 0, [("submit_answer", {"answer": "4" * 200})])
        assert too_long.final_state["reward"] == 0.0
        assert "HTTP 422" in too_long.final_state["verify"]["verifyError"]
        # A gateway's 503 says nothing about the call: the episode ends errored, as before.
        with pytest.raises(EnvironmentFailed, match="HTTP 503"):
            await run_tool_script(spec, 0, [("busy", {})])
    with serving(fragile_app(verify_fails_always=True)) as url:
        # A /verify that fails on every answer, controls too, is the server's: errored.
        with pytest.raises(EnvironmentFailed, match="verify failed: HTTP 500"):
            await run_tool_script(sums(url), 0, [("submit_answer", {"answer": "4"})])
