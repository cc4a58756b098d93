"""The one envelope every event shares, with deterministic ids and trace propagation."""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    model_validator,
)
from pydantic_core import PydanticCustomError, from_json

from rollout.shared import subjects

# MAJOR.MINOR. A minor version only adds fields, so an older reader keeps what it knows; a new
# major changes meaning, so a reader of another major must not guess (it dead-letters the event).
SCHEMA_MAJOR = 1
SCHEMA_MINOR = 0
SCHEMA_VERSION = f"{SCHEMA_MAJOR}.{SCHEMA_MINOR}"
# The pydantic error type of an event from a major version this reader cannot read.
UNSUPPORTED_SCHEMA_VERSION = "unsupported_schema_version"
_VERSION = re.compile(r"^(\d{1,4})(?:\.(\d{1,4}))?$")
# Fixed namespace so the same command always yields the same event ids (JetStream dedup).
_ID_NAMESPACE = uuid.UUID("6f1c1d0e-6b0b-4a57-9a43-2c0f3f1f9a11")
_ID_PREFIX = _ID_NAMESPACE.bytes
# The media type of an event on the wire: JSON, named so that FastStream hands a typed
# handler the bytes (parsed once, by pydantic-core, into EventEnvelope) instead of first
# decoding them into Python objects with json.loads and then validating those.
CONTENT_TYPE = "application/vnd.rollout.event+json"


def deterministic_id(*parts: object) -> str:
    """A stable id from its parts: retrying the same command gives the same id.

    It is uuid5's hex (name-based, SHA-1) computed without building UUID objects: the
    services derive one per rollout, item and event.
    """
    digest = bytearray(
        hashlib.sha1(_ID_PREFIX + "\x1f".join(str(p) for p in parts).encode()).digest()[:16]
    )
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    return digest.hex()


def new_id() -> str:
    """A fresh random id (commands, runs, traces)."""
    return uuid.uuid4().hex


class Payload(BaseModel):
    """Base of every event payload; subclasses name their event type and aggregate."""

    model_config = ConfigDict(extra="forbid")

    event_type: ClassVar[str] = ""
    aggregate: ClassVar[str] = ""


_REGISTRY: dict[str, type[Payload]] = {}


def register(cls: type[Payload]) -> type[Payload]:
    """Class decorator: make a payload type known to envelopes by its `event_type`."""
    if cls.event_type in _REGISTRY:
        raise ValueError(f"event type {cls.event_type!r} registered twice")
    _REGISTRY[cls.event_type] = cls
    return cls


def payload_types() -> dict[str, type[Payload]]:
    """Every registered event type and its payload model."""
    return dict(_REGISTRY)


def parse_schema_version(raw: object) -> tuple[int, int]:
    """(major, minor) of an envelope's `schema_version`: "1.2", "1", or a bare 1 (before 1.0)."""
    text = str(raw) if isinstance(raw, int) and not isinstance(raw, bool) else raw
    match = _VERSION.match(text) if isinstance(text, str) else None
    if match is None:
        raise PydanticCustomError(
            "schema_version",
            "schema_version must look like MAJOR.MINOR (e.g. {current}), got {raw}",
            {"current": SCHEMA_VERSION, "raw": repr(raw)},
        )
    return int(match[1]), int(match[2] or 0)


def _check_readable(data: dict[str, Any]) -> tuple[int, int]:
    """The event's version, or an error naming it when its major is not the one we read."""
    major, minor = parse_schema_version(data.get("schema_version", SCHEMA_VERSION))
    if major != SCHEMA_MAJOR:
        raise PydanticCustomError(
            UNSUPPORTED_SCHEMA_VERSION,
            "unsupported schema version {version} of {type} event: this reader understands "
            "major version {major} only (upgrade the service that reads it)",
            {
                "version": f"{major}.{minor}",
                "type": str(data.get("type", "?")),
                "major": SCHEMA_MAJOR,
            },
        )
    return major, minor


class EventEnvelope(BaseModel):
    """An event as stored on the events stream."""

    model_config = ConfigDict(extra="forbid")

    id: str
    type: str
    subject: str
    time: datetime
    schema_version: str = Field(
        default=SCHEMA_VERSION,
        pattern=r"^\d+\.\d+$",
        description="MAJOR.MINOR: readers skip unknown fields of a newer minor, refuse a new major",
    )
    correlation_id: str
    causation_id: str | None = None
    run_id: str | None = None
    trace_id: str
    span_id: str
    payload: dict[str, Any] = Field(default_factory=dict)

    _parsed: Payload | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _check_version(cls, data: Any) -> Any:
        if isinstance(data, bytes | bytearray):
            # A handler argument typed EventEnvelope gets the message's bytes (CONTENT_TYPE):
            # parsed here by pydantic-core, in one pass, not by json.loads first.
            data = from_json(data)
        if not isinstance(data, dict):
            return data
        if data.get("schema_version") == SCHEMA_VERSION:
            return data  # what every current writer sends: nothing to normalise
        major, minor = _check_readable(data)
        data = {**data, "schema_version": f"{major}.{minor}"}
        if minor > SCHEMA_MINOR:
            # A newer minor may add envelope fields too: keep what this reader knows.
            data = {k: v for k, v in data.items() if k in cls.model_fields}
        return data

    @model_validator(mode="after")
    def _check_payload(self) -> EventEnvelope:
        model = _REGISTRY.get(self.type)
        if model is None:
            raise ValueError(f"unknown event type {self.type!r}")
        # Fields this reader does not know are a mistake at our version, news at a newer minor.
        if self.schema_version == SCHEMA_VERSION:
            self._parsed = model.model_validate(self.payload)
            return self
        _, minor = parse_schema_version(self.schema_version)
        extra = "ignore" if minor > SCHEMA_MINOR else None
        self._parsed = model.model_validate(self.payload, extra=extra)
        return self

    def body(self) -> Payload:
        """The payload as its typed model."""
        assert self._parsed is not None
        return self._parsed

    @classmethod
    def new(
        cls,
        payload: Payload,
        *,
        aggregate_id: str,
        id_parts: tuple[object, ...],
        parent: EventEnvelope | None = None,
        run_id: str | None = None,
        trace_id: str | None = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        dumped: dict[str, Any] | None = None,
    ) -> EventEnvelope:
        """Build an event; ids derive from `id_parts`, trace ids from `parent` when given.

        `dumped` is `payload.model_dump(mode="json")` when the caller has it already (the
        actor assembles a batch's from trajectories already dumped): it must equal that dump.
        """
        if _REGISTRY.get(payload.event_type) is not type(payload):
            raise ValueError(f"unknown event type {payload.event_type!r}")
        event_id = deterministic_id(payload.event_type, *id_parts)
        # The full type names the event on the subject: `rollout.evt.run.<id>.rollout_scored`.
        name = subjects.event_name(payload.event_type)
        # Built from a payload model that is valid already: no second validation of its dump
        # (for a batch of trajectories that was most of the cost of building the event).
        envelope = cls.model_construct(
            id=event_id,
            type=payload.event_type,
            subject=subjects.event(payload.aggregate, aggregate_id, name),
            time=datetime.now(UTC),
            correlation_id=correlation_id
            or (parent.correlation_id if parent else None)
            or event_id,
            causation_id=causation_id or (parent.id if parent else None),
            run_id=run_id or (parent.run_id if parent else None),
            trace_id=trace_id or (parent.trace_id if parent else None) or new_id(),
            span_id=deterministic_id("span", event_id)[:16],
            payload=payload.model_dump(mode="json") if dumped is None else dumped,
            schema_version=SCHEMA_VERSION,
        )
        envelope._parsed = payload
        return envelope

    def to_bytes(self) -> bytes:
        """Serialise for the wire."""
        return self.model_dump_json().encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> EventEnvelope:
        """Parse from the wire (raises pydantic.ValidationError on bad input)."""
        return cls.model_validate_json(data)
