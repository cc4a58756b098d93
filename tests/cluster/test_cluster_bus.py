"""Three nats-servers clustered on loopback: one JetStream, R3 streams, clients on every node."""

from __future__ import annotations

import asyncio
import contextlib

import nats
import nats.errors
import nats.js.errors
import pytest
from cluster_kit import kill_node, restart_nodes, wait_for_stream_leaders
from faststream.nats import NatsBroker
from nats.js import api
from structlog.testing import capture_logs
from waiting import wait_until

from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.auth.keys import KeyStore
from rollout.shared.auth.roles import Role
from rollout.shared.bus.reader import read_events
from rollout.shared.bus.streams import ensure_consumer, ensure_streams
from rollout.shared.service.bootstrap import started
from rollout.shared.service.consumer import Consumer
from rollout.shared.service.routes import service_broker
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.health import heartbeat_bucket
from rollout.shared.stack.nats import NatsCluster, NatsServer, jetstream_report, meta_leader

pytestmark = pytest.mark.slow

STREAMS = [subjects.EVENTS_STREAM, subjects.WORK_STREAM]


async def test_three_nodes_agree_on_one_meta_leader_and_a_client_skips_a_dead_one(
    nats_cluster: NatsCluster, cluster_nats_settings: Settings
) -> None:
    nodes = nats_cluster.nodes
    assert [n.server_name for n in nodes] == ["rollout-1", "rollout-2", "rollout-3"]
    assert len({n.store_dir for n in nodes}) == 3
    assert len({n.port for n in nodes} | {n.cluster_port for n in nodes}) == 6
    leaders = {meta_leader(n) for n in nodes}
    assert len(leaders) == 1 and leaders <= {n.server_name for n in nodes}
    for node in nodes:
        report = await asyncio.to_thread(jetstream_report, node.monitor_url) or {}
        assert report["meta_cluster"]["cluster_size"] == 3
        config = node.config_path.read_text()
        # Routes authenticate: no other local process joins the cluster as a peer.
        assert "authorization" in config.split("cluster {")[1].split("server_name")[0]
        assert node.config_path.stat().st_mode & 0o777 == 0o600

    # Given every node, a client connects while the first is down.
    kill_node(nats_cluster.nodes[0])
    nc = await connect_nats(cluster_nats_settings)
    try:
        assert nc.connected_url is not None
        assert nc.connected_url.port != nats_cluster.nodes[0].port
    finally:
        await nc.close()


async def test_streams_and_heartbeats_get_three_replicas_and_survive_a_lost_node(
    nats_cluster: NatsCluster, cluster_nats_settings: Settings
) -> None:
    settings = cluster_nats_settings
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        await ensure_streams(js, settings.stream_replicas)
        kv = await heartbeat_bucket(js, settings.stream_replicas)
        leaders = await wait_for_stream_leaders(js, STREAMS)
        for name in STREAMS:
            info = await js.stream_info(name)
            assert info.config.num_replicas == 3
        assert (await js.stream_info(f"KV_{subjects.HEARTBEATS_BUCKET}")).config.num_replicas == 3
        ack = await js.publish(subjects.event("run", "r1", "probe"), b"before")

        # The events stream's leader goes; the two others elect a new one and keep the data.
        lost = nats_cluster.node(leaders[subjects.EVENTS_STREAM])
        kill_node(lost)
        await wait_for_stream_leaders(js, STREAMS, replicas=2, not_on=lost.server_name)
        assert (await js.get_msg(subjects.EVENTS_STREAM, ack.seq)).data == b"before"
        await kv.put("probe", b"still writable")
        assert (await kv.get("probe")).value == b"still writable"
    finally:
        await nc.close()


async def test_three_replicas_on_a_single_server_is_a_clear_error(
    nats_settings: Settings, nats_server: NatsServer
) -> None:
    nc = await connect_nats(nats_settings)
    try:
        with pytest.raises(RolloutError) as info:
            await ensure_streams(nc.jetstream(), 3)
        assert "ROLLOUT_STREAM_REPLICAS" in " ".join(info.value.problems)
        assert "3 replicas" in str(info.value)
    finally:
        await nc.close()


async def test_sync_interval_always_reaches_the_server(fresh_nats: NatsServer) -> None:
    report = await asyncio.to_thread(jetstream_report, fresh_nats.monitor_url) or {}
    assert not report["config"].get("sync_always")  # the default: fsync every 2 minutes
    fresh_nats.stop()
    fresh_nats.sync_interval = "always"
    await asyncio.to_thread(fresh_nats.start, attached=True)
    report = await asyncio.to_thread(jetstream_report, fresh_nats.monitor_url) or {}
    assert report["config"]["sync_always"] is True
    # Recorded for reloads (the server reads it only at start).
    assert fresh_nats.describe()["sync_interval"] == "always"


async def test_a_key_reads_an_r3_stream_from_a_follower_whole_and_without_a_consumer(
    nats_cluster: NatsCluster, cluster_nats_settings: Settings
) -> None:
    """Any replica answers a direct get, and a follower may lag its leader by a moment (a
    direct get of a just-acknowledged message found nothing on a follower 4% of the time here):
    a read through a follower while appends go on still holds everything the leader held
    when it began (the leader is asked before a read ends). No read leaves a consumer, and the
    key may create none."""
    admin = await connect_nats(cluster_nats_settings)
    key = writer = None
    try:
        js = admin.jetstream()
        await ensure_streams(js, cluster_nats_settings.stream_replicas)
        leaders = await wait_for_stream_leaders(js, STREAMS)
        leader = nats_cluster.node(leaders[subjects.EVENTS_STREAM])
        follower = next(node for node in nats_cluster.nodes if node is not leader)
        _, api_key = KeyStore(nats_cluster.nodes[0].home).create(Role.VIEWER, "cluster reads")
        for node in nats_cluster.nodes:
            await asyncio.to_thread(node.reload)
        key = await nats.connect(
            follower.url,
            user=api_key.user,
            password=api_key.secret,
            inbox_prefix=subjects.inbox_prefix(api_key.user),
        )
        writer = await nats.connect(
            leader.url, user=nats_cluster.user, password=nats_cluster.password
        )
        wjs, kjs = writer.jetstream(), key.jetstream()
        subject = subjects.event("run", "r1", "probe")

        async def append(n: int) -> None:
            for _ in range(n):
                await wjs.publish(subject, b"x")

        appending = [asyncio.ensure_future(append(100)) for _ in range(20)]
        reads = 0
        while not all(task.done() for task in appending) or reads == 0:
            held = (await js.stream_info(subjects.EVENTS_STREAM)).state.last_seq
            read = [m.seq async for m in read_events(kjs, subjects.run_events("r1"))]
            assert read[:held] == list(range(1, held + 1)), (held, read[-3:])
            reads += 1
        await asyncio.gather(*appending)
        with pytest.raises(nats.errors.TimeoutError):
            config = api.ConsumerConfig(name="mine", ack_policy=api.AckPolicy.NONE)
            await kjs.add_consumer(subjects.EVENTS_STREAM, config, timeout=1)
        assert (await js.stream_info(subjects.EVENTS_STREAM)).state.consumer_count == 0
    finally:
        for client in (key, writer, admin):
            if client is not None:
                await client.close()


async def test_a_broker_that_starts_while_jetstream_cannot_answer_starts_once_it_can(
    nats_cluster: NatsCluster, cluster_nats_settings: Settings
) -> None:
    # A service whose broker started while JetStream could not answer (a cluster with no
    # quorum, or a loaded server timing an API call out) crashed at start; it waits now, as
    # its stream and consumer setup already did, and consumes once JetStream answers.
    settings = cluster_nats_settings
    durable = Consumer(
        subjects.WORK_STREAM, "start-probe", subjects.work_filter("probe"), title="probe"
    )
    nc = await connect_nats(settings)
    got: asyncio.Queue[str] = asyncio.Queue()

    async def handle(body: dict) -> None:
        await got.put(body["note"])

    try:
        js = nc.jetstream()
        await ensure_streams(js, settings.stream_replicas)
        await ensure_consumer(js, durable.stream, durable.config())
        await wait_for_stream_leaders(js, STREAMS)
        lost = nats_cluster.nodes[1:]
        for node in lost:
            kill_node(node)  # one of three left: no quorum, no API answers

        async def unanswered() -> bool:
            # The consumer's leader answers for a moment more, until it sees its peers gone.
            try:
                await js.consumer_info(durable.stream, durable.name, timeout=2)
            except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                return True
            return False

        await wait_until(unanswered, "JetStream to stop answering", 30)
        broker = service_broker(settings, consumers=[(durable, handle)])
        with capture_logs() as logs:
            starting = asyncio.create_task(_start_and_hold(broker, got))

            def retrying() -> bool:
                assert not starting.done(), starting.exception()
                return any(e["event"].startswith("jetstream api not answering") for e in logs)

            await wait_until(retrying, "the broker start to retry", 40)
            await restart_nodes(nats_cluster, lost)
            await wait_for_stream_leaders(js, STREAMS)
            await js.publish(subjects.work("probe", "x"), b'{"note": "after quorum"}')
            assert await asyncio.wait_for(got.get(), 60) == "after quorum"
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
    finally:
        await nc.close()


async def _start_and_hold(broker: NatsBroker, got: asyncio.Queue[str]) -> None:
    """Start `broker` (the kit's way) and keep it running until cancelled."""
    async with started(broker):
        await asyncio.Event().wait()
