"""`rollout status` says when the read models stop advancing: the projector's lag and error."""

from __future__ import annotations

import asyncio

import pytest
from store.test_projection import run_history
from waiting import wait_until

from rollout.cli import main as cli_main
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import last_sequence
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import new_id
from rollout.shared.errors import RolloutError
from rollout.shared.service import durables
from rollout.shared.settings import Settings
from rollout.shared.stack.files import write_json
from rollout.shared.stack.projections import STALL_ENV, stall_limit_s
from rollout.shared.stack.serve import run_service
from rollout.shared.stack.status import Component, as_table, collect_status
from rollout.shared.store.db import create_pool

DEADLINE_S = 30.0
LINE = durables.TRACKER_READ_MODELS.title
# What a full disk or a revoked privilege looks like to the projection: every write refused.
REFUSE_WRITES = """
create function refuse_writes() returns trigger language plpgsql as $$
begin raise exception 'could not extend file: No space left on device (test)'; end $$;
create trigger refuse_writes before insert or update on projection_tracking
for each row execute function refuse_writes();
"""


def stalls_in_a_second(monkeypatch: pytest.MonkeyPatch, settings: Settings, pg_dsn: str) -> None:
    """The CLI's environment for this test's stack, a projection stalled after 1 s."""
    for name, value in {
        "ROLLOUT_HOME": str(settings.home),
        "ROLLOUT_NATS_URL": settings.nats_url,
        "ROLLOUT_NATS_USER": settings.nats_user,
        "ROLLOUT_NATS_PASSWORD": settings.nats_password,
        "ROLLOUT_DATABASE_URL": pg_dsn,
        STALL_ENV: "1",
    }.items():
        monkeypatch.setenv(name, value or "")


async def test_status_shows_a_projection_that_cannot_write_as_stalled_then_recovered(
    settings: Settings,
    nats_client,
    pg_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    await EventPublisher(js).publish_batch(run_history(new_id()))
    write_json(
        settings.home / "state.json",
        {"phase": "ready", "services": {"tracker": {"service": "tracker", "replica_id": "t-1"}}},
    )
    tracker = asyncio.create_task(run_service("tracker", settings, replica_id="t-1", interval=0.2))
    pool = await create_pool(pg_dsn)
    seen: dict[str, Component] = {}

    async def line(stall_s: float) -> Component:
        if tracker.done():
            tracker.result()
        seen["line"] = {c.name: c for c in await collect_status(settings, stall_s=stall_s)}[LINE]
        return seen["line"]

    async def reads(predicate, what: str, stall_s: float = 1.0) -> Component:  # noqa: ANN001
        async def met() -> bool:
            return predicate(await line(stall_s))

        try:
            await wait_until(met, what, DEADLINE_S, interval_s=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last read: {seen.get('line')}") from None
        return seen["line"]

    try:
        caught_up = await reads(lambda c: c.healthy and "caught up" in c.detail, "caught up")
        assert f"through event {await last_sequence(js)}" in caught_up.detail

        await pool.execute(REFUSE_WRITES)
        await EventPublisher(js).publish_batch(run_history(new_id()))
        # Behind, within the limit: healthy (a projector working through a backlog is fine),
        # and the error its beats carry is already shown.
        behind = await reads(
            lambda c: c.healthy and "behind" in c.detail and "No space left" in c.detail,
            "behind, with its last error",
            stall_s=600,
        )
        assert "STALLED" not in behind.detail and not behind.hint
        stalled = await reads(lambda c: not c.healthy, "stalled")
        assert "STALLED" in stalled.detail and "No space left on device" in stalled.detail
        assert "event(s) stale" in stalled.hint and "privileges" in stalled.hint
        table = as_table([stalled])
        assert "UNHEALTHY" in table and f"{LINE}: what it writes" in table
        # The CLI itself, its limit from the environment: exit 1, the line and what to do.
        stalls_in_a_second(monkeypatch, settings, pg_dsn)
        capsys.readouterr()
        assert await asyncio.to_thread(cli_main, ["status"]) == 1
        out = capsys.readouterr().out
        assert f"{LINE}  UNHEALTHY" in out and "STALLED" in out and f"{LINE}: what it" in out

        await pool.execute("drop trigger refuse_writes on projection_tracking")
        # It retries with backoff and applies the backlog by itself: healthy and caught up.
        recovered = await reads(lambda c: c.healthy and "caught up" in c.detail, "recovered")
        assert f"through event {await last_sequence(js)}" in recovered.detail
        assert not recovered.hint
        capsys.readouterr()
        assert await asyncio.to_thread(cli_main, ["status"]) == 0, capsys.readouterr().out
    finally:
        tracker.cancel()
        await asyncio.gather(tracker, return_exceptions=True)
        await pool.close()


def test_a_bad_stall_limit_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STALL_ENV, "soon")
    with pytest.raises(RolloutError, match="ROLLOUT_PROJECTION_STALL_S must be a number"):
        stall_limit_s()
    monkeypatch.setenv(STALL_ENV, "0")
    with pytest.raises(RolloutError, match="ROLLOUT_PROJECTION_STALL_S must be > 0"):
        stall_limit_s()
