"""The `openenv` template: episodes played on a real OpenEnv server over its WebSocket.

Two real servers: our own `rollout env serve` app (tools mode, rewards from its verifier) and a
native OpenEnv environment written on openenv-core's `Environment` (raw actions, its reward).
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest
from fakes.openai_server import FakeOpenAI, by_conversation, text_reply, tool_reply
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from servers import free_port, serving
from test_openenv_server import REFUND

from rollout.cli import main
from rollout.errors import RolloutError
from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.envs import build_runtime, run_tool_script, score, validate_environment
from rollout.shared.envs.runtime import EnvironmentFailed
from rollout.shared.envs.templates.openenv import check_url
from rollout.shared.interop.openenv_server import create_app


class GuessAction(Action):
    """Guess the secret number."""

    guess: int


class GuessObservation(Observation):
    hint: str = ""


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    """A native OpenEnv env: reward 1.0 for the secret, 0.25 for a near miss; done on a hit."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id="e", step_count=0)
        self.secret = 7

    def reset(self, seed=None, episode_id=None, secret: int = 7, **kw) -> GuessObservation:
        self.secret = secret
        self._state = State(episode_id=episode_id or "e", step_count=0)
        return GuessObservation(hint="guess a number in 1..10")

    def step(self, action: GuessAction, timeout_s=None, **kw) -> GuessObservation:
        self._state.step_count += 1
        if action.guess < 0:
            raise ValueError("no negative guesses")
        if action.guess == self.secret:
            return GuessObservation(hint="right", done=True, reward=1.0)
        near = abs(action.guess - self.secret) == 1
        return GuessObservation(
            hint="higher" if action.guess < self.secret else "lower", reward=0.25 if near else 0.0
        )

    @property
    def state(self) -> State:
        return self._state


def consumer(url: str, **config) -> dict:
    return {
        "slug": "remote-refund",
        "template": "openenv",
        "config": {"url": url, **config},
        "tasks": [
            {"instruction": "Refund order O-1 for $100", "input": {"task": 0}},
            {"instruction": "Do nothing", "input": {"task": "noop"}},
        ],
    }


@pytest.fixture(scope="module")
def refund_server():
    with serving(create_app(EnvironmentSpec.model_validate(REFUND))) as url:
        yield url


@pytest.fixture(scope="module")
def guess_server():
    with serving(create_fastapi_app(GuessEnv, GuessAction, GuessObservation)) as url:
        yield url


REFUND_CALLS = [
    ("lookup_order", {"order_id": "O-1"}),
    ("refund", {"order_id": "O-1", "amount": 100}),
    ("submit_answer", {"answer": "refunded"}),
]


async def test_tools_mode_the_servers_reward_scores_the_episode(refund_server) -> None:
    spec = consumer(refund_server)
    assert validate_environment(spec) == []
    runtime = build_runtime(spec, 0)
    try:
        names = [t.name for t in runtime.tool_specs()]
        assert names == ["lookup_order", "refund", "submit_answer"]
    finally:
        await runtime.close()
    trajectory = await run_tool_script(spec, 0, REFUND_CALLS)
    assert trajectory.tool_calls[0].result == {"customer": "Alice", "amount": 100}
    state = trajectory.final_state
    assert state["done"] is True and state["reward"] == 1.0
    assert state["state"]["env_state"]["refunds"] == [{"order_id": "O-1", "amount": 100.0}]
    verdict = await score(spec, 0, trajectory)  # the default verifier: env_reward
    assert verdict.passed and verdict.score == 1.0
    assert verdict.primitives[0].type == "env_reward"

    # The wrong thing done on the noop task: the server's verifier says 0, and so do we.
    wrong = await run_tool_script(spec, 1, REFUND_CALLS)
    assert wrong.final_state["reward"] == 0.0
    assert not (await score(spec, 1, wrong)).passed


async def test_our_primitives_score_the_remote_state_alongside_the_reward(refund_server) -> None:
    spec = consumer(
        refund_server,
        finishAction={},  # the model stops without submitting: the server still scores
    )
    spec["verifier"] = [
        {"name": "reward", "type": "env_reward", "weight": 1},
        {
            "name": "refunded",
            "type": "state_match",
            "expected": {"state.env_state.refunds": [{"order_id": "O-1", "amount": 100}]},
        },
        {"name": "looked-up", "type": "tool_was_called", "tool": "lookup_order"},
    ]
    assert validate_environment(spec) == []
    trajectory = await run_tool_script(spec, 0, REFUND_CALLS[:2])
    assert trajectory.final_state["done"] is True
    verdict = await score(spec, 0, trajectory)
    assert verdict.passed, verdict.primitives
    assert [p.passed for p in verdict.primitives] == [True, True, True]


async def test_an_episode_that_never_ends_earns_no_reward(refund_server) -> None:
    spec = consumer(refund_server)
    trajectory = await run_tool_script(spec, 0, REFUND_CALLS[:2])
    assert trajectory.final_state["done"] is False
    verdict = await score(spec, 0, trajectory)
    assert not verdict.passed
    assert "did not end" in verdict.primitives[0].reason


async def test_sessions_are_isolated_between_concurrent_episodes(refund_server) -> None:
    spec = consumer(refund_server)
    a, b = build_runtime(spec, 0), build_runtime(spec, 0)
    try:
        await asyncio.gather(
            a.call_tool("refund", {"order_id": "O-1", "amount": 100}),
            b.call_tool("refund", {"order_id": "O-2", "amount": 5}),
        )
        assert a.final_state()["state"]["env_state"]["refunds"] == [
            {"order_id": "O-1", "amount": 100.0}
        ]
        assert b.final_state()["state"]["env_state"]["refunds"] == [
            {"order_id": "O-2", "amount": 5.0}
        ]
    finally:
        await a.close()
        await b.close()


async def test_raw_mode_against_a_native_openenv_env(guess_server) -> None:
    spec = {
        "slug": "guess",
        "template": "openenv",
        "config": {"url": guess_server, "actions": "raw", "actionTool": "guess"},
        "tasks": [{"instruction": "Guess the number", "input": {"secret": 3}}],
        "verifier": [{"name": "reward", "type": "env_reward", "passAt": 1.0}],
    }
    assert validate_environment(spec) == []
    runtime = build_runtime(spec, 0)
    try:
        [tool] = runtime.tool_specs()
        assert tool.name == "guess"
        assert tool.parameters["properties"]["guess"]["type"] == "integer"
        assert "metadata" not in tool.parameters["properties"]
    finally:
        await runtime.close()
    trajectory = await run_tool_script(spec, 0, [("guess", {"guess": 2}), ("guess", {"guess": 3})])
    first = trajectory.tool_calls[0].result
    assert first["observation"]["hint"] == "higher" and first["reward"] == 0.25
    assert trajectory.final_state["rewards"] == [0.25, 1.0]
    assert (await score(spec, 0, trajectory)).passed
    # The server validates its own action model: a bad action is a tool error the model reads.
    bad = await run_tool_script(spec, 0, [("guess", {"guess": "many"})])
    assert bad.tool_calls[0].error and "guess" in bad.tool_calls[0].error
    # The env raising is the server's error answer: the model reads it, the session lives on.
    raised = await run_tool_script(spec, 0, [("guess", {"guess": -1}), ("guess", {"guess": 3})])
    assert raised.tool_calls[0].error == (
        "the server refused the step: no negative guesses (code: EXECUTION_ERROR)"
    )
    assert raised.final_state["done"] is True and raised.final_state["reward"] == 1.0


def test_rollout_test_drives_a_remote_env_with_a_model(refund_server, tmp_path, capsys) -> None:
    script = by_conversation(
        {
            "Refund order O-1": [
                tool_reply(("lookup_order", {"order_id": "O-1"})),
                tool_reply(("refund", {"order_id": "O-1", "amount": 100})),
                tool_reply(("submit_answer", {"answer": "refunded"})),
                text_reply("done"),
            ],
            "Do nothing": [text_reply("nothing to do")],
        }
    )
    (tmp_path / "remote.py").write_text(
        textwrap.dedent(
            f"""
            from rollout import Environment, Task
            env = Environment(slug="remote-refund", template="openenv",
                              config={{"url": {refund_server!r}, "finishAction": {{}}}},
                              tasks=[Task(instruction="Refund order O-1 for $100",
                                          input={{"task": 0}}),
                                     Task(instruction="Do nothing", input={{"task": "noop"}})])
            """
        )
    )
    with FakeOpenAI(script) as model:
        code = main(
            ["test", str(tmp_path / "remote.py"), "--model", f"{model.base_url}#m", "--json"]
        )
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    tasks = report["environments"][0]["tasks"]
    assert [t["passed"] for t in tasks] == [True, True]


def test_rollout_plan_checks_the_server(refund_server, tmp_path, capsys) -> None:
    env_file = tmp_path / "remote_env.py"
    for url in (refund_server, f"http://127.0.0.1:{free_port()}"):
        env_file.write_text(
            "from rollout import Environment, Task\n"
            f"env = Environment(slug='remote', template='openenv', config={{'url': {url!r}}},\n"
            "                  tasks=[Task(instruction='Refund O-1', input={'task': 0})])\n"
        )
        code = main(["plan", str(env_file), "--json"])
        report = json.loads(capsys.readouterr().out)["environments"][0]
        if url == refund_server:
            assert code == 0 and report["tools"] == ["lookup_order", "refund", "submit_answer"]
            assert report["verifier"]["primitives"] == ["reward (env_reward, w=1)"]
        else:
            assert code == 1 and report["problems"][0].startswith("config.url: the OpenEnv")


def test_plan_time_names_config_url_when_the_server_does_not_answer() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    problems = validate_environment(consumer(dead))
    assert len(problems) == 1
    assert problems[0].startswith("config.url: the OpenEnv server at " + dead)
    assert "/schema" in problems[0]


def test_plan_time_refuses_a_server_that_is_not_openenv() -> None:
    class NotOpenEnv(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"hello": "world"}'
            self.send_response(200 if self.path == "/schema" else 404)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotOpenEnv)
    Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        [problem] = validate_environment(consumer(url))
        assert problem.startswith("config.url: ") and "not an OpenEnv schema" in problem
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://user:secret@127.0.0.1:9/", "must not carry credentials"),
        ("ftp://127.0.0.1/", "scheme must be http, https, ws or wss"),
        ("http://127.0.0.1:9/?token=x", "no query or fragment"),
        ("http://", "no host"),
    ],
)
def test_bad_urls_are_refused_with_their_config_path(url: str, message: str) -> None:
    [problem] = validate_environment(consumer(url))
    assert problem.startswith("config.url: ") and message in problem
    with pytest.raises(RolloutError, match=message):
        check_url(url)


async def test_a_server_that_goes_away_ends_the_episode_as_errored() -> None:
    with serving(create_app(EnvironmentSpec.model_validate(REFUND))) as url:
        spec = consumer(url)
        runtime = build_runtime(spec, 0)
    try:  # the server stopped: the session is gone
        with pytest.raises(EnvironmentFailed):
            await runtime.call_tool("lookup_order", {"order_id": "O-1"})
    finally:
        await runtime.close()
    unreachable = build_runtime(consumer(f"http://127.0.0.1:{free_port()}"), 0)
    with pytest.raises(EnvironmentFailed, match="openenv http://127.0.0.1"):
        unreachable.tool_specs()
    await unreachable.close()
