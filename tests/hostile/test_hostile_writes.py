"""A key that floods a service with write requests gets its budget, not the service.

Each replica answers attributed requests (run creation and cancel, imports, plan events, job
submissions, env pushes) one at a time. A runner key sending a thousand at once used to have
every one handled (each a Postgres read, most an event append), while every other key's
request waited behind them. Past `ROLLOUT_WRITES_PER_KEY` (20 a second, a burst of 100) a
replica answers the key at once with `rate limited` and when to retry, before parsing the
request (shared/service/throttle.py); the SDK client waits that out, so an honest burst is
paced, never failed.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest
from auth.conftest import make_key, refund_env

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.auth.credentials import with_credentials
from rollout.shared.auth.keys import ApiKey
from rollout.shared.auth.roles import Role
from rollout.shared.contracts import requests as rq
from rollout.shared.service.throttle import (
    BURST_SECONDS,
    DEFAULT_WRITES_PER_KEY,
    RATE_LIMITED,
    KeyBuckets,
    writes_per_key,
)
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.nats import NatsServer

BURST = int(DEFAULT_WRITES_PER_KEY * BURST_SECONDS)
FLOOD = 1_000


def test_a_key_gets_its_burst_then_its_rate_and_is_told_when_to_retry() -> None:
    now = [0.0]
    buckets = KeyBuckets(rate=20, burst=100, clock=lambda: now[0])
    assert [buckets.take("a") for _ in range(100)] == [0.0] * 100
    assert buckets.take("a") == pytest.approx(0.05)  # one request's worth at 20 a second
    assert buckets.take("b") == 0.0  # each key its own budget
    now[0] += 0.05
    assert buckets.take("a") == 0.0
    assert buckets.take("a") == pytest.approx(0.05)
    now[0] += 3600  # a quiet hour saves no more than the burst
    assert sum(buckets.take("a") == 0.0 for _ in range(150)) == 100


def test_the_budget_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUT_WRITES_PER_KEY", "0")
    assert writes_per_key() is None
    monkeypatch.setenv("ROLLOUT_WRITES_PER_KEY", "lots")
    with pytest.raises(RolloutError, match="ROLLOUT_WRITES_PER_KEY must be a number"):
        writes_per_key()


async def test_a_flooding_key_is_answered_at_once_and_another_key_is_not_held_behind_it(
    service_settings: Settings, services: None, auth_nats: NatsServer, runner_key: ApiKey
) -> None:
    hostile_key = make_key(auth_nats, Role.RUNNER)
    alice = AsyncClient(service_settings, api_key=runner_key.text, timeout_s=30)
    await alice.push_environment(refund_env())
    nc = await connect_nats(with_credentials(service_settings, None, hostile_key.text))
    try:
        # A thousand cancels at once, on the subject the server lets this key publish on.
        subject = subjects.request("tracker", "cancel_run", hostile_key.user)
        bodies = [
            rq.CancelRun(run_id=f"run-{i:06d}").model_dump_json().encode() for i in range(FLOOD)
        ]
        started = time.monotonic()
        flood = asyncio.gather(*(nc.request(subject, b, timeout=60) for b in bodies))
        # Alice's run is created while the flood is being answered.
        run = await alice.create_run("refunds", "http://127.0.0.1:9/v1#scripted", n=1)
        replies = [json.loads(m.data) for m in await flood]
        elapsed = time.monotonic() - started
    finally:
        await nc.close()
        await alice.close()
    assert run["runId"]
    limited = [r for r in replies if r["error"] == RATE_LIMITED]
    handled = [r for r in replies if r["error"] != RATE_LIMITED]
    # Handled: the burst, and the rate for as long as the flood lasted (and no more).
    assert BURST <= len(handled) <= BURST + DEFAULT_WRITES_PER_KEY * elapsed + 1, (
        len(handled),
        elapsed,
    )
    assert all("no run 'run-" in r["error"] for r in handled)
    refusal = limited[0]
    assert 0 < refusal["data"]["retryAfterS"] <= 1 / DEFAULT_WRITES_PER_KEY + 0.001
    [problem] = refusal["problems"]
    assert hostile_key.user in problem and "ROLLOUT_WRITES_PER_KEY" in problem
    assert "tracker" in problem


async def test_the_client_paces_an_honest_burst_past_the_budget_instead_of_failing_it(
    service_settings: Settings, services: None, runner_key: ApiKey
) -> None:
    alice = AsyncClient(service_settings, api_key=runner_key.text, timeout_s=30)
    extra = 30  # past the burst: these wait for the rate
    started = time.monotonic()
    try:
        outcomes = await asyncio.gather(
            *(alice.cancel_run(f"run-{i:06d}") for i in range(BURST + extra)),
            return_exceptions=True,
        )
    finally:
        await alice.close()
    elapsed = time.monotonic() - started
    # Every cancel reached the tracker (and was refused: no such run), none for its rate.
    assert all(isinstance(o, RolloutError) for o in outcomes)
    assert [o.message for o in outcomes if "no run" not in o.message] == []  # type: ignore[union-attr]
    assert elapsed >= (extra - 1) / DEFAULT_WRITES_PER_KEY


async def test_a_clients_concurrent_first_calls_open_one_connection(
    service_settings: Settings, services: None, auth_nats: NatsServer, runner_key: ApiKey
) -> None:
    # Each of them used to open its own connection, all but one left open, and 64 at once
    # failed: the server's (bcrypt) authentications took past its timeout.
    alice = AsyncClient(service_settings, api_key=runner_key.text, timeout_s=30)
    try:
        answers = await asyncio.gather(*(alice.list_runs() for _ in range(64)))
        url = f"http://127.0.0.1:{auth_nats.monitor_port}/connz?auth=1&limit=1024"
        conns = (await asyncio.to_thread(_json, url))["connections"]
    finally:
        await alice.close()
    assert len(answers) == 64
    assert sum(c.get("authorized_user") == runner_key.user for c in conns) == 1


def _json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)
