"""Helpers for learner tests: services as tasks, a refund env, scripted agents, job events."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import subprocess
from pathlib import Path
from typing import Any

from fakes.openai_server import Reply, text_reply, tool_reply

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.settings import Settings
from rollout.shared.stack.supervisor import cli_command

SERVICES = {
    "env-registry": "rollout.services.env_registry.main",
    "tracker": "rollout.services.tracker.main",
    "actor": "rollout.services.actor.main",
    "verifier": "rollout.services.verifier.main",
    "learner": "rollout.services.learner.main",
    "buffer": "rollout.services.buffer.main",
}
TESTS_DIR = Path(__file__).resolve().parent.parent


class Platform:
    """Services as tasks of the test's event loop: start and stop them by name."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, name: str, key: str | None = None) -> None:
        """Start service `name` (under `key`, for several replicas)."""
        serve = importlib.import_module(SERVICES[name]).serve
        self.tasks[key or name] = asyncio.create_task(serve(self.settings), name=key or name)

    async def stop(self, key: str) -> None:
        """Cancel one service task and wait for it."""
        task = self.tasks.pop(key)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def check(self) -> None:
        """Fail loudly if a service crashed."""
        for key, task in self.tasks.items():
            if task.done() and not task.cancelled() and task.exception():
                raise AssertionError(f"service {key} crashed") from task.exception()


def refund_env(tasks: int = 3, slug: str = "refunds") -> dict[str, Any]:
    """A workflow env: refund order O-i for amount 10*i (task 0 is the test split)."""
    return {
        "slug": slug,
        "name": "Refunds",
        "template": "workflow",
        "config": {
            "tools": [
                {
                    "name": "lookup_order",
                    "kind": "lookup",
                    "fixturePath": "orders.${args.order_id}",
                },
                {
                    "name": "refund",
                    "kind": "action",
                    "appendTo": "refunds",
                    "value": {"order_id": "${args.order_id}", "amount": "${args.amount}"},
                },
            ],
            "fixtures": {"orders": {f"O-{i}": {"amount": 10 * i} for i in range(tasks)}},
            "initialMutableState": {"refunds": []},
        },
        "tasks": [
            {
                "instruction": f"Refund order O-{i} in full",
                "hiddenGroundTruth": {"refunds": [{"order_id": f"O-{i}", "amount": 10 * i}]},
                "split": "test" if i == 0 else "train",
            }
            for i in range(tasks)
        ],
    }


def letters_env(tasks: int = 4) -> dict[str, Any]:
    """The refund env scored by how many common letters the answer has: rewards vary."""
    env = refund_env(tasks=tasks, slug="letters")
    env["verifier"] = {
        "primitives": [{"name": "letters", "type": "contains_terms", "terms": list("etaoinsrhl")}]
    }
    return env


def refund_agent(body: dict[str, Any]) -> Reply:
    """A scripted agent: refunds correctly unless its seed is divisible by 4 (then 1 too much)."""
    messages = body["messages"]
    user = next(m["content"] for m in messages if m["role"] == "user")
    order = user.split()[2]
    if not any(m["role"] == "tool" for m in messages):
        index = int(order.split("-")[1])
        wrong = (body.get("seed") or 0) % 4 == 0
        amount = 10 * index + (1 if wrong else 0)
        return tool_reply(("refund", {"order_id": order, "amount": amount}))
    return text_reply("refunded")


def hopeless_agent(body: dict[str, Any]) -> Reply:
    """A scripted agent that never refunds anything: every rollout fails its verifier."""
    return text_reply("I cannot help with refunds.")


async def job_events(js: Any, job_id: str) -> list[EventEnvelope]:
    """Every event of one job so far."""
    return [
        EventEnvelope.from_bytes(m.data)
        async for m in read_events(js, subjects.aggregate_events("job", job_id))
    ]


async def all_job_events(js: Any) -> list[EventEnvelope]:
    """Every job event of every job."""
    return [
        EventEnvelope.from_bytes(m.data)
        async for m in read_events(js, subjects.aggregate_events("job"))
    ]


async def wait_for_event(
    js: Any, job_id: str, event_type: str, limit_s: float = 120.0, where: Any = None
) -> EventEnvelope:
    """Follow a job's events until one of `event_type` (matching `where`) arrives."""

    async def follow() -> EventEnvelope:
        async for msg in read_events(js, subjects.aggregate_events("job", job_id), follow=True):
            event = EventEnvelope.from_bytes(msg.data)
            if event.type == "job.failed" and event_type != "job.failed":
                raise AssertionError(f"job failed: {event.payload['reason']}")
            if event.type == event_type and (where is None or where(event.body())):
                return event
        raise AssertionError("event stream ended")

    try:
        return await asyncio.wait_for(follow(), timeout=limit_s)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {event_type} of job {job_id}") from None


async def wait_until(predicate: Any, what: str, limit_s: float = 60.0) -> None:
    """Await an async predicate until true or the deadline passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def service_env(settings: Settings, **extra: str) -> dict[str, str]:
    """Environment for a `rollout serve` child on the test's NATS, home and object store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLOUT_", "PG", "NATS_"))}
    env |= {
        "ROLLOUT_HOME": str(settings.home),
        "ROLLOUT_NATS_URL": settings.nats_url,
        "ROLLOUT_NATS_USER": settings.nats_user or "",
        "ROLLOUT_NATS_PASSWORD": settings.nats_password or "",
        "ROLLOUT_EXTRA_SERVICES": "learner=rollout.services.learner.main",
        "ROLLOUT_LOG_LEVEL": "INFO",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")])),
    }
    return env | extra


def start_learner(settings: Settings, log: Path, **extra: str) -> subprocess.Popen[bytes]:
    """`rollout serve learner` as a child process (its output goes to `log`)."""
    handle = log.open("ab")
    try:
        return subprocess.Popen(
            cli_command("serve", "learner"),
            env=service_env(settings, **extra),
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    finally:
        handle.close()


async def scripted_run(
    client: Any, server: Any, *, n: int = 4, tasks: int = 3, **options: Any
) -> dict[str, Any]:
    """Push the refund env and run the scripted agent on it; return the completed run."""
    await client.push_environment(refund_env(tasks=tasks))
    run = await client.create_run(
        "refunds", f"{server.base_url}#scripted", n=n, temperature=0.0, **options
    )
    done = await client.wait_for_run(run["runId"], timeout_s=120)
    assert done["status"] == "completed", done
    return done


async def ready_client(settings: Settings, check: Any = None) -> AsyncClient:
    """A client once the registry, the tracker and the learner answer."""
    c = AsyncClient(settings, timeout_s=60)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        try:
            await c.list_environments()
            await c.list_training_jobs()
            await c.create_training_job(base_model="hf:/nonexistent", method="sft")
        except RolloutError as exc:
            if "no service answers" not in str(exc) and "did not answer" not in str(exc):
                return c
            if check is not None:
                check()
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)
