"""A plugin host's folder has a disk budget over the host's life: past it the host is killed."""

from __future__ import annotations

import asyncio
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from host_plugins import spec

from rollout.shared.envs import build_runtime
from rollout.shared.envs.plugin_host import client
from rollout.shared.envs.plugin_host.client import HostPool, HostSettings

MB = 1024 * 1024
BUDGET = 32 * MB

WRITER = textwrap.dedent(
    """
    import os
    import time


    class Env:
        def tools(self):
            return [{"name": "write", "description": "",
                     "parameters": {"type": "object", "properties": {"mb": {"type": "integer"}}}}]

        def reset(self, task):
            self.calls = 0

        def step(self, name, arguments):
            self.calls += 1
            chunk = b"x" * (1 << 20)
            for i in range(arguments["mb"]):
                with open(f"f{os.getpid()}-{self.calls}-{i}", "wb") as f:
                    f.write(chunk)
            for _ in range(arguments.get("stderr_mb", 0)):  # stderr is a file on the host
                os.write(2, chunk)
            time.sleep(arguments.get("linger", 0))  # the kill lands during the step
            return {"calls": self.calls}

        def state(self):
            return {"calls": self.calls}


    def make_env(options):
        return Env()
    """
)


@pytest.fixture
def disk_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostPool]:
    """This test's pool: hosts with a 32 MB disk budget."""
    fresh = HostPool(HostSettings(step_timeout_s=20.0, start_timeout_s=10.0, max_disk_bytes=BUDGET))
    monkeypatch.setattr(client, "_pool", fresh)
    yield fresh
    fresh.close()


async def test_a_step_that_fills_the_hosts_folder_is_killed_and_told(disk_pool: HostPool) -> None:
    rt = build_runtime(spec(WRITER, module="writer"), 0)
    try:
        host = rt._host
        assert host is not None
        folder = Path(host._workdir)
        out = await rt.call_tool("write", {"mb": 2000})  # 2 GB, 1 MB a file
        assert out.error == (
            "write failed: wrote more than the tool's disk budget (stopped: disk_limit); "
            "the call had no effect"
        )
        assert host.process.killed_reason == "disk_limit"
        assert "disk_limit" in (host.dead or "")
        assert not await asyncio.to_thread(
            os.path.exists, folder
        )  # the dead host's folder is removed with it
        # The episode goes on, on a fresh host with a fresh budget.
        again = await rt.call_tool("write", {"mb": 1})
        assert again.error is None and again.output == {"calls": 1}
    finally:
        await rt.close()
    assert disk_pool.leased == 0


async def test_what_a_host_writes_to_its_stderr_counts_too(disk_pool: HostPool) -> None:
    rt = build_runtime(spec(WRITER, module="writer"), 0)
    try:
        host = rt._host
        assert host is not None
        # 20 MB in its folder and 30 MB on its stderr: each under the 32 MB budget, not both.
        out = await rt.call_tool("write", {"mb": 20, "stderr_mb": 30, "linger": 10})
        assert out.error is not None and "disk_limit" in out.error
        assert host.process.killed_reason == "disk_limit"
    finally:
        await rt.close()


async def test_a_host_past_half_its_budget_is_not_kept_warm(disk_pool: HostPool) -> None:
    hosts = []
    for mb in (20, 2):  # over half the budget (under all of it), then a little
        rt = build_runtime(spec(WRITER, module="writer"), 0)
        try:
            hosts.append(rt._host)
            assert (await rt.call_tool("write", {"mb": mb})).error is None
        finally:
            await rt.close()
    heavy, light = hosts
    assert heavy is not None and light is not None and heavy is not light
    # A host's folder keeps what it wrote across episodes: recycled before an episode is killed.
    assert heavy.process.proc.poll() is not None
    assert light.alive and light in disk_pool._idle[light.key]
