"""The real stack end to end: `up`, push, run, `down`, `up` again: events and read models kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes.openai_server import FakeOpenAI, Reply, text_reply, tool_reply

from .conftest import Cli, stack_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SERVICES = "env-registry,tracker,actor,verifier"


def refund_o1(body: dict) -> Reply:
    """Refunds order O-1 for 100, as the seed README's task asks."""
    if any(m["role"] == "tool" for m in body["messages"]):
        return text_reply("Refunded O-1.")
    return tool_reply(("refund", {"order_id": "O-1", "amount": 100}))


def _json(cli: Cli, *args: str) -> dict:
    result = cli(*args, "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    return json.loads(result.stdout)


def test_platform_survives_down_and_up(stack_home: Path) -> None:
    cli = Cli(home=stack_home, env=stack_env(stack_home, services=SERVICES))
    try:
        up = cli("up")
        assert up.returncode == 0, up.stderr + up.stdout
        status = _json(cli, "status")
        assert {c["name"] for c in status["components"]} >= {"nats", "postgres", "tracker", "actor"}
        assert all(c["healthy"] for c in status["components"]), status
        # Every service runs as its own NATS user; the server config holds no password.
        creds = json.loads((stack_home / "credentials.json").read_text())
        config = (stack_home / "nats" / "nats.conf").read_text()
        for name in SERVICES.split(","):
            assert creds["services"][name]["user"] == f"svc_{name}"
            assert creds["services"][name]["password"] not in config
        assert creds["nats"]["password"] not in config

        pushed = _json(cli, "push", str(ROOT / "examples" / "refund_agent.py"))
        assert pushed["environments"][0]["slug"] == "refund-agent"
        # A plugin env's module lives next to its file, not where the services run: it is
        # pushed with the spec, and the registry validates it inside a sandboxed plugin host
        # (no service process imports it).
        plugin = _json(cli, "push", str(ROOT / "examples" / "plugin_counter.py"))
        assert plugin["environments"][0]["slug"] == "counter-plugin"
        with FakeOpenAI(refund_o1) as server:
            run = _json(
                cli, "run", "refund-agent", "--model", f"{server.base_url}#scripted", "-n", "3",
                "--follow",
            )  # fmt: skip
        assert (run["status"], run["scored"], run["passed"]) == ("completed", 3, 3)

        before = {
            "envs": _json(cli, "envs"),
            "runs": _json(cli, "runs"),
            "show": _json(cli, "show", run["runId"], "--rollouts"),
        }
        events_before = cli("events", "--json").stdout.splitlines()
        assert any('"run.completed"' in line for line in events_before)
        # Nothing a service did on the way was refused by its least permissions.
        log = (stack_home / "logs" / "nats.log").read_text()
        assert "user:svc_" not in log, [line for line in log.splitlines() if "svc_" in line]

        down = cli("down")
        assert down.returncode == 0, down.stderr
        assert cli("status").returncode == 1
        up = cli("up")
        assert up.returncode == 0, up.stderr + up.stdout

        after = {
            "envs": _json(cli, "envs"),
            "runs": _json(cli, "runs"),
            "show": _json(cli, "show", run["runId"], "--rollouts"),
        }
        assert after == before
        assert cli("events", "--json").stdout.splitlines() == events_before
        rebuilt = _json(cli, "admin", "rebuild")
        assert rebuilt["events_applied"] == len(events_before)
        assert _json(cli, "show", run["runId"], "--rollouts") == before["show"]
    finally:
        cli("down")
