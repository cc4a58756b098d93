"""The buffer's answers carry its projection's lag (`readModels`), and `export --buffer` says
when it is stalled behind the event log (real NATS and Postgres, the buffer in this process)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from buffer.buffer_kit import ask, publish_run
from pipeline.kit import refund_env
from store.test_read_models_stale import NOTE, Cli, _env
from waiting import wait_until

from rollout import snapshots
from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.services.buffer import main as buffer_main
from rollout.shared import stale
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import new_id
from rollout.shared.contracts.buffer import RolloutsQuery
from rollout.shared.settings import Settings
from rollout.shared.stack.serve import run_service
from rollout.shared.store.db import create_pool

DEADLINE_S = 30.0
# Postgres refuses the buffer projection's writes only (a full disk, a revoked privilege).
REFUSE_BUFFER_WRITES = """
create function refuse_buffer_writes() returns trigger language plpgsql as $$
begin raise exception 'could not extend file: No space left on device (test)'; end $$;
create trigger refuse_buffer_writes before insert or update on projection_tracking
for each row when (new.name = 'buffer') execute function refuse_buffer_writes();
"""


async def test_buffer_answers_and_export_say_when_the_buffer_projection_stalls(
    settings: Settings,
    nats_client,  # noqa: ANN001
    pg_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    _env(monkeypatch, settings, pg_dsn)
    cli = Cli(capsys)
    js = nats_client.jetstream()
    await ensure_streams(js)
    first = new_id()
    # A query waits 2 s (not 15) for the buffer to catch up: a shorter test.
    buffer = asyncio.create_task(buffer_main.serve(settings, catch_up_s=2.0))
    # `export` reads the rollouts' env (run_history's refund-agent v1) from the registry.
    registry = asyncio.create_task(run_service("env-registry", settings, replica_id="r-1"))
    pool = await create_pool(pg_dsn)

    async def answered(*, stale_now: bool) -> dict[str, Any]:
        """The buffer's rollouts answer's readModels, polled until stale (or caught up)."""
        seen: dict[str, Any] = {}

        async def met() -> bool:
            if buffer.done():
                buffer.result()
            try:
                data = await ask(settings, "rollouts", RolloutsQuery(env_slug="refund-agent"))
            except RolloutError:
                return False  # not answering yet, or the run not applied yet
            seen.clear()
            seen.update(data.read_models or {})
            if stale_now:
                return bool(seen.get("stale"))
            return seen.get("behind") == 0 and seen.get("stale") is False

        await wait_until(met, f"the buffer answering stale={stale_now}", DEADLINE_S, interval_s=0.1)
        return seen

    try:
        client = AsyncClient(settings, timeout_s=5)

        async def pushed() -> bool:
            try:
                await client.push_environment(refund_env(slug="refund-agent"))
            except RolloutError:
                return False  # the registry not answering yet
            return True

        try:
            await wait_until(pushed, "the registry to take the environment", DEADLINE_S)
        finally:
            await client.close()
        env = refund_env(slug="refund-agent")
        await publish_run(js, first, env, {0: [1.0, 0.0], 1: [1.0]})
        caught_up = await answered(stale_now=False)
        assert caught_up["appliedSeq"] > 0

        out_a = tmp_path / "a.jsonl"
        code, out, err = await cli("export", "--buffer", "--out", str(out_a), "--json")
        assert code == 0 and NOTE not in err, err
        assert json.loads(out)["readModels"]["stale"] is False
        applied = caught_up["appliedSeq"]

        # Stale after 1 s, not 5 (the buffer runs in this process): a shorter test.
        monkeypatch.setattr(stale, "STALE_AFTER_S", 1.0)
        await pool.execute(REFUSE_BUFFER_WRITES)
        await publish_run(js, new_id(), env, {0: [1.0]})
        stalled = await answered(stale_now=True)
        assert stalled["behind"] > 0 and stalled["appliedSeq"] <= applied

        # An export from now is refused (the buffer never gets to now), and says why.
        code, _, err = await cli("export", "--buffer", "--out", str(tmp_path / "d.jsonl"))
        assert code == 1 and "the buffer has not caught up" in err, err
        assert NOTE in err and "Traceback" not in err, err

        # An export that began before the stalled events (its selection as of then) is
        # answered, and says its numbers may be stale.
        async def before_the_stall(_js: Any) -> int:
            return applied

        monkeypatch.setattr(snapshots, "last_sequence", before_the_stall)
        out_b = tmp_path / "b.jsonl"
        code, out, err = await cli("export", "--buffer", "--out", str(out_b), "--json")
        assert code == 0, err
        assert json.loads(out)["readModels"]["stale"] is True
        assert err.startswith("note: the read models are ") and NOTE in err, err
        code, out, err = await cli("export", "--buffer", "--out", str(tmp_path / "c.jsonl"))
        assert code == 0 and NOTE in err and "rollouts of 1 run(s)" in out, (out, err)

        # Writes allowed again: the buffer applies the backlog and the note goes.
        await pool.execute("drop trigger refuse_buffer_writes on projection_tracking")
        await answered(stale_now=False)
    finally:
        buffer.cancel()
        registry.cancel()
        await asyncio.gather(buffer, registry, return_exceptions=True)
        await pool.close()
