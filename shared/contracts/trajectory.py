"""What one rollout produced: messages, tool calls, final output and state, and its score."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollout.shared.contracts.budgets import EndedBy

# What kept an errored rollout from a verdict: the platform (sandbox, object store, bus), the
# environment's own code (a plugin, a verifier that raised), or the model endpoint.
ErrorKind = Literal["infra", "env", "model"]


class ToolCallRecord(BaseModel):
    """One tool call the agent made and what came back."""

    model_config = ConfigDict(populate_by_name=True)

    index: int
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: Any = None
    error: str | None = None


class Trajectory(BaseModel):
    """The full record of one agent episode on one task."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    final_output: str | None = None
    final_state: dict[str, Any] = Field(default_factory=dict)
    finish_reason: str = "stop"
    error: str | None = None
    # What broke when `error` is set: the model endpoint ("model") or the env's code ("env").
    error_kind: ErrorKind | None = None
    # Kept when the backend gives them, so training sees exactly the sampled tokens.
    token_ids: list[list[int]] | None = None
    logprobs: list[list[float]] | None = None
    # The sha256 of the weights that generated every model turn (weights_proof.py), when the
    # backend proves it; `mixed:<a>,<b>` when turns came from different weights. The learner
    # trains only on rollouts whose digests are those of the version they claim or newer ones.
    weights_sha256: str | None = None
    # Which budget ended the episode (None: the model ended it); its model turns and tokens.
    ended_by: EndedBy | None = None
    turns: int = 0
    completion_tokens: int = 0


class PrimitiveResult(BaseModel):
    """The outcome of one verifier primitive."""

    name: str
    type: str
    weight: float
    score: float
    passed: bool
    reason: str


class VerifierResult(BaseModel):
    """Weighted score over all primitives; passed only when every primitive passed."""

    score: float
    passed: bool
    primitives: list[PrimitiveResult] = Field(default_factory=list)
    error: str | None = None
