"""Validating a training-job request completely before anything is appended."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.js import JetStreamContext
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollout.services.learner import training_sets
from rollout.services.learner.basemodels import (
    PROVIDERS,
    TrainBase,
    local_dir,
    resolve_base,
    validate_local,
)
from rollout.services.learner.context import LearnerContext
from rollout.shared import subjects
from rollout.shared.aggregates.run import RunState, load_run_head, rollout_id
from rollout.shared.contracts.events import EnvRegistered, JobRequested
from rollout.shared.contracts.requests import CreateTrainingJob
from rollout.shared.contracts.snapshot import SnapshotRow
from rollout.shared.envs.judged import NOTHING_SCORED, judges_nothing
from rollout.shared.errors import RolloutError
from rollout.shared.learning import methods
from rollout.shared.learning.config import TrainConfig, config_problems, parse_config
from rollout.shared.learning.methods import Method
from rollout.shared.learning.rm import RM_MARKER
from rollout.shared.learning.rm_scoring import past_positions
from rollout.shared.models import trained
from rollout.shared.models.names import check_suffix
from rollout.shared.models.trained import new_job_id
from rollout.shared.objectstore import ObjectStore
from rollout.shared.observability import get_logger
from rollout.shared.store import env_versions


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProviderOptions(_Options):
    """Hyperparameters a provider's fine-tuning API takes."""

    epochs: float | None = Field(None, gt=0)
    learning_rate: float | None = Field(None, gt=0)
    learning_rate_multiplier: float | None = Field(None, gt=0)
    batch_size: int | None = Field(None, ge=1)
    lora: bool | None = None
    beta: float | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0)


_HELD_OUT_WHY = (
    "a model trained on held-out tasks scores recall on them, not generalisation: a later "
    "run on that split would overstate what it learned"
)
_HELD_OUT_OVERRIDE = "to train on them anyway, pass --include-held-out (include_held_out)"

log = get_logger(__name__)


@dataclass
class JobPlan:
    """A validated job: its request event, base model, settings and training data.

    `rows` are the buffer's items as it sent them: SFT examples (`messages`, `tools`), DPO/RM
    pairs (`prompt`, `chosen`, `rejected`, `tools`, with `pair_meta` aligned to them) or, for
    KTO, every scored rollout grouped by task (`prompt`, `completions` with `passed`).
    """

    event: JobRequested
    method: Method
    base: TrainBase
    config: TrainConfig | None
    options: Any
    run: RunState | None = None
    rows: list[dict[str, Any]] | None = None
    pair_meta: list[dict[str, Any]] | None = None
    pairs: int = 0
    # Tasks of the source run left out of the training data as held out (their splits).
    held_out_excluded: int = 0
    # An online job's env, at the version its request pinned (`event.env_version`).
    env: EnvRegistered | None = None


def settings(method: Method, base: TrainBase, hyperparams: dict[str, Any]) -> tuple[Any, Any]:
    """(TrainConfig or None, options) from the user's hyperparams; every bad key named."""
    if not isinstance(hyperparams, dict):
        raise RolloutError("hyperparams: must be a mapping")
    if not base.local:
        try:
            return None, ProviderOptions.model_validate(hyperparams)
        except ValidationError as exc:
            raise RolloutError(
                f"invalid hyperparameters for a {base.kind} fine-tune",
                problems=config_problems(exc, "hyperparams"),
            ) from None
    problems: list[str] = []
    rest = dict(hyperparams)
    if "method" in rest:
        problems.append("hyperparams.method: set the method with `method`, not in hyperparams")
        rest.pop("method")
    config = None
    # The base's own defaults (LoRA for local/smollm2-135m) under what the user set; a default
    # the method has no field for (batch_size of ...) is not the user's mistake.
    fields = method.config.model_fields
    defaults = {k: v for k, v in base.train_defaults.items() if k in fields}
    if method.full_weights:
        defaults = {k: v for k, v in defaults.items() if not k.startswith("lora")}
    try:
        config = parse_config({**defaults, **rest, "method": method.name})
    except ValidationError as exc:
        problems += config_problems(exc, "hyperparams")
    if config is not None and method.online and config.max_steps is None:
        problems.append(f"hyperparams.max_steps: required for {method.name} (`--steps K`)")
    if problems:
        raise RolloutError("invalid hyperparameters", problems=problems)
    # A local job's options are its config: one model holds every setting of the method.
    return config, config


async def _source_run(js: JetStreamContext, cmd: CreateTrainingJob) -> RunState:
    """The completed run a job trains on (every problem with it named)."""
    run_id = cmd.source_run_id
    if not run_id:
        raise RolloutError(
            f"source_run_id: {cmd.method} trains on a run's rollouts; pass --run RUN"
        )
    try:
        subjects.token(run_id, "source_run_id")
    except subjects.SubjectError as exc:
        raise RolloutError(str(exc)) from None
    run = await load_run_head(js, run_id)
    if run is None:
        raise RolloutError(f"source_run_id: no run {run_id!r} (see `rollout runs`)")
    if run.status != "completed":
        why = f": {run.reason}" if run.reason else ""
        raise RolloutError(
            f"run {run_id} is {run.status}{why}; only completed runs can be trained on"
        )
    return run


async def held_out_of(js: JetStreamContext, slug: str, version: int) -> dict[int, str] | None:
    """An env version's tasks outside the train split, with their split; None when this
    platform does not hold that version."""
    env = await env_versions.version(js, slug, version)
    if env is None:
        return None
    tasks = env.spec.get("tasks", [])
    return {
        t: split
        for t, task in enumerate(tasks)
        if (split := str(task.get("split", "train"))) != "train"
    }


async def held_out_tasks(js: JetStreamContext, run: RunState) -> dict[int, str]:
    """The run's tasks outside the train split, with their split (none when it has no env)."""
    req = run.requested
    if req is None:
        return {}
    held = await held_out_of(js, req.env_slug, req.env_version) or {}
    return {t: held[t] for t in req.task_indices if t in held}


def _without_held_out(
    found: training_sets.TrainingSet,
    held_out: dict[int, str],
    ids: list[str] | None,
    run: RunState,
) -> training_sets.TrainingSet:
    """`found` less the items of held-out tasks; RolloutError if the caller chose some by id."""
    req = run.requested
    assert req is not None
    splits = ", ".join(sorted(set(held_out.values())))
    if ids is not None:
        chosen = set(ids)
        named = sorted(
            rid
            for t in held_out
            for s in range(req.n)
            if (rid := rollout_id(run.run_id, t, s)) in chosen
        )
        if named:
            raise RolloutError(
                f"rollout_ids: {len(named)} of the given rollouts are of held-out tasks "
                f"(split {splits}), e.g. {named[0]}",
                problems=[_HELD_OUT_WHY, _HELD_OUT_OVERRIDE],
            )
    keep = [k for k, m in enumerate(found.meta) if m.get("task_index") not in held_out]
    if len(keep) < len(found.items):
        log.info("held-out tasks left out of the training data", run_id=run.run_id,
                 tasks=len(held_out), items=len(found.items) - len(keep))  # fmt: skip
    return training_sets.TrainingSet(
        [found.items[k] for k in keep], [found.meta[k] for k in keep], found.stats
    )


class SnapshotHeldOut:
    """Leaves a dataset snapshot's rows of held-out tasks out, as a run's: each row names its
    env version and task, and the registry says the task's split. Rows of an env this
    platform does not hold (a snapshot from elsewhere) are kept: their split is unknown."""

    def __init__(self, js: JetStreamContext, cmd: CreateTrainingJob) -> None:
        self.js, self.cmd = js, cmd
        # Held-out tasks left out, as (env, version, task).
        self.excluded = 0

    async def leave_out(self, rows: list[SnapshotRow]) -> list[SnapshotRow]:
        """`rows` less those of held-out tasks; RolloutError when nothing else is left."""
        by_env = {
            env: await held_out_of(self.js, *env)
            for env in sorted({(r.env_slug, r.env_version) for r in rows})
        }
        held = {
            (r.env_slug, r.env_version, r.task_index): split
            for r in rows
            if (split := (by_env[(r.env_slug, r.env_version)] or {}).get(r.task_index))
        }
        self.excluded = len(held)
        kept = [r for r in rows if (r.env_slug, r.env_version, r.task_index) not in held]
        if held and not kept:
            name = self.cmd.source_dataset.name if self.cmd.source_dataset else "the dataset"
            raise RolloutError(
                f"dataset {name} has nothing to train on outside its held-out tasks "
                f"(split {', '.join(sorted(set(held.values())))})",
                problems=[_HELD_OUT_WHY, _HELD_OUT_OVERRIDE],
            )
        if held:
            log.info("held-out tasks left out of the dataset", tasks=len(held),
                     rows=len(rows) - len(kept))  # fmt: skip
        return kept


async def _training_rows(
    nc: Client,
    store: ObjectStore,
    cmd: CreateTrainingJob,
    method: Method,
    run: RunState | None,
    options: Any,
    held_out: dict[int, str] | None = None,
    leave_out: Callable[[list[SnapshotRow]], Awaitable[list[SnapshotRow]]] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, meta) from the buffer, or from the dataset snapshot; RolloutError when empty.

    Rollouts of the run's held-out tasks (`held_out`) are left out, and a snapshot's rows as
    `leave_out` says: a test run on those tasks would otherwise measure recall of what the
    model was trained on.
    """
    ids = cmd.rollout_ids
    margin = float(getattr(options, "min_margin", 0.0))
    if cmd.source_dataset is not None:
        source = f"dataset {cmd.source_dataset.name} ({cmd.source_dataset.sha256[:12]})"
        found = await training_sets.dataset_set(
            store, cmd.source_dataset, method.data, min_margin=margin, leave_out=leave_out
        )
    else:
        assert run is not None
        source = f"run {run.run_id}"
        if method.data == "sft":
            found = await training_sets.sft_set(nc, store, run.run_id, ids, after_seq=run.ended_seq)
        elif method.data == "labelled":
            found = await training_sets.labelled_set(
                nc, store, run.run_id, ids, after_seq=run.ended_seq
            )
        else:
            found = await training_sets.dpo_pairs(
                nc, store, run.run_id, ids, min_margin=margin, after_seq=run.ended_seq
            )
        if held_out:
            had = len(found.items)
            found = _without_held_out(found, held_out, ids, run)
            if had and not found.items:
                # Only held-out tasks had anything to learn from (else the usual "none" below).
                splits = ", ".join(sorted(set(held_out.values())))
                raise RolloutError(
                    f"{source} has nothing to train on outside its held-out tasks (split {splits})",
                    problems=[
                        "train on a run of the train split (`rollout run ... --split train`)",
                        _HELD_OUT_WHY,
                        _HELD_OUT_OVERRIDE,
                    ],
                )
    if method.data == "sft":
        if not found.items:
            considered = int(found.stats.get("examples", 0) + found.stats.get("skipped", 0))
            raise RolloutError(
                f"{source} has no passing rollouts to fine-tune on",
                problems=[
                    f"{considered} rollout(s) considered, none passed its verifier (SFT learns "
                    "from passing ones only): run a stronger model, or more samples per task "
                    "(`rollout run ... -n 8`), until some pass"
                ],
            )
        return found.items, found.meta
    if method.data == "labelled":
        labels = {bool(c["passed"]) for g in found.items for c in g["completions"]}
        if labels != {True, False}:
            which = "passed" if True in labels else "failed" if labels else "was scored"
            raise RolloutError(
                f"{source} has nothing for {method.title} to weigh: "
                + ("no rollout was scored" if not labels else f"every rollout {which}"),
                problems=[
                    f"{method.title} learns from passed (desirable) against failed "
                    "(undesirable) rollouts; run more samples (-n) or a model that sometimes fails"
                ],
            )
        return found.items, found.meta
    if not found.items:
        name = method.title
        raise RolloutError(
            f"{source} has no preference pairs for {name}",
            problems=[
                f"{name} needs two rollouts of the same task whose scores differ by more than "
                f"{margin} (min_margin); run with -n 2 or more on tasks the model sometimes "
                "fails"
            ],
        )
    return found.items, found.meta


async def plan_job(
    ctx: LearnerContext,
    cmd: CreateTrainingJob,
    *,
    job_id: str | None = None,
    env_version: int | None = None,
) -> JobPlan:
    """Validate `cmd`; return the plan or raise RolloutError listing what is wrong.

    An online job trains on `env_version` of its env, the one its request pinned when it is
    planned again to run (None: the newest, pinned now).

    SFT and DPO data come from the buffer, asked once the run is known to have completed.
    """
    js = ctx.js
    method = methods.get(cmd.method)
    if cmd.suffix is not None and (problem := check_suffix(cmd.suffix)) is not None:
        raise RolloutError(f"suffix: {problem}")
    base = await asyncio.to_thread(resolve_base, cmd.base_model)
    if base.local:
        await asyncio.to_thread(validate_local, base)
    elif not method.providers:
        raise RolloutError(
            f"base_model: {method.title} trains local weights; {cmd.base_model!r} is a "
            f"{base.kind} model (use hf:<dir>, local/smollm2-135m or local/tiny-agent)"
        )
    elif base.kind not in method.providers:
        raise RolloutError(
            f"method: {method.title} on provider models is available for "
            f"{', '.join(f'{k}/...' for k in method.providers)} only, not {base.kind}"
        )
    config, options = settings(method, base, cmd.hyperparams)
    job_id = job_id or new_job_id()
    plan = JobPlan(
        event=JobRequested(
            job_id=job_id,
            method=cmd.method,
            base_model=cmd.base_model.strip(),
            source_run_id=cmd.source_run_id,
            rollout_ids=list(cmd.rollout_ids or []),
            env_slug=cmd.env_slug,
            suffix=cmd.suffix,
            hyperparams=dict(cmd.hyperparams),
            source_dataset=cmd.source_dataset,
            include_held_out=cmd.include_held_out,
        ),
        method=method,
        base=base,
        config=config,
        options=options,
    )
    if method.online:
        if cmd.source_dataset is not None:
            raise RolloutError(
                f"source_dataset: {cmd.method} trains online on an env (--env); a dataset "
                f"trains {', '.join(methods.names(online=False))}"
            )
        plan.env = await _check_env(js, cmd.env_slug, env_version)
        plan.event.env_version = plan.env.version
        await reward_model_dir(
            getattr(config, "reward_model", None), getattr(config, "reward_model_max_length", None)
        )
        if getattr(config, "teacher", None) is not None:
            await asyncio.to_thread(teacher_base, config.teacher)
        elif getattr(config, "reward_model", None) is None and judges_nothing(plan.env.spec):
            # Every reply gets the same verdict: the advantages are all zero, and the job
            # would spend its steps learning nothing.
            raise RolloutError(
                f"env_slug: environment {cmd.env_slug!r} judges nothing ({NOTHING_SCORED}):"
                f" {cmd.method} would get one reward for every reply and learn nothing",
                problems=[
                    "give every prompt an 'answer' (its env then checks the replies)",
                    "or reward with a trained reward model (hyperparams.reward_model), or"
                    " distil from a teacher (--method opd)",
                ],
            )
        return plan
    if cmd.source_dataset is not None:
        if cmd.source_run_id or cmd.rollout_ids is not None:
            raise RolloutError(
                "source_dataset: a job trains on a dataset or on a run (source_run_id, "
                "rollout_ids), not both"
            )
    else:
        plan.run = await _source_run(js, cmd)
    if cmd.rollout_ids is not None and not cmd.rollout_ids:
        raise RolloutError("rollout_ids: empty list (omit it to use the whole run)")
    keep_all = plan.run is None or cmd.include_held_out
    held_out = {} if keep_all else await held_out_tasks(js, plan.run)
    snapshot = None if cmd.include_held_out else SnapshotHeldOut(js, cmd)
    plan.rows, meta = await _training_rows(
        ctx.nc, ctx.store, cmd, method, plan.run, options, held_out,
        snapshot.leave_out if snapshot is not None else None,
    )  # fmt: skip
    plan.held_out_excluded = len(held_out) + (snapshot.excluded if snapshot is not None else 0)
    if method.data == "pairs":
        plan.pair_meta, plan.pairs = meta, len(plan.rows)
    return plan


async def _check_env(
    js: JetStreamContext, slug: str | None, number: int | None = None
) -> EnvRegistered:
    """Version `number` of an online job's env (None: the newest), once it is one the job can
    train on."""
    if not slug:
        raise RolloutError("env_slug: online training needs an environment (`--env SLUG`)")
    try:
        subjects.token(slug, "env_slug")
    except subjects.SubjectError as exc:
        raise RolloutError(str(exc)) from None
    if number is not None:
        env = await env_versions.version(js, slug, number)
        if env is None:
            raise RolloutError(f"env_slug: environment {slug!r} has no version {number}")
    else:
        env, _ = await env_versions.latest(js, slug)
    if env is None:
        raise RolloutError(f"env_slug: no environment {slug!r} (push it with `rollout push`)")
    tasks = env.spec.get("tasks", [])
    if not any(t.get("split", "train") == "train" for t in tasks):
        raise RolloutError(f"env_slug: environment {slug!r} has no tasks in its train split")
    return env


async def reward_model_dir(name: str | None, max_length: int | None = None) -> Path | None:
    """The folder of PPO's `reward_model` (a trained name or hf:DIR); None when not set.
    RolloutError when `max_length` (its reward_model_max_length) is past the model's positions."""
    if name is None:
        return None
    where = "hyperparams.reward_model"
    record = await asyncio.to_thread(trained.find_trained, name)
    if record is not None and record.kind == "hf":
        path = await trained.materialize(record)
    elif name.startswith("hf:") and name[3:].strip():
        path = await asyncio.to_thread(Path(name[3:].strip()).expanduser)
    else:
        raise RolloutError(
            f"{where}: no trained reward model {name!r}",
            problems=[
                "give the model name a `rollout improve --method rm` job produced, or hf:DIR"
            ],
        )
    if not await asyncio.to_thread((path / RM_MARKER).is_file):
        raise RolloutError(
            f"{where}: {name!r} is not a reward model (no {RM_MARKER} in {path}); train one "
            "with `rollout improve --method rm`"
        )
    if max_length is not None:
        # Before the job starts: a conversation longer than the model's positions but under
        # the limit would be fed whole, and fail or be scored on garbage positions.
        problem = await asyncio.to_thread(past_positions, max_length, name, path)
        if problem:
            raise RolloutError(f"hyperparams.reward_model_max_length: {problem}")
    return path


def teacher_base(name: str) -> TrainBase:
    """Distillation's teacher as a local model (checked loadable); RolloutError otherwise."""
    where = "hyperparams.teacher"
    provider = any(name.startswith(prefix) for prefix in PROVIDERS)
    base = None if provider and trained.find_trained(name) is None else resolve_base(name, where)
    if base is None or not base.local:
        kind = base.kind if base is not None else name.split("/", 1)[0]
        raise RolloutError(
            f"{where}: {name!r} is a {kind} model; the teacher scores every sampled token "
            "here, so it must be a local model (hf:DIR, local/..., or a trained name)"
        )
    validate_local(base, where)
    return base


async def teacher_dir(name: str) -> Path:
    """The folder of distillation's teacher, fetched when it is a trained name."""
    return await local_dir(await asyncio.to_thread(teacher_base, name))


def train_task_indices(spec: dict[str, Any]) -> list[int]:
    """The env's train-split task indices (tasks without a split count as train)."""
    return [i for i, t in enumerate(spec.get("tasks", [])) if t.get("split", "train") == "train"]


def request_of(event: JobRequested) -> CreateTrainingJob:
    """The request a recorded job came from (to plan it again when it runs)."""
    return CreateTrainingJob(
        method=event.method,
        base_model=event.base_model,
        source_run_id=event.source_run_id,
        rollout_ids=event.rollout_ids or None,
        env_slug=event.env_slug,
        suffix=event.suffix,
        hyperparams=event.hyperparams,
        source_dataset=event.source_dataset,
        include_held_out=event.include_held_out,
    )
