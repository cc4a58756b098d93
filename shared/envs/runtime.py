"""The protocol every template runtime implements: tools in, state out."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, Field

from rollout.shared.errors import RolloutError


class ToolSpec(BaseModel):
    """A tool as offered to the model (OpenAI function shape)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_openai(self) -> dict[str, Any]:
        """Return the OpenAI `tools[]` entry for this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


class ToolResult(BaseModel):
    """What a tool call returned, or the error it raised (never an exception)."""

    output: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the call succeeded."""
        return self.error is None


class EnvRuntime(Protocol):
    """One live episode of an environment on one task."""

    def tool_specs(self) -> list[ToolSpec]:
        """Tools the model may call."""
        ...

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one tool; errors come back in ToolResult.error, never raised."""
        ...

    def final_state(self) -> dict[str, Any]:
        """The state the verifier sees (mutable state, files, db rows, url/forms...)."""
        ...

    async def close(self) -> None:
        """Release temp dirs, db handles and the like."""
        ...


class EnvironmentFailed(RolloutError):
    """The environment itself failed (its plugin host crashed or hung): the episode ends as
    errored with this reason; raised by tool_specs / call_tool / final_state."""
