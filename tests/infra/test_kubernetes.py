"""The Kubernetes manifests (infra/k8s), checked offline: every overlay renders with the real
kustomize (kubectl's), validates against the Kubernetes schemas of the pinned version, and
holds what the platform needs (GPU pools, autoscaling on the work queue, disruption budgets,
heartbeat probes, secrets only from the secret store, a 3-node NATS with TLS and R3 streams).
Checkov and hadolint run in tests/infra/test_scanners.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from k8s_kit import (
    CLUSTER_VALUES,
    CUSTOM_KINDS,
    GPU_POOLS,
    K8S,
    KUBERNETES_VERSION,
    OVERLAYS,
    TERRAFORM,
    find,
    render,
    render_cluster_layer,
)

from rollout.services.actor.tuning import DEFAULT_CONCURRENCY
from rollout.services.tracker.runs import RUN_WINDOW_ENV
from rollout.shared import subjects
from rollout.shared.auth.services import SERVICE_ROLES, service_user
from rollout.shared.stack.nats import service_password_variable
from rollout.shared.stack.services import SERVICES


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every deployable rendering: the overlays and the Terraform's cluster layers."""
    out = {name: render(K8S / "overlays" / name) for name in OVERLAYS}
    for cloud in OVERLAYS:
        out[f"terraform-{cloud}"] = render_cluster_layer(cloud, tmp_path_factory.mktemp(cloud))
    return out


def each(rendered: dict[str, list[dict[str, Any]]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, docs in rendered.items():
        for doc in docs:
            yield name, doc


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def containers(workload: dict[str, Any], init: bool = False) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return list(spec.get("containers", [])) + (list(spec.get("initContainers", [])) if init else [])


def config_map(docs: list[dict[str, Any]], prefix: str) -> dict[str, str]:
    found = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == prefix]
    found += [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(f"{prefix}-")
    ]
    assert len(found) == 1, f"one ConfigMap {prefix}, found {len(found)}"
    return found[0]["data"]


def test_kubernetes_version_matches_the_terraform() -> None:
    """The schemas checked are EKS's default version (GKE follows its REGULAR channel)."""
    text = (TERRAFORM / "aws" / "variables.tf").read_text()
    block = text[text.index('variable "kubernetes_version"') :]
    default = re.search(r'default\s*=\s*"([^"]+)"', block)
    assert default is not None and default.group(1) == KUBERNETES_VERSION


def test_every_manifest_validates_against_the_kubernetes_schema(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    import kubernetes_validate

    checked = 0
    for name, doc in each(rendered):
        key = (doc["apiVersion"], doc["kind"])
        if key in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, f"{KUBERNETES_VERSION}.0", strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {exc.message}")
        checked += 1
    assert checked > 40


def test_schema_validation_can_fail() -> None:
    """The validator refuses what the API server would (so the test above means something)."""
    import kubernetes_validate

    docs = render(K8S / "overlays" / "aws")
    broken = find(docs, "Deployment", "tracker")
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["periodSecond"] = 5
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, f"{KUBERNETES_VERSION}.0", strict=True)


def test_only_known_custom_kinds(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Custom resources are the operators' documented kinds, with the fields they require."""
    for name, doc in each(rendered):
        key = (doc["apiVersion"], doc["kind"])
        if not key[0].startswith(("v1", "apps/", "policy/", "networking.k8s.io/")):
            assert key in CUSTOM_KINDS, f"{name}: unexpected kind {key}"
        spec = doc.get("spec") or {}
        if doc["kind"] == "Certificate":
            assert spec["secretName"] and spec["issuerRef"]["name"]
        if doc["kind"] == "ExternalSecret":
            assert spec["secretStoreRef"] == {"name": "rollout", "kind": "SecretStore"}
            assert spec["target"]["name"] == doc["metadata"]["name"]
            assert all(entry["remoteRef"]["property"] for entry in spec["data"])


def test_every_service_is_deployed_with_its_own_user(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name, docs in rendered.items():
        deployed = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
        assert deployed == set(SERVICES), name
        for service in SERVICES:
            container = containers(find(docs, "Deployment", service))[0]
            assert container["args"][:2] == ["serve", service]
            env = {e["name"]: e for e in container["env"]}
            assert env["ROLLOUT_NATS_USER"]["value"] == service_user(service)
            ref = env["ROLLOUT_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": f"rollout-{service}", "key": "ROLLOUT_NATS_PASSWORD"}
            holds_database = "ROLLOUT_DATABASE_URL" in env
            assert holds_database == (service in {"tracker", "buffer"}), service


def test_each_service_secret_holds_only_its_own_password(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name, docs in rendered.items():
        for service in SERVICES:
            secret = find(docs, "ExternalSecret", f"rollout-{service}")
            properties = {e["remoteRef"]["property"] for e in secret["spec"]["data"]}
            expected = {service_password_variable(service)}
            if service in {"tracker", "buffer"}:
                expected.add("ROLLOUT_DATABASE_URL")
            assert properties == expected, (name, service)
        users = find(docs, "ExternalSecret", "rollout-nats-users")
        wanted = {"ROLLOUT_NATS_PASSWORD", *(service_password_variable(s) for s in SERVICES)}
        assert {e["secretKey"] for e in users["spec"]["data"]} == wanted


def test_no_plaintext_secret_in_any_manifest(rendered: dict[str, list[dict[str, Any]]]) -> None:
    secret_like = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|DATABASE_URL|CREDENTIAL")
    for name, docs in rendered.items():
        assert not [d for d in docs if d["kind"] == "Secret"], f"{name}: a Secret in the manifests"
        targets = {
            d["spec"]["target"]["name"]: {e["secretKey"] for e in d["spec"]["data"]}
            for d in docs
            if d["kind"] == "ExternalSecret"
        }
        for workload in workloads(docs):
            for container in containers(workload, init=True):
                for env in container.get("env", []):
                    if secret_like.search(env["name"]):
                        assert "value" not in env, f"{name}: {env['name']} given in plain text"
                        ref = env["valueFrom"]["secretKeyRef"]
                        assert ref["key"] in targets[ref["name"]], f"{name}: {ref} not synced"
                for source in container.get("envFrom", []):
                    if "secretRef" in source:
                        assert source["secretRef"]["name"] in targets
        for doc in docs:
            if doc["kind"] == "ConfigMap":
                for key in doc["data"]:
                    assert not secret_like.search(key) or key == "SECRET_NAME", (name, key)


def test_secrets_come_from_each_clouds_secret_store(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    providers = {"aws": "aws", "gcp": "gcpsm"}
    for name, docs in rendered.items():
        cloud = name.removeprefix("terraform-")
        store = find(docs, "SecretStore", "rollout")["spec"]["provider"]
        assert list(store) == [providers[cloud]], name
        assert "auth" not in store[providers[cloud]], "the controller's cloud identity, no keys"
        if cloud == "aws":
            assert store["aws"]["service"] == "SecretsManager"


def test_terraform_cluster_layers_set_the_deployment_values(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for cloud in OVERLAYS:
        docs = rendered[f"terraform-{cloud}"]
        images = {c["image"] for w in workloads(docs) for c in containers(w, init=True)}
        repo = CLUSTER_VALUES["image_repository"]
        tag = CLUSTER_VALUES["image_tag"]
        assert {f"{repo}:{tag}", f"{repo}:{tag}-gpu"} <= images, images
        assert {i for i in images if not i.startswith("nats:")} <= {
            f"{repo}:{tag}",
            f"{repo}:{tag}-train",
            f"{repo}:{tag}-gpu",
        }
        for doc in docs:
            if doc["kind"] == "ExternalSecret":
                keys = {e["remoteRef"]["key"] for e in doc["spec"]["data"]}
                assert keys == {CLUSTER_VALUES["secret_name"]}, doc["metadata"]["name"]
        config = config_map(docs, "rollout-config")
        assert config["ROLLOUT_OBJECT_STORE_URL"] == CLUSTER_VALUES["object_store_url"]
        store = find(docs, "SecretStore", "rollout")["spec"]["provider"]
        if cloud == "aws":
            assert store["aws"]["region"] == CLUSTER_VALUES["region"]
            assert config["AWS_REGION"] == CLUSTER_VALUES["region"]
        else:
            assert store["gcpsm"]["projectID"] == CLUSTER_VALUES["project_id"]
            account = find(docs, "ServiceAccount", "rollout")["metadata"]["annotations"]
            assert (
                account["iam.gke.io/gcp-service-account"]
                == (CLUSTER_VALUES["workload_service_account"])
            )


def test_cluster_layer_templates_get_exactly_their_variables() -> None:
    """Every ${name} in a template is passed by its templatefile call, and nothing else."""
    for cloud in OVERLAYS:
        used = set(
            re.findall(
                r"\$\{(\w+)\}", (TERRAFORM / cloud / "cluster-kustomization.tftpl").read_text()
            )
        )
        code = (TERRAFORM / cloud / "kubernetes.tf").read_text()
        call = code[code.index('templatefile("${path.module}/cluster-kustomization.tftpl"') :]
        call = call[: call.index("})")]
        passed = set(re.findall(r"^\s+(\w+)\s+=", call, re.M))
        assert used == passed, cloud


def test_actors_and_learner_run_on_the_gpu_pools(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    pool_label = '"rollout.dev/pool" = each.key'
    for cloud in OVERLAYS:
        assert pool_label in (TERRAFORM / cloud / "main.tf").read_text(), cloud
    for name, docs in rendered.items():
        for service, pool in GPU_POOLS.items():
            spec = find(docs, "Deployment", service)["spec"]["template"]["spec"]
            assert spec["nodeSelector"] == {"rollout.dev/pool": pool}, (name, service)
            assert {
                "key": "nvidia.com/gpu",
                "operator": "Exists",
                "effect": "NoSchedule",
            } in spec["tolerations"]
            container = spec["containers"][0]
            assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
            assert "-gpu" in container["image"] or container["image"].startswith("rollout-gpu")
        for service in set(SERVICES) - set(GPU_POOLS):
            spec = find(docs, "Deployment", service)["spec"]["template"]["spec"]
            assert "nodeSelector" not in spec and "tolerations" not in spec, service


def test_actors_scale_on_their_work_queue(rendered: dict[str, list[dict[str, Any]]]) -> None:
    actor = SERVICE_ROLES["actor"]
    (durable,) = actor.consumes
    for _name, docs in rendered.items():
        scaled = find(docs, "ScaledObject", "actor")["spec"]
        assert scaled["scaleTargetRef"]["name"] == "actor"
        # KEDA owns the count: a replicas field would conflict on every server-side re-apply.
        assert "replicas" not in find(docs, "Deployment", "actor")["spec"]
        assert scaled["minReplicaCount"] >= 1 and scaled["maxReplicaCount"] > 2
        (trigger,) = scaled["triggers"]
        assert trigger["type"] == "nats-jetstream"
        meta = trigger["metadata"]
        assert meta["stream"] == subjects.WORK_STREAM == durable.stream
        assert meta["consumer"] == durable.name
        # Clustered: the scaler asks <server_name>.<endpoint>, so it must be the headless one.
        nats = find(docs, "StatefulSet", "nats")
        host = meta["natsServerMonitoringEndpoint"].split(":")[0]
        assert host.startswith(f"{nats['spec']['serviceName']}.rollout.svc"), host


def test_one_keys_window_can_call_for_every_actor(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    # KEDA scales on the queue's depth, and a key's runs queue at most the tracker's window:
    # a window under the pool's appetite would cap one user's run at a few actors.
    for _name, docs in rendered.items():
        scaled = find(docs, "ScaledObject", "actor")["spec"]
        lag = int(scaled["triggers"][0]["metadata"]["lagThreshold"])
        (tracker,) = containers(find(docs, "Deployment", "tracker"))
        env = {e["name"]: e.get("value") for e in tracker.get("env", [])}
        window = int(env[RUN_WINDOW_ENV])
        items = window // 16  # the default batch size, rollouts per work item
        assert items >= scaled["maxReplicaCount"] * max(lag, DEFAULT_CONCURRENCY), window


def test_every_multi_replica_workload_has_a_disruption_budget(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name, docs in rendered.items():
        scaled = {d["spec"]["scaleTargetRef"]["name"] for d in docs if d["kind"] == "ScaledObject"}
        budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
        for workload in workloads(docs):
            wname = workload["metadata"]["name"]
            if workload["spec"].get("replicas", 1) <= 1 and wname not in scaled:
                continue
            labels = workload["spec"]["template"]["metadata"]["labels"]
            matching = [
                b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
            ]
            assert len(matching) == 1, f"{name}: {wname} needs one PodDisruptionBudget"
            assert matching[0]["spec"].get("maxUnavailable") == 1


def test_every_container_has_probes_from_the_heartbeat(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name, docs in rendered.items():
        for workload in workloads(docs):
            for container in containers(workload):
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    assert probe in container, f"{name}: {container['name']} lacks {probe}"
            if workload["kind"] == "Deployment":
                service = workload["metadata"]["name"]
                container = containers(workload)[0]
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    command = container[probe]["exec"]["command"]
                    assert command[:3] == ["rollout", "health", service], (service, probe)
                    # Only readiness fails on stalled read models: a restart would not cure
                    # a Postgres refusing the projection's writes, and would lose the leader.
                    beat_only = probe != "readinessProbe" and service in ("tracker", "buffer")
                    assert ("--beat-only" in command) == beat_only, (service, probe)
                # The heartbeat's replica id is the pod's name.
                assert container["args"][2:4] == ["--replica-id", "$(POD_NAME)"]


def test_pods_run_locked_down(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for _name, docs in rendered.items():
        for workload in workloads(docs):
            spec = workload["spec"]["template"]["spec"]
            assert spec["automountServiceAccountToken"] is False
            assert spec["securityContext"]["runAsNonRoot"] is True
            assert spec["securityContext"]["runAsUser"] >= 10000
            for container in containers(workload, init=True):
                context = container["securityContext"]
                assert context["allowPrivilegeEscalation"] is False, container["name"]
                assert context["readOnlyRootFilesystem"] is True
                assert context["capabilities"] == {"drop": ["ALL"]}
                assert container["resources"]["limits"]["memory"]
        sandboxed = {"actor", "verifier"}
        for service in SERVICES:
            pod = find(docs, "Deployment", service)["spec"]["template"]["spec"]
            seccomp = pod["securityContext"]["seccompProfile"]
            if service in sandboxed:
                # bubblewrap: the compose profile, installed on the nodes.
                assert seccomp == {
                    "type": "Localhost",
                    "localhostProfile": "profiles/rollout-sandbox.json",
                }
                assert pod["securityContext"]["appArmorProfile"]["localhostProfile"] == (
                    "rollout-sandbox"
                )
            else:
                assert seccomp == {"type": "RuntimeDefault"}, service
        policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
        assert any(p["spec"]["podSelector"] == {} for p in policies), "default deny"


def test_nats_is_three_nodes_with_tls_and_r3_streams(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for _name, docs in rendered.items():
        nats = find(docs, "StatefulSet", "nats")
        assert nats["spec"]["replicas"] == 3
        assert nats["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
        conf = find(docs, "ConfigMap", "nats-config")["data"]["nats.conf"]
        headless = nats["spec"]["serviceName"]
        routes = re.findall(r"nats-route://(\S+):6222", conf)
        assert routes == [f"nats-{i}.{headless}.rollout.svc.cluster.local" for i in range(3)]
        assert conf.count("cert_file: /etc/nats/tls/tls.crt") == 2, "clients and routes on TLS"
        assert "verify: true" in conf
        certificate = find(docs, "Certificate", "nats-tls")["spec"]
        assert f"*.{headless}.rollout.svc.cluster.local" in certificate["dnsNames"]
        init = nats["spec"]["template"]["spec"]["initContainers"][0]
        assert init["command"][:3] == ["rollout", "admin", "nats-config"]
        assert init["command"][-2:] == ["--server-name", "$(POD_NAME)"]
        config = config_map(docs, "rollout-config")
        assert config["ROLLOUT_STREAM_REPLICAS"] == "3"
        urls = config["ROLLOUT_NATS_URL"].split(",")
        assert urls == [
            f"tls://nats-{i}.{headless}.rollout.svc.cluster.local:4222" for i in range(3)
        ]
        ca = config["ROLLOUT_NATS_CA_FILE"]
        for service in SERVICES:
            mounts = containers(find(docs, "Deployment", service))[0]["volumeMounts"]
            assert any(ca.startswith(m["mountPath"] + "/") for m in mounts), service
        budget = find(docs, "PodDisruptionBudget", "nats")["spec"]
        assert budget["maxUnavailable"] == 1
