"""The platform verbs through the real `rollout` CLI (a subprocess) against in-process services."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from pipeline.kit import refund_env

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
    assert cmp["base"]["passRateInterval"] == list(wilson_interval(base["passed"], 8))
    assert cmp["deltaPassRateInterval"] == list(
        newcombe_interval(base["passed"], 8, other["passed"], 8)
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
