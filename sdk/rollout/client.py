"""`Client`: the platform over NATS, with the seed's method names. The CLI is a thin wrapper."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pydantic

from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.aggregates.run_options import REFUSED, option_problems
from rollout.shared.auth.credentials import client_settings, with_credentials
from rollout.shared.auth.denials import PermissionWatch
from rollout.shared.bus.reader import read_events
from rollout.shared.bus.requests import RequestTooLarge, call, connection_user, service_subject
from rollout.shared.contracts import requests as rq
from rollout.shared.contracts.envelope import new_id
from rollout.shared.contracts.training import resolve_method
from rollout.shared.envs.coerce import TOO_LARGE_HINT, pydantic_problems, raw_environment
from rollout.shared.envs.validation import unsendable
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stale import stale_note, worst
from rollout.snapshots import stage_dataset

T = TypeVar("T")
# How often an unanswered create is resent (with its client request id: never a second run).
CREATE_RETRIES = 1
# What `errored_rollouts` keeps of each: where it is, why it errored, how it ended.
_ERROR_KEYS = ("rolloutId", "taskIndex", "sampleIndex", "errorKind", "error", "endedBy", "turns")


class AsyncClient:
    """The async API; `Client` runs it on a private event loop for synchronous callers."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        endpoint: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        # Explicit settings (services, tests) are used as given; otherwise the endpoint and API
        # key resolve like the CLI's: arguments, ROLLOUT_* env vars, `rollout login`, local stack.
        if settings is None:
            settings = client_settings(endpoint, api_key)
        elif endpoint or api_key:
            settings = with_credentials(settings, endpoint, api_key)
        self.settings = settings
        self.timeout_s = timeout_s
        self._nc: Any = None
        self._connecting = asyncio.Lock()
        # A request the key's role may not make fails at once instead of timing out.
        self._denials = PermissionWatch(settings.nats_user)
        # The stalest `readModels` the tracker's answers to this client carried (None: none
        # behind, or not told): a command that read many says whether any may be stale.
        self.read_models: dict[str, Any] | None = None

    async def _conn(self) -> Any:
        # One connection however many calls start at once: without the lock each concurrent
        # first call opened its own, and all but the last were left open, unclosed.
        async with self._connecting:
            if self._nc is None or self._nc.is_closed:
                self._nc = await connect_nats(
                    self.settings, name="rollout-client", error_cb=self._denials.error_cb
                )
            return self._nc

    async def request(
        self,
        service: str,
        verb: str,
        body: rq.Request,
        *,
        retries: int = 0,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """One request/reply to a service; RolloutError with its problems on failure."""
        nc = await self._conn()
        subject = service_subject(nc, service, verb)
        wait = self.timeout_s if timeout_s is None else timeout_s
        return await self._denials.guard(
            subject, call(nc, subject, body, timeout_s=wait, retries=retries)
        )

    async def jetstream(self) -> Any:
        """The JetStream context (for following events)."""
        return (await self._conn()).jetstream()

    async def close(self) -> None:
        """Close the connection."""
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()

    # --- environments ------------------------------------------------------------------------

    async def push_environment(self, env: Any) -> dict[str, Any]:
        """Register an Environment (or its dict form); identical content is a no-op."""
        spec = raw_environment(env)
        if lost := unsendable(spec):
            # Said here: JSON would carry a NaN as null and cannot nest that deep at all.
            raise RolloutError(
                f"environment {spec.get('slug')!r} cannot be sent as JSON", problems=lost
            )
        try:
            return await self.request("registry", "push", rq.PushEnvironment(spec=spec))
        except RequestTooLarge as exc:
            raise RolloutError(
                f"environment {spec.get('slug')!r} is too large to push: {exc.size:,} bytes as "
                f"JSON, over the {exc.limit:,} the server accepts in one message",
                problems=[TOO_LARGE_HINT],
            ) from None

    async def get_environment(self, slug: str, version: int | None = None) -> dict[str, Any]:
        """One environment version with its spec (newest by default)."""
        return await self.request("registry", "get", rq.GetEnvironment(slug=slug, version=version))

    async def audit_environment(
        self,
        slug: str,
        version: int | None = None,
        *,
        split: str | None = None,
        threshold: float = 0.75,
        limit: int | None = None,
        timeout_s: float = 900.0,
    ) -> dict[str, Any]:
        """Run `rollout audit`'s policies on a registered env where it is served; the report."""
        body = rq.AuditEnvironment(
            slug=slug, version=version, split=split, threshold=threshold, limit=limit
        )
        return await self.request("registry", "audit", body, timeout_s=timeout_s)

    async def list_environments(self) -> list[dict[str, Any]]:
        """Every environment's newest version."""
        data = await self.request("registry", "list", rq.ListEnvironments())
        return data["environments"]

    # --- runs --------------------------------------------------------------------------------

    async def create_run(self, env_slug: str, model: str, n: int = 1, **options: Any) -> dict:
        """Start a run; returns a dict with `runId`.

        Each call sends a fresh `client_request_id` (or the one given, to retry a call whose
        answer was lost): the tracker answers a repeat with the run the first one created.
        """
        options.setdefault("client_request_id", None)
        options["client_request_id"] = options["client_request_id"] or new_id()
        try:
            body = rq.CreateRun(env_slug=env_slug, model=model, n=n, **options)
        except pydantic.ValidationError as exc:
            # By option, as the tracker's refusals are: not pydantic's report and its links.
            raise RolloutError(REFUSED, problems=pydantic_problems(exc)) from None
        # What the tracker would refuse whatever the environment, refused before sending.
        if problems := option_problems(body):
            raise RolloutError(REFUSED, problems=problems)
        # Unanswered, it is sent again with the same id: the retry returns the same run.
        return await self.request("tracker", "create_run", body, retries=CREATE_RETRIES)

    async def cancel_run(self, run_id: str, reason: str | None = None) -> dict[str, Any]:
        """End a running run now (it fails as cancelled); RolloutError if it already ended."""
        try:
            body = rq.CancelRun(run_id=run_id, reason=reason)
        except pydantic.ValidationError as exc:
            raise RolloutError("invalid cancel", problems=pydantic_problems(exc)) from None
        return await self.request("tracker", "cancel_run", body)

    async def import_run(self, body: rq.ImportRun) -> dict[str, Any]:
        """Record scored rollouts made elsewhere as a completed run; returns `runId`.

        The run id derives from the content, so a resend (or importing the same file again)
        answers with the same run and records nothing twice.
        """
        nc = await self._conn()
        size = len(body.model_dump_json().encode())
        if size > nc.max_payload:
            raise RolloutError(
                f"the import is {size} bytes, over the {nc.max_payload} bytes the server "
                "accepts in one request",
                problems=["split the file into smaller ones and import each"],
            )
        return await self.request("tracker", "import_run", body, retries=CREATE_RETRIES)

    async def get_run(
        self,
        run_id: str,
        include_rollouts: bool = False,
        include_trajectories: bool = False,
        *,
        outcome: str | None = None,
        include_tasks: bool = True,
    ) -> dict[str, Any]:
        """A run's summary and per-task table (and every rollout when asked, page by page).

        `readModels` says how far the read models it comes from are behind (see
        rollout.shared.stack.staleness; None when the tracker could not tell).

        `outcome` (passed, failed, errored, pending) keeps only the rollouts with it;
        `include_tasks=False` leaves the per-task table out.
        """
        try:
            query = rq.GetRun(
                run_id=run_id,
                include_rollouts=include_rollouts,
                include_trajectories=include_trajectories,
                outcome=outcome,
                include_tasks=include_tasks,
            )
        except pydantic.ValidationError as exc:
            raise RolloutError("invalid run query", problems=pydantic_problems(exc)) from None
        run = await self.request("tracker", "get_run", query)
        self.read_models = worst(self.read_models, run.get("readModels"))
        # The per-task table and the rollouts come in pages that fit a message; follow each
        # until its last page (the table first: a reply that cut it short holds no rollouts).
        seen_tasks: set[int] = set()
        while (task_cursor := run.pop("tasksCursor", None)) is not None:
            if task_cursor in seen_tasks:
                raise RolloutError(
                    f"the tracker repeated tasks cursor {task_cursor!r} for {run_id}"
                )
            seen_tasks.add(task_cursor)
            update = {"tasks_cursor": task_cursor, "include_rollouts": False}
            page = await self.request("tracker", "get_run", query.model_copy(update=update))
            run["tasks"].extend(page["tasks"])
            run["tasksCursor"] = page.get("tasksCursor")
        seen: set[str] = set()
        while cursor := run.pop("rolloutsCursor", None):
            if cursor in seen:
                raise RolloutError(f"the tracker repeated rollouts cursor {cursor!r} for {run_id}")
            seen.add(cursor)
            update = {"rollouts_cursor": cursor, "include_tasks": False}
            page = await self.request("tracker", "get_run", query.model_copy(update=update))
            run["rollouts"].extend(page["rollouts"])
            run["rolloutsCursor"] = page.get("rolloutsCursor")
        return run

    async def errored_rollouts(self, run_id: str, expected: int) -> list[dict[str, Any]]:
        """The run's errored rollouts (why each errored), in task order, without trajectories.

        The tracker selects them, so a big run with a few errors costs a page whatever their
        place; pages stop once `expected` are found (the run's `errored` count).
        """
        query = rq.GetRun(
            run_id=run_id, include_rollouts=True, include_tasks=False, page_size=1000,
            outcome="errored",
        )  # fmt: skip
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        seen: set[str] = set()
        while len(found) < expected:
            page = await self.request(
                "tracker", "get_run", query.model_copy(update={"rollouts_cursor": cursor})
            )
            found += [{k: r.get(k) for k in _ERROR_KEYS} for r in page.get("rollouts", [])]
            cursor = page.get("rolloutsCursor")
            if not cursor or cursor in seen:
                break
            seen.add(cursor)
        return found

    async def list_runs(
        self, limit: int = 20, env_slug: str | None = None, *, owner: str | None = None
    ) -> list[dict]:
        """Recent runs, newest first (only `owner`'s, when given: see `caller`)."""
        return (await self.runs_listing(limit, env_slug, owner=owner))["runs"]

    async def runs_listing(
        self, limit: int = 20, env_slug: str | None = None, *, owner: str | None = None
    ) -> dict[str, Any]:
        """`list_runs` with the read models' lag: `runs`, and `readModels` (None: unknown)."""
        data = await self.request(
            "tracker", "list_runs", rq.ListRuns(limit=limit, env_slug=env_slug, owner=owner)
        )
        self.read_models = worst(self.read_models, data.get("readModels"))
        return {"runs": data["runs"], "readModels": data.get("readModels")}

    async def caller(self) -> str:
        """Who this client is to the services: the owner recorded on what it starts."""
        return subjects.caller_token(connection_user(await self._conn()))

    async def get_rollouts(self, run_id: str, include_trajectories: bool = True) -> list[dict]:
        """Every rollout of a run."""
        run = await self.get_run(run_id, True, include_trajectories)
        return run["rollouts"]

    async def passing_rollout_ids(self, run_id: str) -> list[str]:
        """Ids of the run's rollouts that passed their verifier."""
        run = await self.get_run(run_id, True, False, outcome="passed", include_tasks=False)
        return [r["rolloutId"] for r in run["rollouts"]]

    async def wait_for_run(self, run_id: str, timeout_s: float = 600.0) -> dict[str, Any]:
        """Block until the run completes or fails (follows its events), then return it."""
        js = await self.jetstream()

        async def follow() -> None:
            async for msg in read_events(js, subjects.run_events(run_id), follow=True):
                if msg.subject.endswith((".run_completed", ".run_failed")):
                    return

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        follower = asyncio.ensure_future(follow())
        try:
            while not (await asyncio.wait({follower}, timeout=deadline - loop.time()))[0]:
                # The timeout counts from the run's start, not while it waits for its owner's
                # earlier runs (the tracker's ROLLOUT_RUNS_PER_OWNER).
                deadline = await self._started_deadline(run_id, timeout_s, loop.time())
            follower.result()
            # The event is on the log; the read model follows it within moments, so the
            # first looks come quickly (a fixed 50 ms poll was most of a short run's tail).
            pause = 0.005
            while (run := await self.get_run(run_id))["status"] not in ("completed", "failed"):
                if loop.time() > deadline:
                    # Its end is on the log: a stalled read model is why it does not show.
                    note = stale_note(run.get("readModels"))
                    raise RolloutError(
                        f"run {run_id} did not finish within {timeout_s:.0f}s",
                        problems=[note] if note else None,
                    )
                await asyncio.sleep(pause)
                pause = min(0.05, pause * 2)
        finally:
            follower.cancel()
        return run

    async def _started_deadline(self, run_id: str, timeout_s: float, now: float) -> float:
        """A later end for waiting on `run_id` (loop time), if it waited to start; else raise."""
        run = await self.get_run(run_id)
        if run.get("waiting"):
            return now + timeout_s
        if run.get("startedAt"):
            ran = (datetime.now(UTC) - datetime.fromisoformat(run["startedAt"])).total_seconds()
            if ran < timeout_s:
                return now + timeout_s - ran
        raise RolloutError(f"run {run_id} did not finish within {timeout_s:.0f}s")

    # --- training jobs -----------------------------------------------------------------------

    async def cancel_training_job(self, job_id: str, reason: str | None = None) -> dict[str, Any]:
        """End a queued or running training job (it fails as cancelled at its next step)."""
        try:
            body = rq.CancelTrainingJob(job_id=job_id, reason=reason)
        except pydantic.ValidationError as exc:
            raise RolloutError("invalid cancel", problems=pydantic_problems(exc)) from None
        return await self.request("learner", "cancel_job", body)

    async def create_training_job(
        self,
        base_model: str,
        method: str,
        source_run_id: str | None = None,
        rollout_ids: list[str] | None = None,
        suffix: str | None = None,
        hyperparams: dict[str, Any] | None = None,
        env_slug: str | None = None,
        client_request_id: str | None = None,
        dataset: str | Path | None = None,
        include_held_out: bool = False,
    ) -> dict[str, Any]:
        """Start a training job; returns a dict with `id`.

        Like `create_run`, each call sends a fresh `client_request_id` unless given one.
        `method` is one of sft, dpo, kto, rm, grpo, ppo, opd, or `ipo` (dpo with `loss_type="ipo"`);
        grpo, ppo and opd train online on `env_slug`. `dataset` (an export: .jsonl, .parquet or a
        save_to_disk folder) trains on that snapshot instead of a run: every row is checked
        here first, then its canonical bytes go to the object store and the job names them.
        A run's rollouts of held-out tasks (splits other than train) are left out unless
        `include_held_out` (the reply's `heldOutTasksExcluded` counts those tasks).
        """
        method, hyperparams = resolve_method(method, dict(hyperparams or {}))
        source_dataset = None
        if dataset is not None:
            source_dataset = await stage_dataset(self.settings, Path(dataset))
            # The job's lineage records env_slug as the env it trained on: it must be the one
            # the rows ran on, never another.
            ran_on = sorted({env.rpartition("@")[0] for env in source_dataset.lineage.envs})
            if env_slug and ran_on != [env_slug]:
                raise RolloutError(
                    f"env_slug (--env {env_slug}): the dataset's rows ran on "
                    f"{', '.join(ran_on)}; leave --env out, the dataset's lineage names its env"
                )
        try:
            body = rq.CreateTrainingJob(
                base_model=base_model,
                method=method,  # type: ignore[arg-type]
                source_run_id=source_run_id,
                rollout_ids=rollout_ids,
                suffix=suffix,
                hyperparams=hyperparams or {},
                env_slug=env_slug,
                client_request_id=client_request_id or new_id(),
                source_dataset=source_dataset,
                include_held_out=include_held_out,
            )
        except ValueError as exc:
            raise RolloutError(f"invalid training job: {exc}") from None
        return await self.request("learner", "create_job", body, retries=CREATE_RETRIES)

    async def get_training_job(self, job_id: str) -> dict[str, Any]:
        """One training job."""
        return await self.request("tracker", "get_job", rq.GetJob(job_id=job_id))

    async def list_training_jobs(
        self, limit: int = 20, *, owner: str | None = None
    ) -> list[dict[str, Any]]:
        """Recent training jobs (only `owner`'s, when given)."""
        query = rq.ListJobs(limit=limit, owner=owner)
        return (await self.request("tracker", "list_jobs", query))["jobs"]


class Client:
    """Synchronous client with the seed's method names: `Client().create_run(...)`."""

    def __init__(
        self,
        endpoint: str | None = None,
        api_key: str | None = None,
        *,
        settings: Settings | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self._async = AsyncClient(settings, endpoint=endpoint, api_key=api_key, timeout_s=timeout_s)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        """Close the connection and stop the private loop."""
        if self._loop.is_running():
            self._run(self._async.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._async, name, None)
        if method is None or name.startswith("_") or not asyncio.iscoroutinefunction(method):
            raise AttributeError(name)

        def sync(*args: Any, **kwargs: Any) -> Any:
            return self._run(method(*args, **kwargs))

        sync.__name__ = name
        sync.__doc__ = method.__doc__
        return sync
