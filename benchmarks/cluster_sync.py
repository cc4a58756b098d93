"""Publish throughput into the events stream: one server R1 vs a 3-node cluster R3, with the
default fsync (every 2 minutes) and with `sync_interval: always`.

Baseline, in the same process: one nats-server, R1, default sync. Each configuration gets a
fresh server (or cluster) on loopback; 1 KiB events are published as the services do
(`Nats-Msg-Id` set, acks awaited), one at a time and with `--window` in flight. Prints
events/s and the ratio to the baseline. See docs/cluster.md.

    python benchmarks/cluster_sync.py [--events 2000] [--window 64]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from rollout.shared import subjects
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.nats import NatsCluster, NatsServer, start_nats, start_nats_cluster

PAYLOAD = b"x" * 1024


async def publish_rate(settings: Settings, replicas: int, events: int, window: int) -> float:
    """Events/s for `events` acked publishes, `window` of them in flight at a time."""
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        await ensure_streams(js, replicas)
        subject = subjects.event("run", "bench", "probe")
        started = time.perf_counter()
        for first in range(0, events, window):
            batch = range(first, min(first + window, events))
            await asyncio.gather(
                *(js.publish(subject, PAYLOAD, headers={"Nats-Msg-Id": f"m{i}"}) for i in batch)
            )
        return events / (time.perf_counter() - started)
    finally:
        await nc.close()


def settings_of(home: Path, server: NatsServer | NatsCluster) -> Settings:
    """Admin settings for every URL of `server`."""
    urls = tuple(server.urls) if isinstance(server, NatsCluster) else ()
    return Settings(
        home=home,
        nats_url=server.url,
        nats_urls=urls,
        database_url=None,
        nats_user=server.user,
        nats_password=server.password,
        external_nats=True,
    )


async def measure(kind: str, sync: str, events: int, window: int) -> float:
    """Start a fresh server or cluster, measure, stop it."""
    home = Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
    server: NatsServer | NatsCluster
    if kind == "single":
        server = await asyncio.to_thread(start_nats, home, port=0, monitor_port=0, attached=True)
        if sync:
            server.stop()
            server.sync_interval = sync
            await asyncio.to_thread(server.start, attached=True)
        replicas = 1
    else:
        server = await asyncio.to_thread(
            start_nats_cluster, home, 3, any_port=True, sync_interval=sync, attached=True
        )
        replicas = 3
    try:
        return await publish_rate(settings_of(home, server), replicas, events, window)
    finally:
        server.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--window", type=int, default=64)
    args = parser.parse_args()
    configs = [
        ("single R1, default sync", "single", ""),
        ("single R1, sync always", "single", "always"),
        ("cluster R3, default sync", "cluster", ""),
        ("cluster R3, sync always", "cluster", "always"),
    ]
    for window in (1, args.window):
        events = args.events if window > 1 else max(args.events // 4, 100)
        print(f"\n{events} acked 1 KiB publishes, {window} in flight")
        baseline = None
        for label, kind, sync in configs:
            rate = await measure(kind, sync, events, window)
            baseline = baseline or rate
            print(f"  {label:28s} {rate:9.0f} events/s   ratio {rate / baseline:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
