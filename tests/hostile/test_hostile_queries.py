"""A key that floods queries, export pages or audits gets its budget, not the service.

Queries (`tracker list_runs`, `registry get`, ...) and the buffer's export pages and training
sets used to name no caller, so no budget could count them: a key sending thousands at once had
every one handled, one at a time per replica, while another key's same request waited behind
them all. Every request a key may send now ends with the key's user (subjects.attributed), and
each class has its budget per key (shared/service/throttle.py): reads `ROLLOUT_READS_PER_KEY`,
costly requests (audits, training sets) `ROLLOUT_COSTLY_PER_KEY`, writes
`ROLLOUT_WRITES_PER_KEY`, each counted apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from auth.conftest import make_key, refund_env
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.auth.credentials import with_credentials
from rollout.shared.auth.keys import ApiKey
from rollout.shared.auth.permissions import permissions
from rollout.shared.auth.roles import INTERNAL, MUTATIONS, QUERIES, Role
from rollout.shared.contracts import requests as rq
from rollout.shared.contracts.buffer import RolloutsQuery
from rollout.shared.service.throttle import (
    COSTLY,
    RATE_LIMITED,
    READS,
    WRITES,
    KeyBuckets,
    budget_of,
)
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.nats import NatsServer

ROOT = Path(__file__).resolve().parents[2]
FLOOD = 3_000


def test_every_request_a_key_may_send_names_the_key() -> None:
    assert set(INTERNAL) == subjects.SERVICE_ONLY
    for service, verb in (*QUERIES, *MUTATIONS):
        assert subjects.attributed(service, verb), (service, verb)
        subject = subjects.request(service, verb, "rk_viewer_0123456789ab")
        assert subjects.caller_of(subject) == "rk_viewer_0123456789ab"
    for service, verb in INTERNAL:
        assert subjects.request(service, verb, "svc_tracker") == f"rollout.req.{service}.{verb}"
    # A key may ask only under its own name: no subject of its role without it.
    allowed = permissions(Role.RUNNER, "rk_runner_0123456789ab")["publish"]["allow"]
    asks = [s for s in allowed if s.startswith("rollout.req.")]
    assert len(asks) == len(QUERIES) + len(MUTATIONS)
    assert all(s.endswith(".rk_runner_0123456789ab") for s in asks)


def test_each_request_a_key_may_send_spends_the_budget_of_its_class() -> None:
    assert {budget_of(*q) for q in QUERIES} == {READS}
    assert budget_of("buffer", "rollouts") is READS  # an export's page
    assert budget_of("registry", "audit") is COSTLY
    assert {budget_of("buffer", v) for v in ("sft_set", "dpo_pairs", "grpo_groups")} == {COSTLY}
    assert budget_of("tracker", "create_run") is WRITES
    # Reads and costly requests are charged the time they took; a costly one the smaller share.
    assert READS.timed and COSTLY.timed and not WRITES.timed
    assert READS.default > COSTLY.default


def test_a_timed_budget_lets_one_request_at_a_time_through_and_makes_a_flood_wait() -> None:
    now = [0.0]
    rate = READS.default
    buckets = KeyBuckets(rate, rate * READS.burst_s, clock=lambda: now[0])
    # A paging client: each page 40 ms at the replica, then as long its own (reading the
    # reply, asking the next): 10,000 pages (640,000 rollouts) and none refused.
    for _ in range(10_000):
        assert buckets.take("pager", 0.0) == 0.0
        now[0] += 0.04
        buckets.charge("pager", 0.04)
        now[0] += 0.04
    # A flood, handled back to back: through until what it saved and earned is spent ...
    handled = 0
    while (wait := buckets.take("flood", 0.0)) == 0.0:
        handled += 1
        now[0] += 0.04
        buckets.charge("flood", 0.04)
    burst = rate * READS.burst_s
    assert burst / 0.04 <= handled <= burst / (1 - rate) / 0.04 + 1
    # ... then told to wait until its debt (at most one request's) is paid back.
    assert 0 < wait <= 0.04 / rate


def test_no_caller_builds_a_request_subject_without_its_user() -> None:
    """Code outside shared/ that builds an attributed request's subject names its caller: a
    service's (or a key's) request on the anonymous subject is refused by the server."""
    two_args = re.compile(r"subjects\.request\(\s*([^,()]+),\s*([^,()]+)\)")
    for folder in ("services", "sdk"):
        for path in (ROOT / folder).rglob("*.py"):
            for service, verb in two_args.findall(path.read_text()):
                pair = (service.strip().strip('"'), verb.strip().strip('"'))
                assert pair in subjects.SERVICE_ONLY, (
                    f"{path.relative_to(ROOT)}: subjects.request{pair} names no caller; "
                    "use bus.requests.service_subject(nc, service, verb)"
                )


@pytest.fixture
def small_read_budget(monkeypatch: pytest.MonkeyPatch) -> float:
    """A read budget a few hundred queries spend (before the services start: they read it)."""
    share = 0.05  # 0.5 s of handling saved
    monkeypatch.setenv(READS.env, str(share))
    return share


async def test_a_key_flooding_queries_is_answered_at_once_and_another_keys_query_goes_on(
    small_read_budget: float,
    service_settings: Settings,
    services: None,
    auth_nats: NatsServer,
    viewer_key: ApiKey,
) -> None:
    hostile_key = make_key(auth_nats, Role.VIEWER)
    alice = AsyncClient(service_settings, api_key=viewer_key.text, timeout_s=30)
    nc = await connect_nats(with_credentials(service_settings, None, hostile_key.text))
    try:
        # Thousands of run listings at once, on the subject the server lets this key use.
        subject = subjects.request("tracker", "list_runs", hostile_key.user)
        body = rq.ListRuns(limit=20).model_dump_json().encode()
        flood = asyncio.gather(*(nc.request(subject, body, timeout=60) for _ in range(FLOOD)))
        # Alice's listings (her own budget) are answered while the flood is.
        listed = [await alice.list_runs() for _ in range(20)]
        replies = [json.loads(m.data) for m in await flood]
    finally:
        await nc.close()
        await alice.close()
    assert listed == [[]] * 20
    limited = [r for r in replies if r["error"] == RATE_LIMITED]
    handled = [r for r in replies if r["error"] != RATE_LIMITED]
    # Past its saved half second, each listing it was handled cost it 20 times as long refused.
    assert handled and all(r["ok"] for r in handled)
    assert len(limited) > FLOOD / 2, len(limited)
    refusal = limited[0]
    assert refusal["data"]["retryAfterS"] > 0
    [problem] = refusal["problems"]
    assert hostile_key.user in problem and READS.env in problem and "read requests" in problem
    assert "tracker" in problem


@pytest.fixture
def small_costly_budget(monkeypatch: pytest.MonkeyPatch) -> float:
    """A costly budget a few small audits spend (before the services start: they read it)."""
    share = 0.002  # 0.02 s of handling saved: a few one-task audits
    monkeypatch.setenv(COSTLY.env, str(share))
    return share


async def test_a_keys_costly_requests_spend_its_time_budget_apart_from_its_writes(
    small_costly_budget: float,
    service_settings: Settings,
    services: None,
    auth_nats: NatsServer,
    runner_key: ApiKey,
) -> None:
    hostile_key = make_key(auth_nats, Role.RUNNER)
    admin = AsyncClient(service_settings, timeout_s=30)
    await admin.push_environment(refund_env())
    await admin.close()
    nc = await connect_nats(with_credentials(service_settings, None, hostile_key.text))
    alice = AsyncClient(service_settings, api_key=runner_key.text, timeout_s=60)
    try:
        subject = subjects.request("registry", "audit", hostile_key.user)
        body = rq.AuditEnvironment(slug="refunds").model_dump_json().encode()
        replies = [
            json.loads(m.data)
            for m in await asyncio.gather(
                *(nc.request(subject, body, timeout=60) for _ in range(60))
            )
        ]
        # Its audits spent none of its writes: a cancel right after is handled.
        cancel = subjects.request("tracker", "cancel_run", hostile_key.user)
        msg = await nc.request(cancel, rq.CancelRun(run_id="run-000001").model_dump_json().encode())
        # Another key's audit spends its own budget, not the hostile key's.
        report = await alice.audit_environment("refunds")
    finally:
        await nc.close()
        await alice.close()
    assert "no run 'run-000001'" in json.loads(msg.data)["error"]
    assert report["version"] == 1
    handled = [r for r in replies if r["error"] != RATE_LIMITED]
    limited = [r for r in replies if r["error"] == RATE_LIMITED]
    assert handled and all(r["ok"] for r in handled)
    assert limited, "every audit was handled: the time they took was not charged"
    # Told to wait until its debt (the audits' time past its saved 0.1 s) is paid back.
    assert limited[0]["data"]["retryAfterS"] > 0
    [problem] = limited[0]["problems"]
    assert COSTLY.env in problem and "costly requests" in problem and "registry" in problem


@pytest.fixture
async def buffer(service_settings: Settings, services: None) -> AsyncIterator[None]:
    """The buffer too, answering export pages (the registry and the tracker: `services`)."""
    task = asyncio.create_task(
        importlib.import_module("rollout.services.buffer.main").serve(service_settings)
    )
    admin = AsyncClient(service_settings, timeout_s=5)

    async def answering() -> bool:
        if task.done():
            task.result()  # a buffer that died says why
        try:
            await admin.request("buffer", "rollouts", RolloutsQuery())
        except RolloutError:
            return False
        return True

    await wait_until(answering, "the buffer to answer", 30)
    await admin.close()
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_key_flooding_export_pages_is_refused_past_its_reads(
    small_read_budget: float,
    buffer: None,
    service_settings: Settings,
    auth_nats: NatsServer,
    runner_key: ApiKey,
) -> None:
    hostile_key = make_key(auth_nats, Role.RUNNER)
    nc = await connect_nats(with_credentials(service_settings, None, hostile_key.text))
    alice = AsyncClient(service_settings, api_key=runner_key.text, timeout_s=30)
    try:
        subject = subjects.request("buffer", "rollouts", hostile_key.user)
        page = RolloutsQuery(page_size=64)
        body = page.model_dump_json().encode()
        flood = asyncio.gather(*(nc.request(subject, body, timeout=60) for _ in range(FLOOD)))
        # Alice's page (her own budget) is answered while the flood is.
        mine = await alice.request("buffer", "rollouts", page)
        replies = [json.loads(m.data) for m in await flood]
    finally:
        await nc.close()
        await alice.close()
    assert mine["items"] == []
    limited = [r for r in replies if r["error"] == RATE_LIMITED]
    assert len(limited) > FLOOD / 2, len(limited)
    [problem] = limited[0]["problems"]
    assert READS.env in problem and "buffer" in problem
