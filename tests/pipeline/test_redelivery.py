"""A work item delivered again generates only what is not on the log yet (one trajectory per
rollout, never two); an item that every delivery dies on is recorded as errored, not dropped."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fakes.openai_server import FakeOpenAI
from pipeline.fixtures import without
from pipeline.kit import Platform, refund_agent, refund_env

from rollout.client import AsyncClient
from rollout.services.actor.generate import failed_batch
from rollout.shared import subjects
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts import EventEnvelope
from rollout.shared.contracts.events import RolloutsGenerated
from rollout.shared.contracts.work import RolloutWork
from rollout.shared.models.catalog import register_backend
from rollout.shared.service import durables
from rollout.shared.settings import Settings


async def _take(js: Any, times: int) -> RolloutWork:
    """Take the run's one work item `times` times, as replicas that died on it would."""
    sub = await js.pull_subscribe_bind(durable="actors", stream=subjects.WORK_STREAM)
    for _ in range(times):
        (msg,) = await sub.fetch(1, timeout=30)
        work = RolloutWork.model_validate_json(msg.data)
        await msg.nak()  # redelivered at once (a dead replica's ack wait, without the wait)
    await sub.unsubscribe()
    return work


async def _generated(js: Any, run_id: str) -> Counter[str]:
    """How many trajectories of each rollout are on the run's log."""
    subject = subjects.event("run", run_id, "rollout_generated")
    ids = [
        r["rollout_id"]
        async for m in read_events(js, subject)
        for r in EventEnvelope.from_bytes(m.data).payload["rollouts"]
    ]
    return Counter(ids)


async def test_a_redelivered_item_generates_only_the_rollouts_not_on_the_log(
    actorless: tuple[Platform, AsyncClient, Any],
) -> None:
    platform, client, js = actorless
    await client.push_environment(refund_env(tasks=2))
    with FakeOpenAI(refund_agent) as server:
        run = await client.create_run(
            "refunds", f"{server.base_url}#scripted", n=2, temperature=0.0, batch_size=4
        )
        work = await _take(js, times=1)
        assert len(work.items) == 4
        # The replica that had it published its first task's rollouts, then died unacked.
        first = work.model_copy(update={"items": work.items[:2]})
        part = failed_batch(first, "the first delivery's result", actor_id="dead", kind="model")
        await EventPublisher(js).publish(
            EventEnvelope.new(
                RolloutsGenerated(run_id=work.run_id, work_item_id=work.work_item_id,
                                  rollouts=part),
                aggregate_id=work.run_id, id_parts=(work.work_item_id, 0, 2),
                run_id=work.run_id,
            )
        )  # fmt: skip
        platform.start("actor")
        done = await client.wait_for_run(run["runId"], timeout_s=120)
        assert done["status"] == "completed" and done["scored"] == 4, done
        # Each rollout once: the two on the log kept, only the other two generated.
        assert await _generated(js, run["runId"]) == Counter(i.rollout_id for i in work.items)
        assert done["errored"] == 2, done  # the two the dead replica published
        assert len(server.requests) > 0


async def test_an_item_queued_again_past_the_dedup_window_generates_only_what_is_not_on_the_log(
    actorless: tuple[Platform, AsyncClient, Any],
) -> None:
    # A redelivered fan-out queues the run's items again; past the work stream's dedup window
    # JetStream takes the copy as a new message, its first delivery. The copy says it was
    # queued before, so the actor reads the log first and generates only the rest.
    platform, client, js = actorless
    await client.push_environment(refund_env(tasks=2))
    with FakeOpenAI(refund_agent) as server:
        run = await client.create_run(
            "refunds", f"{server.base_url}#scripted", n=2, temperature=0.0, batch_size=4
        )
        sub = await js.pull_subscribe_bind(durable="actors", stream=subjects.WORK_STREAM)
        (msg,) = await sub.fetch(1, timeout=30)
        work = RolloutWork.model_validate_json(msg.data)
        await msg.ack()  # the first queue was taken and half generated
        await sub.unsubscribe()
        first = work.model_copy(update={"items": work.items[:2]})
        part = failed_batch(first, "the first queue's result", actor_id="gone", kind="model")
        # Under an event id of its own: past the events stream's dedup window too, a second
        # trajectory of these rollouts would not be dropped there either.
        await EventPublisher(js).publish(
            EventEnvelope.new(
                RolloutsGenerated(run_id=work.run_id, work_item_id=work.work_item_id,
                                  rollouts=part),
                aggregate_id=work.run_id, id_parts=(work.work_item_id, "first queue"),
                run_id=work.run_id,
            )
        )  # fmt: skip
        again = work.model_copy(update={"requeued": True})
        await js.publish(
            subjects.work("rollouts", work.run_id), again.model_dump_json().encode()
        )  # a new message id: as JetStream takes it once its dedup window has passed
        platform.start("actor")
        done = await client.wait_for_run(run["runId"], timeout_s=120)
        assert done["status"] == "completed" and done["scored"] == 4, done
        assert await _generated(js, run["runId"]) == Counter(i.rollout_id for i in work.items)


async def test_an_item_every_delivery_dies_on_is_recorded_as_errored(
    actorless: tuple[Platform, AsyncClient, Any],
) -> None:
    platform, client, js = actorless
    await client.push_environment(refund_env(tasks=1))
    with FakeOpenAI(refund_agent) as server:
        run = await client.create_run("refunds", f"{server.base_url}#scripted", n=2)
        # Five replicas took it and died (JetStream's old limit dropped it here, silently).
        work = await _take(js, times=5)
        platform.start("actor")
        done = await client.wait_for_run(run["runId"], timeout_s=120)
        assert done["status"] == "failed" and done["errored"] == 2, done
        assert done["reason"].startswith("every rollout errored (2 of 2)"), done
        assert not server.requests, "an abandoned item must not call the model"
    full = await client.get_run(run["runId"], include_rollouts=True)
    errors = {r["error"] for r in full["rollouts"]}
    assert len(errors) == 1, errors
    [error] = errors
    assert error.startswith("gave up after 5 attempts: the actor replica handling it stopped"), (
        error
    )
    assert {r["errorKind"] for r in full["rollouts"]} == {"infra"}
    assert len(work.items) == 2


async def test_a_batch_every_verifier_dies_on_is_recorded_as_errored(settings: Settings) -> None:
    async with without(settings, "verifier", durables.VERIFIER) as (platform, client, js):
        await client.push_environment(refund_env(tasks=1))
        with FakeOpenAI(refund_agent) as server:
            run = await client.create_run("refunds", f"{server.base_url}#scripted", n=2)
            # Five verifier replicas took the generated batch and died on it.
            sub = await js.pull_subscribe_bind(durable="verifier", stream=subjects.EVENTS_STREAM)
            for _ in range(5):
                (msg,) = await sub.fetch(1, timeout=60)
                await msg.nak()
            await sub.unsubscribe()
            platform.start("verifier")
            done = await client.wait_for_run(run["runId"], timeout_s=120)
        assert done["status"] == "failed" and done["errored"] == 2, done
        assert done["reason"].startswith("every rollout errored (2 of 2)"), done
        full = await client.get_run(run["runId"], include_rollouts=True)
        [error] = {r["error"] for r in full["rollouts"]}
        assert error.startswith("gave up after 5 attempts: the verifier replica handling it"), error


class _Unexpected:
    """A backend that fails in a way no handler expects (a bug, say): not a model error."""

    name = "unexpected-test"

    async def generate(self, requests: list[Any]) -> list[Any]:
        """Fail the way a bug would."""
        raise ZeroDivisionError("a bug in the backend")


async def test_an_item_an_unexpected_error_fails_is_recorded_as_errored_not_dropped(
    actorless: tuple[Platform, AsyncClient, Any],
) -> None:
    # Retried like any failure, then its rollouts are recorded as errored with the reason, so
    # the run ends saying why instead of waiting for its deadline with the item dead-lettered.
    register_backend("unexpected-test:", lambda rest: _Unexpected(), example="unexpected-test:x")
    platform, client, js = actorless
    await client.push_environment(refund_env(tasks=2))
    run = await client.create_run("refunds", "unexpected-test:x", n=1)
    platform.start("actor")
    done = await client.wait_for_run(run["runId"], timeout_s=120)
    assert (done["status"], done["errored"]) == ("failed", 2), done
    assert "ZeroDivisionError: a bug in the backend" in (done["reason"] or ""), done
