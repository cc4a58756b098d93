"""Model backends behind one batch interface."""

from rollout.shared.models.base import (
    ChatRequest,
    ChatResponse,
    ModelBackend,
    ToolCall,
    Usage,
    close_backend,
)
from rollout.shared.models.registry import register_backend, resolve_backend

__all__ = [
    "ChatRequest",
    "ChatResponse",
    "ModelBackend",
    "ToolCall",
    "Usage",
    "close_backend",
    "register_backend",
    "resolve_backend",
]
