"""`rollout login | whoami | keys` as a user runs them, against real NATS and real services."""

from __future__ import annotations

import json
import time
from pathlib import Path

import nats
from store.test_projection import run_history
from store.test_projection_lag import REFUSE_WRITES
from waiting import wait_until

from rollout.shared.auth.credentials import save_credentials
from rollout.shared.auth.keys import ApiKey
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.contracts import new_id
from rollout.shared.service import durables
from rollout.shared.settings import Settings
from rollout.shared.stack.nats import NatsServer
from rollout.shared.stack.projections import STALL_ENV
from rollout.shared.store.db import create_pool

from .conftest import Cli, cli_env

ROOT = Path(__file__).resolve().parents[2]
REFUND_AGENT = str(ROOT / "examples" / "refund_agent.py")


def saved_credentials(cli: Cli) -> Path:
    """Where `rollout login` writes, inside this test's private config dir."""
    return Path(cli.env["XDG_CONFIG_HOME"]) / "rollout" / "credentials"


def private_json(path: str) -> tuple[int, dict]:
    """A file's permission bits and its JSON content."""
    file = Path(path)
    return file.stat().st_mode & 0o777, json.loads(file.read_text())


async def whoami(cli: Cli) -> dict:
    """`rollout whoami --json`, which must succeed."""
    result = await cli("whoami", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def test_login_verifies_the_key_before_saving_it(
    cli: Cli, services: None, auth_nats: NatsServer, runner_key: ApiKey
) -> None:
    url = auth_nats.url
    wrong = ApiKey(role=runner_key.role, key_id=runner_key.key_id, secret="f" * 48)
    result = await cli("login", "--endpoint", url, "--key", wrong.text)
    assert result.returncode == 1
    assert f"refused API key {runner_key.user}" in result.stderr
    assert "f" * 48 not in result.stderr
    assert not saved_credentials(cli).exists()

    result = await cli("login", "--endpoint", url, stdin="sk-live-123\n")
    assert result.returncode == 1
    assert "API keys start with 'rk_'" in result.stderr
    assert not saved_credentials(cli).exists()

    # The key from stdin (not a terminal), as `echo $KEY | rollout login` gives it.
    result = await cli("login", "--endpoint", url, stdin=runner_key.text + "\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"✓ saved credentials for {url}")
    path = saved_credentials(cli)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert json.loads(path.read_text()) == {"endpoint": url, "api_key": runner_key.text}

    me = await whoami(cli)
    assert (me["endpoint"], me["keyId"], me["role"]) == (url, runner_key.key_id, "runner")
    assert me["credentialSource"] == str(path)


async def test_login_refuses_when_the_key_cannot_be_verified(
    cli: Cli, auth_nats: NatsServer, runner_key: ApiKey
) -> None:
    # No registry answers: the key authenticates, but the query that proves it cannot run.
    result = await cli("login", "--endpoint", auth_nats.url, "--key", runner_key.text)
    assert result.returncode == 1
    assert "could not verify the key with a query" in result.stderr
    assert not saved_credentials(cli).exists()


async def test_environment_variables_override_the_saved_login(
    cli: Cli, services: None, auth_nats: NatsServer, runner_key: ApiKey, viewer_key: ApiKey
) -> None:
    result = await cli("login", "--endpoint", auth_nats.url, "--key", runner_key.text)
    assert result.returncode == 0, result.stderr

    as_viewer = Cli(cli.env | {"ROLLOUT_API_KEY": viewer_key.text})
    me = await whoami(as_viewer)
    assert (me["role"], me["keyId"], me["credentialSource"]) == (
        "viewer",
        viewer_key.key_id,
        "ROLLOUT_API_KEY",
    )

    # The saved key is never sent to another endpoint.
    elsewhere = Cli(cli.env | {"ROLLOUT_ENDPOINT": "nats://127.0.0.1:1"})
    result = await elsewhere("whoami")
    assert result.returncode == 1
    assert "no API key for nats://127.0.0.1:1 (endpoint from ROLLOUT_ENDPOINT)" in result.stderr


async def test_without_login_the_cli_uses_the_local_stack_key(cli: Cli) -> None:
    me = await whoami(cli)
    assert me["role"] == "runner"
    assert me["credentialSource"].endswith("local_key.json")
    mode, local = private_json(me["credentialSource"])
    assert (me["keyId"], mode) == (local["id"], 0o600)


async def test_keys_create_list_revoke_take_effect_without_a_restart(
    cli: Cli, services: None
) -> None:
    created = await cli("keys", "create", "--role", "viewer", "--name", "ci dashboard", "--json")
    assert created.returncode == 0, created.stderr
    doc = json.loads(created.stdout)
    assert (doc["role"], doc["name"], doc["applied"]) == ("viewer", "ci dashboard", True)
    key = ApiKey.parse(doc["apiKey"])

    listed = await cli("keys", "list", "--json")
    rows = {row["id"]: row for row in json.loads(listed.stdout)["keys"]}
    assert rows[key.key_id]["role"] == "viewer"
    assert "apiKey" not in rows[key.key_id] and doc["apiKey"] not in listed.stdout
    assert any(row["local"] and row["role"] == "runner" for row in rows.values())

    viewer = Cli(cli.env | {"ROLLOUT_API_KEY": key.text})
    result = await viewer("envs", "--json")
    assert result.returncode == 0, result.stderr
    started = time.monotonic()
    result = await viewer("push", REFUND_AGENT)
    assert result.returncode == 1
    assert "permission denied: a viewer key cannot push environments" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 15  # a CLI start, not the 30 s request timeout

    revoked = await cli("keys", "revoke", key.key_id)
    assert revoked.returncode == 0, revoked.stderr
    result = await viewer("envs")
    assert result.returncode == 1
    assert f"refused API key {key.user}" in result.stderr


async def test_revoking_the_local_key_rotates_it(cli: Cli, services: None) -> None:
    # Revoking it used to lock this machine's CLI out of its own stack until a restart.
    old = await whoami(cli)
    old_text = private_json(old["credentialSource"])[1]["api_key"]
    revoked = await cli("keys", "revoke", old["keyId"], "--json")
    assert revoked.returncode == 0, revoked.stderr
    doc = json.loads(revoked.stdout)
    assert doc["revoked"]["id"] == old["keyId"] and doc["applied"] is True
    new = await whoami(cli)  # the CLI goes on, on a new key the server already knows
    assert new["keyId"] == doc["newLocalKeyId"] != old["keyId"]
    assert new["credentialSource"] == old["credentialSource"]
    result = await Cli(cli.env | {"ROLLOUT_API_KEY": old_text})("envs")
    assert result.returncode == 1 and "refused API key" in result.stderr
    listed = json.loads((await cli("keys", "list", "--json")).stdout)["keys"]
    assert [r["id"] for r in listed if r["local"]] == [new["keyId"]]
    assert old["keyId"] not in {r["id"] for r in listed}


async def test_keys_need_a_valid_role_and_an_existing_id(cli: Cli) -> None:
    result = await cli("keys", "create", "--role", "admin")
    assert result.returncode == 2
    result = await cli("keys", "revoke", "0123456789ab")
    assert result.returncode == 1
    assert "no API key '0123456789ab'" in result.stderr


async def test_keys_refuse_an_external_nats(cli: Cli, tmp_path: Path) -> None:
    env = cli_env(tmp_path / "home", tmp_path / "config", ROLLOUT_NATS_URL="nats://10.0.0.1:4222")
    result = await Cli(env)("keys", "list")
    assert result.returncode == 1
    assert "ROLLOUT_NATS_URL points at an external one" in result.stderr


async def test_keys_refuse_a_shell_that_acts_as_a_key_holder(
    cli: Cli, auth_nats, runner_key: ApiKey
) -> None:
    # A remote key holder's shell: the keys it would make or list are not that server's.
    before = json.loads((await cli("keys", "list", "--json")).stdout)["keys"]
    for extra in ({"ROLLOUT_API_KEY": runner_key.text}, {"ROLLOUT_ENDPOINT": auth_nats.url}):
        result = await Cli(cli.env | extra)("keys", "create", "--role", "runner")
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert f"{next(iter(extra))} is set: this shell acts as a key holder" in result.stderr
        assert "rk_" not in result.stdout  # no key was made
    assert json.loads((await cli("keys", "list", "--json")).stdout)["keys"] == before
    # Logged in to another endpoint: the same refusal, naming it.
    other = "nats://127.0.0.1:1"
    save_credentials(other, runner_key.text, env=cli.env)  # as `rollout login` saves them
    result = await cli("keys", "list")
    assert result.returncode == 1 and f"logged in to {other}" in result.stderr


async def test_status_in_a_key_holders_shell_says_its_verbs_use_another_endpoint(
    cli: Cli, auth_nats: NatsServer, runner_key: ApiKey, tmp_path: Path
) -> None:
    # A key holder's shell has no stack of its own: `status` shows its empty ROLLOUT_HOME as
    # stopped ("run `rollout up`"), while every other verb talks to the endpoint it was given.
    # It must say so, not send them to start a second, empty platform.
    holder = cli_env(
        tmp_path / "holder-home",
        tmp_path / "holder-config",
        ROLLOUT_ENDPOINT=auth_nats.url,
        ROLLOUT_API_KEY=runner_key.text,
    )
    result = await Cli(holder)("status")
    assert result.returncode == 1
    note = (
        f"the other verbs of this CLI use {auth_nats.url} (from ROLLOUT_ENDPOINT), not this stack"
    )
    assert note in result.stderr, result.stderr
    assert "rollout whoami" in result.stderr
    doc = json.loads((await Cli(holder)("status", "--json")).stdout)
    endpoint = {k: doc["endpoint"][k] for k in ("url", "source")}
    assert endpoint == {"url": auth_nats.url, "source": "ROLLOUT_ENDPOINT"}
    # Logged in instead (`rollout login`): the same note, naming the saved credentials.
    logged_in = cli_env(tmp_path / "holder-home", tmp_path / "holder-config")
    save_credentials(auth_nats.url, runner_key.text, env=logged_in)
    result = await Cli(logged_in)("status")
    assert f"use {auth_nats.url} (from " in result.stderr, result.stderr
    # The operator's own shell: the CLI's verbs use the stack the table shows; no note.
    result = await cli("status")
    assert "other verbs" not in result.stderr, result.stderr
    assert "endpoint" not in json.loads((await cli("status", "--json")).stdout)


async def test_a_key_holders_status_shows_the_lag_of_its_endpoints_read_models(
    auth_nats: NatsServer,
    services: None,
    service_settings: Settings,
    viewer_key: ApiKey,
    tmp_path: Path,
) -> None:
    # Its shell has no stack, but `show`, `runs` and `export` read the endpoint's read models:
    # `status` gives how far behind those are (the key may read their projectors' consumers),
    # where it said only that the verbs use another endpoint.
    holder = Cli(
        cli_env(
            tmp_path / "holder-home",
            tmp_path / "holder-config",
            ROLLOUT_ENDPOINT=auth_nats.url,
            ROLLOUT_API_KEY=viewer_key.text,
            **{STALL_ENV: "1"},
        )
    )
    tracker_line, buffer_line = durables.TRACKER_READ_MODELS.title, durables.BUFFER.title
    lines: dict[str, dict] = {}

    async def endpoint_lines() -> dict[str, dict]:
        result = await holder("status", "--json")
        lines.clear()
        lines.update({c["name"]: c for c in json.loads(result.stdout)["endpoint"]["components"]})
        return lines

    shown = await endpoint_lines()
    assert shown[tracker_line]["healthy"] and shown[tracker_line]["kind"] == "projection"
    assert shown[tracker_line]["detail"].startswith("caught up (applied through event ")
    assert shown[buffer_line]["detail"] == "no consumer yet (created when buffer starts)"

    # The tracker's Postgres refuses its writes: the events it receives are not applied.
    pool = await create_pool(service_settings.database_url)
    admin = await nats.connect(auth_nats.url, user=auth_nats.user, password=auth_nats.password)
    try:
        await pool.execute(REFUSE_WRITES)
        await EventPublisher(admin.jetstream()).publish_batch(run_history(new_id()))

        async def stalled() -> bool:
            return "STALLED" in (await endpoint_lines())[tracker_line]["detail"]

        await wait_until(stalled, "the key holder's status to show the stall", 30)
        assert not lines[tracker_line]["healthy"]
        assert "event(s) behind, no progress for" in lines[tracker_line]["detail"]
        result = await holder("status")
        assert f"the endpoint the other verbs use, {auth_nats.url}: its read models" in (
            result.stdout
        )
        assert "STALLED" in result.stdout and "its read models' lag" in result.stderr
        await pool.execute("drop trigger refuse_writes on projection_tracking")
    finally:
        await admin.close()
        await pool.close()

    # An endpoint that is not there: one line saying so, not a traceback.
    gone = Cli({**holder.env, "ROLLOUT_ENDPOINT": "nats://127.0.0.1:1"})
    result = await gone("status", "--json")
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = json.loads(result.stdout)["endpoint"]["components"]
    assert line["name"] == "endpoint" and not line["healthy"] and line["detail"]
