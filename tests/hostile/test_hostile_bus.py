"""1,000+ hostile bus messages sent with a RUNNER key: every reply is a clean, named refusal,
forged service subjects are refused by NATS, and nothing accepted before is lost.

A run and an environment exist first; afterwards they are intact, and the tracker's read
models equal a rebuild from the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
from typing import Any

import nats
import nats.errors
import pytest
from auth.conftest import refund_env
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.services.tracker.projections import ReadModels
from rollout.shared import subjects
from rollout.shared.auth.keys import ApiKey
from rollout.shared.auth.roles import ROLE_REQUESTS, Role
from rollout.shared.bus.reader import last_sequence
from rollout.shared.service.throttle import COSTLY, READS, WRITES
from rollout.shared.settings import Settings
from rollout.shared.store.db import create_pool
from rollout.shared.store.projection import ProjectionRunner

MODEL = "http://127.0.0.1:9/v1#scripted"
REPLY_S = 5.0
# What a valid body of each request looks like; the hostile ones are built from these.
VALID: dict[tuple[str, str], dict[str, Any]] = {
    ("registry", "push"): {"spec": refund_env()},
    ("registry", "get"): {"slug": "refunds"},
    ("registry", "list"): {},
    ("registry", "audit"): {"slug": "refunds", "limit": 1},
    ("tracker", "create_run"): {"env_slug": "refunds", "model": MODEL, "n": 1},
    ("tracker", "cancel_run"): {"run_id": "no-such-run", "reason": "why"},
    ("tracker", "get_run"): {"run_id": "r1"},
    ("tracker", "list_runs"): {"limit": 5},
    ("tracker", "get_job"): {"job_id": "j1"},
    ("tracker", "list_jobs"): {},
    ("tracker", "record_plan_event"): {
        "plan_id": "p1",
        "type": "plan.stage_started",
        "payload": {},
        "expected_version": 0,
    },
    ("tracker", "import_run"): {
        "env_slug": "refunds",
        "rollouts": [
            {
                "task_index": 0,
                "sample_index": 0,
                "trajectory": {"final_output": "refunded"},
                "score": 1.0,
                "passed": True,
            }
        ],
    },
    ("learner", "create_job"): {"method": "sft", "base_model": "local/tiny-agent"},
    ("learner", "cancel_job"): {"job_id": "job-nosuch", "reason": "why"},
    ("buffer", "sft_set"): {"env_slug": "refunds"},
    ("buffer", "dpo_pairs"): {"env_slug": "refunds"},
    ("buffer", "grpo_groups"): {"env_slug": "refunds"},
    ("buffer", "rollouts"): {"env_slug": "refunds"},
}
WRONG = [
    None,
    True,
    0,
    -1,
    2**64,
    -(2**63),
    3.5,
    1e308,
    float("nan"),
    float("inf"),
    "",
    "\x00",
    "x" * 300,
    "\u202e",
    "\udcff",
    "${args.x}",
    "' OR 1=1 --",
    "../../etc/passwd",
    [],
    {},
    [None],
    ["a"] * 100,
    {"$ne": 1},
    {"nested": {"deep": [1]}},
]


def hostile_bodies(valid: dict[str, Any], max_payload: int) -> list[bytes]:
    """Malformed, mistyped, huge, NUL-laden and misversioned variants of one valid body."""
    raw: list[bytes] = [
        b"",
        b"\x00",
        b"\xff\xfe\xfd",
        b"{",
        b"null",
        b"[]",
        b"1",
        b'"text"',
        b"[" * 5000 + b"]" * 5000,
        b'{"a":' * 2000 + b"1" + b"}" * 2000,
        json.dumps(valid).encode() + b"\x00",
        b"\x00" + json.dumps(valid).encode(),
    ]
    for key in list(valid) or ["x"]:
        for wrong in WRONG:
            raw.append(json.dumps({**valid, key: wrong}).encode())
    for extra in (
        {"unknown_field": 1},
        {"schema_version": 999},
        {"schema_version": "9.0"},
        {"type": "run.completed"},
        {"type": "no.such.event", "payload": {}},
        {"__class__": "os.system"},
        {"\x00": "\x00"},
    ):
        raw.append(json.dumps({**valid, **extra}).encode())
    # Event envelopes where a command belongs: unknown types, wrong schema versions.
    for version in ("0.0", "1.999", "2.0", "99.1", "x", 7, None):
        for kind in ("run.completed", "no.such.event", "env.registered"):
            envelope = {"id": "e1", "type": kind, "schema_version": version, "payload": valid}
            raw.append(json.dumps(envelope).encode())
    # Near the server's max payload: one huge string field, and a huge list of them.
    room = max_payload - 4096
    raw.append(json.dumps({**valid, "pad": "x" * room}).encode())
    raw.append(json.dumps({**valid, next(iter(valid), "x"): "\x00" * (room // 6)}).encode())
    raw.append(json.dumps({**valid, "list": ["y"] * (room // 6)}).encode())
    # NUL bytes deep inside a pushed spec (Postgres cannot store them).
    if "spec" in valid:
        for where in ("name", "instruction", "tool", "key"):
            spec = json.loads(json.dumps(valid["spec"]))
            if where == "name":
                spec["name"] = "Re\x00funds"
            elif where == "instruction":
                spec["tasks"][0]["instruction"] = "Refund\x00 O-1"
            elif where == "tool":
                spec["config"]["tools"][0]["name"] = "re\x00fund"
            else:
                spec["config"]["initialMutableState"]["\x00"] = 1
            raw.append(json.dumps({"spec": spec}).encode())
    # Every NUL-string variant of each string field.
    for key, value in valid.items():
        if isinstance(value, str):
            raw.append(json.dumps({**valid, key: value + "\x00evil"}).encode())
            raw.append(json.dumps({**valid, key: "../" * 50}).encode())
    return raw


@pytest.fixture
def no_key_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys' request budgets off: the hostile bodies must reach the handlers, not be answered
    `rate limited` before they are parsed (the budgets: tests/hostile/test_hostile_queries.py)."""
    for budget in (WRITES, READS, COSTLY):
        monkeypatch.setenv(budget.env, "0")


@pytest.fixture
async def platform(no_key_budgets: None, service_settings: Settings, services: None) -> Any:
    """The buffer and the learner too (the registry and the tracker come from `services`)."""
    tasks = [
        asyncio.create_task(
            importlib.import_module(f"rollout.services.{m}.main").serve(service_settings)
        )
        for m in ("buffer", "learner")
    ]
    yield tasks
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def snapshot(settings: Settings) -> dict[str, list[tuple]]:
    pool = await create_pool(settings.database_url)
    try:
        out = {}
        async with pool.acquire() as conn:
            for table in ReadModels.tables:
                rows = await conn.fetch(f"select * from {table}")
                out[table] = sorted(tuple(r.values()) for r in rows)
        return out
    finally:
        await pool.close()


async def answered(admin: AsyncClient, platform: list[asyncio.Task]) -> None:
    """Wait until the buffer and the learner answer their subjects."""
    nc = await nats.connect(**_kwargs(admin.settings))
    try:
        for service, verb in (("buffer", "sft_set"), ("learner", "create_job")):

            async def answers(service: str = service, verb: str = verb) -> bool:
                for task in platform:
                    if task.done():
                        task.result()
                try:
                    await nc.request(subjects.request(service, verb), b"{", timeout=1)
                except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                    return False
                return True

            await wait_until(answers, f"the {service} to answer", 60, interval_s=0.1)
    finally:
        await nc.close()


async def eventually(call: Any) -> Any:
    """The call's answer once the read model has caught up (a RolloutError until then)."""
    from rollout.errors import RolloutError

    async def answer() -> tuple[Any] | None:
        try:
            return (await call(),)
        except RolloutError:
            return None

    (found,) = await wait_until(answer, "the read model to catch up", 30)
    return found


async def caught_up(view: ProjectionRunner, js: Any) -> None:
    """Wait until the tracker's read models hold the whole log, twice in a row (a dead letter
    is appended after the event it refuses)."""
    steady = [0]

    async def twice() -> bool:
        target = await last_sequence(js)
        position = await view.position()
        steady[0] = steady[0] + 1 if position >= target else 0
        return steady[0] >= 2

    await wait_until(twice, "the tracker to hold the whole log twice in a row", 30, interval_s=0.1)


def _kwargs(settings: Settings) -> dict[str, Any]:
    from rollout.shared.settings import nats_connect_kwargs

    return nats_connect_kwargs(settings)


async def test_hostile_messages_from_a_runner_key(
    service_settings: Settings,
    platform: list[asyncio.Task],
    runner_key: ApiKey,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    admin = AsyncClient(service_settings, timeout_s=20)
    await answered(admin, platform)
    env = await admin.push_environment(refund_env())
    run = await admin.create_run("refunds", MODEL, n=2)
    env_before = await admin.get_environment("refunds")
    run_before = await eventually(lambda: admin.get_run(run["runId"]))

    runner = AsyncClient(service_settings, api_key=runner_key.text, timeout_s=20)
    runner_settings = runner.settings
    denied: list[str] = []

    async def on_error(exc: Exception) -> None:
        denied.append(str(exc))

    nc = await nats.connect(**_kwargs(runner_settings), error_cb=on_error)
    sent = 0
    bad_replies: list[str] = []
    try:
        for service, verb in ROLE_REQUESTS[Role.RUNNER]:
            subject = subjects.request(service, verb, runner_key.user)
            for body in hostile_bodies(VALID[(service, verb)], nc.max_payload):
                sent += 1
                try:
                    msg = await nc.request(subject, body, timeout=REPLY_S)
                except nats.errors.TimeoutError:
                    bad_replies.append(f"{subject}: no reply to {body[:80]!r}")
                    continue
                try:
                    reply = json.loads(msg.data)
                except ValueError:
                    bad_replies.append(f"{subject}: reply not JSON: {msg.data[:200]!r}")
                    continue
                if not isinstance(reply, dict) or "ok" not in reply:
                    bad_replies.append(f"{subject}: not a Reply: {msg.data[:200]!r}")
                elif not reply["ok"] and not (reply.get("error") or "").strip():
                    bad_replies.append(f"{subject}: refusal names nothing: {reply}")
                elif "Traceback" in msg.data.decode("utf-8", "replace"):
                    bad_replies.append(f"{subject}: traceback in reply")
        assert not bad_replies, f"{len(bad_replies)} bad replies of {sent}: {bad_replies[:8]}"

        # Forged service subjects: NATS refuses them; nothing reaches the log.
        js = nc.jetstream()
        admin_js = await admin.jetstream()
        before = (await admin_js.stream_info(subjects.EVENTS_STREAM)).state.last_seq
        forged = [
            subjects.event("run", run["runId"], "run_completed"),
            subjects.event("run", run["runId"], "rollouts_scored"),
            subjects.event("env", "refunds", "env_registered"),
            "rollout.evt.job.j1.job_completed",
            "rollout.work.rollouts.x",
            subjects.js_api("STREAM", "DELETE", subjects.EVENTS_STREAM),
            subjects.js_api("STREAM", "PURGE", subjects.EVENTS_STREAM),
            subjects.request("tracker", "no_such_verb"),
            "_INBOX.someone_else",
            # Asking in another user's name: cancelling as a colleague, or as a service.
            subjects.request("tracker", "cancel_run", "rk_runner_0123456789ab"),
            subjects.request("learner", "cancel_job", "svc_learner"),
            subjects.request("tracker", "create_run", "admin"),
        ]
        envelope = json.dumps({"type": "run.completed", "payload": {"run_id": run["runId"]}})
        for subject in forged * 20:
            await nc.publish(subject, envelope.encode())
            sent += 1
        await nc.flush()
        with pytest.raises(nats.errors.TimeoutError):
            await js.publish(subjects.event("run", run["runId"], "run_completed"), b"{}", timeout=1)
        try:
            await wait_until(
                lambda: sum("permissions violation" in d.lower() for d in denied) >= len(forged),
                "a violation reported per forged subject",
                10,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {denied}") from None
        assert (await admin_js.stream_info(subjects.EVENTS_STREAM)).state.last_seq == before
    finally:
        await nc.close()
        await runner.close()

    assert sent >= 1000, sent
    # Nothing accepted before is lost.
    assert await admin.get_environment("refunds") == env_before
    after_run = await admin.get_run(run["runId"])
    assert after_run["runId"] == run_before["runId"] and after_run[
        "env_slug" if "env_slug" in after_run else "envSlug"
    ] == run_before.get("env_slug", run_before.get("envSlug"))
    assert env["version"] == env_before["version"]
    pool = await create_pool(service_settings.database_url)
    try:
        runner_view = ProjectionRunner(pool, ReadModels())
        js = await admin.jetstream()
        await caught_up(runner_view, js)
        live = await snapshot(service_settings)
        await runner_view.rebuild(js)
    finally:
        await pool.close()
    assert await snapshot(service_settings) == live
    await admin.close()
    for task in platform:
        assert not task.done(), "a service stopped"
    # FastStream's task supervisor logs a pull fetch that timed out (nats-py raises
    # TimeoutError from an empty fetch while the loop is busy) and retries it: load, not input.
    crashes = [
        r
        for r in caplog.records
        if (r.exc_info or "Traceback" in r.getMessage())
        and not (r.exc_info and r.exc_info[0] is TimeoutError and "retrying" in r.getMessage())
    ]
    assert not crashes, [
        f"{r.name}: {r.getMessage()[:300]} {logging.Formatter().formatException(r.exc_info)[:3000] if r.exc_info else ''}"
        for r in crashes[:3]
    ]
