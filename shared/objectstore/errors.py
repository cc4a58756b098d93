"""Errors the object store raises: all RolloutErrors, so the CLI prints them without a traceback."""

from __future__ import annotations

from rollout.shared.errors import RolloutError

CLOUD_EXTRA_HINT = "pip install 'rolloutdev[cloud]'"


class ObjectStoreError(RolloutError):
    """Anything the object store refuses or cannot do."""


class InvalidObjectKey(ObjectStoreError):
    """A key (or prefix, or URI) that no backend may hold: traversal, absolute, null bytes, too long."""


class ObjectNotFound(ObjectStoreError):
    """No object at the given key or URI."""

    def __init__(self, uri: str) -> None:
        super().__init__(f"no object at {uri}")
        self.uri = uri


class ObjectCorrupted(ObjectStoreError):
    """The stored bytes do not hash to the sha256 the caller expected."""

    def __init__(self, uri: str, *, expected: str, actual: str, size: int) -> None:
        super().__init__(
            f"object {uri} is corrupted: sha256 {actual} ({size} bytes) "
            f"does not match the expected {expected}",
            problems=["the blob changed after it was written; re-create it from its source"],
        )
        self.uri = uri
        self.expected = expected
        self.actual = actual


class ObjectConflict(ObjectStoreError):
    """A put would replace an object holding different content (blobs are immutable by default)."""

    def __init__(self, uri: str, *, existing_size: int, new_sha256: str, new_size: int) -> None:
        super().__init__(
            f"object {uri} already exists with different content "
            f"({existing_size} bytes stored, {new_size} bytes with sha256 {new_sha256} given)",
            problems=["use a new key (claim-check blobs are immutable) or pass overwrite=True"],
        )
        self.uri = uri


class CloudExtraMissing(ObjectStoreError):
    """A cloud backend was asked for but its client library is not installed."""

    def __init__(self, scheme: str, missing: str) -> None:
        super().__init__(
            f"the {scheme}:// object store needs the `{missing}` package, which is not installed",
            problems=[f"install the cloud extra: {CLOUD_EXTRA_HINT}"],
        )
        self.scheme = scheme
        self.missing = missing
