"""Environment specs: template, config, tasks and verifier; each template's config model is its own.

JSON keys are camelCase (`hiddenGroundTruth`, `initialMutableState`, `fromArray`...) to match the
seed SDK's payloads; Python attribute names are snake_case. Dump with `by_alias=True`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from rollout.shared.contracts.budgets import Budgets
from rollout.shared.contracts.chat import check_messages

# Which templates exist, their spellings and config models are the template registry's
# (rollout.shared.envs.templates): a spec names its template, the registry knows it. The
# registry installs its spelling rule here when it loads (`code_editing` -> `code-editing`),
# so specs are canonical without the contract importing the engine.
_template_spelling: list[Callable[[str], str]] = []


def set_template_spelling(rule: Callable[[str], str]) -> None:
    """Install the rule that turns a spelling users type into the registered template name."""
    _template_spelling[:] = [rule]


class CamelModel(BaseModel):
    """Base for spec models: camelCase JSON, snake_case Python, typos in keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_assignment=False
    )

    def to_json_dict(self) -> dict[str, Any]:
        """Dump with camelCase keys, leaving out unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ---------------------------------------------------------------- verifier primitives


class PrimitiveSpec(BaseModel):
    """One verifier primitive: name, type, weight; the type's own parameters ride along."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = Field(min_length=1)
    type: str = Field(min_length=1)
    weight: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    description: str = ""

    @property
    def params(self) -> dict[str, Any]:
        """The type-specific parameters (everything but name, type, weight, description)."""
        return dict(self.model_extra or {})


class VerifierSpec(BaseModel):
    """The verifier: weighted primitives; passed only when every primitive passes."""

    model_config = ConfigDict(extra="forbid")

    primitives: list[PrimitiveSpec] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, value: Any) -> Any:
        # A bare list of primitives is the same verifier.
        if isinstance(value, list):
            return {"primitives": value}
        return value


# ---------------------------------------------------------------- tasks and the env


class TaskSpec(BaseModel):
    """One task: what the agent is told, and what only the verifier sees."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    instruction: str
    hidden_ground_truth: Any = None
    input: dict[str, Any] | None = None
    messages: list[dict[str, Any]] | None = Field(
        None,
        description="earlier turns of a multi-turn prompt (OpenAI chat messages), sent before "
        "the instruction, which is the last user turn; a leading system message replaces the "
        "actor's",
    )
    split: str = "train"
    id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("messages")
    @classmethod
    def _chat(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if value is not None:
            check_messages(value, "messages")
        return value


class EnvironmentSpec(BaseModel):
    """A whole environment as pushed and stored: the config stays the raw camelCase dict."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    slug: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    name: str = ""
    template: str
    description: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    tasks: list[TaskSpec] = Field(default_factory=list)
    verifier: VerifierSpec | None = None
    # The env's own rollout budgets (unset ones: the platform's); a run may override them.
    budgets: Budgets | None = None
    _typed: Any = PrivateAttr(default=None)

    @field_validator("template", mode="before")
    @classmethod
    def _template_alias(cls, value: Any) -> Any:
        if isinstance(value, str) and _template_spelling:
            return _template_spelling[0](value)
        return value

    def to_json_dict(self) -> dict[str, Any]:
        """Dump with camelCase keys (the wire and storage form)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def canonical_json(self) -> str:
        """Deterministic JSON: sorted keys, no whitespace, so equal specs hash equally."""
        return json.dumps(
            self.to_json_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )

    def spec_hash(self) -> str:
        """sha256 of the canonical JSON: the content address of this spec version."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()
