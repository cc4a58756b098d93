"""Request/reply commands and queries (NATS request/reply), one model per message."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from rollout.shared.contracts.budgets import Budgets
from rollout.shared.contracts.events import Method
from rollout.shared.contracts.snapshot import DatasetSource


class Request(BaseModel):
    """Base of every request."""

    model_config = ConfigDict(extra="forbid")


def _client_request_id() -> Any:
    # A command's idempotency key: the client makes one per command and resends it on a retry,
    # so the service answers the retry with what the first attempt created.
    return Field(
        default=None,
        min_length=1,
        max_length=128,
        description="a fresh id per command (e.g. a uuid), the same on every retry of it",
    )


def request_fingerprint(request: Request) -> str:
    """A hash of what a command asks for (its request id and owner aside): tells a retry from a
    reuse. Who asks is in the id the request id derives (see `owned_request_key`)."""
    body = request.model_dump_json(exclude={"client_request_id", "owner"})
    return hashlib.sha256(body.encode()).hexdigest()


def owned_request_key(owner: str | None, client_request_id: str) -> tuple[str, ...]:
    """What a run's or job's id derives from: its owner's request id. Another user sending the
    same request id gets an aggregate of its own, so none can take a colleague's next id first
    (a training job's round runs, a plan's stages: their ids are predictable). An anonymous
    caller (no auth) keeps the id of the request id alone, as before owners were kept."""
    if owner is None or owner == "anonymous":
        return (client_request_id,)
    return (owner, client_request_id)


class Reply(BaseModel):
    """Every reply: `ok` with `data`, or an error with every problem listed."""

    ok: bool = True
    error: str | None = None
    problems: list[str] = Field(default_factory=list)
    data: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def failure(cls, error: str, problems: list[str] | None = None) -> Reply:
        """An error reply."""
        return cls(ok=False, error=error, problems=list(problems or []))


# --- env registry ---------------------------------------------------------------------------


class PushEnvironment(Request):
    """Register a spec (camelCase JSON as produced by the SDK); identical content is a no-op."""

    spec: dict[str, Any]


class GetEnvironment(Request):
    """One environment version (latest when `version` is omitted)."""

    slug: str
    version: int | None = None


class ListEnvironments(Request):
    """Every environment's latest version."""


class AuditEnvironment(Request):
    """Run `rollout audit`'s adversarial policies on a registered env, where it is served."""

    slug: str
    version: int | None = None
    split: str | None = None
    threshold: float = Field(0.75, ge=0, le=1)
    limit: int | None = Field(None, ge=1)


# --- runs ------------------------------------------------------------------------------------


def _one_line(value: str | None) -> str | None:
    # Printed by every CLI and viewer that shows the ending: no control characters (a terminal
    # escape in a colleague's `rollout show`), one line.
    # isprintable() refuses C0/C1 controls, format characters (bidi overrides) and line breaks.
    if value is not None and not value.replace(" ", "").isprintable():
        raise ValueError("must be one line, without control characters")
    return value


def _printable(value: str | None) -> str | None:
    # Text of several lines (a verifier's reason): line breaks and tabs, no other control.
    if (
        value is not None
        and not value.replace(" ", "").replace("\n", "").replace("\t", "").isprintable()
    ):
        raise ValueError("must be text without control characters (line breaks and tabs aside)")
    return value


# Names and model references every CLI prints: one line, no terminal escapes.
OneLine = Annotated[str, AfterValidator(_one_line)]


class CreateRun(Request):
    """Start a run of `model` on an environment's tasks, `n` rollouts per task."""

    env_slug: str
    model: OneLine = Field(max_length=2048)
    n: int = 1
    env_version: int | None = Field(default=None, ge=1)
    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None
    max_tool_calls: int = 16
    # Overrides of the env's rollout budgets (unset fields: the env's, else the platform's).
    budgets: Budgets | None = None
    split: str | None = None
    name: OneLine | None = Field(default=None, max_length=200)
    parent_run_id: str | None = None
    task_indices: list[int] | None = None
    batch_size: int = 16
    deadline_s: float = 3600.0
    # Whom the run is for, when a platform service starts it for someone (a training job's
    # round runs belong to the job's owner); from an API key only its own user is accepted.
    owner: str | None = Field(default=None, max_length=128)
    client_request_id: str | None = _client_request_id()


class CheckModel(Request):
    """Can the actors generate with `model`? Asked by the tracker before it records a run."""

    model: str = Field(max_length=2048)


# Why a run or job was cancelled, kept in its ending.
Reason = Annotated[str | None, Field(max_length=500), AfterValidator(_one_line)]


class CancelRun(Request):
    """End a running run now: it fails as cancelled, and its unstarted work is skipped."""

    run_id: str = Field(min_length=1, max_length=128)
    reason: Reason = None


class GetRun(Request):
    """One run's summary, optionally with its rollouts."""

    run_id: str
    include_rollouts: bool = False
    include_trajectories: bool = False
    # Rollouts come a page at a time, so no reply exceeds the server's max payload: pass the
    # previous reply's `rolloutsCursor` for the next page (the Client follows them for you).
    rollouts_cursor: str | None = None
    page_size: int = Field(500, ge=1, le=1000)
    # The per-task table is paged the same way: the previous reply's `tasksCursor` (the last
    # task index it held) for the next page; `include_tasks=False` leaves the table out.
    include_tasks: bool = True
    tasks_cursor: int | None = Field(None, ge=0)
    tasks_page_size: int = Field(1000, ge=1, le=5000)
    # Only rollouts with this outcome (`pending`: awaiting a verdict), selected by the tracker:
    # a run's few errored rollouts without paging through all of it.
    outcome: Literal["passed", "failed", "errored", "pending"] | None = None


class ListRuns(Request):
    """Recent runs, newest first."""

    limit: int = 20
    env_slug: str | None = None
    # Only the runs this user started (`rollout runs --mine`).
    owner: str | None = Field(default=None, max_length=128)


# --- training jobs ---------------------------------------------------------------------------


class CancelTrainingJob(Request):
    """End a queued or running training job now: it fails as cancelled at its next step."""

    job_id: str = Field(min_length=1, max_length=128)
    reason: Reason = None


class CreateTrainingJob(Request):
    """Fine-tune `base_model` on a run's rollouts (SFT/DPO) or online on an env (GRPO/PPO)."""

    method: Method
    base_model: str
    source_run_id: str | None = None
    rollout_ids: list[str] | None = None
    env_slug: str | None = None
    suffix: str | None = None
    hyperparams: dict[str, Any] = Field(default_factory=dict)
    client_request_id: str | None = _client_request_id()
    source_dataset: DatasetSource | None = Field(
        None,
        description="train on this exported dataset snapshot instead of a run (sft, dpo, kto, rm)",
    )
    include_held_out: bool = Field(
        False,
        description="also train on the run's rollouts of held-out tasks (a split other than "
        "train); left out by default, so a later test run measures what was not trained on",
    )


class GetJob(Request):
    """One training job."""

    job_id: str


class ListJobs(Request):
    """Recent training jobs, newest first."""

    limit: int = 20
    # Only the jobs this user started (`rollout jobs --mine`).
    owner: str | None = Field(default=None, max_length=128)


# --- imported runs -----------------------------------------------------------------------------

MAX_IMPORTED_ROLLOUTS = 10_000
# The tracker's bound on a run's samples per task (services/tracker/runs.py MAX_N): an import's
# run asks for n = 1 + its highest sample_index, which must fit where create_run's would.
MAX_IMPORTED_SAMPLES = 10_000


class ImportedRollout(Request):
    """One scored rollout produced outside the platform (e.g. an ART trajectory)."""

    task_index: int = Field(ge=0)
    sample_index: int = Field(ge=0, le=MAX_IMPORTED_SAMPLES - 1)
    trajectory: dict[str, Any] = Field(description="a rollout Trajectory (trajectory.json)")
    score: float = Field(ge=0, le=1, allow_inf_nan=False)
    passed: bool
    reason: Annotated[str, AfterValidator(_printable)] = Field(default="", max_length=2000)
    model: OneLine | None = Field(default=None, min_length=1, max_length=200)


class ImportRun(Request):
    """Record scored rollouts made elsewhere as a completed run of a registered environment.

    The run's id derives from the content, so importing the same rollouts again names the
    same run and appends nothing.
    """

    env_slug: str
    env_version: int | None = Field(default=None, ge=1)
    source: Literal["art"] = "art"
    model: OneLine = Field(default="imported/art", min_length=1, max_length=200)
    name: OneLine | None = Field(default=None, max_length=200)
    rollouts: list[ImportedRollout] = Field(min_length=1, max_length=MAX_IMPORTED_ROLLOUTS)


# --- experiment plans --------------------------------------------------------------------------


class RecordPlanEvent(Request):
    """Append one event to a plan's history, if the history is still as the caller read it."""

    plan_id: str = Field(min_length=1, max_length=128)
    type: str = Field(description="a plan event type: plan.started, plan.stage_started, ...")
    payload: dict[str, Any] = Field(default_factory=dict)
    expected_version: int = Field(
        ge=0, description="stream sequence of the plan's newest event the caller saw (0: none)"
    )
