"""Per-rollout budgets: what bounds one episode's tokens, time and repeated calls.

A degenerate policy (one that never stops talking, or calls the same tool forever) must not
hold a run for long: every rollout ends at the first budget it reaches, and its record says
which one (`ended_by`). Defaults are the platform's, an environment may set its own (its
episodes' natural size), and a run may override either, field by field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# Which limit ended a rollout (None on its record: the model ended it itself). `model_refused`:
# the model refused a later turn for what the conversation held by then (it outgrew the
# model's context, most often), so the episode ends where it got to and is judged.
EndedBy = Literal[
    "max_turn_tokens",
    "max_rollout_tokens",
    "max_rollout_seconds",
    "max_repeated_calls",
    "max_tool_calls",
    "model_refused",
]


class Budgets(BaseModel):
    """Limits on one rollout; a field left unset takes the next level's (run > env > default)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    max_turn_tokens: int | None = Field(
        None, ge=1, le=1_000_000, description="New tokens the model may write in one turn."
    )
    max_rollout_tokens: int | None = Field(
        None, ge=1, le=10_000_000, description="New tokens the model may write in one rollout."
    )
    max_rollout_seconds: float | None = Field(
        None, gt=0, le=86_400, description="Wall time one rollout may take, generation included."
    )
    max_repeated_calls: int | None = Field(
        None,
        ge=0,
        le=1024,
        description="The same tool call with the same arguments this many times in a row ends "
        "the rollout as a model error (0: no limit).",
    )

    def over(self, base: Budgets | None) -> Budgets:
        """These budgets, with `base`'s value wherever one is unset here."""
        if base is None:
            return self
        mine = self.model_dump(exclude_none=True)
        return Budgets(**{**base.model_dump(exclude_none=True), **mine})


# The platform's defaults: generous for a healthy agent of the example envs (a few turns of a
# few dozen tokens), small next to a run's deadline for one that loops or rambles.
DEFAULT_BUDGETS = Budgets(
    max_turn_tokens=512,
    max_rollout_tokens=4096,
    max_rollout_seconds=300.0,
    max_repeated_calls=5,
)


def resolve_budgets(env: Budgets | None, run: Budgets | None) -> Budgets:
    """Every budget set: the run's, else the environment's, else the platform's."""
    resolved = DEFAULT_BUDGETS
    for level in (env, run):
        if level is not None:
            resolved = level.over(resolved)
    return resolved
