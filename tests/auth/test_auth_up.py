"""After `rollout up`, the CLI works with no login: it uses the runner key the stack made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stack.conftest import Cli, stack_env

from rollout.shared.stack.supervisor import down

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_up_then_push_and_list_with_no_login(stack_home: Path, tmp_path: Path) -> None:
    env = stack_env(stack_home, services="env-registry")
    cli = Cli(home=stack_home, env=env | {"XDG_CONFIG_HOME": str(tmp_path / "config")})
    try:
        up = cli("up")
        assert up.returncode == 0, up.stderr + up.stdout
        assert (stack_home / "local_key.json").stat().st_mode & 0o777 == 0o600
        assert (stack_home / "keys.json").stat().st_mode & 0o777 == 0o600
        config = (stack_home / "nats" / "nats.conf").read_text()
        local = json.loads((stack_home / "local_key.json").read_text())
        assert local["api_key"].rsplit("_", 1)[1] not in config  # only the bcrypt hash

        me = cli("whoami", "--json")
        assert me.returncode == 0, me.stderr
        assert json.loads(me.stdout)["role"] == "runner"
        pushed = cli("push", str(ROOT / "examples" / "refund_agent.py"), "--json")
        assert pushed.returncode == 0, pushed.stderr
        envs = cli("envs", "--json")
        assert envs.returncode == 0, envs.stderr
        assert "refund-agent" in envs.stdout

        # A second `up` keeps the key: the CLI's credentials stay valid across restarts.
        assert cli("down").returncode == 0
        assert cli("up").returncode == 0
        assert json.loads((stack_home / "local_key.json").read_text()) == local
        assert cli("envs", "--json").returncode == 0
    finally:
        down(stack_home, timeout=30)
