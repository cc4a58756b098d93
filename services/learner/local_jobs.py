"""Offline jobs (SFT, DPO, KTO, reward models) on local weights: data from the buffer, TRL in a worker thread, artifacts."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from rollout.services.learner.artifacts import (
    next_version,
    publish_policy,
    restore_checkpoint,
    save_checkpoint,
)
from rollout.services.learner.basemodels import local_dir
from rollout.services.learner.bridge import JobCancelled, ThreadBridge, run_in_thread
from rollout.services.learner.context import LearnerContext
from rollout.services.learner.journal import JobHistory, JobJournal
from rollout.services.learner.planning import JobPlan
from rollout.shared.learning.config import Progress
from rollout.shared.learning.trainer_rows import TrainingSet
from rollout.shared.models.names import trained_name
from rollout.shared.observability import get_logger

log = get_logger(__name__)
# Progress events at most this often (the last step is always reported).
PROGRESS_EVERY_S = 0.5


def model_name(plan: JobPlan) -> str:
    """The name the trained policy is addressed by: `BASE:SUFFIX` (suffix defaults to the id)."""
    return trained_name(plan.event.base_model, plan.event.suffix or plan.event.job_id)


def reporter(bridge: ThreadBridge, journal: JobJournal) -> Any:
    """An on_progress hook that turns trainer reports into job.progress events (throttled)."""
    last = [0.0]

    def on_progress(p: Progress) -> None:
        now = time.monotonic()
        final = p.step >= p.total_steps
        if bridge.cancelled:
            raise JobCancelled("the learner is stopping")
        if not final and now - last[0] < PROGRESS_EVERY_S:
            return
        last[0] = now
        bridge.call(
            lambda: journal.progress(
                p.step, p.total_steps, loss=p.loss, reward=p.reward,
                tokens_per_s=p.tokens_per_s, eta_s=p.eta_s, kl=p.kl,
            ),
            wait=False,
        )  # fmt: skip

    return on_progress


def training_data(plan: JobPlan) -> list[dict[str, Any]]:
    """The trainer's rows from the buffer's answer, shaped by the job's method."""
    assert plan.rows is not None and plan.method.rows is not None
    meta = plan.pair_meta or [{} for _ in plan.rows]
    return plan.method.rows(TrainingSet(items=plan.rows, meta=meta))


async def run_local_job(ctx: LearnerContext, plan: JobPlan, history: JobHistory) -> None:
    """Train, checkpointing into the object store; publish the policy; complete the job."""
    job_id = plan.event.job_id
    journal = JobJournal(ctx.js, job_id, history.envelope)
    journal.last_step = history.last_step
    out_dir = ctx.job_dir(job_id)
    out_dir.mkdir(parents=True, exist_ok=True)
    resumed = await restore_checkpoint(ctx.store, out_dir, history.last_checkpoint())
    base_dir = await local_dir(plan.base)
    rows = training_data(plan)
    assert plan.config is not None
    bridge = ThreadBridge(asyncio.get_running_loop())

    def on_checkpoint(path: Path, step: int) -> None:
        # Waits for the upload: a checkpoint counts once the store holds it.
        bridge.call(lambda: save_checkpoint(ctx.store, journal, out_dir, path, step), wait=True)

    train = plan.method.train
    assert train is not None
    log.info("training", job_id=job_id, method=plan.event.method, rows=len(rows),
             resumed_from=resumed)  # fmt: skip
    result = await run_in_thread(
        bridge,
        lambda: train(
            base_dir,
            rows,
            out_dir,
            plan.config,
            on_progress=reporter(bridge, journal),
            on_checkpoint=on_checkpoint,
            resume=True,
        ),
    )
    # Cancelled after its last report: the trained weights are not published.
    await journal.check_running()
    model = model_name(plan)
    version = await next_version(ctx.store, model, job_id)
    record = await publish_policy(
        ctx.store, journal, model=model, version=version, model_dir=Path(result.model_dir),
        base_model=plan.event.base_model,
    )  # fmt: skip
    metrics = dict(result.metrics)
    metrics.update(steps=float(result.steps), examples=float(len(rows)), version=float(version))
    if result.final_loss is not None:
        metrics["final_loss"] = result.final_loss
    if resumed is not None:
        metrics["resumed_from_step"] = float(resumed)
    await journal.completed(model, record.uri, metrics)
    log.info("job completed", job_id=job_id, model=model, version=version, steps=result.steps)
