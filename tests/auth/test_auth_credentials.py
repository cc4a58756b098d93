"""Endpoint and key resolution (no server needed): arguments, env vars, login file, local stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout.errors import RolloutError
from rollout.shared.auth.credentials import client_settings, same_endpoint, save_credentials
from rollout.shared.auth.keys import ApiKey, KeyStore, ensure_local_key
from rollout.shared.auth.roles import Role
from rollout.shared.stack.files import write_json

LOCAL = "nats://127.0.0.1:14222"
REMOTE = "nats://rollout.example.com:4222"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A home whose embedded stack runs at LOCAL (with its local key), and a private config."""
    home = tmp_path / "home"
    home.mkdir()
    write_json(home / "state.json", {"nats": {"url": LOCAL}}, private=True)
    write_json(home / "credentials.json", {"nats": {"user": "rollout", "password": "p"}})
    return {"ROLLOUT_HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "config")}


def key(role: Role = Role.RUNNER) -> ApiKey:
    """A well-formed key (no server checks it here)."""
    return ApiKey.generate(role)


def test_local_stack_key_is_the_default(env: dict[str, str]) -> None:
    local = ensure_local_key(Path(env["ROLLOUT_HOME"]))
    settings = client_settings(env=env)
    assert (settings.nats_url, settings.nats_user, settings.nats_password) == (
        LOCAL,
        local.user,
        local.secret,
    )
    assert settings.credential_source.endswith("local_key.json")


def test_without_any_key_the_stack_credentials_apply(env: dict[str, str]) -> None:
    settings = client_settings(env=env)
    assert (settings.nats_url, settings.nats_user) == (LOCAL, "rollout")


def test_login_file_beats_the_local_stack(env: dict[str, str]) -> None:
    ensure_local_key(Path(env["ROLLOUT_HOME"]))
    saved = key()
    save_credentials(REMOTE, saved.text, env)
    settings = client_settings(env=env)
    assert (settings.nats_url, settings.nats_user) == (REMOTE, saved.user)
    assert settings.external_nats


def test_env_vars_beat_the_login_file(env: dict[str, str]) -> None:
    save_credentials(REMOTE, key().text, env)
    override = key(Role.VIEWER)
    settings = client_settings(env=env | {"ROLLOUT_API_KEY": override.text})
    assert (settings.nats_url, settings.nats_user) == (REMOTE, override.user)
    assert settings.credential_source == "ROLLOUT_API_KEY"
    other = "nats://other:4222"
    both = env | {"ROLLOUT_API_KEY": override.text, "ROLLOUT_ENDPOINT": other}
    assert client_settings(env=both).nats_url == other


def test_arguments_beat_everything(env: dict[str, str]) -> None:
    save_credentials(REMOTE, key().text, env)
    mine = key(Role.VIEWER)
    settings = client_settings("nats://mine:4222", mine.text, env=env | {"ROLLOUT_API_KEY": "x"})
    assert (settings.nats_url, settings.nats_user) == ("nats://mine:4222", mine.user)


def test_a_saved_key_is_never_sent_to_another_endpoint(env: dict[str, str]) -> None:
    save_credentials(REMOTE, key().text, env)
    with pytest.raises(RolloutError, match="no API key for nats://elsewhere:4222"):
        client_settings(env=env | {"ROLLOUT_ENDPOINT": "nats://elsewhere:4222"})
    # ...but the same server, spelled with its default port, gets it.
    same = client_settings(env=env | {"ROLLOUT_ENDPOINT": "nats://rollout.example.com"})
    assert same.nats_user is not None and same.nats_user.startswith("rk_runner_")


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("https://rollout.example.com", "is an HTTP URL; rollout talks NATS"),
        ("rollout.example.com:4222", "is not a valid endpoint"),
        ("nats://u:secret@host:4222", "must not carry credentials"),
    ],
)
def test_bad_endpoints_are_named(env: dict[str, str], endpoint: str, message: str) -> None:
    with pytest.raises(RolloutError, match=message) as caught:
        client_settings(env=env | {"ROLLOUT_ENDPOINT": endpoint, "ROLLOUT_API_KEY": key().text})
    assert "ROLLOUT_ENDPOINT" in str(caught.value)
    assert "secret" not in str(caught.value)


def test_a_damaged_login_file_names_its_path(env: dict[str, str]) -> None:
    path = Path(env["XDG_CONFIG_HOME"]) / "rollout" / "credentials"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"endpoint": 3}))
    with pytest.raises(RolloutError, match=str(path)):
        client_settings(env=env)


def test_keys_json_holds_hashes_only(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    record, made = store.create("viewer", "dash")
    text = (tmp_path / "keys.json").read_text()
    assert made.secret not in text and record.password_hash.startswith("$2a$")
    assert (tmp_path / "keys.json").stat().st_mode & 0o777 == 0o600
    assert store.find(made.text).id == store.find(made.user).id == record.id
    store.revoke(record.id)
    assert store.records() == []


def test_same_endpoint_normalises_ports_and_localhost() -> None:
    assert same_endpoint("nats://localhost:4222", "nats://127.0.0.1")
    assert not same_endpoint("nats://127.0.0.1:4223", "nats://127.0.0.1:4222")
