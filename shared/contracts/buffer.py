"""Request/reply contracts of the buffer service: training data built from scored rollouts.

Every reply carries its items inline, or (when their JSON is larger than the request's
`inline_limit`) a claim check: an object-store reference with the sha256 the bytes must have.
`BufferData.load(store)` gives the items either way, verified.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollout.shared.contracts.requests import Request
from rollout.shared.errors import RolloutError
from rollout.shared.objectstore.base import ObjectRef, ObjectStore
from rollout.shared.objectstore.claimcheck import DEFAULT_INLINE_LIMIT, get_json

SERVICE = "buffer"
# Replies go over NATS (1 MiB max payload by default): item lists larger than the one
# claim-check threshold (DEFAULT_INLINE_LIMIT, defined in the claim-check module) go to the
# object store.
MIN_INLINE_LIMIT = 1024

Kind = Literal["sft_set", "dpo_pairs", "grpo_groups", "rollouts"]
# How a buffer reply that could not wait for `after_seq` begins: the caller may ask again.
BEHIND = "the buffer has not caught up with the events stream"


class BufferQuery(Request):
    """Options every buffer query shares."""

    inline_limit: int = Field(
        DEFAULT_INLINE_LIMIT,
        ge=MIN_INLINE_LIMIT,
        description="items whose JSON is larger than this many bytes come back as an object ref",
    )
    offset: int = Field(0, ge=0, description="the first item of the page (0: from the start)")
    page_size: int | None = Field(
        None,
        ge=1,
        description="at most this many items per reply; the reply's next_offset asks for the "
        "next page (none: every item in one reply, by object ref when large)",
    )
    after_seq: int | None = Field(
        None,
        ge=0,
        description="answer only once the buffer has applied the events stream up to this "
        "sequence (e.g. a run's run.completed), so the answer holds every rollout before it",
    )


class SftSetQuery(BufferQuery):
    """Passing rollouts of a run (or the given rollout ids) as chat examples with tools."""

    run_id: str | None = None
    rollout_ids: list[str] | None = None

    @model_validator(mode="after")
    def _needs_a_source(self) -> SftSetQuery:
        if not self.run_id and not self.rollout_ids:
            raise ValueError("give run_id or rollout_ids")
        return self


class DpoPairsQuery(BufferQuery):
    """Best vs worst rollout of each task's group, where the score margin is at least `min_margin`."""

    run_ids: list[str] = Field(min_length=1)
    rollout_ids: list[str] | None = Field(
        None, description="only these rollouts (of the one run in run_ids) are paired"
    )
    min_margin: float = Field(0.0, ge=0.0, le=1.0)


class GrpoGroupsQuery(BufferQuery):
    """Scored rollouts grouped by (run, task), with token ids, logprobs, rewards, versions.

    With `max_staleness`, completions older than `current_policy_version - max_staleness`
    are dropped; so are completions newer than `current_policy_version` (it defaults to the
    newest version among the selection).
    """

    run_ids: list[str] = Field(default_factory=list)
    env_slug: str | None = None
    policy_versions: list[int] | None = None
    max_staleness: int | None = Field(None, ge=0)
    current_policy_version: int | None = Field(None, ge=0)
    min_group_size: int = Field(2, ge=1)
    require_tokens: bool = True

    @model_validator(mode="after")
    def _needs_a_source(self) -> GrpoGroupsQuery:
        if not self.run_ids and not self.env_slug:
            raise ValueError("give run_ids or env_slug")
        return self


class RolloutsQuery(BufferQuery):
    """Scored rollouts as the buffer keeps them, selected by env, verdict, version and time.

    What `rollout export --buffer` writes out: every filter given must hold (none: all).
    """

    env_slug: str | None = None
    env_version: int | None = Field(None, ge=1, description="only this version of env_slug")
    run_ids: list[str] | None = None
    verdict: Literal["passed", "failed"] | None = Field(
        None, description="only rollouts that passed (or failed) their verifier"
    )
    include_errored: bool = Field(
        False, description="keep rollouts whose generation or scoring erred"
    )
    policy_versions: list[int] | None = None
    since: datetime | None = Field(None, description="only rollouts scored at or after this time")
    include_imported: bool = Field(
        False,
        description="also select imported runs' rollouts (rewards recorded elsewhere, e.g. ART);"
        " runs named in run_ids are always selected",
    )
    as_of: int | None = Field(
        None,
        ge=0,
        description="only rollouts scored at or before this events-stream sequence: the pages "
        "of one export see one selection, whatever is scored while it pages",
    )
    after_rollout: str | None = Field(
        None,
        description="the page starts right after this rollout (the previous page's last), in "
        "(run_id, task_index, sample_index) order; offset is then only reported back",
    )

    @model_validator(mode="after")
    def _version_needs_env(self) -> RolloutsQuery:
        if self.env_version is not None and not self.env_slug:
            raise ValueError("env_version needs env_slug")
        if self.verdict is not None and self.include_errored:
            raise ValueError("verdict selects passed or failed rollouts; errored ones have none")
        return self


# --- items ------------------------------------------------------------------------------------


class SftExample(BaseModel):
    """One multi-turn chat with tool calls and tool results, and the tools the model was offered."""

    model_config = ConfigDict(extra="forbid")

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)


class DpoPair(BaseModel):
    """A preference pair in TRL's conversational form: shared prompt, chosen and rejected turns."""

    model_config = ConfigDict(extra="forbid")

    prompt: list[dict[str, Any]]
    chosen: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)


class GrpoCompletion(BaseModel):
    """One sampled completion of a group: exactly the tokens and logprobs the actor sampled."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    token_ids: list[list[int]] | None = None
    logprobs: list[list[float]] | None = None
    messages: list[dict[str, Any]]
    reward: float
    passed: bool
    policy_version: int
    # The digest of the weights that generated it (None: no proof was given).
    weights_sha256: str | None = None


class GrpoGroup(BaseModel):
    """Every completion for one task of one run: advantages are normalised within it."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    task_index: int
    prompt: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    completions: list[GrpoCompletion]


class BufferData(BaseModel):
    """A query's answer: `items` (with `meta`, aligned) inline, or `ref` to them in the store."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    kind: Kind
    count: int
    # Every item of the answer (count is this page's), where this page starts, the next one.
    total: int | None = None
    offset: int = 0
    next_offset: int | None = None
    items: list[dict[str, Any]] | None = None
    meta: list[dict[str, Any]] | None = None
    ref: ObjectRef | None = None
    stats: dict[str, float] = Field(default_factory=dict)
    # How far the buffer's projection is behind the events stream, as the tracker's answers
    # say it (rollout.shared.stale.lag_report); None: unknown (NATS did not say in time).
    read_models: dict[str, Any] | None = Field(default=None, alias="readModels")

    async def load(self, store: ObjectStore | None = None) -> tuple[list[dict], list[dict]]:
        """(items, meta), fetched from the store and verified by sha256 when they are a ref."""
        if self.ref is None:
            return list(self.items or []), list(self.meta or [])
        if store is None:
            raise RolloutError(f"{self.kind} came back as {self.ref.uri}: pass the object store")
        blob = await get_json(store, self.ref)
        return list(blob["items"]), list(blob["meta"])
