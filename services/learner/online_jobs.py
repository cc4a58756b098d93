"""Online methods (GRPO, PPO): the learner asks actors for rollouts and steps as they arrive.

Up to `max_staleness + 1` runs are in flight at once: while the learner trains on the oldest,
actors generate the next ones with whatever policy version they have loaded (each rollout
records it). With `max_staleness 0` the loop is synchronous: one run, one step, the next run
on the new version. Every new version goes to the object store and is announced with
`policy.updated`, so actors load it without restarting. The groups of each finished run come
from the buffer, which drops completions more than `max_staleness` versions behind.

PPO runs on the same loop with its own learner (a value head instead of group baselines), so
a single completion of a task is trainable and groups of one are kept.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rollout.services.learner import training_sets
from rollout.services.learner.artifacts import (
    announced_version,
    publish_policy,
    restore_checkpoint,
    save_checkpoint,
)
from rollout.services.learner.basemodels import local_dir
from rollout.services.learner.context import LearnerContext
from rollout.services.learner.journal import JobEnded, JobHistory, JobJournal
from rollout.services.learner.local_jobs import model_name
from rollout.services.learner.planning import (
    JobPlan,
    reward_model_dir,
    teacher_dir,
    train_task_indices,
)
from rollout.shared.aggregates.run import follow_run
from rollout.shared.bus.requests import call, service_subject
from rollout.shared.contracts.envelope import deterministic_id
from rollout.shared.contracts.events import RunFailed
from rollout.shared.contracts.requests import CancelRun, CreateRun
from rollout.shared.errors import RolloutError
from rollout.shared.models import trained
from rollout.shared.models.weights_proof import proven
from rollout.shared.observability import get_logger

log = get_logger(__name__)
T = TypeVar("T")
# Runs that yield nothing trainable (all stale or failed generations) before the job gives up.
MAX_EMPTY_RUNS = 8
# Rounds in a row whose groups all scored alike (GRPO: no advantage; the step is skipped).
MAX_FLAT_ROUNDS = 8
# Extra runs one step may start to refill groups dynamic sampling dropped.
MAX_REFILLS = 4
# Refill runs' attempt numbers start here, apart from a round's retries (0, 1, 2, ...).
REFILL_ATTEMPT = 1000
# policy.updated's off_policy entries, from the learner's metrics of its last step.
OFF_POLICY_METRICS = {
    "mismatch_kl": "last_mismatch_kl",
    "max_is_ratio": "last_max_is_ratio",
    "is_outside_fraction": "last_is_outside_fraction",
    "clip_fraction": "last_clip_fraction",
    "staleness": "last_staleness",
}


def round_request_id(job_id: str, step: int, attempt: int) -> str:
    """The create_run request id of a GRPO round: the same for the same job, step and try."""
    return deterministic_id("grpo-round", job_id, step, attempt)


@dataclass(frozen=True)
class RoundRun:
    """A run started for one round: the policy step it feeds and which try at it."""

    step: int
    attempt: int
    run_id: str


@dataclass
class Timing:
    """Where the learner's wall time goes: waiting for rollouts vs training."""

    waiting_s: float = 0.0
    training_s: float = 0.0
    stale_dropped: int = 0
    # Completions whose weights digest is not that of the version they claim (or missing).
    weights_refused: int = 0
    used: int = 0
    # Dynamic sampling: groups dropped for equal rewards (this step's; and the job's), refills.
    flat_dropped: int = 0
    flat_dropped_total: int = 0
    refills: int = 0
    runs: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """The numbers job.completed reports."""
        total = self.waiting_s + self.training_s
        return {
            "wait_s": self.waiting_s,
            "train_s": self.training_s,
            "wait_share": self.waiting_s / total if total else 0.0,
            "stale_dropped": float(self.stale_dropped),
            "weights_refused": float(self.weights_refused),
            "completions_used": float(self.used),
            "runs": float(len(self.runs)),
            "dynamic_sampling_dropped": float(self.flat_dropped_total),
            "dynamic_sampling_refills": float(self.refills),
        }


class OnlineJob:
    """One online job (GRPO or PPO): runs in flight, steps, versions."""

    def __init__(self, ctx: LearnerContext, plan: JobPlan, history: JobHistory) -> None:
        assert plan.config is not None and plan.method.learner is not None
        self.ctx, self.plan, self.history = ctx, plan, history
        self.config, self.options = plan.config, plan.options
        self.method = plan.event.method
        self.min_group = plan.method.min_group
        self.job_id = plan.event.job_id
        self.model = model_name(plan)
        self.journal = JobJournal(ctx.js, self.job_id, history.envelope)
        self.journal.last_step = history.last_step
        self.out_dir = ctx.job_dir(self.job_id)
        self.timing = Timing()
        self.learner: Any = None
        # Each policy version's weights digest ("" when its record predates digests).
        self.digests: dict[int, str] = {}
        # Round runs that ended and were read (the rest are cancelled if the job ends).
        self.collected: set[str] = set()
        # Why the last round run with no verdict at all failed (for the job's own failure).
        self.last_errored: str | None = None

    async def _publish(self, *, checkpoint: bool = True) -> None:
        """Save the learner's current version: checkpoint (resume) and policy (actors)."""
        path = await asyncio.to_thread(self.learner.save)
        version = int(self.learner.policy_version)
        if checkpoint:
            await save_checkpoint(self.ctx.store, self.journal, self.out_dir, path, version)
        record = await publish_policy(
            self.ctx.store, self.journal, model=self.model, version=version, model_dir=path,
            base_model=self.plan.event.base_model, off_policy=self._off_policy(),
            signals=getattr(self.learner, "last_signals", None) if self.learner.steps else None,
        )  # fmt: skip
        self.digests[version] = record.weights_sha256

    def _off_policy(self) -> dict[str, float] | None:
        """What the step that made the current version measured (None before any step)."""
        if not self.learner.steps:
            return None
        metrics = self.learner.metrics
        return {
            name: float(metrics[key]) for name, key in OFF_POLICY_METRICS.items() if key in metrics
        } | {"dynamic_sampling_dropped": float(self.timing.flat_dropped)}

    async def _start_run(
        self, step: int, attempt: int, train_tasks: list[int], count: int | None = None
    ) -> RoundRun:
        """Start (or, resumed, find again) the run of one round: the step it feeds, the try.

        The request id and the tasks derive from (job, step, attempt) alone, so a learner
        resumed after a kill asks for the very runs it had started, and the tracker answers
        with those runs instead of starting fresh ones for the same round.
        """
        k = min(count or self.options.tasks_per_step, len(train_tasks))
        tasks = sorted(random.Random(f"{self.job_id}:{step}:{attempt}").sample(train_tasks, k))
        body = CreateRun(
            client_request_id=round_request_id(self.job_id, step, attempt),
            env_slug=self.plan.event.env_slug or "",
            env_version=self.plan.event.env_version,
            model=self.model,
            n=self.config.group_size,
            split="train",
            task_indices=tasks,
            temperature=self.options.temperature,
            max_tokens=self.options.max_tokens,
            max_tool_calls=self.options.max_tool_calls,
            deadline_s=self.options.run_deadline_s,
            name=f"{self.job_id} {self.method}",
            # The round runs are the job owner's: they may cancel them as they may the job.
            owner=self.history.requested.owner if self.history.requested else None,
        )
        data = await call(self.ctx.nc, service_subject(self.ctx.nc, "tracker", "create_run"), body)
        self.timing.runs.append(data["runId"])
        return RoundRun(step, attempt, data["runId"])

    async def run(self) -> None:
        """Drive runs and steps until `max_steps` versions; then complete the job."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        resumed = await restore_checkpoint(
            self.ctx.store, self.out_dir, self.history.last_checkpoint()
        )
        base_dir = await local_dir(self.plan.base)
        # A method whose config names a reward model (PPO) learns from its scores.
        extra = {}
        if "reward_model" in type(self.config).model_fields:
            extra["reward_model"] = await reward_model_dir(
                self.options.reward_model, self.options.reward_model_max_length
            )
        # Distillation learns from its teacher's logprobs.
        if "teacher" in type(self.config).model_fields:
            extra["teacher"] = await teacher_dir(self.options.teacher)
        self.learner = await asyncio.to_thread(
            self.plan.method.learner, base_dir, self.out_dir, self.config, resume=True, **extra
        )
        version = int(self.learner.policy_version)
        announced = await announced_version(self.ctx.js, self.model)
        if announced is None or announced < version:
            # Actors need the starting version by this name; after a kill between a
            # checkpoint and its announcement, the resumed version is announced now.
            saved = {c.step for c in self.history.checkpoints}
            await self._publish(checkpoint=version not in saved)
        # Every round runs on the version the job's request pinned (the plan read it): a
        # version pushed meanwhile (by anyone's key, with another verifier) must not change
        # the rewards the job learns from, mid-way or after a resume.
        env = self.plan.env
        assert env is not None  # planned as an online job
        train_tasks = train_task_indices(env.spec)
        target = int(self.config.max_steps or 1)
        # The runs in flight, one per upcoming step (in step order); after a step, the next
        # ones are exactly those a learner resumed from that step's checkpoint starts.
        in_flight: deque[RoundRun] = deque()
        empty = flat = 0
        started = time.monotonic()
        first_version = int(self.learner.policy_version)
        while self.learner.policy_version < target:
            # A job cancelled during a flat round starts no more rounds.
            await self.journal.check_running()
            room = target - self.learner.policy_version
            while len(in_flight) < min(self.config.max_staleness + 1, room):
                step = in_flight[-1].step + 1 if in_flight else int(self.learner.policy_version) + 1
                in_flight.append(await self._start_run(step, 0, train_tasks))
            current = in_flight.popleft()
            fresh = await self._collect(current)
            if fresh and getattr(self.config, "dynamic_sampling", False):
                # Nothing with a signal even after refills: the flat-round path below.
                fresh = await self._refilled(current, fresh, train_tasks) or fresh
            if not fresh:
                empty += 1
                if empty > MAX_EMPTY_RUNS:
                    refused = (
                        f", {self.timing.weights_refused} refused for weights that are not "
                        "those of the version they claim (is the inference server serving the "
                        "adapter the actors loaded?)"
                        if self.timing.weights_refused
                        else ""
                    )
                    errored = (
                        f"; the last that errored: {self.last_errored}"
                        if (self.last_errored)
                        else ""
                    )
                    raise RolloutError(
                        f"{empty} runs in a row gave nothing to train on (rollouts older than "
                        f"{self.config.max_staleness} versions, or failed generations"
                        f"{refused}); are the actors loading new policy versions?{errored}"
                    )
                # The same step's next try goes first: the runs behind it feed later steps.
                in_flight.appendleft(
                    await self._start_run(current.step, current.attempt + 1, train_tasks)
                )
                continue
            empty = 0
            trained_at = time.monotonic()
            before = int(self.learner.policy_version)
            progress = await asyncio.to_thread(self.learner.step, fresh)
            if int(self.learner.policy_version) == before:
                # Every task's samples scored the same: no signal, no new version. Sampling
                # again may differ (temperature), but not forever.
                flat += 1
                self.timing.training_s += time.monotonic() - trained_at
                if flat >= MAX_FLAT_ROUNDS:
                    raise RolloutError(
                        f"{flat} rounds in a row where every task's {self.config.group_size} "
                        f"samples got the same reward (reward {progress.reward}): "
                        f"{self.method.upper()} has nothing to learn from. Raise group_size "
                        "or the temperature, pick tasks the model sometimes solves, or train "
                        "with --method sft first"
                    )
                in_flight.appendleft(
                    await self._start_run(current.step, current.attempt + 1, train_tasks)
                )
                continue
            flat = 0
            done = int(self.learner.policy_version) - first_version
            elapsed = time.monotonic() - started
            eta = (target - self.learner.policy_version) * elapsed / done if done else None
            # Reported before its checkpoint: a checkpoint's step is always on the log, so a
            # learner resumed from it never leaves a hole; a step redone after a kill between
            # the two is not reported again (the journal skips steps it has seen).
            await self.journal.progress(
                int(self.learner.policy_version), target, loss=progress.loss,
                reward=progress.reward, tokens_per_s=progress.tokens_per_s, eta_s=eta,
                kl=progress.kl, off_policy=self._off_policy(),
            )  # fmt: skip
            await self._publish()
            self.timing.training_s += time.monotonic() - trained_at
        metrics = self.timing.metrics()
        metrics.update(steps=float(self.learner.policy_version), version=float(target))
        if "completions_rescored" in self.learner.metrics:
            # Which reward the policy learned from (PPO): the reward model's or the verifier's.
            metrics["completions_rescored"] = float(self.learner.metrics["completions_rescored"])
        if self.learner.metrics.get("completions_too_long_for_rm"):
            # Left out of their steps: the reward model cannot read them whole (PPO).
            metrics["completions_too_long_for_rm"] = float(
                self.learner.metrics["completions_too_long_for_rm"]
            )
        if resumed is not None:
            metrics["resumed_from_step"] = float(resumed)
        latest = await trained.latest_record(self.ctx.store, self.model)
        await self.journal.completed(self.model, latest.uri if latest else None, metrics)
        log.info(
            "online job completed", method=self.method, job_id=self.job_id, model=self.model,
            **metrics,
        )  # fmt: skip

    async def _collect(self, current: RoundRun) -> list[dict[str, Any]]:
        """Wait for a round's run to end; its groups the learner accepts."""
        waited = time.monotonic()
        # A job cancelled meanwhile stops waiting at once (its runs are then cancelled with it).
        run = await self._unless_ended(
            follow_run(self.ctx.js, current.run_id, timeout_s=self.options.run_deadline_s + 30)
        )
        self.collected.add(current.run_id)
        if isinstance(run.ended, RunFailed) and run.ended.cause == "errored":
            # Every generation failed (a server restarting?): nothing to train on, as with a
            # run of stale rollouts; the next try may fare better, and the job gives up after
            # MAX_EMPTY_RUNS such runs in a row, naming this.
            self.last_errored = f"run {current.run_id}: {run.reason}"
            log.warning("round run errored throughout", run_id=current.run_id, reason=run.reason)
            return []
        if run.status != "completed":
            raise RolloutError(
                f"{self.method.upper()} run {current.run_id} did not complete: {run.reason}"
            )
        found = await training_sets.grpo_groups(
            self.ctx.nc, self.ctx.store, current.run_id,
            current_version=int(self.learner.policy_version),
            max_staleness=self.config.max_staleness, after_seq=run.ended_seq,
            min_group_size=self.min_group,
        )  # fmt: skip
        self.timing.waiting_s += time.monotonic() - waited
        self.timing.stale_dropped += int(found.stats.get("stale_dropped", 0))
        claimed = [int(c["policy_version"]) for g in found.items for c in g["completions"]]
        # A rollout's turns may come from its claimed version or any newer one (an update
        # landed mid-rollout): every version since the oldest claimed is needed.
        newest = int(self.learner.policy_version)
        versions = set(range(min(claimed, default=newest), newest + 1)) | set(claimed)
        return self._fresh(found.items, await self._digests(versions), current.run_id)

    async def _unless_ended(self, waiting: Coroutine[Any, Any, T]) -> T:
        """`waiting`'s result, or JobEnded as soon as the job has an ending on the log."""
        work = asyncio.ensure_future(waiting)
        ended = asyncio.ensure_future(self.journal.wait_ended())
        try:
            done, _ = await asyncio.wait({work, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, ended):
                task.cancel()
            await asyncio.gather(work, ended, return_exceptions=True)
        if ended in done:
            if ended.exception() is not None and work not in done:
                raise ended.exception()  # type: ignore[misc]  # the log could not be read
            if ended.exception() is None:
                raise JobEnded(f"job {self.job_id} ended while it waited on a round")
        return work.result()

    async def cancel_rounds(self, why: str) -> None:
        """Cancel the rounds' runs not yet collected: a job that ends stops its generation."""
        open_runs = [r for r in dict.fromkeys(self.timing.runs) if r not in self.collected]

        async def cancel(run_id: str) -> None:
            body = CancelRun(run_id=run_id, reason=f"its job {self.job_id} {why}")
            try:
                await call(
                    self.ctx.nc,
                    service_subject(self.ctx.nc, "tracker", "cancel_run"),
                    body,
                    timeout_s=10.0,
                )
            except RolloutError as exc:
                if "nothing to cancel" not in str(exc):
                    log.warning("round run not cancelled", job_id=self.job_id, run_id=run_id,
                                error=str(exc))  # fmt: skip
                return
            log.info("round run cancelled with its job", job_id=self.job_id, run_id=run_id)

        await asyncio.gather(*(cancel(r) for r in open_runs))

    async def _digests(self, versions: set[int]) -> dict[int, str]:
        """The weights digest of each version (from the records when this learner did not
        publish it itself, e.g. after a resume)."""
        for version in versions - set(self.digests):
            record = await trained.read_record(
                self.ctx.store, trained.record_key(self.model, version)
            )
            self.digests[version] = record.weights_sha256 if record is not None else ""
        return {v: self.digests[v] for v in versions}

    async def _refilled(
        self, current: RoundRun, groups: list[dict[str, Any]], train_tasks: list[int]
    ) -> list[dict[str, Any]]:
        """DAPO's dynamic sampling: drop groups whose rewards are all equal, and sample more
        tasks for this step until `tasks_per_step` groups carry a signal (or MAX_REFILLS runs).

        A refill's request id derives from (job, step, attempt, refill) like a round's, so a
        learner resumed after a kill finds the same refill runs again.
        """
        want = min(self.options.tasks_per_step, len(train_tasks))
        kept = [g for g in groups if _has_signal(g)]
        dropped = len(groups) - len(kept)
        for refill in range(1, MAX_REFILLS + 1):
            if len(kept) >= want:
                break
            attempt = REFILL_ATTEMPT * refill + current.attempt
            extra = await self._start_run(current.step, attempt, train_tasks, want - len(kept))
            self.timing.refills += 1
            more = await self._collect(extra)
            kept.extend(g for g in more if _has_signal(g))
            dropped += sum(1 for g in more if not _has_signal(g))
        self.timing.flat_dropped = dropped
        self.timing.flat_dropped_total += dropped
        return kept

    def _fresh(
        self, groups: list[dict[str, Any]], digests: dict[int, str], run_id: str = ""
    ) -> list[dict[str, Any]]:
        """Groups with only completions the learner accepts: not too stale, and generated by
        the weights of the version they claim (their digest is that version's)."""
        kept = trainable(groups, self.learner.accepts, digests, self.min_group)
        self.timing.stale_dropped += kept.stale
        self.timing.used += sum(len(g["completions"]) for g in kept.groups)
        if kept.refused:
            self.timing.weights_refused += len(kept.refused)
            log.warning(
                "rollouts refused: their weights are not those of the version they claim",
                job_id=self.job_id, run_id=run_id, refused=len(kept.refused),
                example=kept.refused[0],
            )  # fmt: skip
        return kept.groups


@dataclass
class Kept:
    """What a round's groups leave to train on, and what was dropped."""

    groups: list[dict[str, Any]]
    stale: int = 0
    # Rollout ids whose weights digest is not that of the version they claim.
    refused: list[str] = field(default_factory=list)


def trainable(
    groups: list[dict[str, Any]],
    accepts: Callable[[int], bool],
    digests: dict[int, str],
    min_group: int,
) -> Kept:
    """The groups' completions that are fresh enough (`accepts` their version) and proven
    (every turn generated by the weights of the claimed version or a newer one, `digests`
    giving each version's); groups left smaller than `min_group` go."""
    out = Kept(groups=[])
    for group in groups:
        fresh = [c for c in group["completions"] if accepts(c["policy_version"])]
        out.stale += len(group["completions"]) - len(fresh)
        keep = [c for c in fresh if _proven(c, digests)]
        out.refused.extend(c["rollout_id"] for c in fresh if not _proven(c, digests))
        if len(keep) >= min_group:
            out.groups.append({**group, "completions": keep})
    return out


def _proven(completion: dict[str, Any], digests: dict[int, str]) -> bool:
    """False only when the completion's weights are shown not to be its claimed version's or
    a newer one's (weights_proof.proven; a version without a digest holds nothing to it)."""
    claimed = int(completion["policy_version"])
    return proven(completion.get("weights_sha256"), claimed, digests) is not False


def _has_signal(group: dict[str, Any]) -> bool:
    """True when the group's completions were not all rewarded alike."""
    return len({float(c.get("reward", 0.0)) for c in group["completions"]}) > 1


async def run_online_job(ctx: LearnerContext, plan: JobPlan, history: JobHistory) -> None:
    """Run an online job (GRPO, PPO, ...) to completion."""
    job = OnlineJob(ctx, plan, history)
    try:
        await job.run()
    except JobEnded:
        await job.cancel_rounds("ended")
        raise
    except RolloutError:
        await job.cancel_rounds("failed")  # its runs would go on to their deadline
        raise
