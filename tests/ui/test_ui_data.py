"""Pages over rows written straight into the read models: pagination, joins, bad input."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from ui_kit import serve

from rollout.services.ui.auth import COOKIE
from rollout.services.ui.queries import PAGE
from rollout.shared.auth.keys import ApiKey
from rollout.shared.settings import Settings
from rollout.shared.store.db import create_pool, migrate

TASKS = 120
T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _seed(settings: Settings) -> None:
    pool = await create_pool(settings.database_url)
    try:
        await migrate(pool)
        for run_id, model, version, wrong in (("ra", "tiny:v", 1, 7), ("rb", "tiny:v", 2, 3)):
            await pool.execute(
                "insert into runs(run_id, env_slug, env_version, env_hash, model, n, sampling,"
                " max_tool_calls, policy_version, status, total, scored, passed, created_at)"
                " values ($1, 'e', $2, 'h', $3, 1, '{}', 4, $4, 'completed', $5, $5, $6, $7)",
                run_id, 1 if run_id == "ra" else 2, model, version, TASKS,
                TASKS - TASKS // wrong, T0 + timedelta(minutes=version),
            )  # fmt: skip
            prims = json.dumps([{"name": "p", "type": "t", "weight": 1, "score": 1.0,
                                 "passed": True, "reason": ""}])  # fmt: skip
            await pool.executemany(
                "insert into rollouts(rollout_id, run_id, task_index, sample_index, status,"
                " model, policy_version, score, passed, primitives, generated_at)"
                " values ($1, $2, $3, 0, 'scored', $4, $5, $6, $7, $8::jsonb, $9)",
                [(f"{run_id}-{t}", run_id, t, model, version, float(t % wrong != 0),
                  t % wrong != 0, prims, T0) for t in range(TASKS)],
            )  # fmt: skip
        await pool.execute(
            "insert into jobs(job_id, method, base_model, hyperparams, status, created_at,"
            " updated_at, model_id) values ('job-1', 'sft', 'tiny', '{}', 'completed', $1, $1,"
            " 'tiny:v')",
            T0,
        )
        await pool.executemany(
            "insert into policies(model, version, checkpoint_uri, sha256, job_id, updated_at)"
            " values ('tiny:v', $1, $2, 's', 'job-1', $3)",
            [(v, f"file:///c/{v}", T0) for v in (1, 2)],
        )
    finally:
        await pool.close()


@pytest.fixture
async def http(settings: Settings, viewer_key: ApiKey) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client logged in to a viewer over the seeded read models."""
    await _seed(settings)
    async with serve(settings) as ui:
        cookie = await ui.session_cookie(viewer_key)
        async with httpx.AsyncClient(base_url=ui.url, cookies={COOKIE: cookie}) as client:
            yield client


def task_rows(html: str) -> list[int]:
    return [int(x) for x in re.findall(r'<tr id="task-(\d+)"', html)]


async def test_the_run_page_pages_its_tasks(http: httpx.AsyncClient) -> None:
    first = await http.get("/runs/ra")
    assert task_rows(first.text) == list(range(PAGE))
    assert 'id="next-page"' in first.text
    last = await http.get("/runs/ra", params={"page": 3})
    assert task_rows(last.text) == list(range(2 * PAGE, TASKS))
    assert 'id="next-page"' not in last.text


async def test_compare_finds_flips_across_pages_and_warns_on_env_versions(
    http: httpx.AsyncClient,
) -> None:
    page = await http.get("/compare", params={"a": "ra", "b": "rb", "page": 2})
    flips = [int(x) for x in re.findall(r"task (\d+): ", page.text)]
    expected = [t for t in range(TASKS) if (t % 7 != 0) != (t % 3 != 0)]
    assert flips == expected  # every flip, not just this page's
    assert "different environments: e v1 vs e v2" in page.text
    assert len(re.findall(r"<td>task \d+</td>", page.text)) == PAGE


async def test_the_job_page_names_the_runs_that_evaluated_each_version(
    http: httpx.AsyncClient,
) -> None:
    page = await http.get("/jobs/job-1")
    rows = re.findall(r"<td>v(\d)</td>.*?</tr>", page.text, re.S)
    assert rows == ["1", "2"]
    v1, v2 = page.text.split("<td>v2</td>")
    assert 'href="/runs/ra"' in v1.split("<td>v1</td>")[1] and 'href="/runs/rb"' not in v1
    assert 'href="/runs/rb"' in v2


async def test_bad_input_is_a_page_that_says_what_is_wrong(http: httpx.AsyncClient) -> None:
    missing = await http.get("/runs/nope")
    assert missing.status_code == 404 and "no run &#39;nope&#39;" in missing.text
    bad_page = await http.get("/runs/ra", params={"page": "two"})
    assert bad_page.status_code == 400 and "&#39;page&#39; must be a whole number" in bad_page.text
    bad_id = await http.get("/rollouts/a.b")
    assert bad_id.status_code == 400 and "rollout id" in bad_id.text
    topic = await http.get("/live", params={"topic": "everything"})
    assert topic.status_code == 400 and "topic must be" in topic.text
    # Numbers past what the database or the stream holds, or below 0, are bad input too
    # (they were a bare "Internal Server Error").
    for path, name, value in (
        ("/", "page", 10**20), ("/runs/ra", "page", 10**19), ("/runs/ra", "task", 10**11),
        ("/jobs", "page", 10**20), ("/compare?a=ra&b=rb", "task", 10**11),
        ("/runs/ra/replay", "after", -1), ("/runs/ra/replay", "after", 10**21),
        ("/", "page", -5),
    ):  # fmt: skip
        page = await http.get(path, params={name: value})
        assert page.status_code == 400, (path, name, value, page.text[:200])
        assert f"&#39;{name}&#39; must be from 0 to" in page.text


async def test_a_runs_interval_counts_its_samples_per_task_as_rollout_compare_does(
    http: httpx.AsyncClient, settings: Settings
) -> None:
    """8 samples of each of 12 tasks, every task all-pass or all-fail (a deterministic model):
    the samples of a task are worth one trial, so the interval is as wide as 12 samples',
    not 96 independent ones."""
    from rollout.shared.stats import design_effect, wilson_interval

    pool = await create_pool(settings.database_url)
    try:
        await pool.execute(
            "insert into runs(run_id, env_slug, env_version, env_hash, model, n, sampling,"
            " max_tool_calls, policy_version, status, total, scored, passed, created_at)"
            " values ('rc', 'e', 1, 'h', 'tiny:v', 8, '{}', 4, 0, 'completed', 96, 96, 48, $1)",
            T0,
        )
        await pool.executemany(
            "insert into rollouts(rollout_id, run_id, task_index, sample_index, status,"
            " model, policy_version, score, passed, generated_at)"
            " values ($1, 'rc', $2, $3, 'scored', 'tiny:v', 0, $4, $5, $6)",
            [(f"rc-{t}-{s}", t, s, float(t % 2), t % 2 == 1, T0)
             for t in range(12) for s in range(8)],
        )  # fmt: skip
    finally:
        await pool.close()
    effect = design_effect([(8 * (t % 2), 8) for t in range(12)])
    assert effect > 7.5
    page = await http.get("/runs/rc")
    shown = re.search(r'id="run-design-effect">([\d.]+)<', page.text)
    assert shown and float(shown.group(1)) == pytest.approx(effect, abs=0.01), page.text
    low, high = wilson_interval(48 / effect, 96 / effect)
    assert f"[{100 * low:.1f}, {100 * high:.1f}]" in page.text
    naive = wilson_interval(48, 96)
    assert f"[{100 * naive[0]:.1f}, {100 * naive[1]:.1f}]" not in page.text
    # The runs list counts them the same way.
    listing = await http.get("/")
    assert f"[{100 * low:.1f}, {100 * high:.1f}]" in listing.text


async def test_a_run_whose_env_judges_nothing_shows_no_pass_rate_and_says_why(
    http: httpx.AsyncClient, settings: Settings
) -> None:
    """A prompts file without answers (`rollout generate`): every reply "passes" its one
    check, so the viewer shows no pass rate for its runs, and why, as the CLI does."""
    from markupsafe import escape

    from rollout.generate import prompts_environment
    from rollout.shared.envs.judged import NOTHING_SCORED

    spec = prompts_environment([{"instruction": f"say {t}", "id": str(t)} for t in range(4)])
    answered = prompts_environment(
        [{"instruction": "hi", "id": "0", "hiddenGroundTruth": {"answer": "yo"}}]
    )
    pool = await create_pool(settings.database_url)
    try:
        for slug, env in ((spec["slug"], spec), ("answered", answered)):
            await pool.execute(
                "insert into environments(slug, version, spec_hash, name, template, task_count,"
                " spec, registered_at) values ($1, 1, 'h', $2, 'custom', 4, $3::jsonb, $4)",
                slug, env["name"], json.dumps(env), T0,
            )  # fmt: skip
        for run_id, slug in (("rg", spec["slug"]), ("rh", "answered")):
            await pool.execute(
                "insert into runs(run_id, env_slug, env_version, env_hash, model, n, sampling,"
                " max_tool_calls, policy_version, status, total, scored, passed, score_sum,"
                " created_at) values ($1, $2, 1, 'h', 'tiny:v', 1, '{}', 4, 0, 'completed',"
                " 4, 4, 4, 4, $3)",
                run_id, slug, T0 + timedelta(hours=1),
            )  # fmt: skip
            await pool.executemany(
                "insert into rollouts(rollout_id, run_id, task_index, sample_index, status,"
                " model, policy_version, score, passed, generated_at)"
                " values ($1, $2, $3, 0, 'scored', 'tiny:v', 0, 1.0, true, $4)",
                [(f"{run_id}-{t}", run_id, t, T0) for t in range(4)],
            )  # fmt: skip
    finally:
        await pool.close()
    reason = str(escape(NOTHING_SCORED))
    # A shown pass rate of 100% (not the progress bar's width).
    full = '<span class="rate">100.0%'

    run = (await http.get("/runs/rg")).text
    rate = run.split('id="run-rate">')[1].split("</dd>")[0]
    assert full not in rate and "–" in rate and f'id="run-no-verdict">{reason}<' in rate
    # Nor per task: each task's 100% measured nothing too.
    assert full not in run.split('id="task-0"')[1].split("</tr>")[0]
    # An answered prompts env judges its replies: its rate is shown as ever.
    assert full in (await http.get("/runs/rh")).text.split('id="run-rate">')[1]

    listing = (await http.get("/")).text
    row = listing.split('id="run-rg"')[1].split("</tr>")[0]
    assert full not in row and f'title="{reason}">–<' in row
    assert f"pass rate –: {reason}" in listing
    assert full in listing.split('id="run-rh"')[1].split("</tr>")[0]

    compare = (await http.get("/compare", params={"a": "ra", "b": "rg"})).text
    assert f"run B: {reason}" in compare
    table = compare.split("<h2>Flipped tasks")[0]
    assert full not in table.split("<td>B</td>")[1]
    # No flips nor deltas against rates that measured nothing.
    assert "Flipped tasks (0)" in compare and " pts</td>" not in compare
