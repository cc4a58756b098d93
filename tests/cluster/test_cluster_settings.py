"""Settings for a cluster: every server's URL, and the replicas streams are created with."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.errors import RolloutError
from rollout.shared.settings import STATE_FILE, load_settings, nats_connect_kwargs
from rollout.shared.stack.files import write_json
from rollout.shared.stack.nats import sync_interval_setting

pytestmark = pytest.mark.slow

URLS = ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222", "nats://10.0.0.3:4222"]


def test_a_comma_separated_nats_url_gives_the_client_every_server(tmp_path: Path) -> None:
    env = {"ROLLOUT_HOME": str(tmp_path), "ROLLOUT_NATS_URL": " , ".join(URLS)}
    settings = load_settings(env)
    assert settings.nats_url == URLS[0] and settings.nats_servers == URLS
    assert nats_connect_kwargs(settings)["servers"] == URLS
    assert settings.stream_replicas == 1  # R1 stays the default, even on several servers


def test_one_bad_server_in_the_list_names_the_variable(tmp_path: Path) -> None:
    env = {"ROLLOUT_HOME": str(tmp_path), "ROLLOUT_NATS_URL": f"{URLS[0]},http://x:1"}
    with pytest.raises(RolloutError, match="ROLLOUT_NATS_URL"):
        load_settings(env)


@pytest.mark.parametrize("value", ["three", "0", "6", "-1"])
def test_a_bad_replica_count_is_a_clear_error(tmp_path: Path, value: str) -> None:
    env = {"ROLLOUT_HOME": str(tmp_path), "ROLLOUT_STREAM_REPLICAS": value}
    with pytest.raises(RolloutError, match="ROLLOUT_STREAM_REPLICAS") as info:
        load_settings(env)
    assert "1 to 5" in " ".join(info.value.problems)


def test_the_embedded_cluster_state_gives_every_node_and_r3(tmp_path: Path) -> None:
    write_json(tmp_path / STATE_FILE, {"nats": {"url": URLS[0], "urls": URLS, "replicas": 3}})
    settings = load_settings({"ROLLOUT_HOME": str(tmp_path)})
    assert settings.nats_servers == URLS and settings.stream_replicas == 3
    # The operator's variable wins over what the stack recorded.
    env = {"ROLLOUT_HOME": str(tmp_path), "ROLLOUT_STREAM_REPLICAS": "1"}
    assert load_settings(env).stream_replicas == 1


def test_a_single_server_home_is_unchanged(tmp_path: Path) -> None:
    write_json(tmp_path / STATE_FILE, {"nats": {"url": URLS[0]}})
    settings = load_settings({"ROLLOUT_HOME": str(tmp_path)})
    assert settings.nats_servers == [URLS[0]] and settings.stream_replicas == 1


@pytest.mark.parametrize("value", ["sometimes", "0s", "1 s", "5d"])
def test_a_bad_sync_interval_is_a_clear_error(value: str) -> None:
    with pytest.raises(RolloutError, match="ROLLOUT_NATS_SYNC_INTERVAL"):
        sync_interval_setting({"ROLLOUT_NATS_SYNC_INTERVAL": value})


def test_sync_interval_values() -> None:
    assert sync_interval_setting({}) == ""
    for value in ("always", "500ms", "1s", "2m"):
        assert sync_interval_setting({"ROLLOUT_NATS_SYNC_INTERVAL": value}) == value
