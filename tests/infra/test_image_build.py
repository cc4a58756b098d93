"""Build the service image with a daemonless builder (podman, else buildah) where one can run
and has the base image; skip, saying exactly why, where none can (docs/kubernetes.md).

Here (a container itself) the OCI runtime cannot start build containers ("cgroups in hybrid
mode not supported"), so RUN steps use chroot isolation; Docker Hub is out of reach, so the
base image must already be in the builder's store; and HTTPS goes through the host's CA, which
the build is given when the host's pip names one (PIP_CERT)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "infra" / "images" / "Dockerfile"
BASE_IMAGE = "docker.io/library/python:3.11-slim"


def _builder() -> tuple[str, str]:
    """(builder, why not) : the first builder that runs here, or the reason none does."""
    reasons = []
    for name, probe in (("podman", ["info"]), ("buildah", ["info"])):
        path = shutil.which(name)
        if path is None:
            reasons.append(f"{name} is not installed")
            continue
        result = subprocess.run([path, *probe], capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            reasons.append(f"`{name} info` fails: {result.stderr.strip().splitlines()[-1:]}")
            continue
        # The base image comes from Docker Hub, which this machine cannot reach; a builder
        # helps only if the image is already in its store.
        exists = subprocess.run(
            [path, "image", "exists", BASE_IMAGE]
            if name == "podman"
            else [path, "inspect", BASE_IMAGE],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if exists.returncode != 0:
            reasons.append(f"{name} runs, but {BASE_IMAGE} is not in its store (no registry)")
            continue
        return path, ""
    return "", "; ".join(reasons)


def test_the_builder_probe_says_why_when_none_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert _builder() == ("", "podman is not installed; buildah is not installed")


@pytest.mark.slow
def test_the_image_builds_and_runs_the_cli(tmp_path: Path) -> None:
    builder, why_not = _builder()
    if not builder:
        pytest.skip(f"no image builder can run here: {why_not}")
    tag = "localhost/rollout:test"
    command = [builder, "build" if builder.endswith("podman") else "bud", "--isolation=chroot"]
    command += ["--pull=never", "--file", str(DOCKERFILE), "--tag", tag]
    host_ca = os.environ.get("PIP_CERT")
    if host_ca and Path(host_ca).is_file():
        # A copy: the image's ca-certificates package rewrites the bundle during the build.
        copy = tmp_path / "ca-certificates.crt"
        shutil.copyfile(host_ca, copy)
        command += ["--volume", f"{copy}:/etc/ssl/certs/ca-certificates.crt"]
    build = subprocess.run(
        [*command, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    # The build itself ran `rollout --help` in the image (the Dockerfile's last RUN); starting a
    # container is not possible here (crun: setrlimit RLIMIT_NOFILE refused), so the image's
    # configuration is read instead.
    inspect = subprocess.run(
        [builder, "image", "inspect", tag, "--format", "{{.Config.User}} {{.Config.Entrypoint}}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert inspect.returncode == 0, inspect.stderr
    assert inspect.stdout.split()[0] == "10001:10001", inspect.stdout
    assert "rollout" in inspect.stdout and "tini" in inspect.stdout, inspect.stdout
