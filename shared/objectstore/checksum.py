"""SHA-256 helpers: the integrity half of a claim check (events carry a URI and its sha256)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from rollout.shared.objectstore.errors import ObjectCorrupted, ObjectStoreError

SHA256_PATTERN = r"^[0-9a-f]{64}$"
_SHA256_RE = re.compile(SHA256_PATTERN)

# 1 MiB: large enough that per-chunk overhead (thread hops, HTTP reads) is noise.
CHUNK_SIZE = 1024 * 1024


def sha256_bytes(data: bytes | bytearray | memoryview) -> str:
    """The hex sha256 of some bytes."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path, chunk_size: int = CHUNK_SIZE) -> tuple[str, int]:
    """The hex sha256 and size of a file, read in chunks (blocking: run it in a thread)."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def normalize_sha256(value: object, *, what: str = "sha256") -> str:
    """A lower-case 64-hex-digit sha256, or a clear error naming what was wrong."""
    if not isinstance(value, str) or not _SHA256_RE.match(value.strip().lower()):
        raise ObjectStoreError(
            f"{what} must be 64 hexadecimal characters, got {value!r}",
            problems=["pass the sha256 from the ObjectRef the blob was stored under"],
        )
    return value.strip().lower()


def check_sha256(uri: str, *, expected: str | None, actual: str, size: int) -> None:
    """Raise ObjectCorrupted when an expected sha256 was given and the bytes hash differently."""
    if expected is not None and expected != actual:
        raise ObjectCorrupted(uri, expected=expected, actual=actual, size=size)
