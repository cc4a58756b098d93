"""Helpers for running the real `rollout` CLI against a private ROLLOUT_HOME."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollout.shared.stack.supervisor import cli_command, down

TESTS_DIR = Path(__file__).resolve().parent.parent


@dataclass
class Cli:
    """Runs `rollout ...` as a subprocess with a fixed environment."""

    home: Path
    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run one command and return its result (never raises on a non-zero exit)."""
        return subprocess.run(
            cli_command(*args),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def stack_env(home: Path, services: str = "idle") -> dict[str, str]:
    """Environment for an embedded stack in `home` running the named dummy services."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLOUT_", "PG", "NATS_"))}
    env |= {
        "ROLLOUT_HOME": str(home),
        # A developer's own `rollout login` must not leak into these tests.
        "XDG_CONFIG_HOME": str(home / "xdg-config"),
        "ROLLOUT_PG_FSYNC": "off",
        "ROLLOUT_NATS_PORT": "0",
        "ROLLOUT_NATS_MONITOR_PORT": "0",
        "ROLLOUT_PG_PORT": "0",
        "ROLLOUT_SERVICES": services,
        "ROLLOUT_EXTRA_SERVICES": ",".join(
            f"{name}=stack.dummy_services:{name}" for name in ("idle", "crash_once", "always_crash")
        ),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")])),
    }
    return env


@pytest.fixture
def cli(stack_home: Path) -> Iterator[Cli]:
    """`rollout` against a fresh home; whatever the test started is stopped afterwards."""
    yield Cli(home=stack_home, env=stack_env(stack_home))
    down(stack_home, timeout=30)
