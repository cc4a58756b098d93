"""No message over the server's max payload: big tool outputs, split batches, paged replies."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
from fakes.openai_server import FakeOpenAI, Reply, text_reply, tool_reply
from pipeline.kit import Platform, wait_for_platform
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.services.actor.generate import failed_batch
from rollout.services.tracker.runs import work_items
from rollout.shared import subjects
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts import EventEnvelope
from rollout.shared.contracts.buffer import BufferData, SftSetQuery
from rollout.shared.contracts.events import (
    RolloutsGenerated,
    RolloutsScored,
    RunRequested,
    ScoredRollout,
)
from rollout.shared.contracts.requests import GetRun
from rollout.shared.objectstore.claimcheck import DEFAULT_INLINE_LIMIT
from rollout.shared.settings import CREDENTIALS_FILE, Settings, connect_nats
from rollout.shared.stack.files import write_json
from rollout.shared.stack.nats import RELOADED_LINE
from rollout.shared.stack.process import file_size, wait_for_log
from rollout.shared.store.trajectories import INLINE_LIMIT_ENV, object_store

BIG = 150 * 1024


async def sft_set(client: Any, query: SftSetQuery, total: int) -> BufferData:
    """Ask the buffer, once it has ingested the run's `total` passing rollouts (it may lag)."""

    async def answer() -> BufferData | None:
        try:
            data = BufferData.model_validate(await client.request("buffer", "sft_set", query))
        except RolloutError:
            return None
        return data if data.total == total else None

    return await wait_until(answer, f"the buffer to answer with {total} items", 60, interval_s=0.2)


def big_doc_env(slug: str = "bigdocs") -> dict[str, Any]:
    """A workflow env whose one lookup tool returns 150 KB."""
    return {
        "slug": slug,
        "name": "Big documents",
        "template": "workflow",
        "config": {
            "tools": [{"name": "read_doc", "kind": "lookup", "fixturePath": "docs.${args.name}"}],
            "fixtures": {"docs": {"manual": "x" * BIG}},
            "initialMutableState": {"notes": []},
        },
        "tasks": [
            {
                "instruction": "Read the manual",
                "hiddenGroundTruth": {"notes": []},
                "split": "train",
            }
        ],
    }


def reader_agent(body: dict[str, Any]) -> Reply:
    """Reads the big document once, then answers."""
    if not any(m["role"] == "tool" for m in body["messages"]):
        return tool_reply(("read_doc", {"name": "manual"}))
    return text_reply("read it")


async def test_a_150kb_tool_output_with_n32_at_batch16_scores_all_32(
    client, platform, settings, monkeypatch
) -> None:
    # Trajectories under a message's size ride inline here (an operator's choice; by default
    # each is claim-checked), so the batches below must be split to fit.
    monkeypatch.setenv(INLINE_LIMIT_ENV, str(DEFAULT_INLINE_LIMIT))
    platform.start("buffer")
    await client.push_environment(big_doc_env())
    with FakeOpenAI(reader_agent) as server:
        run = await client.create_run("bigdocs", f"{server.base_url}#m", n=32, batch_size=16)
        done = await client.wait_for_run(run["runId"], timeout_s=120)
    assert done["status"] == "completed", done["reason"]
    assert done["scored"] == 32 and done["errored"] == 0 and done["passed"] == 32

    full = await client.get_run(run["runId"], include_rollouts=True, include_trajectories=True)
    assert len(full["rollouts"]) == 32
    assert len({r["rolloutId"] for r in full["rollouts"]}) == 32
    for r in full["rollouts"]:
        [call] = r["trajectory"]["tool_calls"]
        assert len(call["result"]) == BIG

    # One reply cannot hold 32 x 150 KB: the first page stops short and names the next.
    first = await client.request(
        "tracker",
        "get_run",
        GetRun(run_id=run["runId"], include_rollouts=True, include_trajectories=True),
    )
    assert 0 < len(first["rollouts"]) < 32 and first["rolloutsCursor"]
    assert [r["rolloutId"] for r in full["rollouts"][: len(first["rollouts"])]] == [
        r["rolloutId"] for r in first["rollouts"]
    ]

    # The buffer's SFT set of those 32, a page of 4 at a time, each page inline.
    whole = await sft_set(client, SftSetQuery(run_id=run["runId"]), 32)
    paged, offset = [], 0
    while offset is not None:
        query = SftSetQuery(run_id=run["runId"], offset=offset, page_size=4)
        page = await sft_set(client, query, 32)
        assert page.items is not None and page.count == 4
        paged.extend(page.items)
        offset = page.next_offset
    async with object_store(settings) as store:
        assert paged == (await whole.load(store))[0]

    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        limit = nc.max_payload
        sizes: dict[str, list[int]] = {"rollout.generated": [], "rollout.scored": []}
        async for msg in read_events(js, subjects.run_events(run["runId"])):
            event = EventEnvelope.from_bytes(msg.data)
            if event.type in sizes:
                sizes[event.type].append(len(msg.data))
    finally:
        await nc.close()
    # Two work items of 16 rollouts, each ~2.7 MB of trajectories: split into several events.
    assert len(sizes["rollout.generated"]) > 2
    assert all(size < limit for size in sizes["rollout.generated"] + sizes["rollout.scored"])


def chatty_agent(size: int) -> Any:
    """Answers at once with `size` characters of text (a trajectory of about that size)."""

    def answer(body: dict[str, Any]) -> Reply:
        return text_reply("y" * size)

    return answer


async def test_a_rollout_too_large_even_after_the_claim_check_is_errored_not_retried(
    client, settings, monkeypatch
) -> None:

    # A claim-check threshold above the server's max payload: a 1.5 MB trajectory stays
    # inline and cannot travel in any message.
    monkeypatch.setenv(INLINE_LIMIT_ENV, str(64 * 1024 * 1024))
    await client.push_environment(big_doc_env("chatty"))
    with FakeOpenAI(chatty_agent(1_500_000)) as server:
        run = await client.create_run("chatty", f"{server.base_url}#m", n=2)
        done = await client.wait_for_run(run["runId"], timeout_s=60)
    # Every rollout errored: the run measured nothing and fails with the first one's cause.
    assert done["status"] == "failed" and "bytes a message may carry" in done["reason"], done
    assert done["errored"] == 2 and done["passed"] == 0
    full = await client.get_run(run["runId"], include_rollouts=True)
    for r in full["rollouts"]:
        assert r["outcome"] == "errored" and r["errorKind"] == "infra"
        assert "bytes a message may carry" in r["error"], r["error"]
    nc = await connect_nats(settings)
    try:
        generated = [
            EventEnvelope.from_bytes(m.data)
            async for m in read_events(nc.jetstream(), subjects.run_events(run["runId"]))
            if m.subject.endswith("rollout_generated")
        ]
    finally:
        await nc.close()
    # Recorded on the first attempt: a size no retry can fix is not retried.
    assert [r["delivery_attempt"] for e in generated for r in e.payload["rollouts"]] == [1, 1]


async def test_a_large_trajectory_goes_to_the_object_store_and_comes_back(
    client, platform, settings
) -> None:
    platform.start("buffer")
    await client.push_environment(big_doc_env("chatty"))
    with FakeOpenAI(chatty_agent(1_500_000)) as server:
        run = await client.create_run("chatty", f"{server.base_url}#m", n=2)
        done = await client.wait_for_run(run["runId"], timeout_s=60)
    assert done["passed"] == 2, done
    full = await client.get_run(run["runId"], include_rollouts=True, include_trajectories=True)
    for r in full["rollouts"]:
        assert r["trajectoryUri"] and r["outcome"] == "passed"
        # 1.5 MB cannot ride in a reply either: it is omitted there, saying where it is.
        assert r["trajectory"] is None and r["trajectoryUri"] in r["trajectoryOmitted"]

    # Its SFT set (2 x 1.5 MB) cannot be one reply, whatever inline_limit asks: by claim check.
    async with object_store(settings) as store:
        query = SftSetQuery(run_id=run["runId"], inline_limit=64 << 20)
        whole = await sft_set(client, query, 2)
        assert whole.items is None and whole.ref is not None
        items, _ = await whole.load(store)
        assert len(items[0]["messages"][-1]["content"]) == 1_500_000
        # A page of one is still too large to ride inline: it comes by claim check too.
        page = await sft_set(client, SftSetQuery(run_id=run["runId"], page_size=1), 2)
        assert page.ref is not None and page.next_offset == 1
        assert (await page.load(store))[0] == items[:1]


# A server whose max payload is 64 KB: a run of TASKS tasks has a per-task table of ~130 KB.
SMALL_PAYLOAD = 64 * 1024
TASKS = 1200


@pytest.fixture
async def small_payload(tmp_path, fresh_nats, pg_dsn):
    """Settings for a nats-server of this test's own, reloaded with max_payload 64 KB."""
    offset = file_size(fresh_nats.log_path)
    with fresh_nats.config_path.open("a") as config:
        config.write(f"max_payload: {SMALL_PAYLOAD}\n")
    os.kill(fresh_nats.ref.pid, signal.SIGHUP)
    wait_for_log(
        fresh_nats.log_path,
        offset,
        lambda text: RELOADED_LINE in text,
        fresh_nats.process,
        what="nats-server reload",
        timeout=15,
    )
    home = tmp_path / "home"
    # As tests/conftest.py's settings_for: the services started in-process connect as themselves.
    write_json(home / CREDENTIALS_FILE, {"services": fresh_nats.services}, private=True)
    return Settings(
        home=home,
        nats_url=fresh_nats.url,
        database_url=pg_dsn,
        nats_user=fresh_nats.user,
        nats_password=fresh_nats.password,
        external_nats=True,
        external_database=True,
    )


async def test_a_per_task_table_over_the_max_payload_comes_in_pages(small_payload) -> None:
    settings = small_payload
    platform = Platform(settings)
    for name in ("env-registry", "tracker"):
        platform.start(name)
    client = AsyncClient(settings, timeout_s=20)
    nc = await connect_nats(settings)
    try:
        assert nc.max_payload == SMALL_PAYLOAD
        await wait_for_platform(client, platform)
        # A run of many tasks, one rollout each, generated and scored as actors and verifiers
        # would (in parts that fit): the tracker projects them and completes the run.
        run = RunRequested(
            run_id="manytasks01", env_slug="wide", env_version=1, env_hash="0" * 64,
            model="openai:m", n=1, task_indices=list(range(TASKS)), batch_size=16,
        )  # fmt: skip
        requested = EventEnvelope.new(
            run, aggregate_id=run.run_id, id_parts=(run.run_id,), run_id=run.run_id
        )
        publisher = EventPublisher(nc.jetstream())
        await publisher.publish(requested)
        for work in work_items(requested, run):
            generated = failed_batch(work, "", actor_id="test")
            scored = [
                ScoredRollout(
                    rollout_id=r.rollout_id, task_index=r.task_index, sample_index=r.sample_index,
                    score=float(r.task_index % 2), passed=r.task_index % 2 == 1,
                )
                for r in generated
            ]  # fmt: skip
            for payload in (
                RolloutsGenerated(
                    run_id=run.run_id,
                    work_item_id=work.work_item_id,
                    rollouts=[
                        r.model_copy(update={"error": None, "trajectory": {}}) for r in generated
                    ],
                ),
                RolloutsScored(run_id=run.run_id, work_item_id=work.work_item_id, rollouts=scored),
            ):
                await publisher.publish(
                    EventEnvelope.new(
                        payload, aggregate_id=run.run_id, id_parts=(work.work_item_id,),
                        run_id=run.run_id,
                    )
                )  # fmt: skip
        done = await client.wait_for_run(run.run_id, timeout_s=120)
        assert done["status"] == "completed" and done["scored"] == TASKS

        # One reply cannot hold the table: it stops short, says where, and fits the server.
        reply = await nc.request(
            subjects.request("tracker", "get_run"),
            GetRun(run_id=run.run_id, include_rollouts=True).model_dump_json().encode(),
            timeout=20,
        )
        assert len(reply.data) <= SMALL_PAYLOAD
        first = json.loads(reply.data)["data"]
        assert 0 < len(first["tasks"]) < TASKS
        assert first["tasksCursor"] == first["tasks"][-1]["taskIndex"]
        assert first["rollouts"] == [] and first["rolloutsCursor"]

        # The Client follows the pages: every task once, in order, then every rollout.
        full = await client.get_run(run.run_id, include_rollouts=True)
        assert [t["taskIndex"] for t in full["tasks"]] == list(range(TASKS))
        assert all(t["n"] == t["scored"] == 1 for t in full["tasks"])
        assert [t["passed"] for t in full["tasks"]] == [i % 2 for i in range(TASKS)]
        assert len({r["rolloutId"] for r in full["rollouts"]}) == TASKS
        assert "tasksCursor" not in full and "rolloutsCursor" not in full
        platform.check()
    finally:
        await nc.close()
        await client.close()
        await platform.stop_all()


async def test_an_env_too_large_to_push_or_register_is_refused_with_its_size(
    small_payload,
) -> None:
    # A request over max_payload failed in the client with nats' MaxPayloadError (a traceback);
    # one just under it became an event just over it, refused with the publisher's advice to
    # claim-check a batch. Both say now how large the env is, and nothing is registered.
    settings = small_payload
    platform = Platform(settings)
    for name in ("env-registry", "tracker"):
        platform.start(name)
    client = AsyncClient(settings, timeout_s=20)
    try:
        await wait_for_platform(client, platform)

        def env(size: int) -> dict[str, Any]:
            spec = big_doc_env("toolarge")
            spec["config"]["fixtures"] = {"docs": {"manual": "x" * size}}
            return spec

        with pytest.raises(RolloutError) as err:
            await client.push_environment(env(SMALL_PAYLOAD))
        assert str(err.value).startswith("environment 'toolarge' is too large to push: 6")
        # Under the request's limit, over what an event may carry (less the headers' room).
        with pytest.raises(RolloutError) as err:
            await client.push_environment(env(SMALL_PAYLOAD - 4096))
        assert str(err.value).startswith("environment 'toolarge' is too large to register: ")
        assert "make its fixtures, files or tasks smaller" in str(err.value)
        assert not [e for e in await client.list_environments() if e["slug"] == "toolarge"]
        small = await client.push_environment(env(1000))
        assert small["version"] == 1 and small["created"]
        platform.check()
    finally:
        await client.close()
        await platform.stop_all()
