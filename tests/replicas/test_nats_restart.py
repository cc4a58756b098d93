"""A leader that steps down because NATS went away stays a replica: it stands by and leads
again once NATS is back, instead of crashing on its leader broker's stop (whose connection is
reconnecting), which took every tracker replica down with one NATS restart."""

from __future__ import annotations

import pytest
from pipeline.kit import Platform
from replicas_kit import leader
from structlog.testing import capture_logs
from waiting import wait_until

from rollout.services.tracker.leader import LEASE_TTL_ENV
from rollout.shared.settings import Settings
from rollout.shared.stack.nats import NatsServer


async def test_a_tracker_that_steps_down_while_nats_restarts_leads_again(
    fresh_nats: NatsServer, fresh_nats_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LEASE_TTL_ENV, "1.5")
    settings = fresh_nats_settings
    platform = Platform(settings)
    platform.start("tracker")
    try:

        async def leading() -> str | None:
            platform.check()
            return await leader(settings)

        first = await wait_until(leading, "the tracker to lead")
        with capture_logs() as logs:
            fresh_nats.stop()

            def stepped_down() -> bool:
                return any("stepping down" in e["event"] for e in logs)

            await wait_until(stepped_down, "the leader to step down without NATS", 30)
            fresh_nats.start(attached=True)

            async def leads_again() -> bool:
                platform.check()  # a crashed replica fails here, with its exception
                holder = await leader(settings)
                return holder is not None and holder == first

            await wait_until(leads_again, "the same replica to lead again", 60)
    finally:
        await platform.stop_all()
