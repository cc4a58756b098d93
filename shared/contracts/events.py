"""Every event payload. Changed only by adding fields (with defaults), never by renaming."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from rollout.shared.contracts.budgets import Budgets, EndedBy
from rollout.shared.contracts.envelope import Payload, register
from rollout.shared.contracts.snapshot import DatasetSource
from rollout.shared.contracts.training import known_method
from rollout.shared.contracts.trajectory import ErrorKind

# A training method with a config (shared/learning/methods.py lists them with their trainers).
Method = Annotated[
    str,
    AfterValidator(known_method),
    Field(description="A training method: one of training_config.json's `method` values."),
]
# How a rollout ended: a verdict (passed / failed), or none at all (errored, with its cause).
RolloutOutcome = Literal["passed", "failed", "errored"]
# Why a run failed: its deadline passed, a user cancelled it, or every rollout errored.
RunFailure = Literal["deadline", "cancelled", "errored"]


class SamplingParams(Payload):
    """How a model was sampled."""

    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None


# --- environments -------------------------------------------------------------------------


@register
class EnvRegistered(Payload):
    """A new version of an environment spec was accepted."""

    event_type = "env.registered"
    aggregate = "env"

    slug: str
    version: int
    spec_hash: str
    name: str = ""
    template: str = ""
    task_count: int = 0
    spec: dict[str, Any] = Field(default_factory=dict)
    # The slug's owner: the NATS user whose push registered its first version (None on
    # versions registered before owners were kept). Every later version carries it on.
    owner: str | None = None


@register
class EnvAudited(Payload):
    """The registry ran the adversarial policies on an env version (`rollout audit --platform`)."""

    event_type = "env.audited"
    aggregate = "env"

    slug: str
    version: int
    split: str | None = None
    threshold: float
    tasks: int
    policies: list[str] = Field(default_factory=list)
    hackable_tasks: list[int] = Field(default_factory=list)
    # Per finding: task_index, split, policy, description, score, passed, primitive,
    # primitive_type, hint (at most MAX_AUDIT_FINDINGS; `findings_total` counts them all).
    findings: list[dict[str, Any]] = Field(default_factory=list)
    findings_total: int = 0
    errors: int = 0
    # Policies that crashed, or whose episodes the verifier gave no verdict on, one line each:
    # the audit is incomplete, so not clean.
    policy_errors: list[str] = Field(default_factory=list)
    seconds: float = 0.0


# --- runs -----------------------------------------------------------------------------------


@register
class RunRequested(Payload):
    """A user asked for a run: env × model × n rollouts per task."""

    event_type = "run.requested"
    aggregate = "run"

    run_id: str
    env_slug: str
    env_version: int
    env_hash: str
    model: str
    n: int = Field(ge=1)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    max_tool_calls: int = 16
    budgets: Budgets | None = None
    split: str | None = None
    name: str | None = None
    parent_run_id: str | None = None
    task_indices: list[int] = Field(default_factory=list)
    batch_size: int = 16
    deadline_s: float = 3600.0
    policy_version: int = 0
    # The command's client request id and fingerprint: a retry gets this run back.
    request_id: str | None = None
    request_hash: str | None = None
    # Where an imported run's scored rollouts came from (e.g. "art"): its rollouts and verdicts
    # are on the log already, so nothing fans it out or scores it. None: the actors generate it.
    source: str | None = None
    # The NATS user the run was started by (or for): who, besides the admin, may cancel it.
    # None on runs recorded before owners were kept.
    owner: str | None = None


@register
class RunStarted(Payload):
    """The tracker fanned a run out into work items."""

    event_type = "run.started"
    aggregate = "run"

    run_id: str
    work_items: int
    total_rollouts: int
    # Work items queued at the start; each later one is queued as an earlier one is scored,
    # so a big run keeps this many in the shared queue and others' runs are not stuck behind
    # its whole backlog. None: all at once (runs started before windows existed). 0: none
    # yet, the run waits for its owner's earlier runs (ROLLOUT_RUNS_PER_OWNER), and its
    # deadline counts from its first release.
    window: int | None = Field(default=None, ge=0)


@register
class WorkReleased(Payload):
    """The tracker queued a windowed run's work items up to `released` (its first N)."""

    event_type = "run.work_released"
    aggregate = "run"

    run_id: str
    released: int = Field(ge=1)


class GeneratedRollout(Payload):
    """One trajectory with its provenance; large ones live in the object store (claim check)."""

    rollout_id: str
    task_index: int
    sample_index: int
    trajectory: dict[str, Any] | None = None
    trajectory_uri: str | None = None
    trajectory_sha256: str | None = None
    model: str
    policy_version: int = 0
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    env_hash: str = ""
    seed: int | None = None
    actor_id: str = ""
    duration_s: float = 0.0
    error: str | None = None
    # Which delivery of the work item produced it (>1: a replica died or timed out first).
    delivery_attempt: int = 1
    # What broke, when `error` says the rollout could not be generated or stored.
    error_kind: ErrorKind | None = None
    # Which budget ended the episode (None: the model did), its model turns and new tokens
    # (None: no episode ran, e.g. the rollout could not be generated).
    ended_by: EndedBy | None = None
    turns: int | None = None
    completion_tokens: int | None = None


@register
class RolloutsGenerated(Payload):
    """A batch of trajectories produced by an actor for one work item."""

    event_type = "rollout.generated"
    aggregate = "run"

    run_id: str
    work_item_id: str
    rollouts: list[GeneratedRollout]


class PrimitiveScore(Payload):
    """One verifier primitive's verdict."""

    name: str
    type: str
    weight: float
    score: float
    passed: bool
    reason: str


class ScoredRollout(Payload):
    """One rollout's verdict."""

    rollout_id: str
    task_index: int
    sample_index: int
    score: float
    passed: bool
    primitives: list[PrimitiveScore] = Field(default_factory=list)
    error: str | None = None
    # errored: no verdict (score and passed mean nothing), `error` and `error_kind` say why.
    # Events written before this field existed get it from `error` and `passed`.
    outcome: RolloutOutcome | None = None
    error_kind: ErrorKind | None = None

    @model_validator(mode="after")
    def _typed_outcome(self) -> ScoredRollout:
        if self.outcome is None:
            self.outcome = "errored" if self.error else ("passed" if self.passed else "failed")
        if self.outcome == "errored":
            # An errored rollout is never a failed verdict nor a reward of anything.
            self.passed = False
            self.score = 0.0
        return self


@register
class RolloutsScored(Payload):
    """A batch of verdicts for one generated batch."""

    event_type = "rollout.scored"
    aggregate = "run"

    run_id: str
    work_item_id: str
    rollouts: list[ScoredRollout]
    # The stream position of the `rollout.generated` event these verdicts judge: a rollout
    # generated twice (a replica presumed dead that was not) has two trajectories on the log,
    # and a read model keeps the first with its own verdict only. None: imported verdicts,
    # and events from before this field.
    generated_seq: int | None = None


@register
class RunCompleted(Payload):
    """Every rollout of the run is scored."""

    event_type = "run.completed"
    aggregate = "run"

    run_id: str
    total: int
    passed: int
    errored: int = 0
    pass_rate: float
    mean_score: float


@register
class RunFailed(Payload):
    """The run could not finish; the reason says why."""

    event_type = "run.failed"
    aggregate = "run"

    run_id: str
    reason: str
    # What ended it: its deadline, a user's cancel, or every rollout errored (all scored, none
    # with a verdict: nothing was measured). None: events from before this field.
    cause: RunFailure | None = None


# --- API keys' daily budgets ------------------------------------------------------------------

# What a key's daily budget counts: rollouts its runs plan (tasks x n), or training jobs.
QuotaKind = Literal["rollouts", "jobs"]


@register
class KeyLimitsSet(Payload):
    """The operator set (or lifted: None) an API key's budgets a UTC day (`rollout keys limit`)."""

    event_type = "key.limits_set"
    aggregate = "key"

    key_id: str
    max_rollouts_per_day: int | None = Field(None, ge=0)
    max_jobs_per_day: int | None = Field(None, ge=0)


@register
class QuotaCharged(Payload):
    """A key's request was admitted within its budget of one UTC day and counted against it.

    The aggregate is the key's day (`<key id>-<YYYYMMDD>`): the charges of one day are all an
    admission decides from, appended expecting that history, so two requests racing for the
    last of a budget cannot both get in.
    """

    event_type = "quota.charged"
    aggregate = "quota"

    key_id: str
    day: str
    kind: QuotaKind
    amount: int = Field(ge=0)
    # The run or job it was charged for: a retried request finds its charge and pays nothing.
    ref: str


# --- training jobs ---------------------------------------------------------------------------


@register
class JobRequested(Payload):
    """A training job was asked for."""

    event_type = "job.requested"
    aggregate = "job"

    job_id: str
    method: Method
    base_model: str
    source_run_id: str | None = None
    rollout_ids: list[str] = Field(default_factory=list)
    env_slug: str | None = None
    # The env version an online job trains on: the newest when the job was requested, so a
    # version pushed later (by anyone's key, with another verifier) never changes the rewards
    # it learns from, resumed or not. None: requested before versions were pinned.
    env_version: int | None = None
    suffix: str | None = None
    hyperparams: dict[str, Any] = Field(default_factory=dict)
    # The command's client request id and fingerprint: a retry gets this job back.
    request_id: str | None = None
    request_hash: str | None = None
    # A job trained on a dataset snapshot: its hash, where it is, and its lineage.
    source_dataset: DatasetSource | None = None
    # The NATS user that asked for the job: who, besides the admin, may cancel it (None on
    # jobs recorded before owners were kept).
    owner: str | None = None
    # Whether it may train on the source run's held-out tasks (splits other than train).
    include_held_out: bool = False


@register
class JobStarted(Payload):
    """A learner took a training job and is working on it (before its first step)."""

    event_type = "job.started"
    aggregate = "job"

    job_id: str
    # Which delivery of the job's work item this is: a job resumed elsewhere starts again.
    attempt: int = 1


@register
class JobProgress(Payload):
    """A training job advanced."""

    event_type = "job.progress"
    aggregate = "job"

    job_id: str
    step: int
    total_steps: int
    loss: float | None = None
    reward: float | None = None
    tokens_per_s: float | None = None
    eta_s: float | None = None
    # KL to the reference policy, where the method has one (GRPO, DPO); for on-policy
    # distillation, the reverse KL to the teacher.
    kl: float | None = None
    # Online methods: the step's actor-vs-learner gap, clip fraction, staleness and
    # dynamic-sampling drops (as policy.updated's `off_policy`), for the training page.
    off_policy: dict[str, float] | None = None


@register
class JobCompleted(Payload):
    """A training job finished and produced a model."""

    event_type = "job.completed"
    aggregate = "job"

    job_id: str
    model_id: str
    checkpoint_uri: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)


@register
class JobFailed(Payload):
    """A training job stopped with a reason."""

    event_type = "job.failed"
    aggregate = "job"

    job_id: str
    reason: str


@register
class CheckpointSaved(Payload):
    """Weights (and optimizer/RNG state) were written to the object store."""

    event_type = "checkpoint.saved"
    aggregate = "job"

    job_id: str
    step: int
    uri: str
    sha256: str
    size_bytes: int = 0


@register
class PolicyUpdated(Payload):
    """A new policy version is available to actors."""

    event_type = "policy.updated"
    aggregate = "policy"

    model: str
    version: int
    checkpoint_uri: str
    sha256: str
    job_id: str | None = None
    # The step that made this version, for online methods: the gap between the actor's
    # recorded logprobs and the learner's own on the same tokens (mismatch_kl, max_is_ratio,
    # is_outside_fraction), the PPO clip fraction and the mean staleness in versions.
    off_policy: dict[str, float] | None = None
    # What each token of the step's trained rollouts got (advantage, applied importance
    # ratio, actor-vs-learner logprob gap, clipped), as a JSON document in the object store
    # keyed by rollout and turn; the viewer shades a trained rollout's tokens by it.
    signals_uri: str | None = None
    signals_sha256: str | None = None
    trained_rollouts: list[str] = Field(default_factory=list)
    # The digest of the version's weights (shared/models/weights_proof.py): what an actor
    # loading it into an inference server sends with the load, and what a rollout generated
    # with it must carry for the learner to train on it.
    weights_sha256: str | None = None


# --- failures ----------------------------------------------------------------------------------


@register
class DeadLettered(Payload):
    """A message could not be handled after its attempts; kept here with the reason."""

    event_type = "deadletter.recorded"
    aggregate = "deadletter"

    consumer: str
    stream: str
    stream_seq: int
    subject: str
    deliveries: int
    reason: str
    data_preview: str = ""


# --- experiment plans ----------------------------------------------------------------------------


@register
class PlanStarted(Payload):
    """An experiment plan began: its canonical form (envs pinned), its hash, its stages."""

    event_type = "plan.started"
    aggregate = "plan"

    plan_id: str
    name: str
    plan_hash: str
    plan: dict[str, Any] = Field(default_factory=dict)
    stages: list[str] = Field(default_factory=list)
    # The registry version each environment ran at (files are pushed when the plan starts).
    env_versions: dict[str, int] = Field(default_factory=dict)
    # The NATS user driving the plan (set by the tracker from the request): only it, the admin
    # and the services may record the plan's later events. None on plans recorded before.
    owner: str | None = None


@register
class PlanStageStarted(Payload):
    """One stage of a plan began (again, when a rerun resumes it)."""

    event_type = "plan.stage_started"
    aggregate = "plan"

    plan_id: str
    stage: str
    kind: str
    index: int = 0


@register
class PlanStageCompleted(Payload):
    """One stage of a plan finished: what it produced (run id, job id, model, comparison)."""

    event_type = "plan.stage_completed"
    aggregate = "plan"

    plan_id: str
    stage: str
    kind: str
    outputs: dict[str, Any] = Field(default_factory=dict)


@register
class PlanStageFailed(Payload):
    """One stage of a plan failed, with the reason."""

    event_type = "plan.stage_failed"
    aggregate = "plan"

    plan_id: str
    stage: str
    kind: str
    reason: str


@register
class PlanCompleted(Payload):
    """Every stage of a plan completed."""

    event_type = "plan.completed"
    aggregate = "plan"

    plan_id: str
    outputs: dict[str, Any] = Field(default_factory=dict)


@register
class PlanFailed(Payload):
    """A plan stopped at a failed stage (a rerun of the same plan resumes from there)."""

    event_type = "plan.failed"
    aggregate = "plan"

    plan_id: str
    stage: str | None = None
    reason: str
