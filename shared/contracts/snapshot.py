"""A dataset snapshot row: one scored rollout with its lineage (`rollout export` / `import`)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

FORMAT = "rollout.snapshot/1"
Outcome = Literal["passed", "failed", "errored"]


class SnapshotRow(BaseModel):
    """One exported rollout: the verdict, the trajectory and where both came from."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["rollout.snapshot/1"] = Field(description="the snapshot format version")
    rollout_id: str = Field(min_length=1)
    run_id: str = Field(min_length=1)
    task_index: int = Field(ge=0)
    sample_index: int = Field(ge=0)
    task_id: str | None = None
    model: str
    policy_version: int = Field(ge=0)
    seed: int | None = None
    env_slug: str
    env_version: int = Field(ge=1)
    env_hash: str
    score: float | None
    passed: bool | None
    outcome: Outcome
    error: str | None = None
    error_kind: str | None = None
    primitives: str = Field(description="JSON list of the primitives' verdicts")
    trajectory: str = Field(description="JSON Trajectory (messages, token ids, logprobs)")
    tools: str | None = Field(default=None, description="JSON list of OpenAI tools")
    prompt: str | None = None
    completion: str | None = None

    @field_validator("trajectory")
    @classmethod
    def _trajectory(cls, value: str) -> str:
        from rollout.shared.contracts.trajectory import Trajectory

        try:
            trajectory = Trajectory.model_validate_json(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(the document)"
            raise ValueError(f"not a trajectory: {where}: {first['msg']}") from None
        if not trajectory.messages:
            raise ValueError("not a trajectory: messages: missing or empty")
        return value

    @field_validator("primitives", "tools")
    @classmethod
    def _json_list(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                decoded = json.loads(value)
            except ValueError:
                raise ValueError("not JSON text") from None
            if not isinstance(decoded, list):
                raise ValueError("must be a JSON list")
        return value

    def buffer_row(self) -> dict[str, Any]:
        """The row in the shape the buffer keeps (what its training-set builders read)."""
        return {
            "rollout_id": self.rollout_id,
            "run_id": self.run_id,
            "env_hash": self.env_hash,
            "task_index": self.task_index,
            "sample_index": self.sample_index,
            "policy_version": self.policy_version,
            "score": None if self.outcome == "errored" else self.score,
            "passed": bool(self.passed) if self.outcome != "errored" else False,
            "error": self.error if self.outcome == "errored" else None,
            "trajectory": json.loads(self.trajectory),
            "tools": json.loads(self.tools) if self.tools else [],
        }
