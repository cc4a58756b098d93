"""`contains_terms`: the output (or a state path) contains all / any of the terms."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from rollout.shared.contracts.envspec import CamelModel
from rollout.shared.envs.verifiers.primitives.common import binary, text_of
from rollout.shared.envs.verifiers.registry import (
    Outcome,
    ScoreContext,
    register,
)


class ContainsTermsParams(CamelModel):
    """`contains_terms`: the final output (or a state path) contains the terms."""

    terms: list[str] = Field(min_length=1)
    source: str = "output"
    mode: Literal["all", "any"] = "all"
    case_sensitive: bool = False

    @field_validator("terms", mode="before")
    @classmethod
    def _one_term(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


@register("contains_terms", ContainsTermsParams)
def contains_terms(p: ContainsTermsParams, ctx: ScoreContext) -> Outcome:
    """The output (or a state path) contains all / any of the terms."""
    text = text_of(ctx, p.source)
    if text is None:
        return binary(False, f"{p.source}: not in the final state")
    hay = text if p.case_sensitive else text.lower()
    found = [t for t in p.terms if (t if p.case_sensitive else t.lower()) in hay]
    missing = [t for t in p.terms if t not in found]
    if p.mode == "any":
        ok = bool(found)
        why = f"found {found}" if ok else f"none of {p.terms} in {p.source}"
        return binary(ok, why)
    ok = not missing
    why = f"all {len(p.terms)} term(s) found" if ok else f"missing in {p.source}: {missing}"
    return Outcome(len(found) / len(p.terms), ok, why)
