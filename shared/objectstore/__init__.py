"""Blobs behind one interface: local filesystem (embedded default), S3 and GCS (cloud layer).

The cloud backends are not imported here; `open_store` loads them on demand.
"""

from rollout.shared.objectstore.base import ObjectRef, ObjectStore, PutData
from rollout.shared.objectstore.checksum import sha256_bytes, sha256_file
from rollout.shared.objectstore.claimcheck import (
    DEFAULT_INLINE_LIMIT,
    ClaimCheck,
    Inline,
    content_key,
    get_json,
    load_claim,
    put_json,
    store_if_large,
    to_json_bytes,
)
from rollout.shared.objectstore.errors import (
    CloudExtraMissing,
    InvalidObjectKey,
    ObjectConflict,
    ObjectCorrupted,
    ObjectNotFound,
    ObjectStoreError,
)
from rollout.shared.objectstore.factory import (
    OBJECT_STORE_ENV,
    ObjectStoreSettings,
    default_store_url,
    open_store,
)
from rollout.shared.objectstore.keys import validate_key, validate_prefix
from rollout.shared.objectstore.local import LocalObjectStore

__all__ = [
    "DEFAULT_INLINE_LIMIT",
    "OBJECT_STORE_ENV",
    "ClaimCheck",
    "CloudExtraMissing",
    "Inline",
    "InvalidObjectKey",
    "LocalObjectStore",
    "ObjectConflict",
    "ObjectCorrupted",
    "ObjectNotFound",
    "ObjectRef",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreSettings",
    "PutData",
    "content_key",
    "default_store_url",
    "get_json",
    "load_claim",
    "open_store",
    "put_json",
    "sha256_bytes",
    "sha256_file",
    "store_if_large",
    "to_json_bytes",
    "validate_key",
    "validate_prefix",
]
