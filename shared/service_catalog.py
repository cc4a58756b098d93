"""The services whose handlers the AsyncAPI document describes."""

from __future__ import annotations

from faststream.nats import NatsBroker
from rollout.shared.settings import Settings


def asyncapi_brokers() -> list[NatsBroker]:
    """Build each service's broker without connecting, for documentation."""
    from pathlib import Path

    from rollout.services.tracker.main import build_broker as tracker_broker

    offline = Settings(home=Path("."), nats_url="nats://127.0.0.1:4222", database_url=None)
    return [tracker_broker(offline, runner=None)]  # type: ignore[arg-type]
