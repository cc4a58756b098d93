"""Environment specs: every template's config, tools, verifier primitives and tasks.

JSON keys are camelCase (`hiddenGroundTruth`, `initialMutableState`, `fromArray`...) to match the
seed SDK's payloads; Python attribute names are snake_case. Dump with `by_alias=True`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, Literal

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


# ---------------------------------------------------------------- workflow


class WorkflowTool(CamelModel):
    """A workflow tool: `lookup` reads fixtures, `action` appends to state, `mock` answers canned."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")
    kind: Literal["lookup", "action", "mock"]
    description: str = ""
    params_schema: dict[str, Any] | None = None
    # lookup, README shape: a templated dot path into the fixtures.
    fixture_path: str | None = None
    # lookup, helper shape: find the element of fixtures[fromArray] whose matchField equals the arg.
    from_array: str | None = None
    match_field: str | None = None
    match_arg: str | None = None
    # action: README shape `appendTo` + templated `value`; helper shape `stateArray`.
    append_to: str | None = None
    state_array: str | None = None
    value: Any = None
    # mock (and optional override for action): templated response.
    response: Any = None

    @model_validator(mode="after")
    def _kind_fields(self) -> WorkflowTool:
        if self.kind == "lookup":
            if not self.fixture_path and not self.from_array:
                raise ValueError("a lookup tool needs fixturePath or fromArray")
            if self.fixture_path and self.from_array:
                raise ValueError("a lookup tool takes fixturePath or fromArray, not both")
        if self.kind == "action":
            if not self.append_to and not self.state_array:
                raise ValueError("an action tool needs appendTo or stateArray")
            if self.append_to and self.state_array:
                raise ValueError("an action tool takes appendTo or stateArray, not both")
        return self

    @property
    def target(self) -> str | None:
        """The state array an action appends to."""
        return self.append_to or self.state_array


class WorkflowConfig(CamelModel):
    """Config of the `workflow` template."""

    tools: list[WorkflowTool] = Field(default_factory=list)
    fixtures: dict[str, Any] = Field(default_factory=dict)
    initial_mutable_state: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------- custom


class Mutation(CamelModel):
    """A state change: `path` is a dot path to set, or `name[]` to append; `value` is templated."""

    path: str = Field(min_length=1)
    value: Any = None


class CustomTool(CamelModel):
    """A custom tool: templated response plus optional state mutations."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")
    description: str = ""
    params_schema: dict[str, Any] | None = None
    response: Any = None
    mutates: list[Mutation] = Field(default_factory=list)

    @field_validator("mutates", mode="before")
    @classmethod
    def _normalise_mutates(cls, value: Any) -> Any:
        # Accept "orders[]", {"path": ...} or a list of either: one shape downstream.
        if value is None:
            return []
        if isinstance(value, str | dict):
            value = [value]
        if isinstance(value, list):
            return [{"path": v} if isinstance(v, str) else v for v in value]
        return value


class CustomConfig(CamelModel):
    """Config of the `custom` template."""

    tools: list[CustomTool] = Field(default_factory=list)
    initial_mutable_state: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------- sql


class SqlConfig(CamelModel):
    """Config of the `sql` template: DDL plus optional INSERTs, one SQLite db per rollout."""

    schema_: str = Field(alias="schema", min_length=1)
    seed: str = ""
    max_rows: int = Field(default=200, ge=1, le=100_000)
    query_timeout_seconds: float = Field(default=2.0, gt=0, le=60)


# ---------------------------------------------------------------- code-editing


class CodeEditingConfig(CamelModel):
    """Config of the `code-editing` template: files, and how to run the tests in the sandbox."""

    files: dict[str, str] = Field(default_factory=dict)
    test_command: list[str] | str | None = None
    test_timeout_seconds: float = Field(default=60.0, gt=0, le=600)
    memory_mb: int = Field(default=512, ge=64, le=16_384)


# ---------------------------------------------------------------- browser


class BrowserElement(CamelModel):
    """One element of a mock page."""

    id: str = Field(min_length=1)
    type: Literal["text", "link", "input", "button", "form"]
    text: str = ""
    label: str = ""
    href: str | None = None
    name: str | None = None
    form: str | None = None
    value: str | None = None
    placeholder: str | None = None
    required: bool = False
    action: str | None = None


class BrowserPage(CamelModel):
    """One page of the mock site."""

    url: str = Field(min_length=1)
    title: str = ""
    text: str = ""
    elements: list[BrowserElement] = Field(default_factory=list)


class BrowserConfig(CamelModel):
    """Config of the `browser` template: a mock DOM and where the agent starts."""

    pages: list[BrowserPage] = Field(min_length=1)
    initial_url: str | None = None


# ---------------------------------------------------------------- plugin


class PluginConfig(CamelModel):
    """Config of a Python plugin environment: `module.path:function` builds the env object."""

    entrypoint: str
    options: dict[str, Any] = Field(default_factory=dict)
    # The entrypoint's own .py files (relative path -> text), bundled by `push` when the module
    # is the user's code rather than an installed package, so services can import it.
    sources: dict[str, str] = Field(default_factory=dict)


# ---------------------------------------------------------------- openenv


class OpenEnvConfig(CamelModel):
    """Config of the `openenv` template: episodes are played on a remote OpenEnv server.

    Each episode is one WebSocket session on `url`/ws: `reset` with the task's `input` as
    keyword arguments (over `resetOptions`), a `step` per tool call. `actions="tools"` expects
    the server to list its tools in the reset observation (as `rollout env serve` does: a step
    is `{"tool", "arguments"}`); `actions="raw"` offers one tool, `actionTool`, whose
    parameters are the server's action schema (from `/schema`) and whose arguments are sent
    as the action. The URL carries no credentials.
    """

    url: str = Field(min_length=1, max_length=2048, description="http(s):// or ws(s):// base URL.")
    actions: Literal["tools", "raw"] = "tools"
    action_tool: str = Field(
        default="step", min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$"
    )
    # tools mode: a tool that sends {"answer": ...} (ends the episode on `rollout env serve`).
    answer_tool: str | None = Field(
        default="submit_answer", min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$"
    )
    # Sent when the model stops before the server said done (None: leave the episode as is).
    finish_action: dict[str, Any] | None = None
    reset_options: dict[str, Any] = Field(default_factory=dict)
    timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    max_message_mb: float = Field(default=16.0, gt=0, le=256)


# ---------------------------------------------------------------- verifiers


class VerifiersConfig(CamelModel):
    """Config of the `verifiers` template: a Prime Intellect verifiers (v1) taskset.

    `taskset` is a verifiers taskset id (an importable module exporting one `vf.Taskset`
    subclass); `options` are its `TasksetConfig` fields. Each task's hidden ground truth is
    the taskset's own task data; the `verifiers_rubric` primitive scores the reply with the
    task's `@vf.reward` functions. The taskset's code runs only in a plugin host.
    """

    taskset: str = Field(
        min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
    )
    options: dict[str, Any] = Field(default_factory=dict)
    # The taskset module's own .py files, bundled when it is the user's code (as for plugins).
    sources: dict[str, str] = Field(default_factory=dict)


# ---------------------------------------------------------------- nemo_gym


class NemoGymTool(CamelModel):
    """A tool of a NeMo Gym resources server (a `POST /<name>` route)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class NemoGymConfig(CamelModel):
    """Config of the `nemo_gym` template: episodes on a remote NeMo Gym resources server.

    Each episode is one session (a cookie): `/seed_session` with `seed` and the task's `input`,
    a `POST /<tool>` per tool call, `/verify` at the end (its `reward` is what `env_reward`
    reads). Tools are `tools` when given, else the server's POST routes from `/openapi.json`.
    The URL carries no credentials.
    """

    url: str = Field(min_length=1, max_length=2048, description="http(s):// base URL.")
    tools: list[NemoGymTool] | None = None
    # A tool that records the final answer (sent as the response's output message at /verify).
    answer_tool: str | None = Field(
        default="submit_answer", min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$"
    )
    seed: dict[str, Any] = Field(default_factory=dict)
    timeout_seconds: float = Field(default=30.0, gt=0, le=600)


# ---------------------------------------------------------------- verifier primitives


class PrimitiveSpec(BaseModel):
    """One verifier primitive: name, type, weight; the type's own parameters ride along."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = Field(min_length=1)
    type: str = Field(min_length=1)
    weight: float = Field(default=1.0, ge=0)
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


class StateMatchParams(CamelModel):
    """`state_match`: each key is a dot path into the final state, each value what it must equal."""

    expected: dict[str, Any] | None = None
    partial: bool = False


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


class ToolWasCalledParams(CamelModel):
    """`tool_was_called`: a tool was called, optionally with these args, between count bounds."""

    tool: str = Field(min_length=1)
    args: dict[str, Any] | None = None
    min_count: int = Field(default=1, ge=0)
    max_count: int | None = Field(default=None, ge=0)
    successful_only: bool = False


class NoToolErrorsParams(CamelModel):
    """`no_tool_errors`: no tool call (or none of `tools`) returned an error."""

    tools: list[str] | None = None


class FinalAnswerMatchParams(CamelModel):
    """`final_answer_match`: the answer equals / is numerically close to / matches `expected`."""

    expected: Any = None
    mode: Literal["exact", "numeric", "regex", "contains"] = "exact"
    tolerance: float = Field(default=1e-6, ge=0)
    rel_tolerance: float = Field(default=0.0, ge=0)
    case_sensitive: bool = False
    source: str = "output"


class SqlResultMatchParams(CamelModel):
    """`sql_result_match`: the submitted rows equal a reference query's rows (or given rows)."""

    query: str | None = None
    rows: list[Any] | None = None
    order_matters: bool | None = None


class TestsPassParams(CamelModel):
    """`tests_pass`: the task's tests pass on the final files, run in the sandbox."""

    __test__ = False  # not a pytest class, despite the name

    command: list[str] | str | None = None
    files: dict[str, str] | None = None


class UrlReachedParams(CamelModel):
    """`url_reached`: the browser visited (or ended on) a URL."""

    url: str | None = None
    mode: Literal["visited", "final"] = "visited"
    match: Literal["exact", "prefix", "regex"] = "exact"


class FormSubmittedParams(CamelModel):
    """`form_submitted`: a form was submitted, optionally with these field values."""

    form: str | None = None
    fields: dict[str, Any] | None = None
    min_count: int = Field(default=1, ge=1)


class ToolCallOrderParams(CamelModel):
    """`tool_call_order`: the tools were called in this order (subsequence, or exactly)."""

    tools: list[str] = Field(min_length=1)
    exact: bool = False


RULER_DEFAULT_RUBRIC = (
    "- A trajectory that achieves its goal scores higher than one that does not.\n"
    "- Among those that achieve it, a more efficient one (fewer, more direct steps) scores "
    "higher.\n- A trajectory that makes progress scores higher than one that does not.\n"
    "- Scores are between 0 and 1."
)


class RulerParams(CamelModel):
    """`ruler`: an OpenAI-compatible judge scores the n samples of one task against a rubric,
    relative to each other (RULER); a group of one is judged on its own."""

    judge_model: str = Field(min_length=1, description="A model name, e.g. openai/gpt-4o-mini.")
    rubric: str = Field(default=RULER_DEFAULT_RUBRIC, min_length=1)
    pass_threshold: float = Field(default=0.5, ge=0, le=1)
    max_tokens: int = Field(default=2048, ge=16, le=32768)


class EnvRewardParams(CamelModel):
    """`env_reward`: the reward a remote environment (OpenEnv, NeMo Gym) recorded in the final
    state, mapped from [min, max] to [0, 1]; passed when it reaches `passAt` (default: max)."""

    path: str = Field(default="reward", min_length=1, description="Final-state path of the reward.")
    min: float = 0.0
    max: float = 1.0
    pass_at: float | None = None
    require_done: bool = True

    @model_validator(mode="after")
    def _range(self) -> EnvRewardParams:
        if self.max <= self.min:
            raise ValueError("max must be greater than min")
        return self


class VerifiersRubricParams(CamelModel):
    """`verifiers_rubric`: the verifiers task's own rewards score the final reply (run in a
    plugin host); the weighted reward, clipped to [0, 1], passes at `passAt`."""

    pass_at: float = Field(default=1.0, ge=0, le=1)


class RewardModelParams(CamelModel):
    """`reward_model`: a trained reward model (`rollout improve --method rm`) scores the whole
    conversation; the score is the sigmoid of its logit, passed when it reaches `threshold`."""

    model: str = Field(
        min_length=1,
        max_length=512,
        description="A trained reward model's name (BASE:SUFFIX or a job id), e.g. "
        "local/tiny-agent:rm.",
    )
    threshold: float = Field(
        default=0.5, ge=0, le=1, description="Passed when sigmoid(logit) >= threshold."
    )
    max_length: int = Field(
        default=2048, ge=16, le=131072, description="Tokens of the conversation the model reads."
    )


PRIMITIVE_PARAMS: dict[str, type[CamelModel]] = {
    "state_match": StateMatchParams,
    "contains_terms": ContainsTermsParams,
    "tool_was_called": ToolWasCalledParams,
    "no_tool_errors": NoToolErrorsParams,
    "final_answer_match": FinalAnswerMatchParams,
    "sql_result_match": SqlResultMatchParams,
    "tests_pass": TestsPassParams,
    "url_reached": UrlReachedParams,
    "form_submitted": FormSubmittedParams,
    "tool_call_order": ToolCallOrderParams,
    "ruler": RulerParams,
    "env_reward": EnvRewardParams,
    "verifiers_rubric": VerifiersRubricParams,
    "reward_model": RewardModelParams,
}


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
