"""A key's budgets a UTC day: the operator sets them, the tracker and the learner enforce them.

A runner key with 6 rollouts a day runs 4, is refused 4 more (naming the limit, what it used,
what it asked and when room frees up), and of two runs of 4 racing for it only one gets in; a
retried request pays nothing; lifting the limit lets it run again. Jobs likewise. Only the
operator sets limits: a key holder's shell is refused, and no key may append them to the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import nats.errors
import pytest
from waiting import wait_until

from rollout.errors import RolloutError
from rollout.services.learner import handlers as learner_handlers
from rollout.services.learner import tuning
from rollout.services.learner.context import LearnerContext
from rollout.shared.aggregates import quota
from rollout.shared.auth.keys import ApiKey, read_local_key
from rollout.shared.auth.roles import Role
from rollout.shared.bus.reader import read_events
from rollout.shared.bus.requests import NobodyAnswered
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import KeyLimitsSet
from rollout.shared.contracts.requests import CancelTrainingJob, ImportedRollout, ImportRun
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.service.routes import service_broker
from rollout.shared.settings import Settings
from rollout.shared.stack.nats import NatsServer

from .conftest import Cli, cli_env, make_key, refund_env
from .test_auth_roles import MODEL, client_for, refused_fast


def frees_at() -> str:
    """The next 00:00 UTC, as a refusal names it."""
    tomorrow = datetime.now(UTC).date() + timedelta(days=1)
    return f"{tomorrow.isoformat()}T00:00:00Z"


async def charges(settings: Settings, key: ApiKey) -> list[dict]:
    """The key's charges today, from the log."""
    admin = client_for(settings, None)
    try:
        js = await admin.jetstream()
        day = quota.day_of(datetime.now(UTC))
        return [
            EventEnvelope.from_bytes(m.data).payload
            async for m in read_events(js, quota.day_subject(key.key_id, day))
        ]
    finally:
        await admin.close()


async def limit(settings: Settings, key: ApiKey, **changes: int | None) -> None:
    """Set a key's limits on the log as the operator does (`rollout keys limit`)."""
    admin = client_for(settings, None)
    try:
        await quota.set_limits(await admin.jetstream(), key.key_id, changes)
    finally:
        await admin.close()


async def test_a_runner_keys_rollout_budget_admits_runs_until_spent(
    cli: Cli, service_settings: Settings, services: None
) -> None:
    created = await cli(
        "keys", "create", "--role", "runner", "--max-rollouts-per-day", "6", "--json"
    )
    assert created.returncode == 0, created.stderr
    doc = json.loads(created.stdout)
    assert doc["limits"] == {"max_rollouts_per_day": 6, "max_jobs_per_day": None}
    key = ApiKey.parse(doc["apiKey"])
    runner = client_for(service_settings, key)
    try:
        await runner.push_environment(refund_env())  # one task: a run plans n rollouts
        first = await runner.create_run("refunds", MODEL, n=4, client_request_id="first")
        # Its retry (the same client request id) gets the same run and pays nothing.
        again = await runner.create_run("refunds", MODEL, n=4, client_request_id="first")
        assert again["runId"] == first["runId"]

        denied = await refused_fast(runner.create_run("refunds", MODEL, n=4))
        assert str(denied).startswith(
            f"key {key.key_id} is over its budget of 6 rollouts a day (max_rollouts_per_day): "
            f"it used 4 today (UTC) and this request asks 4 rollouts; room frees up at "
            f"{frees_at()} (in "
        ), denied
        assert "ask for at most 2 rollouts today" in denied.problems, denied.problems

        await runner.create_run("refunds", MODEL, n=2)  # exactly the 2 left
        denied = await refused_fast(runner.create_run("refunds", MODEL, n=1))
        assert "it used 6 today (UTC) and this request asks 1 rollout;" in str(denied)
        assert [c["amount"] for c in await charges(service_settings, key)] == [4, 2]

        listed = await cli("keys", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        row = {r["id"]: r for r in json.loads(listed.stdout)["keys"]}[key.key_id]
        assert row["limits"] == {"maxRolloutsPerDay": 6, "maxJobsPerDay": None}
        assert row["used"] == {"rollouts": 6, "jobs": 0}

        lifted = await cli("keys", "limit", key.key_id, "--max-rollouts-per-day", "none")
        assert lifted.returncode == 0, lifted.stderr
        assert "rollouts unlimited" in lifted.stdout
        await runner.create_run("refunds", MODEL, n=4)
        text = (await cli("keys", "list")).stdout
        assert any(line.startswith(key.key_id) and " 10/- " in line for line in text.splitlines())
    finally:
        await runner.close()


async def test_two_runs_racing_for_the_last_of_a_budget_cannot_both_get_in(
    service_settings: Settings, services: None, auth_nats: NatsServer
) -> None:
    keys = [make_key(auth_nats, Role.RUNNER) for _ in range(3)]
    runners = [client_for(service_settings, key) for key in keys]
    try:
        await runners[0].push_environment(refund_env())
        for key in keys:
            await limit(service_settings, key, max_rollouts_per_day=6)
        # Each key sends two runs of 4 at once, several keys at a time: a decision from a
        # read model (or an unconditional append) lets both of a pair in.
        pairs = [
            asyncio.gather(
                runner.create_run("refunds", MODEL, n=4),
                runner.create_run("refunds", MODEL, n=4),
                return_exceptions=True,
            )
            for runner in runners
        ]
        for key, outcomes in zip(keys, await asyncio.gather(*pairs), strict=True):
            passed = [o for o in outcomes if isinstance(o, dict)]
            refused = [o for o in outcomes if isinstance(o, RolloutError)]
            assert (len(passed), len(refused)) == (1, 1), outcomes
            assert "is over its budget of 6 rollouts a day" in str(refused[0])
            assert [c["ref"] for c in await charges(service_settings, key)] == [passed[0]["runId"]]
        # A sweep at once past its budget: exactly the budget's worth gets in, the rest are
        # refused for it (none for losing races to the others).
        await limit(service_settings, keys[0], max_rollouts_per_day=4 + 10)  # 4 spent above
        outcomes = await asyncio.gather(
            *(runners[0].create_run("refunds", MODEL, n=1) for _ in range(16)),
            return_exceptions=True,
        )
        refused = [o for o in outcomes if not isinstance(o, dict)]
        assert len(refused) == 6, outcomes
        assert all("over its budget of 14 rollouts a day" in str(o) for o in refused), refused
        assert len(await charges(service_settings, keys[0])) == 1 + 10
    finally:
        for runner in runners:
            await runner.close()


async def test_imported_rollouts_count_in_the_same_budget(
    service_settings: Settings, services: None, auth_nats: NatsServer
) -> None:
    key = make_key(auth_nats, Role.RUNNER)
    runner = client_for(service_settings, key)

    def imported(first: int) -> ImportRun:
        rollouts = [
            ImportedRollout(
                task_index=0,
                sample_index=sample,
                trajectory={"messages": [{"role": "user", "content": "hi"}]},
                score=1.0,
                passed=True,
            )
            for sample in range(first, first + 4)
        ]
        return ImportRun(env_slug="refunds", rollouts=rollouts)

    try:
        await runner.push_environment(refund_env())
        await limit(service_settings, key, max_rollouts_per_day=6)
        done = await runner.import_run(imported(0))
        assert (await runner.import_run(imported(0)))["runId"] == done["runId"]  # paid once
        denied = await refused_fast(runner.import_run(imported(4)))
        assert "it used 4 today (UTC) and this request asks 4 rollouts" in str(denied)
        assert [c["amount"] for c in await charges(service_settings, key)] == [4]
    finally:
        await runner.close()


@contextlib.asynccontextmanager
async def learner_requests(settings: Settings) -> AsyncIterator[None]:
    """The learner's request routes in this loop, and no job consumer: jobs are recorded and
    queued, and none trains."""

    async def build(runtime: ServiceRuntime) -> object:
        assert runtime.nc is not None
        ctx = LearnerContext(
            runtime.nc, runtime.js, runtime.object_store(), settings.home / "learner"
        )
        return service_broker(
            settings, learner_handlers.ROUTES, learner=ctx, limits=tuning.limits()
        )

    task = asyncio.create_task(serve_service("learner", settings, build, keep_connection=True))
    admin = client_for(settings, None)

    async def answering() -> bool:
        if task.done():
            task.result()  # a learner that died says why
        try:
            await admin.request("learner", "cancel_job", CancelTrainingJob(job_id="no-such-job"))
        except NobodyAnswered:
            return False
        except RolloutError:
            return True  # refused: it answers
        raise AssertionError("an unknown job was cancelled")

    try:
        await wait_until(answering, "the learner to answer", 60)
        yield
    finally:
        await admin.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_runner_keys_job_budget_admits_jobs_until_spent(
    service_settings: Settings, services: None, auth_nats: NatsServer
) -> None:
    key = make_key(auth_nats, Role.RUNNER)
    runner = client_for(service_settings, key)
    job = {
        "base_model": "local/tiny-agent",
        "method": "grpo",
        "env_slug": "refunds",
        "hyperparams": {"max_steps": 1},
    }
    try:
        await runner.push_environment(refund_env())
        await limit(service_settings, key, max_jobs_per_day=1)
        async with learner_requests(service_settings):
            first = await runner.create_training_job(**job, client_request_id="job-1")
            again = await runner.create_training_job(**job, client_request_id="job-1")
            assert again["id"] == first["id"]  # a retry pays nothing
            denied = await refused_fast(runner.create_training_job(**job))
            assert str(denied).startswith(
                f"key {key.key_id} is over its budget of 1 training job a day "
                f"(max_jobs_per_day): it used 1 today (UTC) and this request asks 1 training "
                f"job; room frees up at {frees_at()}"
            ), denied
            # Its rollout budget is another: runs still go.
            await runner.create_run("refunds", MODEL, n=1)
            await limit(service_settings, key, max_jobs_per_day=None)
            lifted = await runner.create_training_job(**job)
            assert lifted["id"] != first["id"]
        kinds = [(c["kind"], c["amount"]) for c in await charges(service_settings, key)]
        assert kinds == [("jobs", 1), ("rollouts", 1), ("jobs", 1)]
    finally:
        await runner.close()


async def test_only_the_operator_sets_a_keys_limits(
    cli: Cli, service_settings: Settings, services: None, auth_nats: NatsServer
) -> None:
    runner_key = make_key(auth_nats, Role.RUNNER)
    viewer_key = make_key(auth_nats, Role.VIEWER)
    await limit(service_settings, runner_key, max_rollouts_per_day=1)
    # A key holder's shell (either role) cannot reach the operator's verb; bad limits are
    # refused by name (the CLI runs at once: each takes seconds to start on a busy machine).
    lift = ("keys", "limit", runner_key.key_id, "--max-rollouts-per-day", "none")
    local = read_local_key(auth_nats.home)
    assert local is not None
    *holders, negative, empty, own = await asyncio.gather(
        Cli(cli.env | {"ROLLOUT_API_KEY": runner_key.text})(*lift),
        Cli(cli.env | {"ROLLOUT_API_KEY": viewer_key.text})(*lift),
        cli("keys", "limit", runner_key.key_id, "--max-jobs-per-day", "-3"),
        cli("keys", "limit", runner_key.key_id),
        cli("keys", "limit", local.key_id, "--max-jobs-per-day", "1"),
    )
    for result in holders:
        assert result.returncode == 1, result.stderr
        assert "ROLLOUT_API_KEY is set: this shell acts as a key holder" in result.stderr
        assert "Traceback" not in result.stderr
    assert negative.returncode == 2 and "'-3' is not a limit" in negative.stderr
    assert empty.returncode == 1 and "nothing to set" in empty.stderr
    assert own.returncode == 1, own.stderr
    assert "this machine's local key, the operator's own: it stays unlimited" in own.stderr
    # Nor can a key append limits to the log itself: the server drops the publish.
    for key in (runner_key, viewer_key):
        nc = await nats.connect(auth_nats.url, user=key.user, password=key.secret)
        try:
            lifted = KeyLimitsSet(key_id=runner_key.key_id)
            envelope = EventEnvelope.new(lifted, aggregate_id=runner_key.key_id, id_parts=("x",))
            with pytest.raises(nats.errors.Error):
                await nc.jetstream().publish(envelope.subject, envelope.to_bytes(), timeout=1)
        finally:
            await nc.close()
    runner = client_for(service_settings, runner_key)
    try:
        await runner.push_environment(refund_env())
        await runner.create_run("refunds", MODEL, n=1)
        denied = await refused_fast(runner.create_run("refunds", MODEL, n=1))
        assert "is over its budget of 1 rollout a day" in str(denied)
    finally:
        await runner.close()


async def test_limits_are_set_only_on_a_running_stack(cli: Cli, tmp_path: Path) -> None:
    # They live on its log: a key minted while it is down would be live, unlimited, at `up`.
    down = Cli(cli_env(tmp_path / "down-home", tmp_path / "config"))
    result = await down("keys", "create", "--role", "runner", "--max-jobs-per-day", "2")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "a key's limits are kept on the platform's event log" in result.stderr
    assert "rk_" not in result.stdout
    listed = json.loads((await down("keys", "list", "--json")).stdout)
    assert listed == {"keys": [], "stackRunning": False}
