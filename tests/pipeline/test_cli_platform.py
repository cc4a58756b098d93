"""The platform verbs through the real `rollout` CLI (a subprocess) against in-process services."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import pytest
from fakes.openai_server import FakeOpenAI, Reply, tool_reply
from pipeline.kit import refund_agent, refund_env
from waiting import wait_until

from rollout.errors import RolloutError
from rollout.services.tracker.servable import TIMEOUT_ENV
from rollout.shared.contracts.requests import CreateRun
from rollout.shared.settings import Settings
from rollout.shared.stats import format_interval, newcombe_interval, wilson_interval

ROOT = Path(__file__).resolve().parents[2]


async def rollout(settings: Settings, *args: str) -> tuple[int, str, str]:
    """Run `rollout ARGS` pointed at the test's NATS; return (exit code, stdout, stderr)."""
    env = {
        **os.environ,
        "ROLLOUT_HOME": str(settings.home),
        "ROLLOUT_NATS_URL": settings.nats_url,
        "ROLLOUT_NATS_USER": settings.nats_user or "",
        "ROLLOUT_NATS_PASSWORD": settings.nats_password or "",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rollout.cli", *args,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 180)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"`rollout {' '.join(args)}` did not finish within 180 s") from None
    return proc.returncode or 0, out.decode(), err.decode()


async def test_push_run_compare_replay_through_the_cli(
    client, agent_server, settings, tmp_path
) -> None:
    env_file = tmp_path / "refunds.py"
    env_file.write_text(f"env = {refund_env(tasks=2)!r}\n")
    code, out, err = await rollout(settings, "push", str(ROOT / "examples" / "refund_agent.py"))
    assert code == 0 and "refund-agent v1 registered" in out, err
    assert "warning" not in err
    # A weak verifier is pushed all the same, with what it lets through named by path.
    code, out, err = await rollout(settings, "push", str(ROOT / "tests/audit/weak_envs.py"))
    assert code == 0 and "weak-called v1 registered" in out, err
    assert (
        "warning: weak-called: verifier.primitives[0] (refunded, tool_was_called): no `args`" in err
    )
    await client.push_environment(refund_env(tasks=2))

    model = f"{agent_server.base_url}#m"
    code, out, err = await rollout(
        settings, "run", "refunds", "--model", model, "-n", "4", "--follow", "--json"
    )
    assert code == 0, err
    base = json.loads(out)
    assert (base["status"], base["scored"]) == ("completed", 8)
    code, out, err = await rollout(
        settings, "run", "refunds", "--model", model, "-n", "4", "--seed", "7", "--follow", "--json"
    )
    other = json.loads(out)

    code, out, err = await rollout(settings, "runs", "--json")
    assert code == 0 and {r["runId"] for r in json.loads(out)["runs"]} == {
        base["runId"],
        other["runId"],
    }
    code, out, err = await rollout(settings, "compare", base["runId"], other["runId"], "--json")
    assert code == 0, err
    cmp = json.loads(out)
    assert cmp["deltaPassRate"] == other["passRate"] - base["passRate"]
    assert [t["taskIndex"] for t in cmp["tasks"]] == [0, 1]
    # 95% intervals: Wilson per run over its scored rollouts, Newcombe for the difference.
    # Four samples per task are not four independent trials: the counts are divided by each
    # run's design effect over its two tasks (1 when the samples vary as much within a task).
    b, o = cmp["base"]["designEffect"], cmp["other"]["designEffect"]
    assert b >= 1.0 and o >= 1.0
    assert cmp["base"]["passRateInterval"] == list(wilson_interval(base["passed"] / b, 8 / b))
    assert cmp["deltaPassRateInterval"] == list(
        newcombe_interval(base["passed"] / b, 8 / b, other["passed"] / o, 8 / o)
    )
    assert cmp["warnings"] == []  # same env version, split and tasks
    code, out, err = await rollout(settings, "compare", base["runId"], other["runId"])
    assert code == 0 and "pass rate" in out and "TASK" in out
    assert "95% CI" in out and format_interval(cmp["base"]["passRateInterval"]) in out
    assert "warning" not in err

    code, out, err = await rollout(settings, "replay", base["runId"], "--reverify", "--json")
    assert code == 0, err
    replayed = json.loads(out)
    assert replayed["run"]["scored"] == 8 and replayed["changed"] == []
    assert replayed["run"]["passRate"] == base["passRate"]

    code, out, err = await rollout(settings, "show", base["runId"])
    assert code == 0 and base["runId"] in out and "TASK" in out
    code, out, err = await rollout(settings, "show", base["runId"], "--rollouts")
    assert code == 0, err
    # Each rollout with its typed outcome (the scripted agent's seeds decide which pass).
    lines = [line for line in out.splitlines() if " task " in line]
    assert len(lines) == 8 and not any("  ERR   " in line for line in lines)
    assert sum("  PASS  " in line for line in lines) == base["passed"]
    assert sum("  FAIL  " in line for line in lines) == 8 - base["passed"]
    assert f"failed {8 - base['passed']}  errored 0" in out


async def test_cli_errors_are_clear_and_exit_1_or_2(client, settings) -> None:
    code, out, err = await rollout(settings, "run", "no-such-env", "--model", "openai/x")
    assert code == 1 and "no environment 'no-such-env'" in err and "Traceback" not in err
    code, out, err = await rollout(settings, "show", "nope")
    assert code == 1 and "no run 'nope'" in err and "Traceback" not in err
    code, out, err = await rollout(settings, "run", "x")  # --model missing
    assert code == 2 and "--model" in err
    code, out, err = await rollout(settings, "push", "/does/not/exist.py")
    assert code == 1 and "no such file" in err and "Traceback" not in err


async def test_a_push_that_fails_midway_names_the_envs_it_pushed(client, settings, tmp_path):
    # Two envs in one file, the second too large: the first was registered, and the error
    # alone (nats' traceback before that) read as if nothing had been pushed.
    small, big = refund_env(tasks=1, slug="first-ok"), refund_env(tasks=1, slug="second-big")
    big["config"]["fixtures"]["blob"] = "x" * 2_000_000
    env_file = tmp_path / "two.py"
    env_file.write_text(
        "from rollout import Environment\n"
        f"a = Environment.from_spec({small!r})\nb = Environment.from_spec({big!r})\n"
    )
    code, out, err = await rollout(settings, "push", str(env_file))
    assert code == 1 and "Traceback" not in err, err
    assert err.startswith("error: environment 'second-big' is too large to push: 2,000,"), err
    assert err.endswith("  - pushed before it: first-ok v1 registered\n"), err
    assert [e["slug"] for e in await client.list_environments()] == ["first-ok"]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        # Accepted, then its run.requested stopped the read models' projection (an int column).
        (["--max-tool-calls", "99999999999999"], "max_tool_calls: must be between 0 and 1024"),
        # Accepted, then overflowed the tracker's deadline sweep (a timestamp plus an interval).
        (["--deadline", "1e300"], "deadline_s: must be a positive number of seconds up to"),
        (["--seed", str(10**23)], "seed: must be a 64-bit integer"),
        (["--env-version", str(10**20)], f"env_version: no environment has version {10**20}"),
        # pydantic's own report ("1 validation error for CreateRun ... errors.pydantic.dev").
        (["--env-version", "-3"], "env_version: Input should be greater than or equal to 1"),
        (["--name", "x" * 5000], "name: at most 200 characters, got 5000"),
    ],
)
async def test_run_options_out_of_range_are_named_and_record_nothing(
    client, agent_server, settings, flags: list[str], said: str
) -> None:
    await client.push_environment(refund_env(tasks=1))
    model = f"{agent_server.base_url}#m"
    code, out, err = await rollout(settings, "run", "refunds", "--model", model, *flags)
    assert code == 1 and out == "", (out, err)
    assert err.startswith("error: invalid run request\n") and f"  - {said}" in err, err
    assert "pydantic" not in err and "Traceback" not in err and "cmd." not in err, err
    assert await client.list_runs() == []


async def test_the_tracker_refuses_options_a_client_did_not_check(client) -> None:
    # Another client (an older CLI, a script) sends what this one refuses: the tracker says no.
    await client.push_environment(refund_env(tasks=1))
    for option in ({"max_tool_calls": 10**14}, {"deadline_s": 1e300}, {"top_p": 5.0}):
        body = CreateRun(env_slug="refunds", model="local/scripted", **option)
        with pytest.raises(RolloutError) as caught:
            await client.request("tracker", "create_run", body)
        assert f"{next(iter(option))}: must be" in " ".join(caught.value.problems), caught.value
    assert await client.list_runs() == []


async def test_run_and_generate_take_slug_at_version(client, agent_server, settings, tmp_path):
    await client.push_environment(refund_env(tasks=2))
    await client.push_environment(refund_env(tasks=3))  # v2, the newest
    model = f"{agent_server.base_url}#m"
    code, out, err = await rollout(settings, "run", "refunds@1", "--model", model, "--json")
    assert code == 0, err
    run = json.loads(out)
    assert (run["env_version"], len(run["task_indices"])) == (1, 2)
    out_file = tmp_path / "v1.jsonl"
    code, out, err = await rollout(
        settings, "generate", "--env", "refunds@1", "--model", model, "--out", str(out_file),
        "--json",
    )  # fmt: skip
    assert code == 0, err
    assert {json.loads(line)["env_version"] for line in out_file.read_text().splitlines()} == {1}
    for args, said in [
        (["run", "refunds@x"], "SLUG refunds@x: version 'x' must be a whole number >= 1"),
        (["run", "refunds@1", "--env-version", "2"], "names version 1, but --env-version is 2"),
        (["generate", "--env", "refunds@0", "--out", str(tmp_path / "x.jsonl")], "--env refunds@0"),
    ]:
        code, out, err = await rollout(settings, *args, "--model", model)
        assert code == 1 and said in err and "Traceback" not in err, err
    assert "--env-version N" in err


def unused_port() -> int:
    """A local port nothing listens on: a model server that refuses connections."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def half_broken_agent(body: dict) -> Reply:
    """The refund agent, but a 400 for order O-1: that task's rollouts error, the others don't."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    if "O-1 " in user:
        return Reply({"error": {"message": "context length exceeded"}}, status=400)
    return refund_agent(body)


async def test_a_run_whose_every_rollout_errored_fails_and_says_why(
    client, agent_server, settings, monkeypatch
) -> None:
    # The endpoint goes down after the run is accepted: the actors' check at creation
    # (test_model_check.py) is off, so the run starts and every rollout errors.
    monkeypatch.setenv(TIMEOUT_ENV, "0")
    await client.push_environment(refund_env(tasks=2))
    down = f"http://127.0.0.1:{unused_port()}/v1?retries=1#m"  # one retry: the backoff is not what is tested
    code, out, err = await rollout(settings, "run", "refunds", "--model", down, "-n", "2", "-f")
    # Not "completed ... exit 0": nothing was measured, and the first error says why.
    assert code == 1, (out, err)
    assert "error: every rollout of run" in err and "errored (4 of 4)" in err
    assert "cannot reach" in err and "Traceback" not in err
    assert "every rollout errored (4 of 4): no verdict" in out
    assert "pass rate -  mean score -" in out
    kinds = [line for line in out.splitlines() if "cannot reach" in line]
    assert len(kinds) == 1 and kinds[0].strip().startswith("model 4: "), out
    assert "ended by: model" not in out and "errored 4" in out
    run_id = out.split()[1]  # "run ID: refunds v1 × ..."
    run_id = run_id.rstrip(":")

    code, out, err = await rollout(settings, "run", "refunds", "--model", down, "-f", "--json")
    assert code == 1 and "error: every rollout of run" in err
    followed = json.loads(out)
    assert followed["errorSummary"]["allErrored"] is True
    assert followed["errorSummary"]["firstError"]["kind"] == "model"

    code, out, err = await rollout(settings, "show", run_id, "--json")
    assert code == 0, err
    shown = json.loads(out)
    summary = shown["errorSummary"]
    assert (summary["errored"], summary["outOf"], summary["complete"]) == (4, 4, True)
    assert summary["allErrored"] and summary["mostlyErrored"]
    assert [(k["kind"], k["count"]) for k in summary["kinds"]] == [("model", 4)]
    assert "cannot reach" in summary["kinds"][0]["sample"]
    assert "model" not in shown["endedBy"]
    code, out, err = await rollout(settings, "show", run_id)
    assert code == 0 and "every rollout errored (4 of 4)" in out
    assert f"model 4: {down}: gave up after" in out and "cannot reach" in out
    # A task with no verdict has no pass rate either.
    assert [line.split()[2] for line in out.splitlines() if line.startswith("      ")] == ["-", "-"]

    # Against a run that measured something, compare refuses to call the gap a regression.
    model = f"{agent_server.base_url}#m"
    code, out, err = await rollout(settings, "run", "refunds", "--model", model, "-n", "2", "-f")
    assert code == 0, err
    good = out.splitlines()[0].split()[1].rstrip(":")
    code, out, err = await rollout(settings, "compare", good, run_id)
    assert code == 1 and "pass rate" not in out, out
    assert "error: not comparable: over 50% of the rollouts errored (other " in err
    assert f"other {run_id}: 4 of 4 rollouts errored (model 4): {down}: gave up" in err
    assert "--allow-errored" in err and "Traceback" not in err
    code, out, err = await rollout(settings, "compare", good, run_id, "--json")
    assert code == 1 and "error: not comparable" in err
    result = json.loads(out)
    assert result["measured"] is False and result["mostlyErrored"] == ["other"]
    assert result["other"]["errorSummary"]["kinds"][0]["count"] == 4
    assert result["other"]["judged"] == 0 and result["base"]["errorSummary"] is None
    # Nothing judged: the interval says nothing is known, not "0%".
    assert result["other"]["passRateInterval"] == [0.0, 1.0]
    assert all(t["otherPassRate"] is None for t in result["tasks"])
    code, out, err = await rollout(settings, "compare", good, run_id, "--allow-errored")
    assert code == 0 and "pass rate" in out, err
    assert "warning: NOT A MEASUREMENT: most rollouts of other errored" in err
    assert f"warning: other {run_id}: 4 of 4 rollouts errored" in err
    rate = next(line for line in out.splitlines() if line.startswith("pass rate"))
    assert rate.split()[3] == "-", rate  # no verdict: no rate, not 0%


async def test_show_and_follow_give_the_pass_rate_with_its_interval(
    client, agent_server, settings
) -> None:
    await client.push_environment(refund_env(tasks=2))
    model = f"{agent_server.base_url}#m"
    code, out, err = await rollout(settings, "run", "refunds", "--model", model, "-n", "4", "-f")
    assert code == 0, err
    run_id = out.splitlines()[0].split()[1].rstrip(":")
    code, out_cmp, err = await rollout(settings, "compare", run_id, run_id, "--json")
    interval = json.loads(out_cmp)["base"]["passRateInterval"]
    # The same interval `rollout compare` gives (its samples counted as compare counts them).
    assert f"% {format_interval(interval)}  mean score" in out, out
    code, out, err = await rollout(settings, "show", run_id)
    assert code == 0 and f"% {format_interval(interval)}  mean score" in out, out
    code, out, err = await rollout(settings, "show", run_id, "--json")
    assert json.loads(out)["passRateInterval"] == interval
    # A run rebuilt from its events says the same (it printed a bare "pass rate 75.0%").
    code, out, err = await rollout(settings, "replay", run_id)
    assert code == 0 and f"% {format_interval(interval)}  mean score" in out, out
    code, out, err = await rollout(settings, "replay", run_id, "--json")
    assert json.loads(out)["run"]["passRateInterval"] == pytest.approx(interval)


def task_0_only_agent(body: dict) -> Reply:
    """The refund agent, but one cent too much for order O-1: task 0 always passes, 1 never."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    if "O-1 " in user and not any(m["role"] == "tool" for m in body["messages"]):
        return tool_reply(("refund", {"order_id": "O-1", "amount": 10.01}))
    return refund_agent({**body, "seed": 1})


async def test_runs_gives_each_pass_rate_the_interval_show_gives(client, settings) -> None:
    await client.push_environment(refund_env(tasks=2))
    errored = f"http://127.0.0.1:{unused_port()}/v1?retries=1#m"
    with FakeOpenAI(task_0_only_agent) as server:
        model = f"{server.base_url}#m"
        code, out, err = await rollout(settings, "run", "refunds", "--model", model, "-n", "4",
                                       "-f", "--json")  # fmt: skip
        assert code == 0, err
        clustered = json.loads(out)
        code, out, err = await rollout(settings, "run", "refunds", "--model", model, "-f", "--json")
        assert code == 0, err
        single = json.loads(out)
    # 4 of 8 passed, but all of task 0 and none of task 1: two independent trials, not eight.
    assert (clustered["passed"], clustered["scored"]) == (4, 8)
    assert clustered["passRateInterval"] != list(wilson_interval(4, 8))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TIMEOUT_ENV, "0")  # the run starts on the dead endpoint: nothing judged
        code, out, err = await rollout(settings, "run", "refunds", "--model", errored, "-f")
    assert code == 1, (out, err)

    code, out, err = await rollout(settings, "runs", "--json")
    assert code == 0, err
    listed = {r["runId"]: r for r in json.loads(out)["runs"]}
    for run in (clustered, single):
        code, shown, err = await rollout(settings, "show", run["runId"], "--json")
        shown = json.loads(shown)
        # The same interval and design effect as `rollout show --json`, for each listed run.
        assert listed[run["runId"]]["passRateInterval"] == shown["passRateInterval"], shown
        assert listed[run["runId"]]["designEffect"] == pytest.approx(shown["designEffect"])
    [dead] = [r for r in listed.values() if r["runId"] not in (clustered["runId"], single["runId"])]
    assert dead["passRateInterval"] is None  # no verdict: no interval, as show says

    code, out, err = await rollout(settings, "runs")
    assert code == 0, err
    header, *rows = out.splitlines()
    assert "PASS 95% CI" in header
    rows_by_id = {row.split()[0]: row for row in rows}
    for run in (clustered, single):
        assert f"% {format_interval(run['passRateInterval'])} " in rows_by_id[run["runId"]]
    assert rows_by_id[dead["runId"]].split()[5:7] == ["-", "-"]  # PASS and 95% CI


async def test_ctrl_c_while_following_a_run_says_the_run_goes_on(client, settings) -> None:
    await client.push_environment(refund_env(tasks=1))
    env = {
        **os.environ,
        "ROLLOUT_HOME": str(settings.home),
        "ROLLOUT_NATS_URL": settings.nats_url,
        "ROLLOUT_NATS_USER": settings.nats_user or "",
        "ROLLOUT_NATS_PASSWORD": settings.nats_password or "",
    }
    with FakeOpenAI([Reply({"error": {"message": "never sent"}}, 400)]) as server:
        server.hold()  # the run's first model call waits: the CLI is following it then
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rollout.cli", "run", "refunds", "--model",
            f"{server.base_url}#m", "-f",
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await wait_until(lambda: server.held_ports, "the run's first model call")
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        server.release()
    assert proc.returncode == 130
    run_id = out.decode().split()[1].rstrip(":")
    assert f"interrupted: run {run_id} goes on" in err.decode(), err.decode()
    assert f"`rollout cancel {run_id}` stops it" in err.decode()
    assert "Traceback" not in err.decode()


async def test_a_partly_errored_run_names_its_errors_and_still_compares(
    client, agent_server, settings
) -> None:
    await client.push_environment(refund_env(tasks=3))
    with FakeOpenAI(half_broken_agent) as server:
        code, out, err = await rollout(
            settings, "run", "refunds", "--model", f"{server.base_url}#m", "-n", "2", "-f",
            "--json",
        )  # fmt: skip
    assert code == 0, err  # some verdicts: a measurement, with its errors named
    run = json.loads(out)
    summary = run["errorSummary"]
    assert (summary["errored"], summary["outOf"], summary["allErrored"]) == (2, 6, False)
    assert summary["kinds"][0]["kind"] == "model" and summary["kinds"][0]["count"] == 2
    assert summary["firstError"]["taskIndex"] == 1
    code, out, err = await rollout(settings, "show", run["runId"])
    assert code == 0 and "2 of 6 rollouts errored (no verdict" in out, out
    # The tracker selects rollouts by outcome: the outcomes partition the run.
    every = (await client.get_run(run["runId"], True))["rollouts"]
    for outcome in ("passed", "failed", "errored", "pending"):
        picked = (await client.get_run(run["runId"], True, outcome=outcome))["rollouts"]
        assert picked == [
            r for r in every if r["outcome"] == (outcome if outcome != "pending" else None)
        ]
    errored = await client.errored_rollouts(run["runId"], 2)
    assert [(r["taskIndex"], r["errorKind"]) for r in errored] == [(1, "model"), (1, "model")]
    with pytest.raises(RolloutError, match="invalid run query"):
        await client.get_run(run["runId"], True, outcome="lost")
    assert f"pass rate {run['passRate']:.1%}" in out

    model = f"{agent_server.base_url}#m"
    code, out, err = await rollout(settings, "run", "refunds", "--model", model, "-n", "2", "-f")
    good = out.splitlines()[0].split()[1].rstrip(":")
    code, out, err = await rollout(settings, "compare", good, run["runId"], "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["measured"] is True and result["other"]["judged"] == 4
    assert any(
        w.startswith(f"other {run['runId']}: 2 of 6 rollouts errored") for w in result["warnings"]
    )
    # The interval is over the 4 verdicts, as the pass rate is (as independent trials as the
    # task clustering leaves: its design effect).
    effect = result["other"]["designEffect"]
    assert result["other"]["passRateInterval"] == list(
        wilson_interval(run["passed"] / effect, 4 / effect)
    )
    task_1 = next(t for t in result["tasks"] if t["taskIndex"] == 1)
    assert task_1["otherPassRate"] is None and task_1["deltaPassRate"] is None
    code, out, err = await rollout(settings, "compare", good, run["runId"])
    assert code == 0 and "2 errored left out" in out
    assert "rollouts errored (model 2)" in err and "NOT A MEASUREMENT" not in err


async def test_list_flags_and_ids_are_checked(client, settings) -> None:
    for args in (("runs", "--limit", "0"), ("runs", "--limit", "-1"), ("jobs", "--limit", "-1")):
        code, out, err = await rollout(settings, *args)
        assert code == 1 and "error: --limit: must be between 1 and 1000" in err, (args, err)
    code, out, err = await rollout(settings, "runs", "--env", "nosuch")
    assert code == 1 and "error: --env: no environment 'nosuch'" in err
    await client.push_environment(refund_env(tasks=1))
    code, out, err = await rollout(settings, "runs", "--env", "refunds")
    assert code == 0 and "no runs of refunds yet" in out
    code, out, err = await rollout(settings, "job", "job-../../x")
    assert code == 1 and err.startswith("error: job id 'job-../../x' must be")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
