"""Settings resolve from the environment and the home, and bad values are named clearly."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rollout.errors import RolloutError
from rollout.shared.auth.credentials import load_or_create_credentials
from rollout.shared.settings import load_settings, nats_connect_kwargs, redact_url
from rollout.shared.stack.files import write_json
from rollout.shared.stack.process import choose_port
from rollout.shared.stack.services import load_serve, registry, selected


def test_home_defaults_to_the_per_user_data_dir(tmp_path: Path) -> None:
    settings = load_settings({"HOME": str(tmp_path)})
    assert settings.home == tmp_path / ".local" / "share" / "rollout"
    xdg = load_settings({"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "xdg")})
    assert xdg.home == tmp_path / "xdg" / "rollout"


def test_embedded_settings_come_from_the_home(tmp_path: Path) -> None:
    creds = load_or_create_credentials(tmp_path)
    write_json(
        tmp_path / "state.json",
        {"nats": {"url": "nats://127.0.0.1:4999"}, "postgres": {"url": "postgresql://h/db"}},
    )
    settings = load_settings({"ROLLOUT_HOME": str(tmp_path)})
    assert settings.nats_url == "nats://127.0.0.1:4999"
    assert settings.database_url == "postgresql://h/db"
    assert not settings.external_nats and not settings.external_database
    assert nats_connect_kwargs(settings) == {
        "servers": ["nats://127.0.0.1:4999"],
        "user": "rollout",
        "password": creds["nats"]["password"],
    }


def test_external_urls_and_credentials_win(tmp_path: Path) -> None:
    load_or_create_credentials(tmp_path)
    settings = load_settings(
        {
            "ROLLOUT_HOME": str(tmp_path),
            "ROLLOUT_NATS_URL": "nats://nats.example:4222",
            "ROLLOUT_NATS_USER": "svc",
            "ROLLOUT_NATS_PASSWORD": "pw",
            "ROLLOUT_DATABASE_URL": "postgresql://u:p@db.example/rollout",
        }
    )
    assert settings.external_nats and settings.external_database
    assert nats_connect_kwargs(settings) == {
        "servers": ["nats://nats.example:4222"],
        "user": "svc",
        "password": "pw",
    }
    token = load_settings(
        {"ROLLOUT_HOME": str(tmp_path), "ROLLOUT_NATS_URL": "nats://n:1", "ROLLOUT_NATS_TOKEN": "t"}
    )
    assert nats_connect_kwargs(token) == {"servers": ["nats://n:1"], "token": "t"}


@pytest.mark.parametrize(
    ("variable", "value"),
    [("ROLLOUT_NATS_URL", "http://x:4222"), ("ROLLOUT_DATABASE_URL", "mysql://u:secret@h/db")],
)
def test_a_bad_url_names_its_variable(tmp_path: Path, variable: str, value: str) -> None:
    with pytest.raises(RolloutError) as caught:
        load_settings({"ROLLOUT_HOME": str(tmp_path), variable: value})
    assert variable in str(caught.value)
    assert "secret" not in str(caught.value)


def test_a_corrupt_state_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(RolloutError, match="state.json is not valid JSON"):
        load_settings({"ROLLOUT_HOME": str(tmp_path)})


def test_redact_url_hides_the_password() -> None:
    assert redact_url("postgresql://u:secret@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact_url("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"


def test_credentials_are_generated_once_with_mode_0600(tmp_path: Path) -> None:
    first = load_or_create_credentials(tmp_path)
    path = tmp_path / "credentials.json"
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o644)
    assert load_or_create_credentials(tmp_path) == first
    assert path.stat().st_mode & 0o777 == 0o600


def test_service_registry_extras_and_selection() -> None:
    env = {"ROLLOUT_EXTRA_SERVICES": "idle=stack.dummy_services:idle", "ROLLOUT_SERVICES": "idle"}
    assert registry(env)["tracker"] == "rollout.services.tracker.main"
    assert selected(env) == ["idle"]
    assert callable(load_serve("idle", env))
    with pytest.raises(RolloutError, match="unknown service"):
        selected({"ROLLOUT_SERVICES": "nope"})
    with pytest.raises(RolloutError, match="not name=module"):
        registry({"ROLLOUT_EXTRA_SERVICES": "broken"})
    with pytest.raises(RolloutError, match="cannot import"):
        load_serve("x", {"ROLLOUT_EXTRA_SERVICES": "x=no.such.module"})


def test_port_choice_prefers_then_falls_back() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        port, auto = choose_port(None, [taken])
        assert port != taken and auto
        assert choose_port(taken, []) == (taken, False)
    assert choose_port(None, [taken]) == (taken, True)
