"""Fine-tuning at a provider (OpenAI, Together): export, upload, create the job, track it.

OpenAI: `POST /files` (purpose=fine-tune), `POST /fine_tuning/jobs`, then
`GET /fine_tuning/jobs/{id}` and its `/events` for progress. Together: `POST /files/upload`,
`POST /fine-tunes`, then `GET /fine-tunes/{id}`. The data is the run's passing rollouts in the
provider's chat format with tools (Together DPO: preference rows), built from the buffer's
SFT set and DPO pairs. The provider's job id is kept in the object store first, so a
redelivered job tracks the same provider job instead of starting another one.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from rollout.services.learner.artifacts import check_name_owner, owner_of
from rollout.services.learner.basemodels import PROVIDERS, TrainBase, resolve_base
from rollout.services.learner.context import LearnerContext
from rollout.services.learner.journal import JobEnded, JobHistory, JobJournal
from rollout.services.learner.local_jobs import model_name
from rollout.services.learner.planning import JobPlan, ProviderOptions
from rollout.shared.bus.deadletter import describe
from rollout.shared.errors import RolloutError
from rollout.shared.learning.data import conversation
from rollout.shared.learning.trainer_rows import as_rollout
from rollout.shared.models import trained
from rollout.shared.objectstore import ObjectNotFound, get_json, put_json
from rollout.shared.observability import get_logger
from rollout.shared.settings import env_number

log = get_logger(__name__)
POLL_ENV = "ROLLOUT_PROVIDER_POLL_S"
_DONE = {"succeeded", "completed"}
_FAILED = {"failed", "cancelled", "error", "user_error"}


def _wire_message(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message["role"], "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    if message["role"] == "tool":
        out["tool_call_id"] = message.get("tool_call_id")
    return out


def chat_rows(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat fine-tuning rows (OpenAI's format, which Together also reads): messages + tools."""
    rows = []
    for example in examples:
        rollout = as_rollout(example["messages"], example.get("tools"))
        messages = [_wire_message(m) for m in conversation(rollout)]
        if not any(m["role"] == "assistant" for m in messages):
            continue
        row: dict[str, Any] = {"messages": messages}
        if example.get("tools"):
            row["tools"] = example["tools"]
        rows.append(row)
    return rows


def preference_rows(pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Together's preference format: a prompt, one preferred and one non-preferred reply."""
    rows = []
    for pair in pairs:
        cut = len(pair["prompt"])
        chosen = conversation(as_rollout(pair["prompt"] + pair["chosen"], None))
        rejected = conversation(as_rollout(pair["prompt"] + pair["rejected"], None))
        row: dict[str, Any] = {
            "input": {"messages": [_wire_message(m) for m in chosen[:cut]]},
            "preferred_output": [_wire_message(chosen[cut])],
            "non_preferred_output": [_wire_message(rejected[cut])],
        }
        if pair.get("tools"):
            row["input"]["tools"] = pair["tools"]
        rows.append(row)
    return rows


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    """One JSON document per line."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


class ProviderAPI:
    """The few fine-tuning endpoints of one provider."""

    def __init__(self, base: TrainBase) -> None:
        self.base = base
        headers = {"Authorization": f"Bearer {base.api_key}"} if base.api_key else {}
        self.http = httpx.AsyncClient(base_url=base.base_url, headers=headers, timeout=120.0)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.http.aclose()

    async def _json(self, response: httpx.Response, what: str) -> dict[str, Any]:
        if response.status_code >= 400:
            detail = response.text[:300]
            raise RolloutError(
                f"{self.base.kind} {what} failed: HTTP {response.status_code}: {detail}"
            )
        return response.json()

    async def upload(self, data: bytes, filename: str) -> str:
        """Upload a training file; its provider id."""
        files = {"file": (filename, data, "application/jsonl")}
        if self.base.kind == "openai":
            r = await self.http.post("/files", data={"purpose": "fine-tune"}, files=files)
        else:
            form = {"purpose": "fine-tune", "file_name": filename}
            r = await self.http.post("/files/upload", data=form, files=files)
        return str((await self._json(r, "file upload"))["id"])

    async def create(
        self, file_id: str, method: str, suffix: str | None, options: ProviderOptions
    ) -> str:
        """Create the fine-tuning job; its provider id."""
        model = self.base.remote_model
        if self.base.kind == "openai":
            hyper: dict[str, Any] = {}
            if options.epochs is not None:
                hyper["n_epochs"] = max(1, round(options.epochs))
            if options.batch_size is not None:
                hyper["batch_size"] = options.batch_size
            if options.learning_rate_multiplier is not None:
                hyper["learning_rate_multiplier"] = options.learning_rate_multiplier
            body: dict[str, Any] = {
                "model": model,
                "training_file": file_id,
                "method": {"type": "supervised", "supervised": {"hyperparameters": hyper}},
            }
            if suffix:
                body["suffix"] = suffix
            if options.seed is not None:
                body["seed"] = options.seed
            r = await self.http.post("/fine_tuning/jobs", json=body)
        else:
            body = {"training_file": file_id, "model": model}
            if suffix:
                body["suffix"] = suffix
            if options.epochs is not None:
                body["n_epochs"] = max(1, round(options.epochs))
            if options.learning_rate is not None:
                body["learning_rate"] = options.learning_rate
            if options.batch_size is not None:
                body["batch_size"] = options.batch_size
            if options.lora is not None:
                body["lora"] = options.lora
            training: dict[str, Any] = {"method": method}
            if method == "dpo" and options.beta is not None:
                training["dpo_beta"] = options.beta
            body["training_method"] = training
            r = await self.http.post("/fine-tunes", json=body)
        return str((await self._json(r, "fine-tuning job creation"))["id"])

    async def status(self, job_id: str) -> dict[str, Any]:
        """The provider's view of the job: status, trained model, progress numbers."""
        path = (
            f"/fine_tuning/jobs/{job_id}" if self.base.kind == "openai" else f"/fine-tunes/{job_id}"
        )
        job = await self._json(await self.http.get(path), "job status")
        out: dict[str, Any] = {"status": str(job.get("status", "")).lower(), "raw": job}
        if self.base.kind == "openai":
            out["model"] = job.get("fine_tuned_model")
            error = job.get("error") or {}
            out["error"] = error.get("message") if isinstance(error, dict) else error
            out.update(await self._openai_metrics(job_id))
        else:
            out["model"] = job.get("output_name") or job.get("model_output_name")
            out["error"] = job.get("error") or job.get("message")
            out["step"] = job.get("steps_completed") or job.get("step")
            out["total_steps"] = job.get("total_steps")
        return out

    async def cancel(self, job_id: str) -> None:
        """Ask the provider to stop the job (OpenAI and Together: POST .../cancel)."""
        path = (
            f"/fine_tuning/jobs/{job_id}/cancel"
            if self.base.kind == "openai"
            else f"/fine-tunes/{job_id}/cancel"
        )
        await self._json(await self.http.post(path), "job cancel")

    async def _openai_metrics(self, job_id: str) -> dict[str, Any]:
        r = await self.http.get(f"/fine_tuning/jobs/{job_id}/events", params={"limit": 50})
        if r.status_code >= 400:
            return {}
        for event in r.json().get("data", []):  # newest first
            data = event.get("data") or {}
            if event.get("type") == "metrics" and "step" in data:
                return {
                    "step": data.get("step"),
                    "total_steps": data.get("total_steps"),
                    "loss": data.get("train_loss"),
                }
        return {}


def _state_key(job_id: str) -> str:
    return f"provider-jobs/{job_id}.json"


async def run_provider_job(ctx: LearnerContext, plan: JobPlan, history: JobHistory) -> None:
    """Export, upload, create (once), then poll the provider's job to its end."""
    job_id = plan.event.job_id
    journal = JobJournal(ctx.js, job_id, history.envelope)
    journal.last_step = history.last_step
    options = plan.options if isinstance(plan.options, ProviderOptions) else ProviderOptions()
    api = ProviderAPI(plan.base)
    try:
        try:
            state = await get_json(ctx.store, _state_key(job_id))
        except ObjectNotFound:
            state = await _start(ctx, api, plan, options)
        await _track(ctx, api, plan, journal, state)
    finally:
        await api.aclose()


async def _start(
    ctx: LearnerContext, api: ProviderAPI, plan: JobPlan, options: ProviderOptions
) -> dict[str, Any]:
    assert plan.rows is not None
    rows = preference_rows(plan.rows) if plan.method.data == "pairs" else chat_rows(plan.rows)
    if not rows:
        raise RolloutError("nothing to upload: no rollout has an assistant turn")
    filename = f"rollout-{plan.event.job_id}.jsonl"
    file_id = await api.upload(jsonl(rows), filename)
    remote_job = await api.create(file_id, plan.event.method, plan.event.suffix, options)
    state = {"provider": plan.base.kind, "file_id": file_id, "job": remote_job, "rows": len(rows)}
    await put_json(ctx.store, _state_key(plan.event.job_id), state, overwrite=True)
    log.info("provider job created", job_id=plan.event.job_id, provider=plan.base.kind,
             provider_job=remote_job, rows=len(rows))  # fmt: skip
    return state


async def _track(
    ctx: LearnerContext, api: ProviderAPI, plan: JobPlan, journal: JobJournal, state: dict
) -> None:
    every = env_number(POLL_ENV, 10.0, unit="seconds", above=0)
    try:
        seen = await _poll(api, plan, journal, state, every)
        # Cancelled after the provider finished: its model is not published either.
        await journal.check_running()
    except JobEnded:
        # Cancelled here (seen at a poll or at a progress report): the provider's job is
        # stopped too, or it would train (and bill) on; one that cannot be told is logged.
        try:
            await api.cancel(state["job"])
        except (RolloutError, httpx.HTTPError) as exc:
            log.warning("provider job not cancelled", job_id=journal.job_id,
                        provider_job=state["job"], error=describe(exc))  # fmt: skip
        raise
    name = model_name(plan)
    await check_name_owner(ctx.store, ctx.js, name, journal.job_id, owner_of(journal))
    previous = await trained.latest_record(ctx.store, name)
    mine = await trained.job_record(ctx.store, journal.job_id)
    version = mine.version if mine else (previous.version + 1 if previous else 1)
    record = trained.PolicyRecord(
        model=name, version=version, kind=plan.base.kind, job_id=journal.job_id,
        base_model=plan.event.base_model, remote_model=str(seen["model"]),
    )  # fmt: skip
    ref = await trained.publish_record(ctx.store, record)
    await journal.policy(name, version, ref.uri, ref.sha256)
    await journal.completed(name, None, {"rows": float(state.get("rows", 0))})
    log.info("provider job completed", job_id=journal.job_id, model=name, remote=seen["model"])


async def _poll(
    api: ProviderAPI, plan: JobPlan, journal: JobJournal, state: dict, every: float
) -> dict[str, Any]:
    """Poll the provider's job, reporting its steps, until it succeeds (its last status)."""
    while True:
        await journal.check_running()
        seen = await api.status(state["job"])
        if seen.get("step"):
            await journal.progress(
                int(seen["step"]), int(seen.get("total_steps") or seen["step"]),
                loss=seen.get("loss"),
            )  # fmt: skip
        if seen["status"] in _FAILED:
            raise RolloutError(
                f"{plan.base.kind} fine-tuning job {state['job']} {seen['status']}: "
                f"{seen.get('error') or 'no reason given'}"
            )
        if seen["status"] in _DONE:
            if not seen.get("model"):
                raise RolloutError(f"{plan.base.kind} job {state['job']} finished without a model")
            return seen
        await asyncio.sleep(every)


async def cancel_left_behind(ctx: LearnerContext, history: JobHistory) -> bool:
    """Cancel at the provider a job cancelled here while no replica was running it.

    A cancel seen by the job's worker cancels the provider's job at once (`_track`); one that
    lands while the job waits for its next delivery (a retry's backoff, a replica that died)
    is seen here, when that delivery finds the job ended. True when the provider was told.
    """
    request, failed = history.requested, history.failed
    if request is None or failed is None or not failed.reason.startswith("cancelled"):
        return False
    if not request.base_model.startswith(tuple(PROVIDERS)):
        return False
    try:
        state = await get_json(ctx.store, _state_key(request.job_id))
    except ObjectNotFound:
        return False  # it never reached the provider
    if state.get("cancelled"):
        return False
    api = ProviderAPI(resolve_base(request.base_model))
    try:
        await api.cancel(state["job"])
    except (RolloutError, httpx.HTTPError) as exc:
        log.warning("provider job not cancelled", job_id=request.job_id,
                    provider_job=state["job"], error=describe(exc))  # fmt: skip
        return False
    finally:
        await api.aclose()
    await put_json(ctx.store, _state_key(request.job_id), {**state, "cancelled": True},
                   overwrite=True)  # fmt: skip
    log.info("provider job cancelled after its job ended", job_id=request.job_id,
             provider_job=state["job"])  # fmt: skip
    return True
