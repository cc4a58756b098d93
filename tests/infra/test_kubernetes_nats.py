"""The Kubernetes NATS node, run on the real nats-server: the ConfigMap's nats.conf with the
users its init container writes (`rollout admin nats-config`, the same command line), TLS from
a private CA, and the services' client trusting only that CA (ROLLOUT_NATS_CA_FILE)."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_kit import K8S, find, render
from waiting import wait_until_sync

from rollout.errors import RolloutError
from rollout.shared.settings import connect_nats, load_settings
from rollout.shared.stack.nats import nats_server_binary, service_password_variable
from rollout.shared.stack.services import SERVICES

PASSWORDS = {
    "ROLLOUT_NATS_PASSWORD": "admin-secret-0001",
    **{service_password_variable(s): f"{s}-secret-0001" for s in SERVICES},
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _certificates(directory: Path) -> None:
    """ca.crt, tls.crt and tls.key as cert-manager writes them (a CA and a node certificate)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rollout-nats-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    directory.mkdir(parents=True)
    (directory / "ca.crt").write_bytes(ca.public_bytes(pem))
    (directory / "tls.crt").write_bytes(cert.public_bytes(pem))
    (directory / "tls.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def _node(tmp_path: Path) -> dict[str, Any]:
    """One node's files laid out as the pod has them, under tmp_path; free ports."""
    docs = render(K8S / "overlays" / "aws")
    nats = find(docs, "StatefulSet", "nats")
    conf = find(docs, "ConfigMap", "nats-config")["data"]["nats.conf"]
    ports = {"client": _free_port(), "monitor": _free_port(), "cluster": _free_port()}
    etc = tmp_path / "etc" / "nats"
    _certificates(etc / "tls")
    (etc / "generated").mkdir()
    (tmp_path / "run").mkdir()
    conf = conf.replace("/etc/nats/", f"{etc}/").replace("/var/run/nats/", f"{tmp_path}/run/")
    conf = conf.replace("0.0.0.0:6222", f"127.0.0.1:{ports['cluster']}")
    (etc / "nats.conf").write_text(conf)

    # The init container's own command line, with the pod's paths and a free port.
    init = nats["spec"]["template"]["spec"]["initContainers"][0]
    command = [
        part.replace("/etc/nats/", f"{etc}/")
        .replace("$(POD_NAME)", "nats-0")
        .replace("/data", str(tmp_path / "data"))
        for part in init["command"][1:]
    ]
    command += ["--listen", "127.0.0.1", "--port", str(ports["client"])]
    command += ["--http-port", str(ports["monitor"])]
    result = subprocess.run(
        [sys.executable, "-m", "rollout.cli", *command],
        capture_output=True,
        text=True,
        timeout=60,
        env={"ROLLOUT_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", **PASSWORDS},
    )
    assert result.returncode == 0, result.stderr
    return {"config": etc / "nats.conf", "ca": etc / "tls" / "ca.crt", **ports}


def test_the_nats_config_passes_the_servers_own_check(tmp_path: Path) -> None:
    node = _node(tmp_path)
    generated = (node["config"].parent / "generated" / "nats.conf").read_text()
    assert 'server_name: "nats-0"' in generated
    assert "secret-0001" not in generated, "the config keeps only bcrypt hashes"
    result = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(node["config"])],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def tls_node(tmp_path: Path) -> Iterator[dict[str, Any]]:
    node = _node(tmp_path)
    log = (tmp_path / "nats.log").open("wb")
    process = subprocess.Popen(
        [nats_server_binary(), "-c", str(node["config"])], stdout=log, stderr=subprocess.STDOUT
    )
    try:

        def listening() -> bool:
            assert process.poll() is None, (tmp_path / "nats.log").read_text()
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", node["client"])) == 0

        wait_until_sync(listening, "nats-server to listen", 30)
        yield node
    finally:
        process.terminate()
        process.wait(timeout=15)
        log.close()


def _service_env(node: dict[str, Any], home: Path, **extra: str) -> dict[str, str]:
    return {
        "ROLLOUT_HOME": str(home),
        "ROLLOUT_NATS_URL": f"tls://localhost:{node['client']}",
        "ROLLOUT_NATS_USER": "svc_tracker",
        "ROLLOUT_NATS_PASSWORD": PASSWORDS[service_password_variable("tracker")],
        **extra,
    }


async def test_a_service_connects_over_tls_trusting_only_the_private_ca(
    tls_node: dict[str, Any], tmp_path: Path
) -> None:
    from rollout.shared.bus.broker import make_broker

    env = _service_env(tls_node, tmp_path, ROLLOUT_NATS_CA_FILE=str(tls_node["ca"]))
    settings = load_settings(env, service="tracker")
    nc = await connect_nats(settings)
    try:
        assert nc.is_connected
        await nc.flush(timeout=5)
    finally:
        await nc.close()
    # The services' FastStream broker takes the same TLS context.
    broker = make_broker(settings)
    connection = await broker.connect()
    try:
        assert connection.is_connected
    finally:
        await broker.stop()

    # Without the CA the server's certificate is not trusted: refused, with a clear error.
    with pytest.raises(RolloutError, match="cannot reach NATS"):
        await connect_nats(load_settings(_service_env(tls_node, tmp_path), service="tracker"))


def test_a_missing_ca_file_is_named(tmp_path: Path) -> None:
    from rollout.shared.settings import nats_connect_kwargs

    env = {
        "ROLLOUT_HOME": str(tmp_path),
        "ROLLOUT_NATS_URL": "tls://localhost:4222",
        "ROLLOUT_NATS_CA_FILE": str(tmp_path / "absent.crt"),
    }
    with pytest.raises(RolloutError, match="ROLLOUT_NATS_CA_FILE=.*absent.crt"):
        nats_connect_kwargs(load_settings(env))
