"""A dataset snapshot row: one scored rollout with its lineage (`rollout export` / `import`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rollout.shared.contracts.trajectory import Trajectory

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
    source: str | None = Field(
        default=None,
        description="where the verdict came from: none for the platform's verifier, else the"
        " importer ('art': a reward recorded elsewhere, not verified here)",
    )

    @field_validator("trajectory")
    @classmethod
    def _trajectory(cls, value: str) -> str:
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


class DatasetLineage(BaseModel):
    """Where a snapshot's rows came from: runs, policy versions, envs, hashes, verdicts."""

    model_config = ConfigDict(extra="forbid")

    rows: int = Field(ge=1)
    run_ids: list[str]
    policy_versions: list[int]
    envs: list[str] = Field(description="slug@version of every env the rows ran on")
    env_hashes: list[str]
    models: list[str]
    outcomes: dict[str, int] = Field(description="rows per outcome: passed, failed, errored")
    sources: dict[str, int] = Field(
        default_factory=dict,
        description="rows per verdict source: 'verifier' (scored here) or an importer ('art')",
    )


class DatasetSource(BaseModel):
    """A dataset snapshot a training job learns from, stored as canonical JSONL (claim check)."""

    model_config = ConfigDict(extra="forbid")

    uri: str = Field(min_length=1, description="object-store URI of the rows' canonical JSONL")
    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="the dataset's hash: sha256 of those bytes"
    )
    size: int = Field(ge=1)
    name: str = Field(description="the file or folder it was read from (for people)")
    lineage: DatasetLineage


def lineage_of(rows: list[SnapshotRow]) -> DatasetLineage:
    """The lineage of checked snapshot rows."""
    outcomes: dict[str, int] = {}
    for row in rows:
        outcomes[row.outcome] = outcomes.get(row.outcome, 0) + 1
    return DatasetLineage(
        rows=len(rows),
        run_ids=sorted({r.run_id for r in rows}),
        policy_versions=sorted({r.policy_version for r in rows}),
        envs=sorted({f"{r.env_slug}@{r.env_version}" for r in rows}),
        env_hashes=sorted({r.env_hash for r in rows}),
        models=sorted({r.model for r in rows}),
        outcomes=dict(sorted(outcomes.items())),
        sources=source_counts(r.source for r in rows),
    )


def source_counts(sources: Iterable[str | None]) -> dict[str, int]:
    """Rows per verdict source: 'verifier' for the platform's own, else the importer's name."""
    counts: dict[str, int] = {}
    for source in sources:
        counts[source or "verifier"] = counts.get(source or "verifier", 0) + 1
    return dict(sorted(counts.items()))


def canonical_jsonl(rows: list[SnapshotRow]) -> bytes:
    """The rows as one JSON object a line, in order: equal rows give equal bytes (and hash)."""
    # A verifier-scored row leaves `source` out, so its bytes (and hash) are as before it.
    return "".join(
        row.model_dump_json(exclude=None if row.source else {"source"}) + "\n" for row in rows
    ).encode()


def rows_from_jsonl(data: bytes, where: str) -> list[SnapshotRow]:
    """Canonical JSONL back as checked rows; a bad line is named `where:LINE: field: why`."""
    rows: list[SnapshotRow] = []
    seen: set[str] = set()
    for number, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        try:
            row = SnapshotRow.model_validate_json(line)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "(row)"
            raise ValueError(f"{where}:{number}: {field}: {first['msg']}") from None
        if row.rollout_id in seen:
            raise ValueError(f"{where}:{number}: rollout {row.rollout_id} repeats")
        seen.add(row.rollout_id)
        rows.append(row)
    return rows
