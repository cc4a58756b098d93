"""The buffer on real NATS + Postgres: exactly-once storage, SFT sets, DPO pairs, GRPO groups."""

from __future__ import annotations

import json

import asyncpg
import pytest
from buffer_kit import (
    ask,
    buffer_rows,
    publish_run,
    push_env,
    scored_count,
    wait_caught_up,
    wait_for_position,
)
from pipeline.kit import refund_env
from waiting import wait_until

from rollout.errors import RolloutError
from rollout.services.buffer import main as buffer_main
from rollout.services.buffer import queries as buffer_queries
from rollout.shared import subjects
from rollout.shared.bus.reader import last_sequence
from rollout.shared.contracts.buffer import (
    DpoPairsQuery,
    GrpoGroupsQuery,
    RolloutsQuery,
    SftSetQuery,
)
from rollout.shared.objectstore import ObjectCorrupted
from rollout.shared.settings import connect_nats
from rollout.shared.store.trajectories import INLINE_LIMIT_ENV

TOOL_NAMES = {"lookup_order", "refund"}


async def _platform_run(client, agent_server, *, tasks: int = 3, n: int = 4) -> dict:
    await client.push_environment(refund_env(tasks=tasks))
    run = await client.create_run(
        "refunds",
        f"{agent_server.base_url}#scripted",
        n=n,
        batch_size=5,
        temperature=0.0,
        seed=0,  # seeds derive from it: some samples fail, deterministically
    )
    done = await client.wait_for_run(run["runId"], timeout_s=120)
    assert done["status"] == "completed", done
    return done


async def test_buffer_holds_each_rollout_once_even_when_every_event_is_redelivered(
    client, agent_server, platform, settings
) -> None:
    platform.start_buffer()
    done = await _platform_run(client, agent_server, tasks=3, n=4)
    run_id = done["runId"]
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        await wait_until(
            lambda: _equals(scored_count(pool, run_id), 12), "12 scored rollouts in the buffer"
        )
        before = await buffer_rows(pool)
        # Redeliver the whole stream: a new durable consumer starts again from sequence 1.
        await platform.stop("buffer")
        await js.delete_consumer(subjects.EVENTS_STREAM, buffer_main.DURABLE)
        platform.start_buffer()
        await wait_caught_up(settings, platform)
        await wait_for_position(pool, js)
        assert await scored_count(pool, run_id) == 12
        assert await buffer_rows(pool) == before
        # The buffer and the tracker agree on every verdict.
        tracked = {r["rolloutId"]: r for r in await client.get_rollouts(run_id, False)}
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                "select rollout_id, task_index, score, passed from buffer_rollouts"
            )
        assert {r["rollout_id"] for r in rows} == set(tracked)
        for r in rows:
            t = tracked[r["rollout_id"]]
            assert (r["task_index"], r["score"], r["passed"]) == (
                t["taskIndex"], t["score"], t["passed"],
            )  # fmt: skip
    finally:
        await nc.close()
        await pool.close()


async def _equals(value, expected) -> bool:
    return await value == expected


async def test_sft_set_has_only_passing_rollouts_with_tool_calls_intact(
    client, agent_server, platform, settings
) -> None:
    platform.start_buffer()
    done = await _platform_run(client, agent_server, tasks=3, n=4)
    run_id = done["runId"]
    await wait_caught_up(settings, platform)
    passing = set(await client.passing_rollout_ids(run_id))
    assert 0 < len(passing) < 12  # the scripted agent fails when its seed is divisible by 4

    sft = await ask(settings, "sft_set", SftSetQuery(run_id=run_id))
    items, meta = await sft.load()
    assert sft.count == len(items) == len(passing)
    assert {m["rollout_id"] for m in meta} == passing
    trajectories = {r["rolloutId"]: r["trajectory"] for r in await client.get_rollouts(run_id)}
    for item, m in zip(items, meta, strict=True):
        assert set(item) == {"messages", "tools"}
        assert {t["function"]["name"] for t in item["tools"]} == TOOL_NAMES
        assert item["messages"] == trajectories[m["rollout_id"]]["messages"]
        [call] = [c for msg in item["messages"] for c in msg.get("tool_calls") or []]
        assert call["function"]["name"] == "refund"
        order = json.loads(call["function"]["arguments"])["order_id"]
        assert order == f"O-{m['task_index']}"
        tool_msgs = [msg for msg in item["messages"] if msg["role"] == "tool"]
        assert [msg["tool_call_id"] for msg in tool_msgs] == [call["id"]]

    # Paged: two items a page, every page names the next, and together they are the set.
    pages, offset = [], 0
    while offset is not None:
        page = await ask(
            settings, "sft_set", SftSetQuery(run_id=run_id, offset=offset, page_size=2)
        )
        assert page.count <= 2 and page.total == len(items) and page.offset == offset
        pages.append(page)
        offset = page.next_offset
    assert len(pages) == -(-len(items) // 2)
    paged = [await p.load() for p in pages]
    assert [i for p_items, _ in paged for i in p_items] == items
    assert [m for _, p_meta in paged for m in p_meta] == meta

    # A subset by id: only the passing ones among them come back.
    chosen = sorted(r["rolloutId"] for r in await client.get_rollouts(run_id, False))[:6]
    subset = await ask(settings, "sft_set", SftSetQuery(rollout_ids=chosen))
    _, subset_meta = await subset.load()
    assert {m["rollout_id"] for m in subset_meta} == passing & set(chosen)


async def test_large_trajectories_live_in_the_object_store_and_come_back_verified(
    client, agent_server, platform, settings, store, monkeypatch
) -> None:
    # The actor keeps these inline (an operator's choice): this is the buffer's own claim check.
    monkeypatch.setenv(INLINE_LIMIT_ENV, str(1 << 20))
    platform.start_buffer(inline_bytes=256)  # every refund trajectory is larger than this
    done = await _platform_run(client, agent_server, tasks=2, n=2)
    run_id = done["runId"]
    await wait_caught_up(settings, platform)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    try:
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                "select rollout_id, trajectory, trajectory_uri, trajectory_sha256,"
                " trajectory_bytes from buffer_rollouts where run_id = $1",
                run_id,
            )
    finally:
        await pool.close()
    assert len(rows) == 4
    for row in rows:
        assert row["trajectory"] is None and row["trajectory_bytes"] > 256
        assert row["trajectory_uri"].startswith("file://")
        assert len(row["trajectory_sha256"]) == 64
        assert await store.exists(row["trajectory_uri"])
    trajectories = {r["rolloutId"]: r["trajectory"] for r in await client.get_rollouts(run_id)}
    sft = await ask(settings, "sft_set", SftSetQuery(run_id=run_id))
    items, meta = await sft.load()
    assert items and all(
        item["messages"] == trajectories[m["rollout_id"]]["messages"]
        for item, m in zip(items, meta, strict=True)
    )

    # A large answer comes back as a claim check, verified on load.
    by_ref = await ask(settings, "sft_set", SftSetQuery(run_id=run_id, inline_limit=1024))
    assert by_ref.items is None and by_ref.ref is not None and by_ref.count == sft.count
    assert await by_ref.load(store) == (items, meta)

    # A blob changed behind the buffer's back is refused, not served.
    victim = next(r for r in rows if r["rollout_id"] == meta[0]["rollout_id"])
    path = store.root / store.key_for(victim["trajectory_uri"])
    path.chmod(0o644)
    path.write_bytes(path.read_bytes().replace(b"refund", b"refunx"))
    with pytest.raises(RolloutError, match="corrupted"):
        await ask(settings, "sft_set", SftSetQuery(run_id=run_id))
    with pytest.raises(ObjectCorrupted):
        await store.get(victim["trajectory_uri"], sha256=victim["trajectory_sha256"])


async def test_dpo_pairs_respect_the_margin(bare, settings) -> None:
    await push_env(settings, bare, refund_env(tasks=3))
    bare.start_buffer()
    nc = await connect_nats(settings)
    try:
        # task 0: margin 0.9; task 1: margin 0.3; task 2: all equal (no preference).
        await publish_run(
            nc.jetstream(),
            "dpo-run",
            refund_env(tasks=3),
            {0: [0.1, 1.0, 0.5], 1: [0.7, 0.4, 0.6], 2: [1.0, 1.0]},
        )
    finally:
        await nc.close()
    await wait_caught_up(settings, bare)

    wide = await ask(settings, "dpo_pairs", DpoPairsQuery(run_ids=["dpo-run"], min_margin=0.5))
    items, meta = await wide.load()
    assert [(m["task_index"], m["chosen_rollout_id"], m["rejected_rollout_id"]) for m in meta] == [
        (0, "dpo-run-0-1", "dpo-run-0-0")
    ]
    assert meta[0]["margin"] == pytest.approx(0.9)
    assert wide.stats == {"groups": 3, "pairs": 1, "below_margin": 2}

    loose = await ask(settings, "dpo_pairs", DpoPairsQuery(run_ids=["dpo-run"], min_margin=0.3))
    items, meta = await loose.load()
    assert [m["task_index"] for m in meta] == [0, 1]
    assert all(m["margin"] >= 0.3 - 1e-9 for m in meta)
    pair = items[1]
    assert set(pair) == {"prompt", "chosen", "rejected", "tools"}
    assert [m["role"] for m in pair["prompt"]] == ["system", "user"]
    assert pair["chosen"][0]["role"] == "assistant" and pair["rejected"][0]["role"] == "assistant"
    chosen_args = json.loads(pair["chosen"][0]["tool_calls"][0]["function"]["arguments"])
    rejected_args = json.loads(pair["rejected"][0]["tool_calls"][0]["function"]["arguments"])
    assert (chosen_args["amount"], rejected_args["amount"]) == (10, 11)  # 0.7 vs 0.4
    assert {t["function"]["name"] for t in pair["tools"]} == TOOL_NAMES


async def test_grpo_groups_respect_staleness(bare, settings) -> None:
    await push_env(settings, bare, refund_env(tasks=2))
    bare.start_buffer()
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        for version in range(4):
            await publish_run(
                js,
                f"grpo-v{version}",
                refund_env(tasks=2),
                {0: [0.0, 1.0, 0.5], 1: [1.0, 0.0]},
                policy_version=version,
            )
        await publish_run(js, "no-tokens", refund_env(tasks=2), {0: [1.0, 0.0]}, tokens=False)
    finally:
        await nc.close()
    await wait_caught_up(settings, bare)
    runs = [f"grpo-v{v}" for v in range(4)]

    everything = await ask(settings, "grpo_groups", GrpoGroupsQuery(run_ids=runs))
    assert everything.count == 8 and everything.stats["stale_dropped"] == 0

    fresh = await ask(settings, "grpo_groups", GrpoGroupsQuery(run_ids=runs, max_staleness=1))
    items, meta = await fresh.load()
    assert fresh.stats["current_policy_version"] == 3
    assert fresh.stats["stale_dropped"] == 10  # versions 0 and 1: 5 rollouts each
    assert {(g["run_id"], g["task_index"]) for g in items} == {
        ("grpo-v2", 0), ("grpo-v2", 1), ("grpo-v3", 0), ("grpo-v3", 1),
    }  # fmt: skip
    for group in items:
        assert [m["role"] for m in group["prompt"]] == ["system", "user"]
        assert {t["function"]["name"] for t in group["tools"]} == TOOL_NAMES
        for c in group["completions"]:
            assert c["policy_version"] >= 2
            assert c["token_ids"][0][1] == c["policy_version"]
            assert len(c["token_ids"]) == len(c["logprobs"]) == 2
            assert c["messages"][0]["role"] == "assistant"
    first = next(g for g in items if (g["run_id"], g["task_index"]) == ("grpo-v3", 0))
    assert [c["reward"] for c in first["completions"]] == [0.0, 1.0, 0.5]

    # Staleness relative to a given current version; version filters; tokens required.
    pinned = await ask(
        settings,
        "grpo_groups",
        GrpoGroupsQuery(env_slug="refunds", max_staleness=0, current_policy_version=1),
    )
    _, meta = await pinned.load()
    assert {m["run_id"] for m in meta} == {"grpo-v1"}
    assert pinned.stats["newer_dropped"] == 10  # versions 2 and 3 are ahead of the learner
    assert pinned.stats["no_tokens_dropped"] == 0  # the no-token run is version 0: stale first
    versions = await ask(
        settings, "grpo_groups", GrpoGroupsQuery(env_slug="refunds", policy_versions=[0])
    )
    _, meta = await versions.load()
    assert {m["run_id"] for m in meta} == {"grpo-v0"}
    assert versions.stats["no_tokens_dropped"] == 2
    single = await ask(
        settings,
        "grpo_groups",
        GrpoGroupsQuery(run_ids=["grpo-v0"], min_group_size=3),
    )
    assert single.count == 1 and single.stats["small_groups_dropped"] == 1


async def test_bad_queries_get_clear_errors(bare, settings) -> None:
    await push_env(settings, bare, refund_env(tasks=1))
    bare.start_buffer()
    nc = await connect_nats(settings)
    try:
        await publish_run(nc.jetstream(), "known", refund_env(tasks=1), {0: [1.0, 0.0]})
    finally:
        await nc.close()
    await wait_caught_up(settings, bare)
    with pytest.raises(RolloutError, match="the buffer holds no run 'nope'"):
        await ask(settings, "sft_set", SftSetQuery(run_id="nope"))
    with pytest.raises(RolloutError, match="rollout_ids: 1 unknown to the buffer: ghost"):
        await ask(settings, "sft_set", SftSetQuery(rollout_ids=["known-0-0", "ghost"]))
    with pytest.raises(RolloutError, match=r"1 id\(s\) are not rollouts of run other: known-0-0"):
        await publish_and_ask_foreign(settings)
    with pytest.raises(RolloutError, match="min_margin"):
        await _raw(settings, "dpo_pairs", {"run_ids": ["known"], "min_margin": -1})
    with pytest.raises(RolloutError, match="give run_ids or env_slug"):
        await _raw(settings, "grpo_groups", {"max_staleness": 1})


async def publish_and_ask_foreign(settings) -> None:
    """Ask for a run's examples by ids of another run's rollouts."""
    nc = await connect_nats(settings)
    try:
        await publish_run(nc.jetstream(), "other", refund_env(tasks=1), {0: [1.0]})
    finally:
        await nc.close()
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=1)
    try:
        await wait_until(lambda: _equals(scored_count(pool, "other"), 1), "run 'other' stored")
    finally:
        await pool.close()
    await ask(settings, "sft_set", SftSetQuery(run_id="other", rollout_ids=["known-0-0"]))


async def _raw(settings, verb: str, body: dict) -> dict:
    """Send a request body as JSON, unvalidated on this side, and unwrap the reply."""
    from rollout.shared.contracts.requests import Reply

    nc = await connect_nats(settings)
    try:
        msg = await nc.request(
            subjects.request("buffer", verb), json.dumps(body).encode(), timeout=20
        )
    finally:
        await nc.close()
    reply = Reply.model_validate_json(msg.data)
    if not reply.ok:
        raise RolloutError(reply.error or "failed", problems=reply.problems)
    return reply.data


async def test_nul_bytes_from_a_babbling_model_do_not_stall_the_buffer(
    bare, settings, store
) -> None:
    await push_env(settings, bare, refund_env(tasks=1))
    bare.start_buffer()
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        await publish_run(js, "babble", refund_env(tasks=1), {0: [1.0]}, final="ok\x00ok")
        await publish_run(js, "after", refund_env(tasks=1), {0: [0.0]}, error="bad \x00 reason")
    finally:
        await nc.close()
    await wait_caught_up(settings, bare)
    sft = await ask(settings, "sft_set", SftSetQuery(run_id="babble"))
    [item], _ = await sft.load()
    assert item["messages"][-1]["content"] == "ok\x00ok"  # kept exactly, in the object store
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            uri = await conn.fetchval(
                "select trajectory_uri from buffer_rollouts where run_id = 'babble'"
            )
            reason = await conn.fetchval("select error from buffer_rollouts where run_id = 'after'")
    finally:
        await pool.close()
    assert await store.exists(uri)
    assert reason == "bad \ufffd reason"


async def test_a_query_after_a_stream_position_gets_every_verdict_up_to_it(bare, settings) -> None:
    await push_env(settings, bare, refund_env(tasks=2))
    bare.start_buffer()
    await wait_answering(settings, bare)
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        await publish_run(js, "fresh", refund_env(tasks=2), {0: [1.0, 0.0], 1: [1.0, 1.0]})
        end = await last_sequence(js)
        # Asked as soon as the run's last event is on the stream: the buffer answers once it
        # has applied that far, so the answer has all three passing rollouts.
        found = await ask(settings, "sft_set", SftSetQuery(run_id="fresh", after_seq=end))
        assert found.count == 3
    finally:
        await nc.close()


async def test_an_export_paging_while_rollouts_are_scored_sees_each_one_once(
    bare, settings, store, monkeypatch
) -> None:
    await push_env(settings, bare, refund_env(tasks=3))
    bare.start_buffer(inline_bytes=256)  # every trajectory lives in the object store
    await wait_answering(settings, bare)
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        await publish_run(
            js, "m-run", refund_env(tasks=3), {0: [1.0, 0.0], 1: [1.0, 0.0], 2: [1.0, 0.0]}
        )
        start = await last_sequence(js)
        export = RolloutsQuery(after_seq=start, as_of=start, page_size=4)
        first = await ask(settings, "rollouts", export)
        page1, _ = await first.load(store)
        assert (first.count, first.total, first.next_offset) == (4, 6, 4)

        # Scored mid-export, and sorting before every row already sent.
        await publish_run(js, "a-run", refund_env(tasks=3), {0: [1.0, 1.0, 0.0]})
        now = await last_sequence(js)
        follow = export.model_copy(
            update={"after_seq": now, "offset": 4, "after_rollout": page1[-1]["rollout_id"]}
        )
        second = await ask(settings, "rollouts", follow)
        page2, _ = await second.load(store)
    finally:
        await nc.close()
    ids = [i["rollout_id"] for i in page1 + page2]
    assert ids == [f"m-run-{t}-{s}" for t in range(3) for s in range(2)]
    assert second.next_offset is None and second.total == 6
    # The new run is there for the next export, which starts after it was scored.
    fresh = await ask(settings, "rollouts", RolloutsQuery(after_seq=now, as_of=now))
    assert fresh.total == 9 and fresh.items[0]["rollout_id"] == "a-run-0-0"

    # A page loads only its own trajectories: a bad blob on the last page leaves the first alone.
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=1)
    try:
        uri = await pool.fetchval(
            "select trajectory_uri from buffer_rollouts where rollout_id = 'm-run-2-1'"
        )
    finally:
        await pool.close()
    path = store.root / store.key_for(uri)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes().replace(b"refund", b"refunx"))
    mine = RolloutsQuery(run_ids=["m-run"], as_of=now, page_size=4)
    assert (await ask(settings, "rollouts", mine)).count == 4
    with pytest.raises(RolloutError, match="corrupted"):
        await ask(settings, "rollouts", mine.model_copy(update={"offset": 4}))
    # And no reply holds more than the buffer's page cap, whatever the page size asked.
    monkeypatch.setattr(buffer_queries, "ROLLOUTS_PAGE_MAX", 2)
    capped = await ask(settings, "rollouts", RolloutsQuery(run_ids=["a-run"], page_size=1000))
    assert (capped.count, capped.total, capped.next_offset) == (2, 3, 2)


async def test_the_buffer_export_pages_by_key_and_writes_each_rollout_once(
    bare, settings, monkeypatch
) -> None:
    from rollout import snapshots
    from rollout.client import AsyncClient

    await push_env(settings, bare, refund_env(tasks=2))
    bare.start_buffer()
    nc = await connect_nats(settings)
    try:
        await publish_run(
            nc.jetstream(), "k-run", refund_env(tasks=2), {0: [1.0, 0.0, 1.0], 1: [0.0, 1.0]}
        )
    finally:
        await nc.close()
    await wait_caught_up(settings, bare)
    monkeypatch.setattr(snapshots, "BUFFER_PAGE", 2)  # three pages for five rollouts
    client = AsyncClient(settings, timeout_s=20)
    try:
        rows, skipped = await snapshots.export_buffer_rows(client, RolloutsQuery())
    finally:
        await client.close()
    assert skipped == 0
    assert [r["rollout_id"] for r in rows] == [
        "k-run-0-0", "k-run-0-1", "k-run-0-2", "k-run-1-0", "k-run-1-1"
    ]  # fmt: skip


async def wait_answering(settings, platform) -> None:
    """Wait until the buffer answers requests (any answer, an error included)."""

    async def answering() -> bool:
        platform.check()
        try:
            await ask(settings, "sft_set", SftSetQuery(run_id="nothing-yet"))
        except RolloutError as exc:
            return "no service answers" not in str(exc)
        return True

    await wait_until(answering, "the buffer to answer")


async def test_a_rollout_generated_twice_is_trained_on_with_its_own_verdict_only(
    bare, settings
) -> None:
    """A replica presumed dead that was not generates a rollout a second time: both copies
    are on the log and both are scored. The buffer keeps the first trajectory (a failure) and
    must not label it with the second copy's pass, whichever verdict lands first."""
    from buffer_kit import _trajectory

    from rollout.shared.bus.publisher import EventPublisher
    from rollout.shared.contracts import EventEnvelope
    from rollout.shared.contracts import events as ev
    from rollout.shared.replay import replay_run
    from rollout.shared.store import env_versions

    env = refund_env(tasks=1)
    await push_env(settings, bare, env)
    bare.start_buffer()
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        registered, _ = await env_versions.latest(js, env["slug"])
        publisher = EventPublisher(js)
        run_id = "twice"

        async def append(payload: ev.Payload, *tag: object) -> int:
            event = EventEnvelope.new(payload, aggregate_id=run_id, id_parts=(run_id, *tag),
                                      run_id=run_id)  # fmt: skip
            return (await publisher.publish(event)).seq

        await append(
            ev.RunRequested(
                run_id=run_id, env_slug=registered.slug, env_version=registered.version,
                env_hash=registered.spec_hash, model="scripted", n=1, task_indices=[0],
            ),
        )  # fmt: skip
        positions = []
        for copy, amount in (("first", 99), ("zombie", 0)):
            rollout = ev.GeneratedRollout(
                rollout_id="twice-0-0", task_index=0, sample_index=0, model="scripted",
                trajectory=_trajectory("O-0", amount, version=0, tokens=True),
            )  # fmt: skip
            positions.append(
                await append(
                    ev.RolloutsGenerated(run_id=run_id, work_item_id="w", rollouts=[rollout]), copy
                )  # fmt: skip
            )
        first, second = positions
        for judged, passed in ((second, True), (first, False)):  # the second copy's lands first
            verdict = ev.ScoredRollout(
                rollout_id="twice-0-0", task_index=0, sample_index=0, score=float(passed),
                passed=passed,
            )  # fmt: skip
            await append(
                ev.RolloutsScored(run_id=run_id, work_item_id="w", rollouts=[verdict],
                                  generated_seq=judged), "scored", judged,
            )  # fmt: skip
        await wait_caught_up(settings, bare)
        await wait_for_position(pool, js)
        async with pool.acquire() as conn:
            row = await conn.fetchrow("select * from buffer_rollouts where run_id = $1", run_id)
        assert row["generated_seq"] == first
        assert json.loads(row["trajectory"])["tool_calls"][0]["arguments"]["amount"] == 99
        assert row["passed"] is False and row["score"] == 0.0
        # Nothing passed: the failing trajectory is no demonstration.
        sft = await ask(settings, "sft_set", SftSetQuery(run_id=run_id))
        assert (await sft.load())[0] == []
        # A replay of the log alone tells it the same way.
        replayed = await replay_run(js, run_id)
        assert replayed.scored["twice-0-0"].passed is False
        assert replayed.generated_seq["twice-0-0"] == first
    finally:
        await nc.close()
        await pool.close()
