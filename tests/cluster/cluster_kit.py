"""Helpers for cluster tests: ask the servers who leads, kill and restart nodes."""

from __future__ import annotations

import asyncio
import signal

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import APIError
from waiting import wait_until

from rollout.shared.stack.nats import NatsCluster, NatsServer, wait_for_cluster


async def stream_leaders(js: JetStreamContext, streams: list[str]) -> dict[str, str | None]:
    """Each stream's current leader as JetStream reports it (None while it elects one)."""
    leaders: dict[str, str | None] = {}
    for name in streams:
        try:
            info = await js.stream_info(name)
        except (APIError, nats.errors.Error, TimeoutError):
            leaders[name] = None  # no leader to answer yet
            continue
        leaders[name] = info.cluster.leader if info.cluster else None
    return leaders


async def wait_for_stream_leaders(
    js: JetStreamContext,
    streams: list[str],
    *,
    replicas: int = 3,
    not_on: str | None = None,
    limit_s: float = 30.0,
) -> dict[str, str]:
    """Wait until every stream has a leader (not `not_on`) and its `replicas - 1` followers are
    current, asking JetStream each step until the deadline."""

    async def leaders() -> dict[str, str] | None:
        ready: dict[str, str] = {}
        for name in streams:
            try:
                info = await js.stream_info(name)
            except (APIError, nats.errors.Error, TimeoutError):
                return None
            cluster = info.cluster
            if cluster is None or not cluster.leader or cluster.leader == not_on:
                return None
            followers = [peer for peer in cluster.replicas or [] if peer.current]
            if len(followers) < replicas - 1:
                return None
            ready[name] = cluster.leader
        return ready

    return await wait_until(leaders, f"streams {streams} to have current leaders", limit_s)


def kill_node(node: NatsServer) -> None:
    """SIGKILL one node (no shutdown of any kind) and reap it."""
    assert node.process is not None
    node.process.send_signal(signal.SIGKILL)
    node.process.wait()
    node.stop()


async def restart_node(cluster: NatsCluster, node: NatsServer) -> None:
    """Start a killed node again (same ports and store) and wait until the cluster has it."""
    await restart_nodes(cluster, [node])


async def restart_nodes(cluster: NatsCluster, nodes: list[NatsServer]) -> None:
    """Start killed nodes again, all before waiting until the cluster has every one (a node
    still down never names the leader)."""
    for node in nodes:
        await asyncio.to_thread(node.start, attached=True)
    await asyncio.to_thread(wait_for_cluster, cluster.nodes)
