"""open_store: URLs and settings to backends, clear errors, and cloud libraries loaded lazily."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rollout.errors import RolloutError
from rollout.shared.objectstore import (
    CloudExtraMissing,
    LocalObjectStore,
    ObjectStoreError,
    ObjectStoreSettings,
    default_store_url,
    open_store,
)


def test_file_urls_and_paths_open_the_local_store(tmp_path: Path) -> None:
    for target in (tmp_path.as_uri(), str(tmp_path), tmp_path, f"file://localhost{tmp_path}"):
        store = open_store(target)
        assert isinstance(store, LocalObjectStore)
        assert store.root == tmp_path.resolve()
        assert store.base_uri == tmp_path.resolve().as_uri() + "/"


def test_local_uri_round_trips_keys_needing_escapes(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "with space")
    key = "runs/r 1/a#b?c%d.json"
    uri = store.uri_for(key)
    assert " " not in uri and "#" not in uri and "?" not in uri
    assert store.key_for(uri) == key


def test_s3_url_with_options() -> None:
    store = open_store(
        "s3://bucket/some/prefix/?endpoint_url=http://127.0.0.1:9000&region=eu-west-1"
    )
    assert type(store).__name__ == "S3ObjectStore"
    assert store.base_uri == "s3://bucket/some/prefix/"
    assert store.uri_for("k/1") == "s3://bucket/some/prefix/k/1"
    assert store.key_for("s3://bucket/some/prefix/k/1") == "k/1"
    assert store.endpoint_url == "http://127.0.0.1:9000"  # type: ignore[attr-defined]
    assert open_store("s3://bucket").base_uri == "s3://bucket/"


def test_gs_url_and_settings() -> None:
    store = open_store(
        ObjectStoreSettings(url="gs://bucket/p", emulator_host="http://127.0.0.1:9023")
    )
    assert type(store).__name__ == "GCSObjectStore"
    assert store.base_uri == "gs://bucket/p/"
    assert store.emulator_host == "http://127.0.0.1:9023"  # type: ignore[attr-defined]


def test_gcs_emulator_host_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:9023")
    store = open_store("gs://bucket")
    assert store.emulator_host == "http://127.0.0.1:9023"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://host/x", "unsupported scheme 'ftp'"),
        ("s3://", "names no bucket"),
        ("s3:///prefix", "names no bucket"),
        ("gs://bucket?endpoint_url=http://x", "unknown option(s) endpoint_url"),
        ("s3://bucket?region=a&colour=blue", "unknown option(s) colour"),
        ("s3://bucket?endpoint_url=localhost:9000", "is not a valid endpoint"),
        ("file://somehost/path", "not a usable file:// URL"),
        ("s3://bucket/a/../b", "path traversal"),
        ("", "is empty"),
    ],
)
def test_bad_urls_are_clear_errors(url: str, message: str) -> None:
    with pytest.raises(ObjectStoreError) as caught:
        open_store(url, source="ROLLOUT_OBJECT_STORE_URL")
    text = str(caught.value)
    assert message in text
    assert text.startswith("ROLLOUT_OBJECT_STORE_URL")


def test_bad_settings_name_their_config_path() -> None:
    with pytest.raises(RolloutError) as caught:
        open_store({"url": "s3://b", "endpoint": "http://x"}, source="stack.object_store")
    assert "stack.object_store.endpoint: Extra inputs are not permitted" in str(caught.value)
    with pytest.raises(RolloutError, match="stack.object_store.url"):
        open_store({}, source="stack.object_store")
    with pytest.raises(ObjectStoreError, match="must be a URL"):
        open_store(42)  # type: ignore[arg-type]


def test_default_store_url(tmp_path: Path) -> None:
    assert default_store_url(tmp_path, env={}) == (tmp_path.resolve() / "objects").as_uri()
    env = {"ROLLOUT_OBJECT_STORE_URL": "s3://bucket/rollout"}
    assert default_store_url(tmp_path, env=env) == "s3://bucket/rollout"


@pytest.mark.parametrize(
    ("url", "module", "package"),
    [
        ("s3://bucket", "aioboto3", "aioboto3"),
        ("gs://bucket", "gcloud.aio.storage", "gcloud-aio-storage"),
    ],
)
def test_missing_cloud_extra_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, url: str, module: str, package: str
) -> None:
    # A None entry in sys.modules makes `import` fail as if the package were not installed.
    monkeypatch.setitem(sys.modules, module, None)
    for loaded in ("rollout.shared.objectstore.s3", "rollout.shared.objectstore.gcs"):
        monkeypatch.delitem(sys.modules, loaded, raising=False)
    with pytest.raises(CloudExtraMissing) as caught:
        open_store(url)
    text = str(caught.value)
    assert f"`{package}` package" in text
    assert "pip install 'rolloutdev[cloud]'" in text


def test_core_import_loads_no_cloud_library() -> None:
    code = (
        "import sys, rollout.shared.objectstore as o\n"
        "o.open_store('file:///tmp/x')\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'aioboto3', 'aiobotocore', 'boto3', 'botocore', 'gcloud', 'aiohttp'})\n"
        "print(bad)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
