"""pydantic models: the single source of every contract (JSON Schema in schemas/ is generated)."""

from rollout.shared.contracts import events  # noqa: F401  (registers every payload type)
from rollout.shared.contracts.envelope import EventEnvelope, Payload, deterministic_id, new_id

__all__ = ["EventEnvelope", "Payload", "deterministic_id", "new_id"]
