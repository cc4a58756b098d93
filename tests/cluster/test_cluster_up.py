"""`rollout up --cluster 3`: three nats-servers under the supervisor, each in status, all stopped."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import nats
import pytest
from stack.conftest import Cli
from waiting import wait_until

from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.auth.keys import ApiKey
from rollout.shared.settings import connect_nats, load_settings
from rollout.shared.stack.nats import nats_healthy
from rollout.shared.stack.process import ProcessRef
from rollout.shared.stack.supervisor import check_nats_mode, read_state

pytestmark = pytest.mark.slow

NODES = {"nats-1", "nats-2", "nats-3"}


def _status(cli: Cli) -> tuple[int, dict[str, dict]]:
    result = cli("status", "--json")
    assert result.stdout, result.stderr
    doc = json.loads(result.stdout)
    return result.returncode, {c["name"]: c for c in doc["components"]}


async def test_up_cluster_runs_three_nodes_r3_status_shows_each_and_down_stops_all(
    cli: Cli, pg_dsn: str
) -> None:
    # The session's Postgres (a database of this test's own): the nodes are what is tested.
    cli.env["ROLLOUT_DATABASE_URL"] = pg_dsn
    up = cli("up", "--cluster", "3")
    assert up.returncode == 0, up.stderr + up.stdout
    code, components = _status(cli)
    assert code == 0, components
    assert set(components) == NODES | {"postgres", "idle"}
    leaders = {components[n]["detail"].split("(leader ")[1].split(")")[0] for n in NODES}
    assert len(leaders) == 1, components  # every node follows the same meta leader
    assert sum("meta leader" in components[n]["detail"] for n in NODES) == 1

    state = read_state(cli.home)
    assert len(state["nats"]["urls"]) == 3 and state["nats"]["replicas"] == 3
    settings = load_settings(cli.env)
    assert settings.stream_replicas == 3 and len(settings.nats_servers) == 3
    nc = await connect_nats(settings)
    try:
        # The service's heartbeats went into a bucket it created with three replicas.
        info = await nc.jetstream().stream_info(f"KV_{subjects.HEARTBEATS_BUCKET}")
        assert info.config.num_replicas == 3
    finally:
        await nc.close()

    # A key minted while the cluster runs is a user of every node at once (each reloaded).
    made = cli("keys", "create", "--role", "viewer", "--json")
    assert made.returncode == 0, made.stderr
    key = ApiKey.parse(json.loads(made.stdout)["apiKey"])
    for url in state["nats"]["urls"]:
        one = await nats.connect(url, user=key.user, password=key.secret, allow_reconnect=False)
        await one.close()

    # A node that dies is restarted by the supervisor, with its ports and store.
    killed = components["nats-2"]["pid"]
    os.kill(killed, signal.SIGKILL)

    async def restarted() -> bool:
        # The state file names each node's process; the node itself says when it is current.
        node = read_state(cli.home)["nats"]["nodes"][1]
        ref = ProcessRef.from_dict(node)
        if ref is None or ref.pid == killed or not ref.alive():
            return False
        return await asyncio.to_thread(nats_healthy, f"http://127.0.0.1:{node['monitor_port']}")

    await wait_until(restarted, "the supervisor to restart nats-2", 60)

    refs = [ProcessRef.from_dict(node) for node in read_state(cli.home)["nats"]["nodes"]]
    down = cli("down")
    assert down.returncode == 0
    assert NODES <= set(down.stdout.removeprefix("stopped: ").strip().split(", ")), down.stdout
    assert all(ref is not None and not ref.alive() for ref in refs)
    state = read_state(cli.home)
    assert state["phase"] == "stopped"
    assert not any("pid" in node for node in state["nats"]["nodes"])


def test_up_refuses_a_two_node_cluster(cli: Cli) -> None:
    two = cli("up", "--cluster", "2")
    assert two.returncode != 0 and "Traceback" not in two.stderr
    assert "--cluster 2" in two.stderr and "3 or 5" in two.stderr
    assert not read_state(cli.home).get("supervisor")  # nothing was started


def test_a_home_keeps_the_shape_of_its_event_log(stack_home: Path) -> None:
    check_nats_mode(stack_home, 3)  # a fresh home takes either shape
    check_nats_mode(stack_home, 1)
    (stack_home / "nats" / "cluster" / "1").mkdir(parents=True)
    with pytest.raises(RolloutError, match="1-node NATS cluster") as info:
        check_nats_mode(stack_home, 1)
    assert "--cluster 1" in " ".join(info.value.problems)
    with pytest.raises(RolloutError, match="not 3"):
        check_nats_mode(stack_home, 3)
    single = stack_home / "other"
    (single / "nats" / "jetstream" / "jetstream").mkdir(parents=True)
    with pytest.raises(RolloutError, match="single nats-server"):
        check_nats_mode(single, 3)
    check_nats_mode(single, 1)
