"""Static checks of the deployment files: terraform parses and hangs together, compose and the
image carry what the services need. (`terraform validate` needs the providers downloaded, which
this machine cannot do; these checks cover what can be checked without them.)"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import hcl2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TERRAFORM = ROOT / "infra" / "terraform"
PROVIDERS = ["aws", "gcp"]
TF_FILES = sorted(TERRAFORM.glob("*/*.tf"))
DOCKERFILE = ROOT / "infra" / "images" / "Dockerfile"
DOCKERIGNORE = ROOT / "infra" / "images" / "Dockerfile.dockerignore"

ROLLOUT_SERVICES = ["tracker", "env-registry", "actor", "verifier", "buffer", "learner"]
GPU_SERVICES = {"actor-gpu": "actor", "learner-gpu": "learner"}
SERVICE_ENV = [
    "ROLLOUT_NATS_URL",
    "ROLLOUT_NATS_USER",
    "ROLLOUT_NATS_PASSWORD",
]
# The only services that talk to Postgres (read models; the rollout store).
DATABASE_SERVICES = {"tracker", "buffer"}
# The services that run model-written code under bubblewrap.
SANDBOX_SERVICES = {"actor", "verifier", "actor-gpu"}
SECCOMP = ROOT / "infra" / "compose" / "sandbox-seccomp.json"
APPARMOR = ROOT / "infra" / "compose" / "apparmor-rollout-sandbox"
ROLLOUT_OUTPUTS = {
    "rollout_nats_url": False,
    "rollout_nats_user": False,
    "rollout_nats_password": True,
    "rollout_database_url": True,
    "rollout_object_store_url": False,
    "rollout_env": True,
}


def _unquote(key: str) -> str:
    return key[1:-1] if len(key) >= 2 and key[0] == key[-1] == '"' else key


def _blocks(parsed: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    """`resource "type" "name"` blocks as {"type.name": body}; variables/outputs as {name: body}."""
    found: dict[str, dict[str, Any]] = {}
    for entry in parsed.get(kind, []):
        for first, body in entry.items():
            if kind in ("resource", "data"):
                for second, inner in body.items():
                    found[f"{_unquote(first)}.{_unquote(second)}"] = inner
            else:
                found[_unquote(first)] = body
    return found


def _load_provider(provider: str) -> dict[str, Any]:
    """Every top-level block of one provider's configuration, merged across its files."""
    merged: dict[str, dict[str, Any]] = {
        "resource": {},
        "data": {},
        "variable": {},
        "output": {},
        "locals": {},
    }
    for path in sorted((TERRAFORM / provider).glob("*.tf")):
        parsed = hcl2.loads(path.read_text())
        for kind in ("resource", "data", "variable", "output"):
            merged[kind].update(_blocks(parsed, kind))
        for entry in parsed.get("locals", []):
            merged["locals"].update({k: v for k, v in entry.items() if not k.startswith("__")})
    return merged


def _code(provider: str) -> str:
    """The provider's HCL with comments removed, for reference scanning."""
    text = "\n".join(p.read_text() for p in sorted((TERRAFORM / provider).glob("*.tf")))
    return re.sub(r"(?m)^\s*#.*$", "", text)


@pytest.mark.parametrize("path", TF_FILES, ids=lambda p: str(p.relative_to(TERRAFORM)))
def test_every_terraform_file_parses(path: Path) -> None:
    parsed = hcl2.loads(path.read_text())
    assert parsed, f"{path} holds no blocks"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_provider_has_its_files(provider: str) -> None:
    names = {p.name for p in (TERRAFORM / provider).iterdir()}
    assert {"main.tf", "variables.tf", "outputs.tf", "versions.tf", "README.md"} <= names


@pytest.mark.parametrize("provider", PROVIDERS)
def test_references_resolve(provider: str) -> None:
    """What `terraform validate` would catch first: undeclared vars, locals, resources."""
    config = _load_provider(provider)
    code = _code(provider)

    used_vars = set(re.findall(r"\bvar\.([a-z_][a-z0-9_]*)", code))
    declared_vars = set(config["variable"])
    assert used_vars - declared_vars == set(), "variables used but not declared"
    assert declared_vars - used_vars == set(), "variables declared but never used"

    used_locals = set(re.findall(r"\blocal\.([a-z_][a-z0-9_]*)", code))
    assert used_locals - set(config["locals"]) == set(), "locals used but not defined"

    prefixes = r"(?:aws|google|random)_[a-z0-9_]+"
    for kind, pattern in (
        ("data", rf"\bdata\.({prefixes})\.([a-z0-9_]+)"),
        ("resource", rf"(?<![.\w])({prefixes})\.([a-z0-9_]+)"),
    ):
        used = {f"{t}.{n}" for t, n in re.findall(pattern, code)}
        assert used - set(config[kind]) == set(), f"{kind} references without a declaration"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_outputs_give_the_rollout_settings(provider: str) -> None:
    outputs = _load_provider(provider)["output"]
    for name, secret in ROLLOUT_OUTPUTS.items():
        assert name in outputs, f"{provider}: output {name} missing"
        assert bool(outputs[name].get("sensitive")) is secret, f"{provider}: {name} sensitivity"
    env_map = outputs["rollout_env"]["value"]
    keys = set(env_map) if isinstance(env_map, dict) else set()
    assert {*SERVICE_ENV, "ROLLOUT_OBJECT_STORE_URL"} <= keys
    # The 3-node cluster keeps three copies of the log, not one.
    assert _unquote(env_map["ROLLOUT_STREAM_REPLICAS"]) == "3"


def test_aws_has_the_parts() -> None:
    resources = _load_provider("aws")["resource"]
    assert resources["aws_instance.nats"]["count"] == 3
    assert resources["aws_ebs_volume.nats"]["count"] == 3
    assert "postgres" in resources["aws_db_instance.postgres"]["engine"]
    assert "aws_s3_bucket.artifacts" in resources
    assert "aws_eks_cluster.main" in resources
    pools = _load_provider("aws")["locals"]["node_groups"]
    assert {"system", "actors", "learner"} <= set(pools)
    for gpu_pool in ("actors", "learner"):
        assert "NVIDIA" in pools[gpu_pool]["ami_type"] and pools[gpu_pool]["gpu"] is True
    assert 'dynamic "taint"' in _code("aws"), "GPU node groups are tainted"


def test_gcp_has_the_parts() -> None:
    config = _load_provider("gcp")
    resources = config["resource"]
    assert resources["google_compute_instance.nats"]["count"] == 3
    assert resources["google_compute_disk.nats"]["count"] == 3
    assert "google_sql_database_instance.postgres" in resources
    assert "google_storage_bucket.artifacts" in resources
    assert "google_container_cluster.main" in resources
    pools = config["locals"]["node_pools"]
    assert {"system", "actors", "learner"} <= set(pools)
    for gpu_pool, variable in (("actors", "actor_gpu"), ("learner", "learner_gpu")):
        assert pools[gpu_pool]["gpu"] == f"${{var.{variable}}}", f"{gpu_pool} takes an accelerator"
        assert "nvidia" in config["variable"][variable]["default"]["type"]
    assert pools["system"]["gpu"] is None
    assert 'dynamic "guest_accelerator"' in _code("gcp")


@pytest.mark.skipif(shutil.which("terraform") is None, reason="terraform is not installed")
def test_terraform_fmt_is_clean() -> None:
    result = subprocess.run(
        ["terraform", "fmt", "-check", "-recursive", "-diff", str(TERRAFORM)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------
# compose.yaml


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_compose_has_every_service(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"nats", "postgres", *ROLLOUT_SERVICES, *GPU_SERVICES} <= set(services)


def test_compose_lists_every_registered_service(compose: dict[str, Any]) -> None:
    """A service added to the registry must be added to compose as well."""
    registry = pytest.importorskip("rollout.shared.stack.services")
    assert set(registry.SERVICES) <= set(compose["services"])


def test_rollout_services_share_one_image_and_settings(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ROLLOUT_SERVICES:
        service = services[name]
        assert service["command"] == ["serve", name]
        assert service["build"]["dockerfile"] == "infra/images/Dockerfile"
        assert service["build"]["context"] == "."
        assert service["image"] == services["tracker"]["image"], f"{name} uses another image"
        env = service["environment"]
        for variable in SERVICE_ENV:
            assert env.get(variable), f"{name} lacks {variable}"
        assert env["ROLLOUT_NATS_URL"] == "nats://nats:4222"
        if name in DATABASE_SERVICES:
            assert "@postgres:5432/" in env["ROLLOUT_DATABASE_URL"]
        for dependency in ("nats", "postgres"):
            assert service["depends_on"][dependency]["condition"] == "service_healthy"


def test_secrets_must_be_given(compose: dict[str, Any]) -> None:
    """No default passwords: compose refuses to start and says which variable to set."""
    env = compose["services"]["tracker"]["environment"]
    assert env["ROLLOUT_NATS_PASSWORD"].startswith("${ROLLOUT_NATS_PASSWORD_TRACKER:?")
    assert "ROLLOUT_DATABASE_URL" in env
    config_env = compose["services"]["nats-config"]["environment"]
    assert config_env["ROLLOUT_NATS_PASSWORD"].startswith("${ROLLOUT_NATS_PASSWORD:?")
    assert "${ROLLOUT_POSTGRES_PASSWORD:?" in env["ROLLOUT_DATABASE_URL"]
    postgres_env = compose["services"]["postgres"]["environment"]
    assert postgres_env["POSTGRES_PASSWORD"].startswith("${ROLLOUT_POSTGRES_PASSWORD:?")


def test_nats_and_postgres_are_durable_and_checked(compose: dict[str, Any]) -> None:
    nats = compose["services"]["nats"]
    assert nats["image"].startswith("nats:")
    # Its config (JetStream, /data, every user) is generated by the nats-config job first.
    assert nats["command"] == ["-c", "/etc/nats/rollout/nats.conf"]
    assert nats["depends_on"]["nats-config"]["condition"] == "service_completed_successfully"
    assert "nats-config:/etc/nats/rollout:ro" in nats["volumes"]
    assert any(v.endswith(":/data") for v in nats["volumes"])
    assert all(p.startswith("127.0.0.1:") for p in nats["ports"]), (
        "NATS is published on loopback only"
    )
    assert "healthz" in " ".join(nats["healthcheck"]["test"])

    postgres = compose["services"]["postgres"]
    assert postgres["image"].startswith("postgres:")
    assert any(v.endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert {"nats-data", "postgres-data"} <= set(compose["volumes"])


def test_actors_scale_and_sandboxes_can_run(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert "ROLLOUT_ACTOR_REPLICAS" in str(services["actor"]["deploy"]["replicas"])
    for name in SANDBOX_SERVICES:
        options = services[name]["security_opt"]
        assert "seccomp=./infra/compose/sandbox-seccomp.json" in options, f"{name}: bwrap profile"
        assert "apparmor=rollout-sandbox" in options, f"{name}: bwrap needs mount and userns"
    for name in ("actor", "actor-gpu"):
        env = services[name]["environment"]
        assert env["OPENAI_API_KEY"] == "${OPENAI_API_KEY:-}", "hosted-model keys pass through"
        assert set(SERVICE_ENV) <= set(env)
        # No catch-all key that a model name could send to any URL.
        assert "OPENAI_COMPATIBLE_API_KEY" not in env
        assert env["ROLLOUT_MODEL_ENDPOINTS"] == "${ROLLOUT_MODEL_ENDPOINTS:-}"
    # The tracker checks names against the same endpoint policy at run creation.
    assert "ROLLOUT_MODEL_ENDPOINTS" in services["tracker"]["environment"]


def test_no_credentialed_service_runs_unconfined(compose: dict[str, Any]) -> None:
    """Every service holds the NATS password; none may drop seccomp or AppArmor."""
    for name in [*ROLLOUT_SERVICES, *GPU_SERVICES]:
        service = compose["services"][name]
        options = service.get("security_opt") or []
        assert "ROLLOUT_NATS_PASSWORD" in service["environment"]
        assert not [o for o in options if "unconfined" in o], f"{name} runs unconfined"
        assert "no-new-privileges:true" in options, f"{name} may gain privileges"
        assert service.get("cap_drop") == ["ALL"], f"{name} keeps capabilities"
        assert not service.get("privileged"), f"{name} is privileged"
        assert not service.get("cap_add"), f"{name} adds capabilities"


def test_only_the_database_services_hold_the_database_url(compose: dict[str, Any]) -> None:
    for name in [*ROLLOUT_SERVICES, *GPU_SERVICES]:
        env = compose["services"][name]["environment"]
        holds = any(
            "ROLLOUT_POSTGRES_PASSWORD" in str(v) or "DATABASE" in k for k, v in env.items()
        )
        assert holds == (name in DATABASE_SERVICES), f"{name}: database URL held={holds}"


def test_the_sandbox_profiles_allow_bwrap_and_refuse_the_kernel_surface() -> None:
    import json

    profile = json.loads(SECCOMP.read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    denied = {
        n
        for rule in profile["syscalls"]
        if rule["action"] == "SCMP_ACT_ERRNO"
        for n in rule["names"]
    }
    for call in (
        "bpf",
        "kexec_load",
        "init_module",
        "finit_module",
        "ptrace",
        "keyctl",
        "perf_event_open",
        "io_uring_setup",
        "open_by_handle_at",
        "userfaultfd",
    ):
        assert call in denied, f"{call} must be refused"
    for call in ("unshare", "clone", "clone3", "mount", "umount2", "pivot_root", "setns"):
        assert call not in denied, f"bubblewrap needs {call}"
    text = APPARMOR.read_text()
    assert "profile rollout-sandbox" in text
    rules = [line.strip() for line in text.splitlines() if not line.strip().startswith("#")]
    for rule in (
        "mount,",
        "pivot_root,",
        "userns,",
        "deny ptrace,",
        "deny /sys/firmware/** rwklx,",
        "deny @{PROC}/sysrq-trigger rwklx,",
    ):
        assert rule in rules, rule
    assert "deny mount," not in rules


def test_gpu_profile_reserves_nvidia_devices(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, role in GPU_SERVICES.items():
        service = services[name]
        assert service["profiles"] == ["gpu"]
        assert service["command"] == ["serve", role]
        assert service["build"]["args"]["VARIANT"] == "gpu"
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    for name in ROLLOUT_SERVICES:
        assert "profiles" not in services[name], f"{name} must start without a profile"


# ---------------------------------------------------------------------------------------------
# The image


def test_dockerfile_builds_the_package_as_non_root() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:\$\{PYTHON_VERSION\}-slim$", text, re.M)
    assert "ARG PYTHON_VERSION=3.11" in text
    assert "bubblewrap" in text
    assert "download.pytorch.org/whl/cpu" in text and "ARG VARIANT=" in text
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and not users[-1].startswith(("root", "0")), "the image must run as non-root"
    assert re.search(r'^ENTRYPOINT \[.*"rollout"\]$', text, re.M)


def test_dockerignore_lets_every_copied_path_through() -> None:
    """The context excludes everything not re-included; a COPY of an excluded path would fail."""
    included = {
        line[1:].rstrip("/")
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.startswith("!")
    }
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert source in included, f"{source} is copied but excluded from the context"
                assert (ROOT / source).exists(), f"{source} is copied but does not exist"


def test_each_service_holds_only_its_own_nats_password(compose: dict[str, Any]) -> None:
    """No service gets the admin password or another service's; nats-config gets them all."""
    from rollout.shared.auth.services import service_user
    from rollout.shared.stack.nats import service_password_variable

    services = compose["services"]
    variables = {service_password_variable(name) for name in ROLLOUT_SERVICES}
    for name in [*ROLLOUT_SERVICES, *GPU_SERVICES]:
        own = GPU_SERVICES.get(name, name)
        env = services[name]["environment"]
        assert env["ROLLOUT_NATS_USER"] == service_user(own), name
        assert env["ROLLOUT_NATS_PASSWORD"].startswith(f"${{{service_password_variable(own)}:?")
        text = " ".join(f"{k}={v}" for k, v in env.items())
        held = {v for v in variables if v in text}
        assert held == {service_password_variable(own)}, f"{name} holds {held}"
        assert "${ROLLOUT_NATS_PASSWORD:" not in text, f"{name} holds the admin password"
    config = services["nats-config"]
    assert set(config["environment"]) == {"ROLLOUT_NATS_USER", "ROLLOUT_NATS_PASSWORD", *variables}
    assert config["command"][:2] == ["admin", "nats-config"]
    assert config["cap_drop"] == ["ALL"] and "no-new-privileges:true" in config["security_opt"]
