"""Model backends behind one batch interface (model names: rollout.shared.models.catalog)."""

from rollout.shared.models.base import (
    ChatRequest,
    ChatResponse,
    ModelBackend,
    ToolCall,
    Usage,
    close_backend,
)

__all__ = [
    "ChatRequest",
    "ChatResponse",
    "ModelBackend",
    "ToolCall",
    "Usage",
    "close_backend",
]
