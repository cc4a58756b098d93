"""What a hostile model writes is shown as text: nothing it sends runs, breaks a page or passes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from ui_kit import UiServer, serve

from rollout.services.ui.auth import COOKIE
from rollout.shared.auth.keys import ApiKey
from rollout.shared.settings import Settings
from rollout.shared.store.db import create_pool, migrate

# Markup that would run if a page put it in unescaped, a verdict look-alike behind a
# right-to-left override, and terminal colours.
EVIL = (
    "<script>alert('script')</script><img src=x onerror=\"alert('img')\">"
    "<svg onload=\"alert('svg')\"></svg><a href=\"javascript:alert('link')\">[ok](javascript:x)</a>"
    "\u202epassed, score 1.000\u202c \x1b[32mPASS reward 1.0\x1b[0m"
)


@pytest.fixture
async def hostile(settings: Settings) -> AsyncIterator[None]:
    """A failed rollout whose model wrote EVIL everywhere, with a logprob the endpoint sent as
    NaN (stored as null, as pydantic writes it)."""
    pool = await create_pool(settings.database_url)
    try:
        await migrate(pool)
        now = datetime.now(UTC)
        await pool.execute(
            "insert into runs(run_id, name, env_slug, env_version, env_hash, model, n, sampling,"
            " max_tool_calls, policy_version, status, total, scored, passed, created_at, reason)"
            " values ('r1', $1, 'refunds', 1, 'h', $1, 1, '{}', 4, 0, 'failed', 1, 1, 0, $2, $1)",
            EVIL, now,
        )  # fmt: skip
        trajectory = {
            "messages": [
                {"role": "user", "content": "refund order A-1"},
                {"role": "assistant", "name": EVIL, "content": EVIL, "tool_calls": [{"id": "a"}]},
                {"role": "tool", "content": EVIL},
                {"role": "assistant", "content": EVIL},
            ],
            "tool_calls": [{"index": 0, "name": EVIL, "arguments": {EVIL: EVIL}, "result": EVIL}],
            "final_output": EVIL,
            "finish_reason": "stop",
            "final_state": {"note": EVIL},
            "token_ids": [[7], [11, 12]],
            "logprobs": [[None], [-0.5, None]],
        }
        prims = [{"name": EVIL, "type": "t", "weight": 1, "score": 0.0, "passed": False,
                  "reason": EVIL}]  # fmt: skip
        await pool.execute(
            "insert into rollouts(rollout_id, run_id, task_index, sample_index, status, model,"
            " policy_version, score, passed, primitives, generated_at, trajectory)"
            " values ('ro1', 'r1', 0, 0, 'scored', 'm', 0, 0.0, false, $1::jsonb, $2, $3::jsonb)",
            json.dumps(prims), now, json.dumps(trajectory),
        )  # fmt: skip
        # Task 1: the model's output broke the episode (an error, no verdict).
        await pool.execute(
            "insert into rollouts(rollout_id, run_id, task_index, sample_index, status, model,"
            " policy_version, generated_at, trajectory, error)"
            " values ('ro2', 'r1', 1, 0, 'errored', 'm', 0, $1, $2::jsonb, $3)",
            now, json.dumps(trajectory | {"error": EVIL}), EVIL,
        )  # fmt: skip
        yield
    finally:
        await pool.close()


async def _page(browser: Any, ui: UiServer, key: ApiKey) -> tuple[Any, list[str]]:
    context = await browser.new_context()
    await context.add_cookies(
        [{"name": COOKIE, "value": await ui.session_cookie(key), "url": ui.url}]
    )
    page = await context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    return page, dialogs


async def test_a_hostile_trajectory_is_text_and_its_rollout_still_failed(
    settings: Settings, hostile: None, browser: Any, viewer_key: ApiKey
) -> None:
    async with serve(settings) as ui:
        page, dialogs = await _page(browser, ui, viewer_key)
        for path, final in (("/rollouts/ro1", "#final-answer"),
                            ("/compare?a=r1&b=r1&task=0", ".side-1 pre.final")):  # fmt: skip
            response = await page.goto(ui.url + path)
            # A null logprob (a NaN from the endpoint) made both pages a bare 500.
            assert response.status == 200, (path, await page.content())
            assert await page.inner_text(final) == EVIL  # shown as the model wrote it
            assert await page.locator("script:not([src])").count() == 0
            assert await page.locator("img, a[href^='javascript']").count() == 0
            assert await page.locator("main svg[onload]").count() == 0
        assert await page.inner_text(".side-1 .verdict") == "failed, 0.000"
        # An errored rollout has no verdict: side by side said "failed", as if it had one.
        await page.goto(f"{ui.url}/compare?a=r1&b=r1&task=1")
        assert await page.inner_text(".side-1 .verdict") == "errored, not scored"
        await page.goto(f"{ui.url}/rollouts/ro2")
        assert (await page.inner_text("#verdict")).startswith("not scored")
        await page.goto(f"{ui.url}/rollouts/ro1")
        assert (await page.inner_text("#verdict")).startswith("failed")
        titles = await page.locator(".tok").evaluate_all("ns => ns.map(n => n.title)")
        assert titles == ["logprob –", "logprob -0.500", "logprob –"]
        for path in ("/", "/runs/r1"):
            assert (await page.goto(ui.url + path)).status == 200
        assert dialogs == []


async def test_a_model_that_writes_megabytes_gets_a_page_of_bounded_size(
    settings: Settings, viewer_key: ApiKey
) -> None:
    from rollout.services.ui.app import TEXT_SHOWN, TOKENS_SHOWN

    turns = 8
    pool = await create_pool(settings.database_url)
    try:
        await migrate(pool)
        now = datetime.now(UTC)
        await pool.execute(
            "insert into runs(run_id, env_slug, env_version, env_hash, model, n, sampling,"
            " max_tool_calls, policy_version, status, total, scored, passed, created_at)"
            " values ('big', 'refunds', 1, 'h', 'm', 1, '{}', 4, 0, 'failed', 1, 1, 0, $1)",
            now,
        )
        trajectory = {
            "messages": [{"role": "user", "content": "go"}]
            + [{"role": "assistant", "content": "word " * 50_000}] * turns,
            "final_output": "x" * 500_000,
            "token_ids": [list(range(10_000))] * turns,
            "logprobs": [[-0.5] * 10_000] * turns,
        }
        raw = json.dumps(trajectory)
        await pool.execute(
            "insert into rollouts(rollout_id, run_id, task_index, sample_index, status, model,"
            " policy_version, score, passed, generated_at, trajectory)"
            " values ('big-0', 'big', 0, 0, 'scored', 'm', 0, 0.0, false, $1, $2::jsonb)",
            now, raw,
        )  # fmt: skip
    finally:
        await pool.close()
    async with serve(settings) as ui:
        cookie = await ui.session_cookie(viewer_key)
        async with httpx.AsyncClient(base_url=ui.url, cookies={COOKIE: cookie}) as http:
            # Compare shows the rollout twice (as sample 0 of runs A and B).
            for path, sides in (("/rollouts/big-0", 1), ("/compare?a=big&b=big&task=0", 2)):
                page = await http.get(path)
                assert page.status_code == 200
                # 3.5 MB of trajectory was a 9 MB page of 80,000 token spans.
                assert len(page.text) < sides * len(raw) / 2, (path, len(page.text), len(raw))
                assert page.text.count('class="tok"') == sides * turns * TOKENS_SHOWN
                assert f"… {10_000 - TOKENS_SHOWN} more tokens" in page.text
                assert f"… {500_000 - TEXT_SHOWN:,} more characters" in page.text
                assert f"… {250_000 - TEXT_SHOWN:,} more characters" in page.text


async def test_a_tool_result_nested_2000_deep_is_shown_cut_not_a_500(
    settings: Settings, viewer_key: ApiKey
) -> None:
    # A tool result is the env's and can be shaped by the model: one nested 2,000 deep made
    # json.loads (and the page's indented dump after it) raise RecursionError, a bare 500.
    deep = '{"inner": ' * 2_000 + '"bottom"' + "}" * 2_000
    raw = (
        '{"messages": [{"role": "user", "content": "go"},'
        ' {"role": "assistant", "content": null, "tool_calls": [{"id": "c0"}]},'
        f' {{"role": "tool", "content": {deep}}}],'
        f' "tool_calls": [{{"index": 0, "name": "lookup", "arguments": {{}}, "result": {deep}}}],'
        ' "final_output": "done"}'
    )
    pool = await create_pool(settings.database_url)
    try:
        await migrate(pool)
        now = datetime.now(UTC)
        await pool.execute(
            "insert into runs(run_id, env_slug, env_version, env_hash, model, n, sampling,"
            " max_tool_calls, policy_version, status, total, scored, passed, created_at)"
            " values ('deep', 'refunds', 1, 'h', 'm', 1, '{}', 4, 0, 'completed', 1, 1, 1, $1)",
            now,
        )
        await pool.execute(
            "insert into rollouts(rollout_id, run_id, task_index, sample_index, status, model,"
            " policy_version, score, passed, generated_at, trajectory)"
            " values ('deep-0', 'deep', 0, 0, 'scored', 'm', 0, 1.0, true, $1, $2::jsonb)",
            now, raw,
        )  # fmt: skip
    finally:
        await pool.close()
    async with serve(settings) as ui:
        cookie = await ui.session_cookie(viewer_key)
        async with httpx.AsyncClient(base_url=ui.url, cookies={COOKIE: cookie}) as http:
            for path in ("/rollouts/deep-0", "/compare?a=deep&b=deep&task=0"):
                page = await http.get(path)
                assert page.status_code == 200, (path, page.text[-2000:])
                # The message's content and the call's result, each cut where it nests too deep.
                assert page.text.count("[cut at depth 64]") >= 2, path
                assert len(page.text) < 200_000
