"""`rollout audit`: every example env passes its own audit, the weak envs show each class of
finding with its primitive and fix, a hostile env ends with reasons, and usage errors exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes.openai_server import FakeOpenAI

from rollout.cli.audit import report as print_report
from rollout.shared.audit import Policy, View, named
from rollout.shared.audit import audit as run_audit
from rollout.shared.contracts.envspec import VerifierSpec
from rollout.shared.envs import load_environments

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py"))


def audit(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`rollout audit ARGS` in a fresh process, as CI of an env repo runs it."""
    return subprocess.run(
        [sys.executable, "-m", "rollout.cli", "audit", *args],
        capture_output=True, text=True, timeout=timeout, check=False, cwd=HERE,
    )  # fmt: skip


def _examples() -> list[object]:
    # The code-editing env runs pytest in the sandbox for every (task, policy): about a minute.
    return [
        pytest.param(name, marks=pytest.mark.slow) if name == "code_editing_fix.py" else name
        for name in EXAMPLES
    ]


@pytest.mark.parametrize("name", _examples())
def test_every_example_env_passes_its_own_audit(name: str) -> None:
    done = audit(str(ROOT / "examples" / name), "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["ok"] is True
    for env in report["environments"]:
        assert env["hackableTasks"] == [] and env["findings"] == [], env
        assert env["errors"] == [], env["errors"][:3]
        assert env["tasks"] >= 1 and len(env["policies"]) >= 11


def test_the_weak_envs_show_each_class_of_finding() -> None:
    done = audit("weak_envs.py", "--json")
    assert done.returncode == 1, done.stderr
    envs = {e["slug"]: e for e in json.loads(done.stdout)["environments"]}
    assert all(e["hackableTasks"] == [0, 1, 2, 3] for e in envs.values())

    def found(slug: str, policy: str) -> dict:
        return next(f for f in envs[slug]["findings"] if f["policy"] == policy)

    echo = found("weak-echo", "echo_instruction")
    assert echo["passed"] and echo["primitive"] == "mentions"
    assert echo["primitive_type"] == "contains_terms"
    assert "accepts an echo of the instruction" in echo["hint"]
    # A refund of any order passes (one with empty arguments fails: it does not count).
    called = found("weak-called", "wrong_entity")
    assert called["passed"] and called["primitive"] == "refunded"
    assert "give it `args`" in called["hint"]
    # Doing nothing fails the outcome check but still earns 0.8: a partial finding.
    idle = found("weak-weights", "stop_immediately")
    assert not idle["passed"] and idle["score"] == pytest.approx(0.8)
    assert "scored 0.80 while failing refunded" in idle["hint"]
    # Above the threshold only: at 0.9 the weights are no longer a finding.
    stricter = audit("weak_envs.py", "--slug", "weak-weights", "--threshold", "0.9")
    assert stricter.returncode == 0, stricter.stdout
    assert "no task hackable" in stricter.stdout


def test_the_human_report_names_the_primitive_and_the_fix() -> None:
    done = audit("weak_envs.py", "--slug", "weak-called", "--policy", "wrong_entity")
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].startswith("weak-called (workflow): 4 task(s) x 1 policies")
    assert "HACKABLE: 4 of 4 task(s)" in lines[1]
    assert "- wrong_entity: passed 4 task(s) 0-3 via refunded (tool_was_called)" in lines[2]
    assert lines[3].strip().startswith("fix: refunded (tool_was_called) accepts any call")


def test_a_hostile_env_ends_every_episode_with_a_reason() -> None:
    started = time.monotonic()
    done = audit(
        "hostile_env.py", "--json", "--timeout", "3",
        "--policy", "empty_arguments", "--policy", "claim_success", timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    [env] = json.loads(done.stdout)["environments"]
    errors = {(e["task_index"], e["policy"]): e["error"] for e in env["errors"]}
    # Task 0's first tool never returns: the episode is cut at the deadline.
    assert errors[(0, "empty_arguments")].startswith("stalled: no end within 3s")
    assert errors[(1, "empty_arguments")].startswith("stalled: no end within 3s")
    # Task 2's reset raises: the host reports it as the tool's error, the episode ends and is
    # scored (failed); an answer without tools ends normally everywhere.
    assert set(errors) == {(0, "empty_arguments"), (1, "empty_arguments")}
    assert env["hackableTasks"] == [] and env["policyErrors"] == []
    assert time.monotonic() - started < 100


def _divide(view: View) -> object:
    return view.turn / 0


async def test_a_policy_that_crashes_fails_the_audit_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Test-only policies, passed as the CLI passes its --policy choices: one raises, one
    # answers no ChatResponse; a shipped one runs beside them.
    crashing = Policy("divides_by_zero", "raises on its first move", _divide)
    silent = Policy("answers_nothing", "answers None", lambda view: None)
    [env] = load_environments(ROOT / "examples" / "ticket_routing.py")
    audited = await run_audit(
        env.to_spec(), policies=[crashing, silent, named("claim_success")], limit=2
    )
    assert audited.hackable == []
    crashed = [
        "policy divides_by_zero crashed on task(s) 0-1: ZeroDivisionError: division by zero",
        "policy answers_nothing crashed on task(s) 0-1: answered a NoneType, not a ChatResponse",
    ]
    assert audited.policy_errors == crashed
    document = audited.to_json()

    assert print_report([document], as_json=True) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["environments"][0]["policyErrors"] == crashed
    assert out["error"] == "the audit is incomplete: " + "; ".join(crashed)

    assert print_report([document], as_json=False) == 1
    text = capsys.readouterr().out
    assert [line for line in text.splitlines() if "error:" in line] == [
        f"  error: {line}" for line in crashed
    ]
    assert "no task hackable" not in text and "not audited" in text


def test_usage_errors() -> None:
    unknown = audit("weak_envs.py", "--policy", "nope")
    assert unknown.returncode == 2 and "no policy 'nope'" in unknown.stderr
    threshold = audit("weak_envs.py", "--threshold", "2")
    assert threshold.returncode == 2 and "must be a number in [0, 1]" in threshold.stderr
    split = audit("weak_envs.py", "--split", "validation")
    assert split.returncode == 1 and "--split validation: 'weak-echo' has none" in split.stderr
    timeout = audit("weak_envs.py", "--timeout", "0")
    assert timeout.returncode == 2 and "must be seconds in (0, 3600]" in timeout.stderr
    missing = audit("no_such_env.py")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr


async def test_episodes_the_verifier_gave_no_verdict_on_leave_the_audit_incomplete(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A judge that refuses every call (a wrong key): no episode gets a verdict. The audit used
    # to say "no task hackable" and exit 0, so a CI gate passed an env nothing had audited.
    [env] = load_environments(ROOT / "examples" / "refund_agent.py")
    with FakeOpenAI([], api_key="not-sent") as judge:
        judged = {"name": "judge", "type": "ruler", "judgeModel": f"{judge.base_url}#judge"}
        spec = env.to_spec().model_copy(update={"verifier": VerifierSpec(primitives=[judged])})
        audited = await run_audit(
            spec, policies=[named("claim_success"), named("echo_instruction")]
        )
    assert audited.hackable == []
    assert [line.split(": the verifier")[0] for line in audited.policy_errors] == [
        "policy claim_success got no verdict on task(s) 0",
        "policy echo_instruction got no verdict on task(s) 0",
    ]
    assert "HTTP 401" in audited.policy_errors[0]

    assert print_report([audited.to_json()], as_json=True) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["error"].startswith("the audit is incomplete: ")
    assert print_report([audited.to_json()], as_json=False) == 1
    text = capsys.readouterr().out
    assert "no task hackable" not in text and "were not audited" in text


def test_a_policy_that_ends_its_episode_errored_is_a_finding() -> None:
    # A long note kills the plugin's host, and the episode cannot be replayed on a fresh one
    # (its ticket is drawn at random): errored, which a run leaves out of pass rates and GRPO's
    # groups. The audit scored what it left (0) and said "no task hackable", though the policy
    # had escaped its failing verdict.
    done = audit("unreplayable_env.py", "--json", timeout=120)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    [env] = json.loads(done.stdout)["environments"]
    assert env["hackableTasks"] == [0] and env["policyErrors"] == []
    [found] = env["findings"]
    assert found["policy"] == "plugin_extreme_values" and found["escaped"] is True
    assert not found["passed"] and "gave a different result at step 1" in found["hint"]
    assert "escapes a failing verdict" in found["hint"]
    text = audit("unreplayable_env.py", "--policy", "plugin_extreme_values", timeout=120).stdout
    assert "- plugin_extreme_values: ended without a verdict on 1 task(s) 0" in text


async def test_a_policy_the_verifier_gives_no_verdict_where_doing_nothing_gets_one_escaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The taskset's judge times out on a reply of every candidate: no verdict (no fault of the
    # code's), while an empty reply is scored. That was "the audit is incomplete", as if the
    # judge were down; it is the policy escaping its verdict.
    monkeypatch.syspath_prepend(str(HERE))
    from rollout.shared.interop.verifiers_env import environment

    spec = environment("long_reply_taskset").to_spec()
    audited = await run_audit(
        spec, policies=[named("answer_every_candidate"), named("claim_success")]
    )
    assert audited.policy_errors == [] and audited.hackable == [0]
    [found] = audited.findings
    assert found.policy == "answer_every_candidate" and found.escaped
    assert "scoring timed out" in found.hint
