"""A request with a megabyte in one field is refused fast, by name, over real NATS.

A ~1 MB body whose one string field is ~174,000 NULs (`\\u0000` escapes) once took 4-9 s to
refuse: the failure was logged with its exception, and structlog's default console renderer
(a process that never configured logging: these tests, a service started in-process) drew
each frame's locals, the megabyte among them. A refusal now logs no traceback, a bug's
traceback is logged as plain text, and a reason keeps its first characters only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import nats
import pytest
import structlog
from pydantic import BaseModel
from waiting import wait_until

from rollout.services.buffer.main import serve as serve_buffer
from rollout.services.env_registry.main import build_broker as registry_broker
from rollout.shared import subjects
from rollout.shared.service.routes import request_route, service_broker
from rollout.shared.settings import Settings, connect_nats

# Well below the seconds it took; far above the milliseconds it takes.
DEADLINE_S = 2.0
# Room for the headers under the server's max payload, as the hostile suite leaves.
HEADROOM = 4096


@pytest.fixture(autouse=True)
def unconfigured_structlog() -> Iterator[None]:
    """structlog as a process that never configured it has it (rich tracebacks with locals)."""
    saved = structlog.get_config()
    structlog.reset_defaults()
    yield
    structlog.configure(**saved)


def huge_nuls(nc: nats.aio.client.Client, key: str, **rest: Any) -> bytes:
    """A body near the server's max payload: `key` is a string of NULs, each `\\u0000`."""
    room = nc.max_payload - HEADROOM
    return json.dumps({**rest, key: "\x00" * (room // 6)}).encode()


def huge_text(nc: nats.aio.client.Client, key: str, **rest: Any) -> bytes:
    """A body near the server's max payload: `key` is one long plain string."""
    return json.dumps({**rest, key: "x" * (nc.max_payload - HEADROOM)}).encode()


async def timed_refusal(nc: nats.aio.client.Client, subject: str, body: bytes) -> dict:
    """The refusal of `body`, answered within the deadline, small and without a traceback."""
    started = time.perf_counter()
    msg = await nc.request(subject, body, timeout=30)
    took = time.perf_counter() - started
    assert took < DEADLINE_S, f"{subject}: a {len(body)} B body took {took:.2f}s to refuse"
    assert len(msg.data) < 4096, f"{subject}: a {len(msg.data)} B reply"
    assert "Traceback" not in msg.data.decode()
    reply = json.loads(msg.data)
    assert reply["ok"] is False, reply
    return reply


@pytest.fixture
async def registry(nats_settings: Settings) -> AsyncIterator[nats.aio.client.Client]:
    """The env registry's broker, built as its main.py builds it, and a client."""
    broker = registry_broker(nats_settings)
    await broker.start()
    nc = await connect_nats(nats_settings)
    yield nc
    await nc.close()
    await broker.stop()


async def test_a_megabyte_slug_is_refused_fast_naming_the_field(
    registry: nats.aio.client.Client,
) -> None:
    subject = subjects.request("registry", "get")
    for body in (huge_nuls(registry, "slug"), huge_text(registry, "slug")):
        reply = await timed_refusal(registry, subject, body)
        error = reply["error"]
        assert error.startswith("environment slug '"), error
        assert "must be 1-128 characters" in error and "characters)" in error, error


class Note(BaseModel):
    """A request with one free-text field."""

    text: str


async def fails_quoting(note: Note) -> None:
    """A handler with a bug that quotes its whole input in the exception."""
    held = note.text  # a frame local holding the megabyte
    raise ValueError(f"cannot handle {held!r}")


async def test_a_bug_on_a_megabyte_input_is_answered_fast_with_a_short_reason(
    nats_settings: Settings,
) -> None:
    broker = service_broker(
        nats_settings, [request_route(fails_quoting, "oversize", "note", queue="oversize")]
    )
    await broker.start()
    nc = await connect_nats(nats_settings)
    try:
        subject = subjects.request("oversize", "note")
        for body in (huge_nuls(nc, "text"), huge_text(nc, "text")):
            with structlog.testing.capture_logs() as logs:
                reply = await timed_refusal(nc, subject, body)
            assert reply["error"].startswith("ValueError: cannot handle '"), reply
            assert len(reply["error"]) < 1100 and "characters)" in reply["error"], reply
            # The bug's traceback is logged, as plain text and cut short.
            [failed] = [entry for entry in logs if entry["event"] == "request failed"]
            assert "exc_info" not in failed
            assert "Traceback" in failed["exception"] and "fails_quoting" in failed["exception"]
            assert len(failed["exception"]) < 20_000
            assert len(failed["error"]) < 1100
    finally:
        await nc.close()
        await broker.stop()


async def test_the_buffer_refuses_a_megabyte_slug_or_run_id_fast_by_name(
    settings: Settings,
) -> None:
    task = asyncio.create_task(serve_buffer(settings))
    nc = await connect_nats(settings)
    try:

        async def answers() -> bool:
            if task.done():
                task.result()
            try:
                await nc.request(subjects.request("buffer", "rollouts"), b"{", timeout=1)
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                return False
            return True

        await wait_until(answers, "the buffer to answer", 60, interval_s=0.1)
        for verb, body, named in (
            ("rollouts", huge_nuls(nc, "env_slug"), "environment slug '"),
            ("grpo_groups", huge_nuls(nc, "env_slug"), "environment slug '"),
            ("dpo_pairs", json.dumps({"run_ids": ["\x00" * 170_000]}).encode(), "run id '"),
            ("sft_set", json.dumps({"rollout_ids": ["a\x00b"]}).encode(), "rollout id '"),
        ):
            reply = await timed_refusal(nc, subjects.request("buffer", verb), body)
            assert reply["error"].startswith(named), (verb, reply)
    finally:
        await nc.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
