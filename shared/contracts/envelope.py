"""The one envelope every event shares, with deterministic ids and trace propagation."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from rollout.shared import subjects

SCHEMA_VERSION = 1
# Fixed namespace so the same command always yields the same event ids (JetStream dedup).
_ID_NAMESPACE = uuid.UUID("6f1c1d0e-6b0b-4a57-9a43-2c0f3f1f9a11")


def deterministic_id(*parts: object) -> str:
    """A stable id from its parts: retrying the same command gives the same id."""
    return uuid.uuid5(_ID_NAMESPACE, "\x1f".join(str(p) for p in parts)).hex


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


class EventEnvelope(BaseModel):
    """An event as stored on the events stream."""

    model_config = ConfigDict(extra="forbid")

    id: str
    type: str
    subject: str
    time: datetime
    schema_version: int = SCHEMA_VERSION
    correlation_id: str
    causation_id: str | None = None
    run_id: str | None = None
    trace_id: str
    span_id: str
    payload: dict[str, Any] = Field(default_factory=dict)

    _parsed: Payload | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_payload(self) -> EventEnvelope:
        model = _REGISTRY.get(self.type)
        if model is None:
            raise ValueError(f"unknown event type {self.type!r}")
        self._parsed = model.model_validate(self.payload)
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
    ) -> EventEnvelope:
        """Build an event; ids derive from `id_parts`, trace ids from `parent` when given."""
        event_id = deterministic_id(payload.event_type, *id_parts)
        # The full type names the event on the subject: `rollout.evt.run.<id>.rollout_scored`.
        name = subjects.event_name(payload.event_type)
        return cls(
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
            payload=payload.model_dump(mode="json"),
        )

    def to_bytes(self) -> bytes:
        """Serialise for the wire."""
        return self.model_dump_json().encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> EventEnvelope:
        """Parse from the wire (raises pydantic.ValidationError on bad input)."""
        return cls.model_validate_json(data)
