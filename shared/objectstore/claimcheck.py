"""Claim-check helpers: JSON blobs (trajectory batches) in the store, events carry only the ref."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

from rollout.shared.errors import RolloutError
from rollout.shared.objectstore.base import ObjectRef, ObjectStore
from rollout.shared.objectstore.checksum import sha256_bytes
from rollout.shared.objectstore.errors import ObjectStoreError
from rollout.shared.settings import env_number

T = TypeVar("T")

# The largest value (a buffer reply's item) that rides inside a message: a larger one goes to
# the object store. NATS' default max_payload is 1 MiB; inline values stay well under it so
# one of them, with its envelope and headers, always fits in a message (batches of several are
# split by size when they are published: see shared/bus/publisher.py).
DEFAULT_INLINE_LIMIT = 256 * 1024
# Trajectories are claim-checked from 0 bytes: each is stored once, in the object store, and
# the events, the tracker's rollouts and the buffer's all carry its URI and sha256. An operator
# may keep small ones inline (fewer object-store round trips, but each is then stored by both
# read models and the events stream).
DEFAULT_TRAJECTORY_INLINE = 0
INLINE_LIMIT_ENV = "ROLLOUT_INLINE_TRAJECTORY_BYTES"
DEFAULT_CLAIM_PREFIX = "claims"


def inline_limit() -> int:
    """The trajectory claim-check threshold in bytes: ROLLOUT_INLINE_TRAJECTORY_BYTES, else 0."""
    try:
        return int(
            env_number(INLINE_LIMIT_ENV, DEFAULT_TRAJECTORY_INLINE, whole=True, unit="bytes", low=0)
        )
    except RolloutError as exc:
        raise ObjectStoreError(str(exc)) from None


class Inline(BaseModel):
    """A payload small enough to ride inside the event itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    inline: Any


# What an event field holds: the data itself, or a reference to it in the object store.
ClaimCheck = Inline | ObjectRef


def to_json_bytes(value: Any) -> bytes:
    """Canonical JSON (sorted keys, no spaces), so equal values give equal bytes and sha256s."""
    return json.dumps(
        to_jsonable_python(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()


def content_key(prefix: str, sha256: str, suffix: str = ".json") -> str:
    """A content-addressed key, `prefix/ab/abcdef....json`: re-storing the same data is a no-op."""
    return f"{prefix.strip('/')}/{sha256[:2]}/{sha256}{suffix}"


async def put_json(
    store: ObjectStore, key: str, value: Any, *, overwrite: bool = False
) -> ObjectRef:
    """Store a JSON-able value (pydantic models included) as canonical JSON at `key`."""
    return await store.put(key, to_json_bytes(value), overwrite=overwrite)


async def get_json(
    store: ObjectStore,
    target: str | ObjectRef,
    *,
    sha256: str | None = None,
    model: type[T] | Any = None,
) -> Any:
    """Load a JSON blob (verified when a sha256 is known), validated into `model` when given."""
    data = await store.get(target, sha256=sha256)
    uri = target.uri if isinstance(target, ObjectRef) else str(target)
    try:
        if model is not None:
            return TypeAdapter(model).validate_json(data)
        return json.loads(data)
    except (ValidationError, ValueError) as exc:
        raise ObjectStoreError(
            f"object {uri} does not hold the expected JSON",
            problems=[str(exc).splitlines()[0]],
        ) from exc


async def store_if_large(
    store: ObjectStore,
    value: Any,
    *,
    threshold: int = DEFAULT_INLINE_LIMIT,
    prefix: str = DEFAULT_CLAIM_PREFIX,
) -> Inline | ObjectRef:
    """Inline the value when its JSON is at most `threshold` bytes, else store it and return the ref.

    Large values go under a content-addressed key, so a redelivered message re-storing the
    same batch writes nothing new.
    """
    data = to_json_bytes(value)
    if len(data) <= threshold:
        return Inline(inline=json.loads(data))
    return await store.put(content_key(prefix, sha256_bytes(data)), data)


async def load_claim(store: ObjectStore, claim: Inline | ObjectRef, *, model: Any = None) -> Any:
    """The value a claim check stands for, fetched and verified when it is a reference."""
    if isinstance(claim, Inline):
        return (
            TypeAdapter(model).validate_python(claim.inline) if model is not None else claim.inline
        )
    return await get_json(store, claim, model=model)
