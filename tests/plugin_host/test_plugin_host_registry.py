"""Registry push validates a plugin env inside a plugin host, never by importing it."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from host_plugins import COUNTER, spec
from kit import Platform
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.shared.envs import starts
from rollout.shared.envs.plugin_host.client import HostPool
from rollout.shared.settings import Settings


@pytest.fixture
async def registry(settings: Settings, pool: HostPool) -> AsyncIterator[AsyncClient]:
    """The env registry in this process (real NATS) and a client once it answers."""
    platform = Platform(settings)
    platform.start("env-registry")
    client = AsyncClient(settings, timeout_s=30)

    async def answering() -> bool:
        platform.check()
        try:
            await client.list_environments()
        except RolloutError:
            return False
        return True

    await wait_until(answering, "the registry to answer")
    yield client
    await client.close()
    platform.check()
    await platform.stop_all()


def _marking(marker: Path, body: str) -> str:
    # On import: leave a marker where this (unsandboxed) test process can write.
    return (
        textwrap.dedent(
            f"""
        import pathlib, sys
        try:
            pathlib.Path({str(marker)!r}).write_text("imported in " + sys.executable)
        except OSError:
            pass
        """
        )
        + body
    )


async def test_push_of_a_plugin_whose_import_raises_names_the_problem(
    registry: AsyncClient, pool: HostPool, tmp_path: Path
) -> None:
    marker = tmp_path / "imported-here"
    source = _marking(marker, "raise RuntimeError('broken on purpose')\n")
    with pytest.raises(RolloutError) as err:
        await registry.push_environment(spec(source, module="broken_plugin", slug="broken"))
    problems = err.value.problems
    assert any(
        p.startswith("config.entrypoint:")
        and "raised RuntimeError on import: broken on purpose" in p
        for p in problems
    ), problems
    assert not marker.exists()  # the registry process never imported it
    assert pool.started >= 1  # a host did


async def test_push_of_a_good_plugin_validates_in_a_host_only(
    registry: AsyncClient, pool: HostPool, tmp_path: Path
) -> None:
    marker = tmp_path / "imported-here"
    raw = spec(_marking(marker, COUNTER), module="good_plugin", slug="good")
    out = await registry.push_environment(raw)
    assert out["created"] is True and out["version"] == 1
    assert not marker.exists()
    assert pool.started >= 1
    # A new version (new content) is validated by a new host, same registry process.
    started = pool.started
    raw2 = spec(
        _marking(marker, COUNTER.replace('"v1"', '"v2"')), module="good_plugin", slug="good"
    )
    out2 = await registry.push_environment(raw2)
    assert out2["version"] == 2 and pool.started > started
    assert not marker.exists()


async def test_push_of_a_plugin_shadowing_the_stdlib_is_refused(registry: AsyncClient) -> None:
    with pytest.raises(RolloutError) as err:
        await registry.push_environment(spec(module="json", slug="shadow"))
    assert any(p.startswith("config.sources['json.py']") for p in err.value.problems)


async def test_push_of_a_plugin_whose_task_cannot_start_is_refused(registry: AsyncClient) -> None:
    # `rollout plan` and `rollout push` refused it; sent to the API it was registered, and each
    # rollout of its task 1 errored.
    source = COUNTER.replace(
        '        if self.mode == "hang_reset":',
        '        if self.mode == "bad":\n            raise ValueError("no such mode")\n'
        '        if self.mode == "hang_reset":',
    )
    assert source != COUNTER
    with pytest.raises(RolloutError) as err:
        await registry.push_environment(
            spec(source, module="moody", slug="moody", modes=("ok", "bad"))
        )
    assert err.value.problems == [
        "tasks[1]: the environment cannot start: plugin reset() raised ValueError: no such mode"
    ]
    with pytest.raises(RolloutError, match="no environment 'moody'"):
        await registry.get_environment("moody")


async def test_push_of_a_plugin_too_slow_to_start_every_task_says_so(
    registry: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Registered (no task was found that cannot start), and the tasks the start check had no
    # time for are said in the reply: they were skipped in silence.
    slow = COUNTER.replace(
        '        if self.mode == "hang_reset":',
        '        if self.mode == "slow":\n            time.sleep(0.3)\n'
        '        if self.mode == "hang_reset":',
    )
    assert slow != COUNTER
    monkeypatch.setattr(starts, "START_CHECK_S", 0.2)
    out = await registry.push_environment(
        spec(slow, module="slowpoke", slug="slowpoke", modes=("slow",) * 8)
    )
    assert out["created"] is True
    [warning] = out["warnings"]
    assert "of 8 tasks; the other" in warning and "were not checked" in warning, warning
    assert "past the 0.2 s the check may take (the plugin's reset() is slow)" in warning
    # A plugin quick to start every task: nothing to say.
    assert (await registry.push_environment(spec(slug="quick")))["warnings"] == []
