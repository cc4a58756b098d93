"""Every page of the viewer in a real Chromium, over real runs on the in-process platform."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes.openai_server import FakeOpenAI, Reply, text_reply, tool_reply
from pipeline.kit import Platform, refund_env, wait_for_platform
from ui_kit import serve
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.auth.ownership import describe as describe_user
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.contracts import events as ev
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stats import design_effect, wilson_interval
from rollout.shared.store.trajectories import object_store

expect = pytest.importorskip(
    "playwright.async_api", reason="playwright is not installed (pip install -e '.[dev]')"
).expect

WEAK_ENVS = Path(__file__).resolve().parents[1] / "audit" / "weak_envs.py"
# Two sampled tokens on the final answer: one near-certain, one unlikely (shaded dark).
TOKENS = [("token_id:11", -0.01), ("token_id:2042", -3.2)]


def agent(wrong_task: int | None) -> Any:
    """A scripted refund agent: refunds one unit too much on `wrong_task`, else correctly."""

    def answer(body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        user = next(m["content"] for m in messages if m["role"] == "user")
        order = user.split()[2]
        index = int(order.split("-")[1])
        if not any(m["role"] == "tool" for m in messages):
            amount = 10 * index + (1 if index == wrong_task else 0)
            reply = tool_reply(("lookup_order", {"order_id": order}),
                               ("refund", {"order_id": order, "amount": amount}))  # fmt: skip
            # Token logprobs are kept only when every turn has them.
            reply.body["choices"][0]["logprobs"] = {"content": [
                {"token": "token_id:7", "logprob": -0.5, "top_logprobs": []}]}  # fmt: skip
            return reply
        return text_reply(f"refunded {order}", logprobs=TOKENS)

    return answer


def model_of(server: FakeOpenAI) -> str:
    """The scripted model's name, asking for token ids and logprobs."""
    return f"{server.base_url}?logprobs=1&token_ids=1#scripted"


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[AsyncClient]:
    """Registry, tracker, verifier and one actor in this loop, and a client of them."""
    platform = Platform(settings)
    for name in ("env-registry", "tracker", "verifier", "actor"):
        platform.start(name)
    c = AsyncClient(settings, timeout_s=20)
    await wait_for_platform(c, platform)
    yield c
    await c.close()
    platform.check()
    await platform.stop_all()


async def login(page: Any, url: str, key: str) -> None:
    """Log in through the form, as a person would."""
    await page.goto(f"{url}/login")
    await page.fill("#key", key)
    await page.click("button[type=submit]")
    await page.wait_for_selector("table#runs")


# What the step that trained on the wrong rollout did with its tokens (turn 0: the tool call's
# one token; turn 1: the answer's two), as the learner stores it: the second answer token
# pushed down hardest and clipped.
SIGNALS = {
    "0": {"advantage": [-0.8], "ratio": [1.0], "gap": [0.0], "clipped": [0]},
    "1": {"advantage": [-0.8, -1.6], "ratio": [1.02, 1.35], "gap": [0.001, 0.3], "clipped": [0, 1]},
}


async def publish_job(settings: Settings, job_id: str, model_id: str, trained_rollout: str) -> None:
    """A finished GRPO job's events, as the learner appends them, its last step having
    trained on `trained_rollout` (its token signals put in the object store first)."""
    store = object_store(settings)
    doc = {"model": model_id, "version": 1, "job_id": job_id,
           "rollouts": {trained_rollout: SIGNALS}}  # fmt: skip
    ref = await store.put(f"signals/{job_id}.json", json.dumps(doc).encode())
    await store.close()
    nc = await connect_nats(settings)
    try:
        publisher = EventPublisher(nc.jetstream())

        def env(payload: Any, agg: str, *parts: object) -> EventEnvelope:
            return EventEnvelope.new(payload, aggregate_id=agg, id_parts=(job_id, *parts))

        events = [env(ev.JobRequested(job_id=job_id, method="grpo", base_model="tiny"), job_id)]
        for step in range(1, 6):
            events.append(env(ev.JobProgress(
                job_id=job_id, step=step, total_steps=5, loss=1.0 / step, reward=0.1 * step,
                tokens_per_s=100.0 + step, kl=0.01 * step,
                off_policy={"mismatch_kl": 0.001 * step, "clip_fraction": 0.05,
                            "dynamic_sampling_dropped": float(step % 2), "staleness": 0.5}),
                job_id, step))  # fmt: skip
        events.append(env(ev.CheckpointSaved(job_id=job_id, step=5, uri="file:///ckpt/5",
                                             sha256="ab" * 32, size_bytes=1234), job_id, 5))  # fmt: skip
        events.append(env(ev.PolicyUpdated(model=model_id, version=1, checkpoint_uri="file:///ckpt/5",
                                           sha256="ab" * 32, job_id=job_id,
                                           signals_uri=ref.uri, signals_sha256=ref.sha256,
                                           trained_rollouts=[trained_rollout]),
                          "tiny-grpo", 1))  # fmt: skip
        events.append(env(ev.JobCompleted(job_id=job_id, model_id=model_id,
                                          metrics={"kl": 0.02}), job_id))  # fmt: skip
        for e in events:
            await publisher.publish(e)
    finally:
        await nc.close()


async def test_every_page_renders_real_runs(
    client: AsyncClient, settings: Settings, browser: Any, viewer_key: Any, shoot: Any
) -> None:
    await client.push_environment(refund_env(tasks=3))
    with FakeOpenAI(agent(wrong_task=1)) as bad, FakeOpenAI(agent(wrong_task=None)) as good:
        a = await client.create_run("refunds", model_of(bad), n=2, temperature=0.0, name="base")
        b = await client.create_run("refunds", model_of(good), n=2, temperature=0.0, name="fixed")
        done_a = await client.wait_for_run(a["runId"], timeout_s=60)
        done_b = await client.wait_for_run(b["runId"], timeout_s=60)
    assert (done_a["passed"], done_b["passed"]) == (4, 6), (done_a, done_b)
    full = await client.get_run(a["runId"], include_rollouts=True)
    wrong = next(r for r in full["rollouts"] if r["taskIndex"] == 1)
    await publish_job(settings, "job-ui-1", "tiny:ui", wrong["rolloutId"])

    async def job_projected() -> bool:
        # The viewer reads the read models: wait for the tracker to have applied the job.
        jobs = await client.list_training_jobs()
        return any(j.get("jobId") == "job-ui-1" and j.get("status") == "completed" for j in jobs)

    await wait_until(job_projected, "the tracker to project job-ui-1")
    # A new env version whose ground truth for task 2 changed: re-verify must notice.
    changed = refund_env(tasks=3)
    changed["tasks"][2]["hiddenGroundTruth"] = {"refunds": [{"order_id": "O-2", "amount": 99}]}
    await client.push_environment(changed)

    async with serve(settings) as ui:
        page = await (await browser.new_context()).new_page()
        await login(page, ui.url, viewer_key.text)

        # Runs: both runs, env and version, model, pass rate with its interval, filters.
        rows = page.locator("tr.run-row")
        assert await rows.count() == 2
        row_a = page.locator(f"#run-{a['runId']}")
        text = await row_a.inner_text()
        assert "completed" in text and "refunds v1" in text and "6/6" in text
        # Wilson 95% for 4/6, its samples counted by the run's design effect: each task's two
        # greedy samples agree, so they weigh as one (4/6 alone would be [30.0, 90.3]).
        effect = design_effect([(2, 2), (0, 2), (2, 2)])
        low, high = wilson_interval(4 / effect, 6 / effect)
        assert "66.7%" in text and f"[{100 * low:.1f}, {100 * high:.1f}]" in text, text
        assert "[30.0, 90.3]" not in text
        await shoot(page, "runs")
        await page.select_option("select[name=status]", "completed")
        await page.goto(f"{ui.url}/?status=failed")
        assert await page.locator("tr.run-row").count() == 0

        # Run: per-task table, per-primitive pass rates, score histogram.
        await page.goto(f"{ui.url}/runs/{a['runId']}")
        assert "4/6" in await page.inner_text("#run-rate")
        # Who started it (the test's client), as `rollout show` says it.
        owner = describe_user(subjects.caller_token(settings.nats_user))
        assert (await page.inner_text("#run-owner")).strip() == owner
        assert await page.locator("#run-source").count() == 0  # verified here, not imported
        task1 = await page.inner_text("#task-1")
        assert "0.0%" in task1 and "2/2" in task1
        assert "100.0%" in await page.inner_text("#task-0")
        prims = await page.inner_text("#run-prims")
        assert "4/6" in prims
        hist = page.locator("#run-hist svg")
        assert "6 scores" in (await hist.get_attribute("aria-label") or "")
        await shoot(page, "run")

        # Trajectory: turns, tool calls with arguments and results, verdict reasons,
        # provenance (from the read model and from the generated event), shaded logprobs.
        await page.goto(f"{ui.url}/rollouts/{wrong['rolloutId']}")
        assert "failed" in await page.inner_text("#verdict")
        turns = page.locator("#turns")
        assert await turns.locator(".tool-name").all_inner_texts() == ["lookup_order", "refund"]
        args = await turns.locator(".call-args").all_inner_texts()
        assert '"amount": 11' in args[1]
        assert '"amount": 10' in (await turns.locator(".call-result").all_inner_texts())[0]
        assert "refunded O-1" in await page.inner_text("#final-answer")
        assert await page.locator("#breakdown tr.bad .reason").count() >= 1
        assert await page.inner_text("#prov-seed") == str(wrong["seed"])
        assert (await page.inner_text("#prov-hash")).strip() == full["envHash"]
        await page.wait_for_selector("[data-loaded=yes] #prov-attempt")
        assert await page.inner_text("#prov-attempt") == "1"
        assert (await page.inner_text("#prov-actor")).strip() not in ("", "–")
        toks = page.locator(".tokens:not(.trained-tokens) .tok")
        assert await toks.all_inner_texts() == ["7", "11", "2042"]
        shades = [await t.evaluate("n => getComputedStyle(n).backgroundColor") for t in
                  await toks.all()]  # fmt: skip
        assert shades[1] != shades[2]
        # The step that trained on it: per token its advantage (red: pushed down, darker
        # for more), the ratio applied, the actor-vs-learner gap, the clip, on hover.
        assert "tiny:ui v1 (job-ui-1)" in await page.inner_text("#trained-on")
        trained = page.locator(".trained-tokens .tok")
        assert await trained.all_inner_texts() == ["7", "11", "2042"]
        last = trained.nth(2)
        await last.hover()
        assert await last.get_attribute("title") == (
            "advantage -1.600 · ratio 1.350 · actor-vs-learner gap +0.3000 · clipped"
        )
        assert await last.get_attribute("class") == "tok clipped"
        assert await page.locator(".trained-tokens .tok.clipped").count() == 1
        colours = [await t.evaluate("n => getComputedStyle(n).backgroundColor") for t in
                   await trained.all()]  # fmt: skip
        assert colours[1] == "rgba(220, 40, 40, 0.32)" and colours[2] == "rgba(220, 40, 40, 0.64)"
        await shoot(page, "trajectory")

        # Compare: task 1 flipped from failing to passing; side by side trajectories.
        await page.goto(f"{ui.url}/compare?a={a['runId']}&b={b['runId']}&task=1")
        assert await page.locator(".warning").count() == 0
        assert (await page.inner_text("#flipped")).strip().startswith("task 1: 0.0% → 100.0%")
        assert "+100.0 pts" in await page.inner_text("#deltas")
        assert await page.locator(".side section .turn").count() >= 6
        await shoot(page, "compare")

        # Training: curves from the job's progress events, checkpoints, policy versions.
        await page.goto(f"{ui.url}/jobs")
        assert "job-ui-1" in await page.inner_text("#jobs")
        await page.click("text=job-ui-1")
        await page.wait_for_selector("#job-plots svg")
        labels = [await s.get_attribute("aria-label") for s in
                  await page.locator("#job-plots svg").all()]  # fmt: skip
        assert labels[0] == "loss: 5 points, last 0.2"
        assert labels[2] == "KL: 5 points, last 0.05"
        assert labels[3] == "tokens/s: 5 points, last 105"
        # The online job's off-policy signals per step.
        assert labels[4:] == [
            "actor-vs-learner KL (mismatch): 5 points, last 0.005",
            "clip fraction: 5 points, last 0.05",
            "flat groups dropped: 5 points, last 1",
            "staleness (versions): 5 points, last 0.5",
        ]
        assert "kl=0.0200" in await page.inner_text("#job-plots")
        assert "5/5" in await page.inner_text("#job-step")
        assert "file:///ckpt/5" in await page.inner_text("#checkpoints")
        assert "tiny:ui" in await page.inner_text("#policies")
        await shoot(page, "training")

        # Replay: the run's events in order, and a re-verify diff against env v2.
        await page.goto(f"{ui.url}/runs/{a['runId']}/replay")
        types = await page.locator("#events .etype").all_inner_texts()
        assert types[0] == "run.requested" and types[-1] == "run.completed"
        assert "rollout.scored" in types
        await page.click("#reverify-link")
        await page.wait_for_selector("#reverify-summary")
        assert "v2: 2 changed" in await page.inner_text("#reverify-summary")
        assert await page.locator(".hunk .add").count() == 2
        await shoot(page, "replay")
        # While one re-verification runs, a second is turned away, not queued behind it.
        async with ui.app.state.ui.reverifying:
            await page.goto(f"{ui.url}/runs/{a['runId']}/replay?reverify=1")
            assert "another re-verification is running" in await page.inner_text("#reverify")


async def test_a_running_run_moves_without_a_reload(
    client: AsyncClient, settings: Settings, browser: Any, viewer_key: Any, shoot: Any
) -> None:
    await client.push_environment(refund_env(tasks=3))
    gate = threading.Event()
    scripted = agent(wrong_task=None)

    def held(body: dict[str, Any]) -> Reply:
        # The fake server answers on its own threads: a run stays open until the gate opens.
        gate.wait(30)
        return scripted(body)

    with FakeOpenAI(held) as server:
        try:
            await watch_live_run(client, settings, browser, viewer_key, shoot, server, gate)
        finally:
            gate.set()


async def watch_live_run(
    client: AsyncClient, settings: Settings, browser: Any, viewer_key: Any, shoot: Any,
    server: FakeOpenAI, gate: threading.Event,
) -> None:  # fmt: skip
    """Open the run's page and the runs list while it is held, then let it finish."""
    run = await client.create_run("refunds", model_of(server), n=1, batch_size=1)
    run_id = run["runId"]

    async def running() -> bool:
        try:
            return (await client.get_run(run_id))["status"] == "running"
        except RolloutError:  # not projected yet
            return False

    await wait_until(running, "the run to start")
    async with serve(settings) as ui:
        context = await browser.new_context()
        page = await context.new_page()
        await page.goto(await ui.login_link(viewer_key))
        await page.wait_for_selector(f"#run-{run_id}")
        listing = await context.new_page()
        await listing.goto(ui.url + "/")
        await page.goto(f"{ui.url}/runs/{run_id}")
        for p in (page, listing):
            await p.wait_for_selector("body[data-live=on]")
        assert "0/3 scored" in await page.inner_text("#run-progress")
        await page.evaluate("window.__notReloaded = true")
        await listing.evaluate("window.__notReloaded = true")
        # A run created while the list is open appears in it, in its place, without a reload.
        second = (await client.create_run("refunds", model_of(server), n=1, batch_size=3))["runId"]
        await expect(listing.locator(f"#runs-body tr#run-{second}")).to_have_count(
            1, timeout=30_000
        )
        assert await listing.evaluate("window.__notReloaded === true")
        gate.set()
        await expect(page.locator("#run-progress")).to_contain_text("3/3", timeout=30_000)
        await expect(page.locator("#run-status")).to_contain_text("completed", timeout=30_000)
        await expect(listing.locator(f"#run-{run_id}")).to_contain_text("3/3", timeout=30_000)
        assert await page.evaluate("window.__notReloaded === true")
        assert "100.0%" in await page.inner_text("#run-rate")
        assert "3 scores" in (await page.locator("#run-hist svg").get_attribute("aria-label"))
        await shoot(listing, "runs-live")


async def test_an_env_page_lists_its_last_audit(
    client: AsyncClient, settings: Settings, browser: Any, viewer_key: Any, shoot: Any
) -> None:
    import asyncpg

    from rollout.shared.envs import load_environments

    envs = {e.slug: e for e in load_environments(WEAK_ENVS)}
    await client.push_environment(envs["weak-called"])
    await client.push_environment(refund_env(tasks=2))
    report = await client.audit_environment("weak-called")
    assert report["hackableTasks"] == [0, 1, 2, 3]

    async def audited() -> bool:
        conn = await asyncpg.connect(settings.database_url)
        try:
            return bool(await conn.fetchval("select count(*) from env_audits"))
        finally:
            await conn.close()

    await wait_until(audited, "the tracker to project the audit")
    async with serve(settings) as ui:
        page = await (await browser.new_context()).new_page()
        await login(page, ui.url, viewer_key.text)
        await page.goto(f"{ui.url}/envs/weak-called")
        summary = await page.inner_text("#audit-summary")
        assert summary.startswith("4 of 4 task(s) hackable: v1")
        rows = page.locator("#audit-findings tbody tr")
        assert await rows.count() == len(report["findings"])
        first = await rows.nth(0).inner_text()
        assert "refunded" in first and "tool_was_called" in first and "give it `args`" in first
        policies = set(await page.locator("#audit-findings .policy").all_inner_texts())
        assert {"act_without_lookup", "wrong_entity"} <= policies
        await shoot(page, "env-audit")
        # An env never audited says how to audit it.
        await page.goto(f"{ui.url}/envs/refunds")
        assert "not audited yet: rollout audit refunds --platform" in await page.inner_text(
            "#audit-summary"
        )
        # An audit a crashed policy cut short is not "no task hackable".
        crashed = "policy wrong_entity crashed on task(s) 0-1: KeyError: 'x'"
        audited_once = ev.EnvAudited(slug="refunds", version=1, threshold=1.0, tasks=2,
                                  policies=["wrong_entity"], policy_errors=[crashed])  # fmt: skip
        await EventPublisher(await client.jetstream()).publish(
            EventEnvelope.new(audited_once, aggregate_id="refunds", id_parts=("refunds", "a"))
        )

        async def incomplete() -> bool:
            await page.goto(f"{ui.url}/envs/refunds")
            return "audit incomplete: 1 policy crash(es)" in await page.inner_text("#audit-summary")

        await wait_until(incomplete, "the crashed audit on the env page")
        assert await page.inner_text("#audit-policy-errors") == crashed
        missing = await page.goto(f"{ui.url}/envs/nope")
        assert missing is not None and missing.status == 404
