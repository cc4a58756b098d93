"""The tracker says which runs judge nothing (`noVerdict`, once per env version), so `rollout
runs` and `show` read no env spec to find out, and `export --run` says that such a run's
"passed" means nothing (real NATS, Postgres, tracker and registry)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pipeline.kit import refund_env, wait_for_platform
from store.test_projection import run_history
from waiting import wait_until

from rollout.cli import main as cli_main
from rollout.client import AsyncClient
from rollout.generate import prompts_environment
from rollout.shared import subjects
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import events as ev
from rollout.shared.contracts import new_id
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.envs.judged import NOTHING_SCORED
from rollout.shared.settings import Settings
from rollout.shared.stack.serve import run_service


def history_of(run_id: str, env: dict) -> list[EventEnvelope]:
    """`run_history` of a run of the registered env version `env` (the registry's reply)."""
    events = run_history(run_id)
    requested = events[0].body()
    assert isinstance(requested, ev.RunRequested)
    again = requested.model_copy(
        update={
            "env_slug": env["slug"],
            "env_version": env["version"],
            "env_hash": env["spec_hash"],
        }
    )
    # The same ids (the same id parts): the later events' parent is this one.
    events[0] = EventEnvelope.new(
        again, aggregate_id=run_id, id_parts=(run_id, "req"), run_id=run_id
    )
    return events


async def test_run_replies_say_which_runs_judge_nothing_and_runs_reads_no_spec(
    settings: Settings,
    nats_client,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    for name, value in {
        "ROLLOUT_HOME": str(settings.home),
        "ROLLOUT_NATS_URL": settings.nats_url,
        "ROLLOUT_NATS_USER": settings.nats_user or "",
        "ROLLOUT_NATS_PASSWORD": settings.nats_password or "",
    }.items():
        monkeypatch.setenv(name, value)
    js = nats_client.jetstream()
    await ensure_streams(js)
    tracker = asyncio.create_task(run_service("tracker", settings, replica_id="t-1"))
    registry = asyncio.create_task(run_service("env-registry", settings, replica_id="r-1"))
    client = AsyncClient(settings)
    # Every env spec anyone asks the registry for, seen on the wire.
    spec_reads: list[str] = []

    async def seen(msg) -> None:  # noqa: ANN001
        spec_reads.append(msg.data.decode())

    watch = await nats_client.subscribe(subjects.request_filter("registry", "get"), cb=seen)
    try:
        await wait_for_platform(client)
        unanswered = await client.push_environment(
            prompts_environment([{"instruction": f"say {i}", "id": str(i)} for i in range(3)])
        )
        answered = await client.push_environment(refund_env(slug="refund-agent"))
        unscored, scored = new_id(), new_id()
        await EventPublisher(js).publish_batch(history_of(unscored, unanswered))
        await EventPublisher(js).publish_batch(history_of(scored, answered))

        async def both_done() -> bool:
            if tracker.done():
                tracker.result()
            runs = {r["runId"]: r for r in await client.list_runs()}
            return all(runs.get(r, {}).get("status") == "completed" for r in (unscored, scored))

        await wait_until(both_done, "both runs completed in the read models", 30.0)
        # The tracker's replies carry the flag: the reason for the run of the env that judges
        # nothing, None for the judged one; its counts are still there, as recorded.
        run = await client.get_run(unscored)
        assert run["noVerdict"] == NOTHING_SCORED and run["passed"] == 3
        assert (await client.get_run(scored))["noVerdict"] is None
        listed = {r["runId"]: r["noVerdict"] for r in await client.list_runs()}
        assert listed == {unscored: NOTHING_SCORED, scored: None}

        await nats_client.flush()
        spec_reads.clear()
        capsys.readouterr()
        assert await asyncio.to_thread(cli_main, ["runs", "--json"]) == 0
        shown = {r["runId"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
        assert shown[unscored]["noVerdict"] == NOTHING_SCORED
        assert shown[unscored]["passRate"] is None and shown[unscored]["passRateInterval"] is None
        assert shown[scored]["noVerdict"] is None and shown[scored]["passRate"] == 0.5
        assert await asyncio.to_thread(cli_main, ["show", unscored]) == 0
        out = capsys.readouterr().out
        assert "pass rate -" in out and f"no pass rate: {NOTHING_SCORED}" in out
        await nats_client.flush()
        # Neither read an env's spec: the tracker had said which run judges nothing.
        assert spec_reads == []

        # Exporting the run (not only the buffer) says its "passed" rollouts passed nothing.
        out = str(tmp_path / "unscored.jsonl")
        assert (
            await asyncio.to_thread(cli_main, ["export", "--run", unscored, "--out", out, "--json"])
            == 0
        )
        said = capsys.readouterr()
        env = f"{unanswered['slug']}@{unanswered['version']}"
        assert json.loads(said.out)["judgesNothing"] == [env]
        assert f"of {env}, whose env judges nothing" in said.err, said.err
        out = str(tmp_path / "scored.jsonl")
        assert (
            await asyncio.to_thread(cli_main, ["export", "--run", scored, "--out", out, "--json"])
            == 0
        )
        said = capsys.readouterr()
        assert json.loads(said.out)["judgesNothing"] == [] and "judges nothing" not in said.err
    finally:
        await watch.unsubscribe()
        await client.close()
        tracker.cancel()
        registry.cancel()
        await asyncio.gather(tracker, registry, return_exceptions=True)
