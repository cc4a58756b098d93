"""`rollout up --tracker-replicas N`: N supervised tracker processes, one leader, failover."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest
from replicas_kit import holder_pid, leader
from stack.conftest import Cli, stack_env

from rollout.shared.settings import load_settings
from rollout.shared.stack.supervisor import down, read_state


def test_up_refuses_a_tracker_replica_count_out_of_range(stack_home: Path) -> None:
    cli = Cli(home=stack_home, env=stack_env(stack_home, services="tracker"))
    result = cli("up", "--tracker-replicas", "0")
    assert result.returncode != 0
    assert "--tracker-replicas 0: must be between 1 and 5" in result.stderr
    assert "Traceback" not in result.stderr
    assert not read_state(stack_home).get("supervisor")


def test_up_refuses_tracker_replicas_when_no_tracker_runs(stack_home: Path) -> None:
    cli = Cli(home=stack_home, env=stack_env(stack_home, services="idle"))
    result = cli("up", "--tracker-replicas", "2")
    assert result.returncode != 0
    assert "the tracker is not among the services to run" in result.stderr


@pytest.mark.slow
async def test_up_with_two_trackers_elects_one_and_the_other_takes_over_a_sigkill(
    stack_home: Path,
) -> None:
    env = stack_env(stack_home, services="tracker")
    cli = Cli(home=stack_home, env=env)
    try:
        result = cli("up", "--tracker-replicas", "2")
        assert result.returncode == 0, result.stderr + result.stdout
        status = cli("status", "--json")
        doc = json.loads(status.stdout)
        assert status.returncode == 0, doc
        trackers = {c["name"]: c for c in doc["components"] if c["name"].startswith("tracker")}
        assert set(trackers) == {"tracker", "tracker-2"}
        assert all(c["healthy"] for c in trackers.values()), trackers
        services = read_state(stack_home)["services"]
        pids = {services["tracker"]["pid"], services["tracker-2"]["pid"]}
        assert len(pids) == 2

        settings = load_settings(env)
        deadline = time.monotonic() + 60
        while (holder := await leader(settings)) is None:
            assert time.monotonic() < deadline, "no tracker took the lease"
            await _pause()
        first = holder_pid(holder)
        assert first in pids
        os.kill(first, signal.SIGKILL)
        killed_at = time.monotonic()
        # The standby leads within about one lease TTL (3 s by default); the supervisor also
        # restarts the killed one, as a standby.
        while (holder := await leader(settings)) is None or holder_pid(holder) == first:
            assert time.monotonic() - killed_at < 10, "the standby did not take over"
            await _pause()
        # The standby, or the killed one restarted: the supervisor starts it again within a
        # second or two, and at the lease's expiry either may win the race for it.
        services = read_state(stack_home)["services"]
        now = {services[name].get("pid") for name in ("tracker", "tracker-2")}
        assert holder_pid(holder) in (pids | now) - {first}
        assert time.monotonic() - killed_at < 5
    finally:
        cli("down")
        down(stack_home, timeout=30)


async def _pause() -> None:
    # Polling a KV key in short steps; the loops above hold the deadlines.
    await asyncio.sleep(0.05)
