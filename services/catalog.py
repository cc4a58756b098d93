"""Every service's broker, built without connecting: what the AsyncAPI document describes."""

from __future__ import annotations

import json
from pathlib import Path

from faststream.nats import NatsBroker
from faststream.specification import AsyncAPI

from rollout.services.actor.main import build_broker as actor_broker
from rollout.services.buffer.main import build_broker as buffer_broker
from rollout.services.env_registry.main import build_broker as registry_broker
from rollout.services.learner.main import build_broker as learner_broker
from rollout.services.tracker.main import build_broker as tracker_broker
from rollout.services.verifier.main import build_broker as verifier_broker
from rollout.shared.settings import Settings


def asyncapi_brokers() -> list[NatsBroker]:
    """Build each service's broker without connecting, for documentation."""
    offline = Settings(home=Path("."), nats_url="nats://127.0.0.1:4222", database_url=None)
    return [
        registry_broker(offline),
        tracker_broker(offline),
        actor_broker(offline),
        verifier_broker(offline),
        learner_broker(offline),
        buffer_broker(offline),
    ]


def asyncapi_document() -> str:
    """The AsyncAPI document of every service's broker (handlers and their messages)."""
    spec = AsyncAPI(
        *asyncapi_brokers(),
        title="rollout",
        version="1",
        description="Events, work items and requests of the rollout services over NATS JetStream.",
    )
    return json.dumps(spec.to_specification().to_jsonable(), indent=2, sort_keys=True) + "\n"
