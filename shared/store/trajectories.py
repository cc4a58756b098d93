"""Claim checks for trajectories: large ones live in the object store, events carry URI + sha256."""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic_core

from rollout.shared.contracts.events import GeneratedRollout
from rollout.shared.jsondepth import loads_bounded
from rollout.shared.objectstore import ObjectStore, ObjectStoreError, default_store_url, open_store
from rollout.shared.objectstore.checksum import sha256_bytes
from rollout.shared.objectstore.claimcheck import (
    DEFAULT_INLINE_LIMIT,
    INLINE_LIMIT_ENV,
    content_key,
    inline_limit,
    to_json_bytes,
)
from rollout.shared.settings import Settings

# The threshold is defined once, in the claim-check module; re-exported for callers here.
__all__ = [
    "DEFAULT_INLINE_LIMIT",
    "INLINE_LIMIT_ENV",
    "inline_limit",
    "load_trajectory",
    "object_store",
    "offload",
]

# The canonical encoding (sorted keys, stdlib json) is about ten times the cost of
# pydantic-core's compact one, and the two differ in length only in how a number or a
# non-finite float is spelled, never by this factor: a trajectory whose quick encoding is
# under a third of the limit is inline for sure, and only those near it are encoded exactly.
_SURELY_INLINE = 3


def object_store(settings: Settings) -> ObjectStore:
    """The platform's object store (ROLLOUT_OBJECT_STORE_URL, else `<home>/objects`)."""
    return open_store(default_store_url(settings.home), source="ROLLOUT_OBJECT_STORE_URL")


async def offload(store: ObjectStore, rollouts: list[GeneratedRollout]) -> list[GeneratedRollout]:
    """Move every large trajectory to the store, keeping its URI and sha256 on the rollout."""
    limit = inline_limit()

    async def one(rollout: GeneratedRollout) -> GeneratedRollout:
        if rollout.trajectory is None:
            return rollout
        # store_if_large's test, without parsing the encoding back for a trajectory kept inline.
        if len(pydantic_core.to_json(rollout.trajectory)) * _SURELY_INLINE <= limit:
            return rollout
        data = to_json_bytes(rollout.trajectory)
        if len(data) <= limit:
            return rollout
        claim = await store.put(content_key("trajectories", sha256_bytes(data)), data)
        return rollout.model_copy(
            update={
                "trajectory": None,
                "trajectory_uri": claim.uri,
                "trajectory_sha256": claim.sha256,
            }
        )

    # The puts overlap (each waits on its own fsync): a batch costs about one round trip.
    return list(await asyncio.gather(*(one(r) for r in rollouts)))


async def load_trajectory(
    store: ObjectStore, trajectory: dict[str, Any] | None, uri: str | None, sha256: str | None
) -> dict[str, Any] | None:
    """The trajectory itself, fetched and verified when only its claim check was kept."""
    if trajectory is not None or uri is None:
        return trajectory
    data = await store.get(uri, sha256=sha256)
    try:
        # Cut at a depth: a tool result nested past what json.loads reads raised
        # RecursionError in every reader (the verifier, the viewer's page, `rollout export`).
        return loads_bounded(data)
    except ValueError as exc:
        raise ObjectStoreError(
            f"object {uri} does not hold the expected JSON", problems=[str(exc).splitlines()[0]]
        ) from exc
