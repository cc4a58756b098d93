"""Build the service image with a daemonless builder (podman, else buildah) where one can run
and reach the base image; skip, saying exactly why, where none can (docs/kubernetes.md)."""

from __future__ import annotations

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


@pytest.mark.slow
def test_the_image_builds_and_runs_the_cli(tmp_path: Path) -> None:
    builder, why_not = _builder()
    if not builder:
        pytest.skip(f"no image builder can run here: {why_not}")
    tag = "localhost/rollout:test"
    build = subprocess.run(
        [
            builder,
            "build",
            "--file",
            str(DOCKERFILE),
            "--pull=never",
            "--tag",
            tag,
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    run = subprocess.run(
        [builder, "run", "--rm", tag, "health", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "max-age" in run.stdout, run.stdout + run.stderr
