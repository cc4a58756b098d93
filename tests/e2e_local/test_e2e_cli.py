"""`rollout test` as a command: text report, flags, exit codes, and clear errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fakes.openai_server import FakeOpenAI, by_conversation, error_reply, text_reply, tool_reply

REFUND = """
    from rollout import Environment, Task

    env = Environment(
        slug="refund-agent",
        template="workflow",
        config={
            "tools": [
                {"name": "lookup_order", "kind": "lookup", "fixturePath": "orders.${args.order_id}"},
                {"name": "refund", "kind": "action", "appendTo": "refunds",
                 "value": {"order_id": "${args.order_id}", "amount": "${args.amount}"}},
            ],
            "fixtures": {"orders": {"O-1": {"customer": "Alice", "amount": 100}}},
            "initialMutableState": {"refunds": []},
        },
        tasks=[
            Task(instruction="Refund order O-1 for $100 for Alice",
                 hidden_ground_truth={"refunds": [{"order_id": "O-1", "amount": 100.0}]}),
            Task(instruction="Refund order O-2 for $5",
                 hidden_ground_truth={"refunds": [{"order_id": "O-2", "amount": 5}]}),
        ],
    )
"""

GOOD_RUN = [
    tool_reply(("lookup_order", {"order_id": "O-1"})),
    tool_reply(("refund", {"order_id": "O-1", "amount": 100})),
    text_reply("Refunded $100 to Alice."),
]


def test_text_report_shows_verdict_trace_reasons_and_summary(rollout_test) -> None:
    run = rollout_test(REFUND, GOOD_RUN, "--task", "0", json_output=False)
    assert run.code == 0
    out = run.stdout
    assert "refund-agent (workflow) · openai/scripted · 1 task(s)" in out
    assert "[0] PASS  score 1.00  Refund order O-1 for $100 for Alice" in out
    assert '1. lookup_order({"order_id": "O-1"}) -> {"customer": "Alice", "amount": 100}' in out
    assert '2. refund({"order_id": "O-1", "amount": 100}) ->' in out
    assert "final answer: Refunded $100 to Alice." in out
    assert "✓ state (state_match, w=1, score 1.00):" in out
    assert "refund-agent: 1/1 passed · mean score 1.00" in out


def test_text_report_shows_failures_and_tool_errors(rollout_test) -> None:
    run = rollout_test(
        REFUND,
        [tool_reply(("lookup_order", {"order_id": "O-7"})), text_reply("No such order.")],
        "--task",
        "0",
        json_output=False,
    )
    assert run.code == 0
    assert "[0] FAIL  score 0.00" in run.stdout
    assert '1. lookup_order({"order_id": "O-7"}) -> error:' in run.stdout
    assert "✗ state (state_match" in run.stdout
    assert "0/1 passed" in run.stdout


def test_sampling_flags_reach_the_model(rollout_test) -> None:
    run = rollout_test(
        REFUND,
        GOOD_RUN,
        "--task",
        "0",
        "--temperature",
        "0.7",
        "--top-p",
        "0.5",
        "--max-tokens",
        "256",
        "--seed",
        "42",
        "--system-prompt",
        "You are terse.",
    )
    assert run.code == 0
    first = run.server.chat_bodies[0]
    assert (first["temperature"], first["top_p"], first["max_tokens"], first["seed"]) == (
        0.7,
        0.5,
        256,
        42,
    )
    assert first["messages"][0] == {"role": "system", "content": "You are terse."}
    assert first["model"] == "scripted"
    assert run.server.requests[0].headers["Authorization"] == "Bearer sk-e2e"


def test_max_tool_calls_flag_stops_the_episode(rollout_test) -> None:
    lookup = ("lookup_order", {"order_id": "O-1"})
    run = rollout_test(
        REFUND,
        [tool_reply(lookup), tool_reply(lookup), tool_reply(lookup)],
        "--task",
        "0",
        "--max-tool-calls",
        "1",
        json_output=False,
    )
    assert run.code == 0
    assert "stopped: max_tool_calls" in run.stdout
    assert len(run.server.chat_bodies) == 2


def test_malformed_model_arguments_are_tool_errors_not_crashes(rollout_test) -> None:
    run = rollout_test(
        REFUND,
        [
            tool_reply(("refund", '{"order_id": "O-1", "amount": 1')),
            tool_reply(("teleport", {})),
            text_reply("Gave up."),
        ],
        "--task",
        "0",
    )
    assert run.code == 0
    task = run.task()
    assert task["status"] == "FAIL"
    errors = [c["error"] for c in task["toolCalls"]]
    assert "invalid JSON arguments for 'refund'" in errors[0]
    assert "unknown tool 'teleport'" in errors[1]


def test_model_request_failure_marks_the_task_error_and_exits_1(rollout_test) -> None:
    run = rollout_test(REFUND, [error_reply(400, "maximum context length exceeded")], "--task", "0")
    assert run.code == 1
    task = run.task()
    assert task["status"] == "ERROR" and "maximum context length exceeded" in task["error"]
    assert run.report["ok"] is False and run.report["summary"]["errors"] == 1


def test_an_errored_task_has_no_score_and_stays_out_of_the_mean(rollout_test) -> None:
    # Task 0 passes; task 1's model request fails. Its unfinished episode is no verdict: it
    # showed "score 0.25" (an idle episode's credit) and pulled the mean score down with it.
    script = by_conversation({"O-1": GOOD_RUN, "O-2": [error_reply(400, "context too long")]})
    run = rollout_test(REFUND, script)
    assert run.code == 1
    tasks = run.report["environments"][0]["tasks"]
    assert [(t["status"], t["score"]) for t in tasks] == [("PASS", 1.0), ("ERROR", None)]
    summary = run.report["summary"]
    assert (summary["passRate"], summary["meanScore"], summary["errors"]) == (1.0, 1.0, 1)
    run = rollout_test(REFUND, [error_reply(400, "context too long")], "--task", "1",
                       json_output=False)  # fmt: skip
    assert run.code == 1 and "[1] ERROR  score -  Refund order O-2" in run.stdout, run.stdout
    assert "verifier: no verdict (the task errored)" in run.stdout
    assert "0/1 passed · mean score - · 1 error(s)" in run.stdout, run.stdout


def test_bad_api_key_is_a_clear_error(rollout_test) -> None:
    run = rollout_test(REFUND, GOOD_RUN, "--task", "0", api_key="sk-wrong", json_output=False)
    assert run.code == 1
    assert "authentication failed (HTTP 401" in run.stderr
    assert "check OPENAI_API_KEY" in run.stderr
    assert "Traceback" not in run.stderr


def closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rollout_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    """`rollout ARGV` in this process: (exit code, stdout, stderr)."""
    from rollout.cli import main

    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_dead_endpoint_is_one_line_before_any_task(tmp_path: Path, capsys) -> None:
    env_file = tmp_path / "refund_env.py"
    env_file.write_text(textwrap.dedent(REFUND))
    url = f"http://127.0.0.1:{closed_port()}/v1"
    started = time.monotonic()
    code, out, err = rollout_cli(capsys, "test", str(env_file), "--model", f"{url}#m")
    # Not each task's retries (about 12 s each) and then a report of errors: one line, at once.
    assert time.monotonic() - started < 6
    assert code == 1 and out == "" and "Traceback" not in err
    [line] = err.splitlines()
    assert line.startswith(f"error: model {url}#m: cannot reach {url}: ConnectError"), line
    assert "is its server running and the URL right?" in line
    assert line.endswith("(its URL comes from --model; no task was run)"), line
    code, out, err = rollout_cli(capsys, "test", str(env_file), "--model", f"{url}#m", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and f"cannot reach {url}" in doc["error"]


@pytest.mark.parametrize(
    ("status", "said"),
    [
        (404, "not found (HTTP 404: no such route); check the model name 'm' and the base URL"),
        (500, "answers HTTP 500 (no such route): the server is up but failing; see its logs"),
    ],
)
def test_an_endpoint_without_a_working_chat_route_is_one_line_before_any_task(
    tmp_path: Path, capsys, monkeypatch, status: int, said: str
) -> None:
    env_file = tmp_path / "refund_env.py"
    env_file.write_text(textwrap.dedent(REFUND))
    broken = error_reply(status, "no such route")
    with FakeOpenAI([broken] * 20, models=broken) as server:
        code, out, err = rollout_cli(
            capsys, "test", str(env_file), "--model", f"{server.base_url}#m"
        )
        assert code == 1 and out == "" and "Traceback" not in err
        [line] = err.splitlines()
        assert line.startswith(f"error: model {server.base_url}#m: ") and said in line, line
        assert line.endswith("(its URL comes from --model; no task was run)"), line
        # The model list, then the chat route asked for one token: no task's request was sent.
        sent = [(r.method, r.path, (r.body or {}).get("max_tokens")) for r in server.requests]
        assert sent == [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", 1)], sent

        # The same for a provider's model on an endpoint set by OPENAI_BASE_URL.
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-any")
        code, out, err = rollout_cli(capsys, "test", str(env_file), "--model", "openai/m")
    [line] = err.splitlines()
    assert code == 1 and line.startswith("error: model openai/m: ") and said in line, line
    assert line.endswith("(its URL comes from OPENAI_BASE_URL; no task was run)"), line


def test_unknown_model_lists_valid_forms(rollout_test) -> None:
    run = rollout_test(REFUND, [], model="gemini/pro")
    assert run.code == 1
    doc = json.loads(run.stdout)
    assert doc["ok"] is False and "unknown model 'gemini/pro'" in doc["error"]
    assert "openai/" in doc["error"] and "hf:" in doc["error"]


def test_invalid_environment_lists_every_problem(rollout_test) -> None:
    source = """
        from rollout import Environment, Task

        env = Environment(
            slug="broken",
            template="workflow",
            config={"tools": [{"name": "get", "kind": "lookup", "fromArray": "orderz",
                               "matchField": "id"}],
                    "fixtures": {"orders": []}},
            tasks=[Task(instruction="x", hidden_ground_truth={})],
            verifier=[{"name": "p", "type": "no_such_primitive"}],
        )
    """
    run = rollout_test(source, [])
    assert run.code == 1
    doc = json.loads(run.stdout)
    assert "invalid environment" in doc["error"]
    joined = "\n".join(doc["problems"])
    assert "orderz" in joined and "no_such_primitive" in joined
    assert run.server.requests == []  # nothing was sent to the model


def test_task_out_of_range(rollout_test) -> None:
    run = rollout_test(REFUND, [], "--task", "5", json_output=False)
    assert run.code == 1
    assert "--task 5: 'refund-agent' has 2 task(s)" in run.stderr


def test_unknown_split(rollout_test) -> None:
    run = rollout_test(REFUND, [], "--split", "holdout", json_output=False)
    assert run.code == 1 and "no such task" in run.stderr


def test_a_task_outside_the_split_is_named_as_such(rollout_test) -> None:
    # The split exists: "--split test: no such task (splits: ['test', 'train'])" blamed it.
    source = REFUND.replace(
        'hidden_ground_truth={"refunds": [{"order_id": "O-2", "amount": 5}]}',
        'hidden_ground_truth={"refunds": [{"order_id": "O-2", "amount": 5}]}, split="test"',
    )
    assert source != REFUND
    run = rollout_test(source, [], "--split", "test", "--task", "0", json_output=False)
    assert run.code == 1
    assert run.stderr.strip() == (
        "error: --task 0: task 0 of 'refund-agent' is in split 'train', not 'test' "
        "(its test tasks: 1)"
    )


def test_missing_env_file(tmp_path: Path) -> None:
    from rollout.cli import main

    assert main(["test", str(tmp_path / "nope.py"), "--model", "openai/x"]) == 1


@pytest.mark.parametrize(
    "flags",
    [["--limit", "0"], ["--temperature", "hot"], ["--max-tool-calls", "-1"], ["--top-p", "0"]],
)
def test_usage_errors_exit_2(tmp_path: Path, flags: list[str]) -> None:
    from rollout.cli import main

    with pytest.raises(SystemExit) as info:
        main(["test", str(tmp_path / "env.py"), "--model", "openai/x", *flags])
    assert info.value.code == 2


def test_console_script_end_to_end(tmp_path: Path) -> None:
    env_file = tmp_path / "refund_env.py"
    env_file.write_text(textwrap.dedent(REFUND))
    with FakeOpenAI(GOOD_RUN, api_key="sk-sub") as server:
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "sk-sub"}
        rollout = Path(sys.executable).with_name("rollout")
        result = subprocess.run(
            [str(rollout), "test", str(env_file), "--model", "openai/scripted", "--limit", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    assert "[0] PASS" in result.stdout and "1/1 passed" in result.stdout


def test_local_hf_model_end_to_end(tmp_path: Path, rollout_test) -> None:
    # An untrained tiny model babbles: whatever it emits, the run completes and is scored.
    from rollout.shared.models.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "tiny", seed=1)
    run = rollout_test(
        REFUND, [], "--max-tokens", "12", "--temperature", "1", model=f"hf:{model_dir}"
    )
    assert run.code == 0, run.stdout + run.stderr
    tasks = run.report["environments"][0]["tasks"]
    assert [t["status"] for t in tasks] == ["FAIL", "FAIL"]
    assert run.report["model"] == f"hf:{model_dir}"
    assert run.server.requests == []


TWO_ENVS = """
    from rollout import Environment, Task

    def make(slug, answer):
        return Environment(
            slug=slug,
            template="custom",
            config={"tools": [{"name": "answer", "response": "ok",
                               "mutates": [{"path": "answers[]", "value": "${args.text}"}]}],
                    "initialMutableState": {"answers": []}},
            tasks=[Task(instruction=f"Answer {answer} for {slug}",
                        hidden_ground_truth={"answers": [answer]})],
        )

    envs = [make("alpha", "a"), make("beta", "b")]
"""


def test_every_environment_in_the_file_or_one_by_slug(rollout_test) -> None:
    from fakes.openai_server import by_conversation

    script = by_conversation(
        {
            "alpha": [tool_reply(("answer", {"text": "a"})), text_reply("done")],
            "beta": [tool_reply(("answer", {"text": "wrong"})), text_reply("done")],
        }
    )
    run = rollout_test(TWO_ENVS, script, json_output=False)
    assert run.code == 0
    assert "alpha: 1/1 passed" in run.stdout and "beta: 0/1 passed" in run.stdout
    assert "all: 1/2 passed · mean score 0.50" in run.stdout

    only = rollout_test(TWO_ENVS, script, "--slug", "beta")
    assert [e["slug"] for e in only.report["environments"]] == ["beta"]
    missing = rollout_test(TWO_ENVS, script, "--slug", "gamma", json_output=False)
    assert missing.code == 1 and "no environment with slug 'gamma'" in missing.stderr


def test_a_plugin_state_that_raises_is_printed(tmp_path: Path, capsys) -> None:
    # state() raising was scored as an empty state: the report said only "value: missing",
    # never that the author's state() had failed, nor why.
    from rollout.cli import main

    (tmp_path / "state_pkg_h42").mkdir()
    (tmp_path / "state_pkg_h42" / "__init__.py").write_text("")
    (tmp_path / "state_pkg_h42" / "envs.py").write_text(
        textwrap.dedent(
            """
            class Broken:
                def tools(self):
                    return []

                def reset(self, task):
                    pass

                def step(self, name, arguments):
                    return None

                def state(self):
                    raise KeyError("boom")


            def make(options):
                return Broken()
            """
        )
    )
    (tmp_path / "env.py").write_text(
        "from rollout import Environment, Task, plugin_config\n"
        "env = Environment(slug='broken-state', template='plugin',\n"
        "    config=plugin_config('state_pkg_h42.envs:make', {}),\n"
        "    tasks=[Task(instruction='x', hidden_ground_truth={'value': 1})])\n"
    )
    assert main(["test", str(tmp_path / "env.py"), "--model", "local/scripted"]) == 0
    out = capsys.readouterr().out
    assert "    state() failed: KeyError: 'boom' (scored without a state)\n" in out, out
    assert "value: missing (expected 1)" in out
