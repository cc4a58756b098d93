"""Helpers for platform tests: services as tasks, a refund env, a scripted agent, snapshots."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from dataclasses import replace
from typing import Any

import asyncpg
from fakes.openai_server import Reply, text_reply, tool_reply
from waiting import wait_until

from rollout.services.tracker.projections import ReadModels
from rollout.shared.settings import CREDENTIALS_FILE, Settings, read_json_file

SERVICES = {
    "env-registry": "rollout.services.env_registry.main",
    "tracker": "rollout.services.tracker.main",
    "actor": "rollout.services.actor.main",
    "verifier": "rollout.services.verifier.main",
    "learner": "rollout.services.learner.main",
    "buffer": "rollout.services.buffer.main",
}


STOP_DEADLINE_S = 60.0


class Platform:
    """Services as tasks: start, stop and restart them by name."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, name: str, key: str | None = None) -> None:
        """Start service `name` (under `key`, for several replicas) as its own NATS user."""
        serve = importlib.import_module(SERVICES[name]).serve
        self.tasks[key or name] = asyncio.create_task(
            serve(as_service(self.settings, name)), name=key or name
        )

    async def stop(self, key: str) -> None:
        """Cancel one service task and wait for it."""
        task = self.tasks.pop(key)
        # A library mid-start (a broker connecting) can swallow one cancellation: cancel
        # again until the task ends, and fail with its name rather than hang the suite.
        deadline = asyncio.get_running_loop().time() + STOP_DEADLINE_S
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=2.0)
            if asyncio.get_running_loop().time() > deadline and not task.done():
                raise AssertionError(
                    f"service {key} did not stop {STOP_DEADLINE_S:g}s after cancel"
                )
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def stop_all(self) -> None:
        """Cancel every service task and wait for them."""
        for key in list(self.tasks):
            await self.stop(key)

    def check(self) -> None:
        """Fail loudly if a service crashed."""
        for key, task in self.tasks.items():
            if task.done() and not task.cancelled() and task.exception():
                raise AssertionError(f"service {key} crashed") from task.exception()


def as_service(settings: Settings, name: str) -> Settings:
    """`settings` with service `name`'s own NATS user (its least permissions), as `rollout serve
    NAME` connects; the test's home holds the credentials (tests/conftest.py settings_for)."""
    entry = read_json_file(settings.home / CREDENTIALS_FILE).get("services", {}).get(name)
    if not entry:
        raise AssertionError(f"no NATS credential for service {name!r} in {settings.home}")
    return replace(settings, nats_user=entry["user"], nats_password=entry["password"])


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


FIXED = "def add(a, b):\n    return a + b\n"


def fix_env(slug: str = "fix-add", *, sleep_s: float = 0.0) -> dict[str, Any]:
    """A code-editing env whose hidden pytest suite (optionally slow) decides the verdict."""
    hidden = "import time\nfrom calc import add\n\n\ndef test_add():\n"
    hidden += f"    time.sleep({sleep_s})\n    assert add(2, 3) == 5\n"
    return {
        "slug": slug,
        "name": "Fix add",
        "template": "code-editing",
        "config": {"files": {"calc.py": "def add(a, b):\n    return a - b\n"}},
        "tasks": [
            {
                "instruction": "add() in calc.py is wrong; fix it.",
                "hiddenGroundTruth": {"tests": {"test_hidden.py": hidden}},
            }
        ],
    }


def fixer(body: dict[str, Any]) -> Reply:
    """Writes the fix, then says so (never runs the tests itself: only the verifier does)."""
    if not any(m["role"] == "tool" for m in body["messages"]):
        return tool_reply(("write_file", {"path": "calc.py", "content": FIXED}))
    return text_reply("fixed")


async def snapshot(pool: asyncpg.Pool) -> dict[str, list[tuple]]:
    """Every read-model row, in a stable order."""
    out = {}
    async with pool.acquire() as conn:
        for table in ReadModels.tables:
            rows = await conn.fetch(f"select * from {table}")
            out[table] = sorted(tuple(r.values()) for r in rows)
    return out


async def wait_for_platform(client: Any, platform: Platform | None = None) -> None:
    """Wait until the registry and the tracker answer (failing fast if a service crashed)."""
    from rollout.errors import RolloutError

    async def answering() -> bool:
        if platform is not None:
            platform.check()
        try:
            await client.list_environments()
            await client.list_runs()
        except RolloutError:
            return False
        return True

    await wait_until(answering, "the registry and the tracker to answer")
