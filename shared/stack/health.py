"""Service heartbeats in a JetStream KV bucket with a TTL: a silent replica ages out by itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from rollout.shared import subjects
from rollout.shared.bus.cancels import raise_if_cancelled
from rollout.shared.bus.streams import retry_api
from rollout.shared.observability import get_logger

log = get_logger(__name__)

BUCKET = subjects.HEARTBEATS_BUCKET
DEFAULT_INTERVAL = 2.0
# A replica counts as live for this many intervals after its last beat.
LIVE_INTERVALS = 3
BUCKET_TTL = 60.0
# Where `rollout serve` writes its beat files, under ROLLOUT_HOME.
BEATS_DIR = "beats"


@dataclass
class Readiness:
    """Whether a process's service answers yet: a kit-built service is not until its brokers
    have started (its beats say so), so `rollout up` does not hand over a stack whose tracker
    would answer a first request with "no service answers"; any other service is at once."""

    ready: bool = True
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # What keeps failing in this process, by what (a projection's durable): its last error and
    # when, until it succeeds again. Each beat carries it, so `rollout status` can say why a
    # read model falls behind without reading the service's log.
    failures: dict[str, dict[str, Any]] = field(default_factory=dict)

    def starting(self) -> None:
        """The service is starting: not ready until `started`."""
        self.ready = False

    def started(self) -> None:
        """The service is ready; its next beat goes out now, not an interval later."""
        self.ready = True
        self.changed.set()

    def failing(self, what: str, error: str) -> None:
        """`what` failed with `error` (kept until `recovered`)."""
        self.failures[what] = {"error": error[:500], "at": time.time()}

    def recovered(self, what: str) -> None:
        """`what` succeeded again: its last error is no longer news."""
        self.failures.pop(what, None)


# The readiness of the service `rollout serve` runs in this task (set where its beats start).
READINESS: ContextVar[Readiness | None] = ContextVar("rollout_readiness", default=None)


@dataclass(frozen=True)
class Beat:
    """One replica's last heartbeat."""

    service: str
    replica_id: str
    pid: int
    host: str
    time: float
    interval: float
    # Beats from before readiness was kept say nothing of it: taken as ready.
    ready: bool = True
    # Readiness.failures as of this beat.
    failures: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Its projection's lag as of this beat (`behind`, `stalledS`), for a service that keeps
    # read models; None otherwise, or when NATS did not say.
    projection: dict[str, float] | None = None

    @property
    def age(self) -> float:
        """Seconds since this beat."""
        return max(0.0, time.time() - self.time)

    @property
    def live(self) -> bool:
        """Beat recently enough to count as running."""
        return self.age <= self.interval * LIVE_INTERVALS

    def to_dict(self) -> dict[str, Any]:
        """JSON form for `rollout status --json`."""
        return {
            "service": self.service,
            "replica_id": self.replica_id,
            "pid": self.pid,
            "host": self.host,
            "last_beat": self.time,
            "age_s": round(self.age, 3),
            "live": self.live,
            "ready": self.ready,
            "failures": self.failures,
            "projection": self.projection,
        }


def default_replica_id() -> str:
    """host-pid, reduced to the characters a KV key allows."""
    return _key_part(f"{socket.gethostname()}-{os.getpid()}")


async def heartbeat_bucket(js: JetStreamContext, replicas: int = 1) -> KeyValue:
    """The heartbeat bucket, created on first use (idempotent); `replicas` 3 on a cluster, so
    health stays readable while one server is down."""
    try:
        return await retry_api(lambda: js.key_value(BUCKET), BUCKET)
    except nats.js.errors.BucketNotFoundError:
        pass
    config = KeyValueConfig(bucket=BUCKET, history=1, ttl=BUCKET_TTL, replicas=replicas)
    try:
        # ttl bounds how long a crashed replica's last beat lingers in the bucket.
        return await retry_api(lambda: js.create_key_value(config), BUCKET)
    except nats.js.errors.BadRequestError:
        # Another replica created it between our lookup and our create.
        return await js.key_value(BUCKET)


async def heartbeat(
    js: JetStreamContext,
    service: str,
    replica_id: str | None = None,
    interval: float = DEFAULT_INTERVAL,
    replicas: int = 1,
    beat_dir: Path | None = None,
    readiness: Readiness | None = None,
    projection: Callable[[], Awaitable[dict[str, float] | None]] | None = None,
) -> None:
    """Beat every `interval` seconds until cancelled; the beat is removed on a clean stop.

    With `beat_dir`, each beat NATS accepted is also written to a file there, which
    `rollout health` (a Kubernetes probe) reads without a connection of its own. Each beat
    says whether the service is ready (`readiness`; ready when there is none), and, with
    `projection`, how far its read models are behind (what `rollout health` fails on).
    """
    readiness = readiness or Readiness()
    kv = await heartbeat_bucket(js, replicas)
    replica_id = replica_id or default_replica_id()
    key = beat_key(service, replica_id)
    beat = {"service": service, "replica_id": replica_id}
    beat |= {"pid": os.getpid(), "host": socket.gethostname(), "interval": interval}
    path = beat_dir / f"{key}.json" if beat_dir is not None else None
    try:
        while True:
            readiness.changed.clear()  # before reading it: a change meanwhile beats again
            lag = await projection() if projection is not None else None
            record = json.dumps(
                {**beat, "time": time.time(), "ready": readiness.ready}
                | ({"failures": readiness.failures} if readiness.failures else {})
                | ({"projection": lag} if lag is not None else {})
            )
            try:
                await kv.put(key, record.encode())
            except (nats.errors.Error, TimeoutError) as exc:
                # NATS restarting or briefly away: keep beating; the client reconnects.
                log.warning("heartbeat failed", service=service, error=str(exc) or repr(exc))
            else:
                if path is not None:
                    _write_beat_file(path, record)
            raise_if_cancelled()  # a cancel the put's request swallowed (bus/cancels.py)
            # The next beat after `interval`, or at once when the service becomes ready.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(readiness.changed.wait(), interval)
    finally:
        # Best effort: a clean stop shows at once; a crash ages out after LIVE_INTERVALS.
        with contextlib.suppress(Exception):
            await asyncio.shield(kv.delete(key))
        if path is not None:
            path.unlink(missing_ok=True)


def _write_beat_file(path: Path, record: str) -> None:
    # Replaced whole, so a probe never reads half a beat.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        partial.write_text(record)
        partial.replace(path)
    except OSError as exc:
        log.warning("cannot write the beat file", path=str(path), error=exc.strerror)


def local_beats(beat_dir: Path, service: str) -> list[Beat]:
    """The beats this machine's replicas of `service` last had accepted by NATS (beat files)."""
    beats: list[Beat] = []
    for path in sorted(beat_dir.glob(f"{_key_part(service)}.*.json")):
        try:
            beats.append(_beat_from(path.read_bytes()))
        except (OSError, ValueError, KeyError):
            continue  # gone or being replaced between the listing and the read
    return [b for b in beats if b.service == service]


async def read_beats(js: JetStreamContext) -> list[Beat]:
    """Every replica's last beat, live or not (expired entries are gone from the bucket).

    Listing keys creates a short-lived consumer: fine for `status`, not for a tight poll loop.
    """
    try:
        kv = await js.key_value(BUCKET)
    except nats.js.errors.BucketNotFoundError:
        return []
    try:
        keys = await kv.keys()
    except nats.js.errors.NoKeysError:
        return []
    beats: list[Beat] = []
    for key in keys:
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            continue
        if entry.value:
            beats.append(_beat_from(entry.value))
    return sorted(beats, key=lambda b: (b.service, b.replica_id))


async def read_beat(js: JetStreamContext, service: str, replica_id: str) -> Beat | None:
    """One replica's last beat, by direct get (no consumer: cheap to poll)."""
    try:
        kv = await js.key_value(BUCKET)
        entry = await kv.get(beat_key(service, replica_id))
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
        return None
    return _beat_from(entry.value) if entry.value else None


def beat_key(service: str, replica_id: str) -> str:
    """The KV key of one replica's beat."""
    return f"{_key_part(service)}.{_key_part(replica_id)}"


def _beat_from(raw: bytes) -> Beat:
    data = json.loads(raw)
    return Beat(
        service=str(data["service"]),
        replica_id=str(data["replica_id"]),
        pid=int(data["pid"]),
        host=str(data["host"]),
        time=float(data["time"]),
        interval=float(data["interval"]),
        ready=data.get("ready", True) is not False,
        failures=_failures(data.get("failures")),
        projection=_projection(data.get("projection")),
    )


def _projection(raw: Any) -> dict[str, float] | None:
    # A beat is another process's word: only a well-formed lag is kept.
    try:
        return {"behind": float(raw["behind"]), "stalledS": float(raw["stalledS"])}
    except (TypeError, KeyError, ValueError):
        return None


def _failures(raw: Any) -> dict[str, dict[str, Any]]:
    # A beat is another process's word: only well-formed entries are kept.
    if not isinstance(raw, dict):
        return {}
    kept: dict[str, dict[str, Any]] = {}
    for what, entry in raw.items():
        try:
            kept[str(what)] = {"error": str(entry["error"]), "at": float(entry["at"])}
        except (TypeError, KeyError, ValueError):
            continue
    return kept


def _key_part(text: str) -> str:
    """KV keys allow [-_=A-Za-z0-9] in each dot-separated token."""
    return re.sub(r"[^-_=A-Za-z0-9]", "_", text) or "_"
