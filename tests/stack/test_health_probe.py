"""`rollout health SERVICE`, the Kubernetes probe: healthy only while NATS accepts the
replica's heartbeats (the beat files `serve` writes), on the real nats-server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from waiting import wait_until

from rollout.cli import main
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.health import BEATS_DIR, heartbeat
from rollout.shared.stack.projections import STALL_ENV

INTERVAL = 0.2


async def _until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    await wait_until(predicate, "the condition", within, interval_s=0.02)


def _health(home: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setenv("ROLLOUT_HOME", str(home))
    return main(["health", *args])


async def test_health_follows_the_heartbeat(
    fresh_nats,  # noqa: ANN001
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = Settings(
        home=tmp_path,
        nats_url=fresh_nats.url,
        database_url=None,
        nats_user=fresh_nats.user,
        nats_password=fresh_nats.password,
        external_nats=True,
    )
    assert _health(tmp_path, monkeypatch, "tracker") == 1
    assert "no heartbeat accepted yet" in capsys.readouterr().out

    nc = await connect_nats(settings, reconnect_time_wait=0.1)
    beat_dir = tmp_path / BEATS_DIR
    task = asyncio.create_task(
        heartbeat(nc.jetstream(), "tracker", "pod-0", INTERVAL, beat_dir=beat_dir)
    )
    try:
        await _until(lambda: _health(tmp_path, monkeypatch, "tracker") == 0)
        assert "replica pod-0" in capsys.readouterr().out
        # Another service's probe does not pass on this one's beats.
        assert _health(tmp_path, monkeypatch, "buffer") == 1

        # NATS gone: beats are no longer accepted, so the probe fails within three intervals
        # (the process itself is still running and still trying).
        fresh_nats.stop()
        await _until(lambda: _health(tmp_path, monkeypatch, "tracker") == 1)
        assert "last heartbeat accepted" in capsys.readouterr().out
        assert not task.done()
        # The lenient liveness limit still passes.
        assert _health(tmp_path, monkeypatch, "tracker", "--max-age", "120") == 0

        fresh_nats.start()
        await _until(lambda: _health(tmp_path, monkeypatch, "tracker") == 0, within=30.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await nc.close()
    # A clean stop removes the beat file: the probe fails at once.
    assert list(beat_dir.glob("*.json")) == []
    assert _health(tmp_path, monkeypatch, "tracker") == 1


def test_a_stale_beat_file_is_unhealthy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    beat_dir = tmp_path / BEATS_DIR
    beat_dir.mkdir()
    beat = {"service": "actor", "replica_id": "p", "pid": 1, "host": "h", "interval": 2.0}
    (beat_dir / "actor.p.json").write_text(json.dumps({**beat, "time": time.time() - 30}))
    assert _health(tmp_path, monkeypatch, "actor") == 1
    assert _health(tmp_path, monkeypatch, "actor", "--max-age", "60") == 0


def test_health_names_an_unknown_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _health(tmp_path, monkeypatch, "trackr") == 1
    assert "unknown service 'trackr'" in capsys.readouterr().err
    assert _health(tmp_path, monkeypatch, "tracker", "--max-age", "0") == 1
    assert "--max-age 0.0: expected a positive number" in capsys.readouterr().err


def test_health_fails_while_the_beats_say_the_read_models_are_stalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    beat_dir = tmp_path / BEATS_DIR
    beat_dir.mkdir()
    beat = {"service": "buffer", "replica_id": "p", "pid": 1, "host": "h", "interval": 2.0}

    def beats(**projection: float) -> int:
        record = {**beat, "time": time.time(), "projection": projection}
        (beat_dir / "buffer.p.json").write_text(json.dumps(record))
        return _health(tmp_path, monkeypatch, "buffer")

    monkeypatch.setenv(STALL_ENV, "60")
    # Caught up, or behind and advancing (a backlog being applied): ready.
    assert beats(behind=0, stalledS=0) == 0
    assert beats(behind=400, stalledS=59) == 0
    capsys.readouterr()
    assert beats(behind=400, stalledS=61) == 1
    out = capsys.readouterr().out
    assert "buffer: unhealthy: its read models are 400 event(s) behind" in out
    assert f"{STALL_ENV}=60s" in out and "rollout status" in out
    # Liveness and startup probes ask for the heartbeat alone.
    assert _health(tmp_path, monkeypatch, "buffer", "--beat-only") == 0
    # A beat that says nothing of its lag (an older replica, NATS slow) keeps the old meaning.
    (beat_dir / "buffer.p.json").write_text(json.dumps({**beat, "time": time.time()}))
    assert _health(tmp_path, monkeypatch, "buffer") == 0
    # A bad limit is named, not a traceback.
    monkeypatch.setenv(STALL_ENV, "soon")
    capsys.readouterr()
    assert _health(tmp_path, monkeypatch, "buffer") == 1
    assert f"{STALL_ENV} must be a number" in capsys.readouterr().err
