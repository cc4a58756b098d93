"""`show`, `runs`, `compare`, the viewer and `health` say when the read models are stalled
behind the event log, and say nothing while the projector keeps up (real NATS and Postgres)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pipeline.kit import refund_env, wait_for_platform
from store.test_projection import run_history
from store.test_projection_lag import REFUSE_WRITES, stalls_in_a_second
from ui.ui_kit import serve
from waiting import wait_until

from rollout.cli import main as cli_main
from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.services.ui.auth import COOKIE
from rollout.shared import stale
from rollout.shared.auth.keys import KeyStore
from rollout.shared.auth.roles import Role
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import new_id
from rollout.shared.service import durables
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.lag_probe import PROBE_S, LagProbe
from rollout.shared.stack.projections import STALL_ENV, Lag
from rollout.shared.stack.serve import run_service
from rollout.shared.stale import STALE_AFTER_S, lag_report, stale_note
from rollout.shared.store.db import create_pool

DEADLINE_S = 30.0
NOTE = "may be stale"


class Cli:
    """The CLI run as a user runs it, its stdout and stderr kept apart."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    async def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = await asyncio.to_thread(cli_main, list(argv))
        out = self.capsys.readouterr()
        # Less the in-process tracker's own log lines (JSON): a failed write's retry logged
        # meanwhile came before the CLI's note on a loaded machine.
        said = [line for line in out.err.splitlines(keepends=True) if not line.startswith("{")]
        return code, out.out, "".join(said)


_env = stalls_in_a_second  # the CLI on this test's stack, a projection stalled after 1 s


async def test_reads_say_when_the_read_models_stall_and_stop_once_caught_up(
    settings: Settings,
    nats_client,  # noqa: ANN001
    nats_server,  # noqa: ANN001
    pg_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    _env(monkeypatch, settings, pg_dsn)
    cli = Cli(capsys)
    js = nats_client.jetstream()
    await ensure_streams(js)
    first, second = new_id(), new_id()
    tracker = asyncio.create_task(run_service("tracker", settings, replica_id="t-1", interval=0.2))
    # `export` reads the runs' env (run_history's refund-agent v1) from the registry.
    registry = asyncio.create_task(run_service("env-registry", settings, replica_id="r-1"))
    pool = await create_pool(pg_dsn)
    _, key = KeyStore(nats_server.home).create(Role.VIEWER, "stale test viewer")
    nats_server.reload()

    reports: list[dict[str, Any]] = []

    async def shown(run_id: str, *, stale: bool) -> dict[str, Any]:
        """`show --json`, polled until its readModels is (or is not) stale (each kept)."""
        seen: dict[str, Any] = {}

        async def met() -> bool:
            if tracker.done():
                tracker.result()
            code, out, _ = await cli("show", run_id, "--json")
            seen.update(json.loads(out) if code == 0 else {})
            report = seen.get("readModels") or {}
            reports.append(report)
            return code == 0 and bool(report.get("stale")) == stale and "behind" in report

        await wait_until(met, f"show {run_id} reading stale={stale}", DEADLINE_S, interval_s=0.1)
        return seen

    try:
        async with serve(settings) as ui:
            cookie = await ui.session_cookie(key)
            web = httpx.AsyncClient(base_url=ui.url, cookies={COOKIE: cookie})
            # A normal run while the projector keeps up: it is a few events behind at moments,
            # and advancing, so no read of it says anything, however often it is read.
            await EventPublisher(js).publish_batch(run_history(first))
            await EventPublisher(js).publish_batch(run_history(second))
            caught_up = await shown(second, stale=False)
            assert caught_up["status"] == "completed"
            assert reports and not any(r.get("stale") for r in reports), reports
            for argv in (("show", first), ("runs",), ("compare", first, second)):
                code, _, err = await cli(*argv)
                assert code == 0 and NOTE not in err, (argv, err)
            assert NOTE not in (await web.get(f"/runs/{first}")).text
            assert (await cli("health", "tracker"))[0] == 0
            client = AsyncClient(settings)
            try:
                await wait_for_platform(client)
                await client.push_environment(refund_env(slug="refund-agent"))
            finally:
                await client.close()
            code, out, err = await cli("export", "--run", first, "--out", str(tmp_path / "a.jsonl"))
            assert code == 0 and NOTE not in err, err

            # Stale after 1 s, not 5 (the tracker runs in this process): a shorter test.
            monkeypatch.setattr(stale, "STALE_AFTER_S", 1.0)
            # Postgres refuses the projection's writes: what follows is not applied.
            await pool.execute(REFUSE_WRITES)
            await EventPublisher(js).publish_batch(run_history(new_id()))
            stalled = await shown(first, stale=True)
            assert stalled["readModels"]["behind"] > 0
            code, out, err = await cli("show", first)
            assert code == 0 and f"run {first}" in out
            assert err.startswith("note: the read models are ") and NOTE in err
            assert "`rollout status`" in err and len(err.strip().splitlines()) == 1
            code, out, err = await cli("runs", "--json")
            assert code == 0 and json.loads(out)["readModels"]["stale"] and NOTE in err
            code, out, err = await cli("compare", first, second, "--json")
            assert code == 0 and json.loads(out)["readModels"]["stale"] and NOTE in err

            # The viewer reads the lag itself (its own 1.5 s cache): its run page says so too.
            async def banner() -> bool:
                page = (await web.get(f"/runs/{first}")).text
                return 'class="warning stale"' in page and "event(s) behind" in page

            await wait_until(banner, "the viewer's banner", DEADLINE_S, interval_s=0.1)
            code, out, err = await cli(
                "export", "--run", first, "--out", str(tmp_path / "b.jsonl"), "--json"
            )
            assert code == 0 and json.loads(out)["readModels"]["stale"] and NOTE in err, err

            # The readiness probe: the replica's reads are stale past ROLLOUT_PROJECTION_STALL_S.
            async def unready() -> bool:
                return (await cli("health", "tracker"))[0] == 1

            await wait_until(unready, "health tracker failing", DEADLINE_S, interval_s=0.1)
            code, out, _ = await cli("health", "tracker")
            assert "unhealthy: its read models are" in out and STALL_ENV in out

            # Writes allowed again: the projector applies the backlog and the notes go.
            await pool.execute("drop trigger refuse_writes on projection_tracking")
            assert (await shown(first, stale=False))["readModels"]["behind"] == 0
            code, _, err = await cli("show", first)
            assert code == 0 and NOTE not in err

            # The viewer's banner goes too.
            async def no_banner() -> bool:
                return NOTE not in (await web.get(f"/runs/{first}")).text

            await wait_until(no_banner, "the viewer's banner gone", DEADLINE_S, interval_s=0.1)

            async def ready() -> bool:
                return (await cli("health", "tracker"))[0] == 0

            await wait_until(ready, "health tracker passing again", DEADLINE_S, interval_s=0.1)
            await web.aclose()
    finally:
        tracker.cancel()
        registry.cancel()
        await asyncio.gather(tracker, registry, return_exceptions=True)
        await pool.close()


def test_the_note_reads_the_lag() -> None:
    # Behind but advancing (a run in progress), or caught up: nothing to say.
    assert stale_note(lag_report(Lag(12, 100, 0.3, 0.3))) is None
    assert stale_note(lag_report(Lag(0, 100, 0.0, 900.0))) is None
    assert stale_note(None) is None
    note = stale_note(lag_report(Lag(37, 100, 130.0, 130.0)))
    assert note == (
        "the read models are 37 event(s) behind the event log (last applied 2 min ago);"
        " these numbers may be stale — see `rollout status`"
    )
    assert "nothing applied yet" in (stale_note(lag_report(Lag(3, 0, 20.0, None))) or "")
    # Past a few seconds, well short of the 30 s a failed write's retry may wait.
    assert STALE_AFTER_S < 30


async def test_an_unanswered_lag_probe_answers_unknown_at_once_and_fails_nothing(
    fresh_nats,  # noqa: ANN001
    tmp_path: Path,
) -> None:
    settings = Settings(
        home=tmp_path,
        nats_url=fresh_nats.url,
        database_url=None,
        nats_user=fresh_nats.user,
        nats_password=fresh_nats.password,
        external_nats=True,
    )
    nc = await connect_nats(settings, reconnect_time_wait=0.1)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        probe = LagProbe(durables.TRACKER_READ_MODELS)
        # No tracker yet: no consumer, so no lag to tell (not an error).
        assert await probe.report(js) is None
        fresh_nats.stop()
        probe = LagProbe(durables.TRACKER_READ_MODELS)
        started = time.monotonic()
        assert await probe.report(js) is None  # NATS away: unknown, within the probe's wait
        waited = time.monotonic() - started
        assert waited < 2 * PROBE_S + 0.5, waited
        started = time.monotonic()
        # The queries after it do not wait on NATS again while the answer is cached.
        assert await probe.report(js) is None
        assert time.monotonic() - started < 0.1
    finally:
        fresh_nats.start()
        await nc.close()


async def test_waiting_for_a_run_whose_end_the_stalled_read_models_miss_says_why(
    settings: Settings,
    nats_client,  # noqa: ANN001
    pg_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `rollout run --follow` waits for the read model to show the run's end: when they are
    # stalled it never does, and the timeout says why instead of only "did not finish".
    _env(monkeypatch, settings, pg_dsn)
    monkeypatch.setattr(stale, "STALE_AFTER_S", 1.0)
    js = nats_client.jetstream()
    await ensure_streams(js)
    run_id = new_id()
    history = run_history(run_id)
    tracker = asyncio.create_task(run_service("tracker", settings, replica_id="t-1", interval=0.2))
    pool = await create_pool(pg_dsn)
    client = AsyncClient(settings)
    try:
        # Requested and started are applied; its end lands on the log once writes are refused.
        await EventPublisher(js).publish_batch(history[:2])

        async def started() -> bool:
            if tracker.done():
                tracker.result()
            try:
                return (await client.get_run(run_id))["status"] == "running"
            except Exception:  # noqa: BLE001 - not applied (or the tracker not up) yet
                return False

        await wait_until(started, "the run read as running", DEADLINE_S, interval_s=0.1)
        await pool.execute(REFUSE_WRITES)
        await EventPublisher(js).publish_batch(history[2:])
        with pytest.raises(RolloutError) as failed:
            await client.wait_for_run(run_id, timeout_s=3)
        assert f"run {run_id} did not finish within 3s" in str(failed.value)
        assert failed.value.problems and NOTE in failed.value.problems[0], failed.value.problems
    finally:
        await client.close()
        tracker.cancel()
        await asyncio.gather(tracker, return_exceptions=True)
        await pool.close()
