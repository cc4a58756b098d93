"""`rollout run --config PLAN.toml`: a validated plan executed stage by stage, as events.

The plan runs in the CLI process: a client-side process manager that drives each stage through
the ordinary requests (create_run and its events, create_training_job and its events, the
tracker's run summaries for a compare) and records every step as an event of the plan's
aggregate, `rollout.evt.plan.<plan id>.*`, through the tracker. Its decisions come from those
events: a rerun of the same plan (same hash, so the same id) reads them back, skips every
completed stage and resumes at the first one that is not; a stage that was running when the
CLI was killed is re-attached, not repeated, because its run or job was created with a
client request id derived from the plan, the stage and its attempt. Ctrl-C stops the runner
where it is: no later stage starts, and the stage's run or job goes on in the services.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from rollout.client import AsyncClient
from rollout.comparison import comparison, pass_rate_interval
from rollout.errors import RolloutError
from rollout.follow import follow_job, follow_run
from rollout.plans import (
    PLAN_COMPLETED,
    PLAN_FAILED,
    PLAN_STARTED,
    STAGE_COMPLETED,
    STAGE_FAILED,
    STAGE_STARTED,
    PlanCheck,
    PlanState,
    load_plan_state,
    require_ok,
)
from rollout.shared.contracts import requests as rq
from rollout.shared.contracts.buffer import BEHIND
from rollout.shared.contracts.envelope import EventEnvelope, deterministic_id, payload_types
from rollout.shared.contracts.plan import ExperimentPlan, PassingSelection, RunStage, Stage
from rollout.shared.contracts.training import resolve_method
from rollout.shared.envs import load_environments, select_environment
from rollout.shared.stats import format_interval

Say = Callable[[str], None]
# How long a train stage asks again while the buffer catches up with the run it trains on (a
# run that just ended, on a loaded machine, can take longer than the learner waits).
CATCH_UP_S = 300.0
CATCH_UP_POLL_S = 2.0
# How long a progress bar may take to draw its last line once the outcome is known.
FOLLOWER_GRACE_S = 5.0


class PlanRecorder:
    """Appends the plan's events (via the tracker) and folds them into the local state."""

    def __init__(self, client: AsyncClient, state: PlanState) -> None:
        self.client = client
        self.state = state

    async def record(self, event_type: str, **payload: Any) -> None:
        """Append one event at the plan's current version; a conflict is a RolloutError."""
        plan_id = self.state.plan_id
        body = {"plan_id": plan_id, **payload}
        reply = await self.client.request(
            "tracker",
            "record_plan_event",
            rq.RecordPlanEvent(
                plan_id=plan_id,
                type=event_type,
                payload=body,
                expected_version=self.state.version,
            ),
            retries=1,  # the same position and body: a resend is deduplicated
        )
        model = payload_types()[event_type]
        event = EventEnvelope.new(
            model.model_validate(body), aggregate_id=plan_id, id_parts=(plan_id, reply["seq"])
        )
        self.state.apply(event, reply["seq"])


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def run_plan(
    client: AsyncClient,
    check: PlanCheck,
    say: Say,
    *,
    progress: bool = False,
    warn: Say = _to_stderr,
) -> PlanState:
    """Execute a valid plan (resuming it from its events); return its final state.

    With `progress`, every run and job draws a progress bar on stderr while it goes. When the
    task is cancelled (Ctrl-C under asyncio.run), `warn` says what goes on in the services and
    the cancellation propagates: no later stage starts.
    """
    require_ok(check)
    plan, plan_id = check.plan, check.plan_id
    assert plan is not None and check.hash is not None and check.canonical is not None
    js = await client.jetstream()
    state = await load_plan_state(js, plan_id)
    if state.status == "completed":
        say(f"plan {plan_id} already completed (see `rollout replay --plan {plan_id}`)")
        return state
    recorder = PlanRecorder(client, state)
    if state.hash is None:
        versions = await _push_envs(client, check, say)
        await recorder.record(
            PLAN_STARTED,
            name=plan.name,
            plan_hash=check.hash,
            plan=check.canonical,
            stages=[s.name for s in plan.stages],
            env_versions=versions,
        )
        say(f"plan {plan_id} started: {len(plan.stages)} stage(s)")
    else:
        done = sum(1 for s in plan.stages if s.name in state.outputs)
        say(f"plan {plan_id} resumed: {done}/{len(plan.stages)} stage(s) already completed")
    created: list[str] = []  # the run or job the current stage started, once it exists

    def started(what: str) -> None:
        created.append(what)
        say(f"    {what}")

    for index, stage in enumerate(plan.stages):
        if stage.name in state.outputs:
            continue
        say(f"[{index + 1}/{len(plan.stages)}] {stage.kind} {stage.name} ...")
        created.clear()
        try:
            await recorder.record(STAGE_STARTED, stage=stage.name, kind=stage.kind, index=index)
            clock = time.monotonic()
            outputs = await _execute(client, plan, plan_id, stage, state, progress, started)
            outputs["seconds"] = round(time.monotonic() - clock, 1)
        except asyncio.CancelledError:
            # Ctrl-C: nothing is recorded (its events say the stage is still running), so a
            # rerun of the plan re-attaches to this stage's run or job by its request id
            # instead of starting another.
            running = f"; {created[-1]} goes on in the services" if created else ""
            warn(
                f"interrupted: plan {plan_id} stopped in stage {stage.name!r}{running}; "
                "no later stage was started"
            )
            raise
        except RolloutError as exc:
            reason = "; ".join([exc.message, *exc.problems])
            await recorder.record(STAGE_FAILED, stage=stage.name, kind=stage.kind, reason=reason)
            await recorder.record(PLAN_FAILED, stage=stage.name, reason=reason)
            say(f"    failed: {reason}")
            return state
        await recorder.record(STAGE_COMPLETED, stage=stage.name, kind=stage.kind, outputs=outputs)
        say(f"    done: {_brief(outputs)}")
    await recorder.record(PLAN_COMPLETED, outputs=state.outputs)
    say(f"plan {plan_id} completed")
    return state


def _brief(outputs: dict[str, Any]) -> str:
    return describe_outputs(
        outputs, ("runId", "passRate", "jobId", "model", "deltaPassRate", "skipped")
    )


def describe_outputs(outputs: dict[str, Any], keys: tuple[str, ...]) -> str:
    """A stage's outputs in a line; a pass rate or its delta with its 95% interval (the paired
    one when the compare has it), as `rollout show` and `rollout compare` give them."""
    parts = []
    for key in keys:
        value = outputs.get(key)
        if value is None:
            continue
        if key == "passRate":
            text, interval, signed = f"{value:.0%}", outputs.get("passRateInterval"), False
        elif key == "deltaPassRate":
            interval = outputs.get("deltaPassRatePairedInterval")
            text, signed = f"{value:+.0%}", True
            interval = interval or outputs.get("deltaPassRateInterval")
        else:
            text, interval, signed = (
                (f"{value:.3g}" if isinstance(value, float) else str(value)),
                None,
                False,
            )
        if interval:
            text += f" {format_interval((interval[0], interval[1]), signed=signed)}"
        parts.append(f"{key} {text}")
    return ", ".join(parts)


async def _push_envs(client: AsyncClient, check: PlanCheck, say: Say) -> dict[str, int]:
    """Push the plan's environment files (identical content is a no-op); every env's version."""
    from pathlib import Path

    assert check.plan is not None
    versions: dict[str, int] = {}
    for key, entry in check.plan.envs.items():
        pin = check.envs[key]
        if entry.file is None:
            versions[key] = int(pin["version"])
            continue
        env = select_environment(
            load_environments(Path(check.path).parent / entry.file), entry.slug
        )[0]
        pushed = await client.push_environment(env)
        if pushed["spec_hash"] != pin["specHash"]:
            raise RolloutError(f"envs.{key}.file: {entry.file} changed while the plan started")
        versions[key] = pushed["version"]
        say(f"  env {key}: {pushed['slug']} v{pushed['version']}")
    return versions


def _model(plan: ExperimentPlan, state: PlanState, name: str) -> str:
    """A stage's model: a model of [models], or what an earlier train stage produced."""
    if name in plan.models:
        return plan.models[name]
    return str(state.outputs[name]["model"])


def _request_id(plan_id: str, stage: Stage, state: PlanState) -> str:
    # Same plan, stage and attempt: the same run or job (a killed CLI re-attaches to it).
    return deterministic_id("plan", plan_id, stage.name, state.attempts.get(stage.name, 0))


async def _execute(
    client: AsyncClient,
    plan: ExperimentPlan,
    plan_id: str,
    stage: Stage,
    state: PlanState,
    progress: bool,
    started: Say,
) -> dict[str, Any]:
    if stage.run is not None or stage.evaluate is not None:
        spec = stage.run or stage.evaluate
        assert spec is not None
        return await _run(client, plan, plan_id, stage, spec, state, progress, started)
    if stage.train is not None:
        return await _train(client, plan, plan_id, stage, state, progress, started)
    assert stage.compare is not None
    return await _compare(client, state, stage.compare.base, stage.compare.other)


async def _run(
    client: AsyncClient,
    plan: ExperimentPlan,
    plan_id: str,
    stage: Stage,
    spec: RunStage,
    state: PlanState,
    progress: bool = False,
    started: Say = lambda _: None,
) -> dict[str, Any]:
    version = state.env_versions[spec.env]
    env = await client.get_environment(_slug(state, spec.env), version)
    tasks = sum(
        1
        for t in env["spec"].get("tasks", [])
        if spec.split is None or t.get("split") == spec.split
    )
    # One work item per actor replica the plan asks for (each pulls its own).
    batch = max(1, math.ceil(tasks * spec.n / plan.resources.replicas))
    run = await client.create_run(
        env["slug"],
        _model(plan, state, spec.model),
        spec.n,
        temperature=spec.temperature,
        max_tokens=spec.max_tokens,
        max_tool_calls=spec.max_tool_calls,
        budgets=spec.budgets.model_dump(exclude_none=True) if spec.budgets else None,
        seed=plan.seed,
        name=f"{plan.name}/{stage.name}",
        split=spec.split,
        batch_size=min(batch, 256),
        deadline_s=spec.deadline_s,
        env_version=version,
        client_request_id=_request_id(plan_id, stage, state),
    )
    started(f"run {run['runId']}")
    # The bar is best effort; completion is decided by the run's own terminal event.
    bar = asyncio.ensure_future(follow_run(client, run["runId"], quiet=not progress))
    try:
        done = await client.wait_for_run(run["runId"], timeout_s=spec.deadline_s + 60)
    except BaseException:
        # Interrupted or timed out: there is no last line to wait for.
        await _stop(bar)
        raise
    await _settle(bar)
    if done["status"] != "completed":
        raise RolloutError(f"run {run['runId']} {done['status']}: {done.get('reason') or ''}")
    if done["scored"] and done["errored"] >= done["scored"]:
        # No rollout got a verdict (a model server that is down, a name that resolves to
        # nothing): its 0% pass rate would measure the error, and a compare would report it.
        raise RolloutError(await _all_errored(client, done))
    return {
        "runId": done["runId"],
        "model": done["model"],
        "env": env["slug"],
        "envVersion": version,
        "split": spec.split,
        "passRate": done["passRate"],
        "passRateInterval": pass_rate_interval(done),
        "meanScore": done["meanScore"],
        "passed": done["passed"],
        "scored": done["scored"],
        "errored": done["errored"],
        "taskCount": done.get("taskCount"),
        # Per rollout: how it ended (the model, or which budget), its turns and new tokens.
        "endedBy": done.get("endedBy") or {},
        "meanTurns": done.get("meanTurns"),
        "meanCompletionTokens": done.get("meanCompletionTokens"),
    }


async def _all_errored(client: AsyncClient, run: dict[str, Any]) -> str:
    """Why a run none of whose rollouts got a verdict failed: the first rollout's error."""
    # Every rollout errored, so the first of the first page (in task order) is one of them.
    query = rq.GetRun(run_id=run["runId"], include_rollouts=True, include_tasks=False, page_size=1)
    page = await client.request("tracker", "get_run", query)
    first = next((r for r in page.get("rollouts", []) if r.get("error")), None)
    cause = "no error message was recorded"
    if first is not None:
        kind = f" ({first['errorKind']} error)" if first.get("errorKind") else ""
        lines = str(first["error"]).strip().splitlines() or [""]
        cause = f"task {first['taskIndex']}{kind}: {lines[0][:300]}"
    return (
        f"run {run['runId']}: every rollout errored ({run['errored']} of {run['scored']}), "
        f"so nothing was measured; the first: {cause}"
    )


async def _settle(task: asyncio.Future[Any]) -> None:
    """Let a progress follower finish its line (it ends with its subject's last event)."""
    try:
        await asyncio.wait_for(task, FOLLOWER_GRACE_S)
    except Exception:  # noqa: BLE001 - progress display only; the outcome is already known
        await _stop(task)


async def _stop(task: asyncio.Future[Any]) -> None:
    """Cancel a progress follower and wait until it has let go of its subscription."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        # The follower's own cancellation is expected; a Ctrl-C meanwhile is not swallowed.
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:  # noqa: BLE001, S110 - progress display only
        pass


def _slug(state: PlanState, env: str) -> str:
    assert state.plan is not None
    return str(state.plan["envs"][env]["slug"])


async def _train(
    client: AsyncClient,
    plan: ExperimentPlan,
    plan_id: str,
    stage: Stage,
    state: PlanState,
    progress: bool = False,
    started: Say = lambda _: None,
) -> dict[str, Any]:
    train = stage.train
    assert train is not None
    method, config = resolve_method(train.method, dict(train.config))
    # The plan's seed, checkpoint policy and threads, unless the stage sets its own.
    config.setdefault("seed", plan.seed)
    config.setdefault("save_every", plan.checkpoints.save_every)
    if plan.resources.threads is not None:
        config.setdefault("threads", plan.resources.threads)
    if isinstance(config.get("reward_model"), str) and config["reward_model"] in state.outputs:
        config["reward_model"] = state.outputs[config["reward_model"]]["model"]
    # Distillation's teacher: a model of [models] or what an earlier train stage produced.
    teacher = config.get("teacher")
    if isinstance(teacher, str) and (teacher in plan.models or teacher in state.outputs):
        config["teacher"] = _model(plan, state, teacher)
    assert state.hash is not None
    base = _model(plan, state, train.model)
    source = state.outputs[train.from_]["runId"] if train.from_ else None
    chosen = None
    if train.passing is not None and source is not None:
        chosen = passing_selection(await client.get_rollouts(source, False), train.passing)
    try:
        if chosen == []:
            raise RolloutError(f"run {source} has no passing rollouts to fine-tune on")
        job = await _create_job(
            client,
            base_model=base,
            method=method,
            source_run_id=source,
            rollout_ids=chosen,
            env_slug=_slug(state, train.env) if train.env else None,
            suffix=train.suffix or f"{stage.name[:40]}-{state.hash[:8]}",
            hyperparams=config,
            client_request_id=_request_id(plan_id, stage, state),
        )
    except RolloutError as exc:
        if not (train.skip_without_data and "no passing rollouts" in exc.message):
            raise
        # Nothing to learn from: later stages use the base model, and say so.
        return {"skipped": exc.message, "method": method, "model": base, "jobId": None}
    started(f"job {job['id']}")
    done = await follow_job(client, job["id"], quiet=not progress)
    if done.get("status") != "completed":
        raise RolloutError(f"job {job['id']} {done.get('status')}: {done.get('reason') or ''}")
    return {
        "jobId": job["id"],
        "method": method,
        "model": done["modelId"],
        "step": done.get("step"),
        "loss": done.get("loss"),
        "rollouts": len(chosen) if chosen is not None else None,
    }


async def _create_job(client: AsyncClient, **job: Any) -> dict[str, Any]:
    """Create a training job, asking again while the buffer catches up with its source run."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CATCH_UP_S
    while True:
        try:
            return await client.create_training_job(**job)
        except RolloutError as exc:
            # The run just ended and the buffer has not applied its last verdicts yet. The
            # same client request id: a create that did land is answered, not repeated.
            if not exc.message.startswith(BEHIND) or loop.time() > deadline:
                raise
        await asyncio.sleep(CATCH_UP_POLL_S)


def passing_selection(rollouts: list[dict[str, Any]], selection: PassingSelection) -> list[str]:
    """Ids of passing rollouts: at most `per_task` per task (best score first), at most `limit`
    in all (every task's k-th pick before any task's (k+1)-th)."""
    passing = sorted(
        (r for r in rollouts if r["passed"]),
        key=lambda r: (r["taskIndex"], -(r["score"] or 0.0), r["sampleIndex"]),
    )
    taken: Counter[int] = Counter()
    picks: list[tuple[int, int, str]] = []  # (rank within its task, task, rollout id)
    for r in passing:
        rank = taken[r["taskIndex"]]
        if rank < selection.per_task:
            taken[r["taskIndex"]] += 1
            picks.append((rank, r["taskIndex"], r["rolloutId"]))
    if selection.limit is None:
        return [rid for *_, rid in picks]
    return [rid for *_, rid in sorted(picks)[: selection.limit]]


async def _compare(client: AsyncClient, state: PlanState, base: str, other: str) -> dict[str, Any]:
    result = comparison(
        await client.get_run(state.outputs[base]["runId"]),
        await client.get_run(state.outputs[other]["runId"]),
    )
    return {
        "baseRunId": result["base"]["runId"],
        "otherRunId": result["other"]["runId"],
        "basePassRate": result["base"]["passRate"],
        "otherPassRate": result["other"]["passRate"],
        "deltaPassRate": result["deltaPassRate"],
        "deltaPassRateInterval": result["deltaPassRateInterval"],
        "deltaPassRatePairedInterval": result["deltaPassRatePairedInterval"],
        "warnings": result["warnings"],
    }
