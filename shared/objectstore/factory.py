"""Open a store from a URL or settings; the cloud backends are imported here and only here."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from rollout.shared.errors import RolloutError
from rollout.shared.objectstore.base import ObjectStore
from rollout.shared.objectstore.errors import CloudExtraMissing, ObjectStoreError
from rollout.shared.objectstore.local import LocalObjectStore

# Overrides the embedded default (a folder in ROLLOUT_HOME) for every process.
OBJECT_STORE_ENV = "ROLLOUT_OBJECT_STORE_URL"
DEFAULT_FOLDER = "objects"

_EXPECTED = "expected file:///path, s3://bucket/prefix or gs://bucket/prefix"

# Each cloud scheme's backend, imported on first use so the core needs no cloud libraries.
_CLOUD_MODULES = {
    "s3": ("rollout.shared.objectstore.s3", "S3ObjectStore"),
    "gs": ("rollout.shared.objectstore.gcs", "GCSObjectStore"),
}
# The pip name to suggest for each module a cloud backend imports.
_PIP_NAMES = {
    "aioboto3": "aioboto3",
    "aiobotocore": "aioboto3",
    "boto3": "aioboto3",
    "botocore": "aioboto3",
    "gcloud": "gcloud-aio-storage",
    "aiohttp": "gcloud-aio-storage",
}
# Options a URL may carry in its query string, per scheme.
_QUERY_OPTIONS = {"s3": {"endpoint_url", "region"}, "gs": {"emulator_host"}}


class ObjectStoreSettings(BaseModel):
    """Where blobs go: a URL plus the options a cloud backend needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(
        min_length=1, description="file:///path, s3://bucket/prefix or gs://bucket/prefix"
    )
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint (MinIO, moto)")
    region: str | None = Field(None, description="S3 region")
    access_key_id: str | None = Field(None, description="S3 access key (else the AWS chain)")
    secret_access_key: SecretStr | None = Field(None, description="S3 secret key")
    emulator_host: str | None = Field(None, description="GCS emulator (else STORAGE_EMULATOR_HOST)")
    service_file: str | None = Field(None, description="GCS service account JSON file")


def default_store_url(home: Path, env: Mapping[str, str] | None = None) -> str:
    """ROLLOUT_OBJECT_STORE_URL if set, else `file://<home>/objects` (the embedded default)."""
    env = os.environ if env is None else env
    return (
        env.get(OBJECT_STORE_ENV) or (Path(home).expanduser().resolve() / DEFAULT_FOLDER).as_uri()
    )


def open_store(
    target: str | Path | ObjectStoreSettings | Mapping[str, Any], *, source: str = "object_store"
) -> ObjectStore:
    """A store for `file:///path`, `s3://bucket/prefix`, `gs://bucket/prefix`, a path or settings.

    `source` names where the value came from (a config path or variable) in error messages.
    """
    if isinstance(target, Path):
        return LocalObjectStore(target)
    if isinstance(target, str):
        if not target.strip():
            raise ObjectStoreError(f"{source} is empty", problems=[_EXPECTED])
        return _open(ObjectStoreSettings(url=target), source)
    if isinstance(target, ObjectStoreSettings):
        return _open(target, f"{source}.url")
    if isinstance(target, Mapping):
        try:
            settings = ObjectStoreSettings.model_validate(dict(target))
        except ValidationError as exc:
            raise RolloutError(
                f"invalid object store settings in {source}",
                problems=[_problem(source, error) for error in exc.errors()],
            ) from None
        return _open(settings, f"{source}.url")
    raise ObjectStoreError(
        f"{source} must be a URL, a path or object store settings, got {type(target).__name__}",
        problems=[_EXPECTED],
    )


def _open(settings: ObjectStoreSettings, source: str) -> ObjectStore:
    """Build the store, prefixing any construction error with where the URL came from."""
    try:
        return _build(settings, source)
    except CloudExtraMissing:
        raise
    except ObjectStoreError as exc:
        if exc.message.startswith(source):
            raise
        raise ObjectStoreError(
            f"{source}={settings.url!r}: {exc.message}", problems=exc.problems
        ) from None


def _build(settings: ObjectStoreSettings, source: str) -> ObjectStore:
    """Dispatch on the URL's scheme, merging query-string options into the settings."""
    url = settings.url.strip()
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if "://" not in url:
        # A bare path: the local store, the same as file://.
        return LocalObjectStore(url)
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path or parts.query:
            raise ObjectStoreError(
                f"{source}={url!r} is not a usable file:// URL",
                problems=["expected file:///absolute/path (three slashes, no host, no query)"],
            )
        return LocalObjectStore(unquote(parts.path))
    if scheme not in _CLOUD_MODULES:
        raise ObjectStoreError(
            f"{source}={url!r} has an unsupported scheme {parts.scheme!r}", problems=[_EXPECTED]
        )
    if not parts.netloc:
        raise ObjectStoreError(
            f"{source}={url!r} names no bucket", problems=[f"expected {scheme}://bucket/prefix"]
        )
    options = _query_options(url, parts.query, scheme, source)
    bucket, prefix = parts.netloc, unquote(parts.path)
    cls = _cloud_class(scheme)
    if scheme == "s3":
        endpoint = options.get("endpoint_url") or settings.endpoint_url
        _check_http_url(endpoint, f"{source} endpoint_url")
        secret = settings.secret_access_key
        return cls(
            bucket,
            prefix,
            endpoint_url=endpoint,
            region=options.get("region") or settings.region,
            access_key_id=settings.access_key_id,
            secret_access_key=secret.get_secret_value() if secret else None,
        )
    emulator = options.get("emulator_host") or settings.emulator_host
    return cls(bucket, prefix, emulator_host=emulator, service_file=settings.service_file)


def _cloud_class(scheme: str) -> Any:
    """Import a cloud backend on demand; a missing client library names the extra to install."""
    module_name, class_name = _CLOUD_MODULES[scheme]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top in _PIP_NAMES:
            raise CloudExtraMissing(scheme, _PIP_NAMES[top]) from None
        raise
    return getattr(module, class_name)


def _query_options(url: str, query: str, scheme: str, source: str) -> dict[str, str]:
    """Options given as `?name=value` on the URL; unknown names are an error, not ignored."""
    try:
        parsed = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ObjectStoreError(f"{source}={url!r} has a malformed query string") from None
    unknown = sorted(set(parsed) - _QUERY_OPTIONS[scheme])
    if unknown:
        raise ObjectStoreError(
            f"{source}={url!r} has unknown option(s) {', '.join(unknown)}",
            problems=[f"{scheme}:// URLs accept: {', '.join(sorted(_QUERY_OPTIONS[scheme]))}"],
        )
    return {name: values[-1] for name, values in parsed.items()}


def _check_http_url(value: str | None, where: str) -> None:
    """Reject an endpoint that is not http(s)://host[:port]."""
    if value is None:
        return
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ObjectStoreError(
            f"{where}={value!r} is not a valid endpoint", problems=["expected http(s)://host:port"]
        )


def _problem(source: str, error: Any) -> str:
    """One pydantic error as `source.field: message`."""
    loc = ".".join(str(part) for part in error.get("loc", ()))
    return f"{source}.{loc}: {error.get('msg', 'invalid')}" if loc else f"{source}: {error['msg']}"
