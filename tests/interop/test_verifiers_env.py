"""verifiers (v1) both ways, with the real package: a taskset as a rollout env (its code in
a plugin host) and a rollout env exported as a verifiers taskset module, round trip."""

from __future__ import annotations

import importlib
import json
import sys

import pytest
import verifiers.v1 as vf
from fakes.openai_server import FakeOpenAI, by_conversation, text_reply

from rollout.cli import main
from rollout.errors import RolloutError
from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.contracts.trajectory import Trajectory
from rollout.shared.envs import score, validate_environment
from rollout.shared.envs.plugin_host import client
from rollout.shared.envs.plugin_host.client import HostPool, HostSettings
from rollout.shared.interop.verifiers_env import environment

QA = """
import os
import verifiers.v1 as vf

__all__ = ["QATaskset"]

class QAData(vf.TaskData):
    answer: str

class QATask(vf.Task[QAData, vf.State]):
    @vf.reward
    async def exact(self, task: QAData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip().lower() == task.answer.lower())

    @vf.reward(weight=0.0)
    async def where(self, task: QAData, trace: vf.Trace) -> float:
        # A zero-weight reward is reported but does not move the score.
        return float(os.getpid())

class QATaskset(vf.Taskset[QATask]):
    def load(self):
        for q, a in [("What is 2+2?", "4"), ("Capital of France?", "Paris")]:
            yield QATask(QAData(prompt=q, answer=a, id=f"q-{a}"), self.config.task)
"""


def _trajectory(reply: str) -> Trajectory:
    return Trajectory(final_output=reply, final_state={})


async def test_a_taskset_is_a_rollout_env_scored_by_its_own_rewards(user_module) -> None:
    user_module("qa_taskset", QA)
    env = environment("qa_taskset")
    spec = env.to_spec()
    assert spec.template == "verifiers" and spec.slug == "qa-taskset"
    assert [t.instruction for t in spec.tasks] == ["What is 2+2?", "Capital of France?"]
    assert spec.tasks[1].id == "q-Paris"
    assert spec.tasks[1].hidden_ground_truth["answer"] == "Paris"
    assert "qa_taskset.py" in spec.config["sources"]  # the user's code travels with the env
    assert validate_environment(env) == []

    right = await score(spec, 1, _trajectory("paris"))
    assert right.passed and right.score == 1.0
    assert "exact=1" in right.primitives[0].reason
    wrong = await score(spec, 0, _trajectory("5"))
    assert not wrong.passed and wrong.score == 0.0
    assert "qa_taskset" not in sys.modules  # its code ran in the plugin host, not here


def test_rollout_test_runs_a_verifiers_env(user_module, tmp_path, capsys) -> None:
    user_module("qa_taskset", QA)
    (tmp_path / "qa_env.py").write_text(
        "from rollout.shared.interop.verifiers_env import environment\n"
        "env = environment('qa_taskset')\n"
    )
    script = by_conversation(
        {"What is 2+2?": [text_reply("4")], "Capital of France?": [text_reply("Lyon")]}
    )
    with FakeOpenAI(script) as model:
        code = main(
            ["test", str(tmp_path / "qa_env.py"), "--model", f"{model.base_url}#m", "--json"]
        )
    report = json.loads(capsys.readouterr().out)
    tasks = report["environments"][0]["tasks"]
    assert [t["passed"] for t in tasks] == [True, False], report
    assert code in (0, 1)


# A reward that parses the reply (the usual math taskset) raises on one it cannot read.
PARSING = """
import verifiers.v1 as vf

__all__ = ["SumTaskset"]

class SumData(vf.TaskData):
    answer: int
    fails: str = ""

class SumTask(vf.Task[SumData, vf.State]):
    @vf.reward
    async def exact(self, task: SumData, trace: vf.Trace) -> float:
        if task.fails == "always":
            return float(task.answr)  # a typo: no reply can be scored
        if task.fails == "network":
            raise ConnectionError("the judge's endpoint is down")
        return float(int(trace.last_reply.strip()) == task.answer)

class SumTaskset(vf.Taskset[SumTask]):
    def load(self):
        for i, fails in enumerate(["", "always", "network"]):
            yield SumTask(SumData(prompt=f"{i}+{i}?", answer=2 * i, fails=fails, id=f"s{i}"),
                          self.config.task)
"""


async def test_a_reply_the_rewards_cannot_parse_fails_instead_of_escaping_its_verdict(
    user_module,
) -> None:
    # The rewards raised on "five", which made the rollout errored (no verdict): left out of
    # pass rates and GRPO's groups, so a model unsure of its answer escaped every 0 that way.
    user_module("sum_taskset", PARSING)
    spec = environment("sum_taskset").to_spec()
    assert (await score(spec, 0, _trajectory("0"))).passed
    for reply in ("five", "", "9" * 5000):
        verdict = await score(spec, 0, _trajectory(reply))
        assert verdict.error is None and not verdict.passed and verdict.score == 0.0, verdict
        assert "the reply is at fault" in verdict.primitives[0].reason
    # A reward that raises whatever the reply (a bug), or on a connection: no verdict, as before.
    for task, why in ((1, "controls too"), (2, "endpoint is down")):
        verdict = await score(spec, task, _trajectory("2"))
        assert verdict.error is not None and why in verdict.error, verdict


STOPPING = """
import os
import verifiers.v1 as vf

__all__ = ["StopTaskset"]

class StopData(vf.TaskData):
    answer: str

class StopTask(vf.Task[StopData, vf.State]):
    @vf.reward
    async def exact(self, task: StopData, trace: vf.Trace) -> float:
        if trace.last_reply == "crash":
            os._exit(1)  # a C extension's crash on what it was given
        while trace.last_reply == "hang":  # a pattern that never ends on this reply
            pass
        return float(trace.last_reply == task.answer)

class StopTaskset(vf.Taskset[StopTask]):
    def load(self):
        yield StopTask(StopData(prompt="2+2?", answer="4", id="s4"), self.config.task)
"""


async def test_a_reply_that_crashes_or_hangs_the_rewards_host_fails_instead_of_escaping(
    user_module, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its host died or hung scoring the reply: no verdict, as if the platform had failed,
    # though a control reply is scored by a fresh host at once.
    fresh = HostPool(HostSettings(step_timeout_s=8.0))
    monkeypatch.setattr(client, "_pool", fresh)
    try:
        user_module("stop_taskset", STOPPING)
        spec = environment("stop_taskset").to_spec()
        assert (await score(spec, 0, _trajectory("4"))).passed
        for reply in ("crash", "hang"):
            verdict = await score(spec, 0, _trajectory(reply))
            assert verdict.error is None and not verdict.passed, verdict
            assert "the reply is at fault" in verdict.primitives[0].reason
        assert fresh.leased == 0
    finally:
        fresh.close()


@pytest.mark.slow
def test_a_taskset_that_does_not_import_is_named(user_module) -> None:
    user_module("broken_taskset", "import verifiers.v1 as vf\nraise ImportError('no numpy here')\n")
    with pytest.raises(RolloutError, match="broken_taskset"):
        environment("broken_taskset")
    with pytest.raises(RolloutError, match="not a module name"):
        environment("not a module")


REFUND = {
    "slug": "qa-rollout",
    "template": "custom",
    "config": {"tools": []},
    "tasks": [
        {"instruction": "Say hello", "id": "hello"},
        {"instruction": "Say goodbye", "id": "bye"},
    ],
    "verifier": [
        {"name": "greets", "type": "contains_terms", "terms": ["hello"]},
    ],
}


async def test_export_round_trip(tmp_path, monkeypatch, capsys) -> None:
    spec = EnvironmentSpec.model_validate(REFUND)
    (tmp_path / "env.py").write_text(
        "import json\nfrom rollout import Environment\n"
        f"env = Environment.from_spec(json.loads({json.dumps(REFUND)!r}))\n"
    )
    out = tmp_path / "exported"
    assert main(["env", "export-verifiers", str(tmp_path / "env.py"), "-o", str(out)]) == 0
    path = out / "qa_rollout.py"
    assert str(path) in capsys.readouterr().out
    monkeypatch.syspath_prepend(str(out))
    module = importlib.import_module("qa_rollout")

    # The peer's side: verifiers' own loader sees our tasks, and our verifier is its reward.
    taskset = vf.load_taskset(vf.TasksetConfig(id="qa_rollout"))
    tasks = list(taskset)
    assert [t.data.prompt for t in tasks] == ["Say hello", "Say goodbye"]
    for reply, expected in (("hello there", 1.0), ("bye", 0.0)):
        task = tasks[0]
        trace = vf.Trace(
            task=vf.TraceTask(type="RolloutTask", data=task.data, key=task.key, hash=task.hash),
            agent=vf.AgentInfo(config=vf.AgentConfig(), name="t", trainable=False),
            root_reply=reply,
        )
        await task.score(trace)
        ours = await score(spec, 0, _trajectory(reply))
        assert trace.reward == ours.score == expected
    assert isinstance(module.load_taskset(), vf.Taskset)
    env = module.load_environment()  # verifiers' own Env around the taskset
    assert isinstance(env, vf.Env) and len(list(env.taskset)) == 2

    # And back: the exported module loads as a rollout env (in a plugin host) with our tasks.
    back = environment("qa_rollout").to_spec()
    assert [t.instruction for t in back.tasks] == ["Say hello", "Say goodbye"]
