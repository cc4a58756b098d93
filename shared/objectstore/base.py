"""The object store interface: immutable blobs by key, returned as URI + sha256 + size."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, ClassVar, Self

import structlog
from pydantic import BaseModel, ConfigDict, Field

from rollout.shared.objectstore.checksum import (
    CHUNK_SIZE,
    SHA256_PATTERN,
    check_sha256,
    normalize_sha256,
    sha256_bytes,
    sha256_file,
)
from rollout.shared.objectstore.errors import ObjectConflict, ObjectStoreError
from rollout.shared.objectstore.keys import looks_like_uri, validate_key, validate_prefix

log = structlog.get_logger(__name__)

PutData = bytes | bytearray | memoryview | Path | AsyncIterable[bytes]


class ObjectRef(BaseModel):
    """A claim check: where a blob lives and the sha256 and size it must have."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uri: str = Field(min_length=1, description="file://, s3:// or gs:// URI of the blob")
    sha256: str = Field(pattern=SHA256_PATTERN, description="hex sha256 of the blob's bytes")
    size: int = Field(ge=0, description="size of the blob in bytes")


@dataclass(frozen=True)
class StoredObject:
    """What a backend knows about a stored object without reading it."""

    size: int
    # None where the backend keeps no checksum (the local store, foreign cloud objects).
    sha256: str | None


class ObjectStore(ABC):
    """Async blob store; backends implement the underscored primitives, this class the contract."""

    scheme: ClassVar[str]

    # --- backend primitives -------------------------------------------------------------

    @property
    @abstractmethod
    def base_uri(self) -> str:
        """URI of the store's root; every object URI starts with it."""

    @abstractmethod
    def uri_for(self, key: str) -> str:
        """The URI of a (validated) key in this store."""

    @abstractmethod
    def _key_from_uri(self, uri: str) -> str:
        """The key a URI of this store names; InvalidObjectKey when it is not in this store."""

    @abstractmethod
    async def _write_bytes(self, key: str, data: bytes, sha256: str) -> None:
        """Store `data` at `key`, replacing what is there."""

    @abstractmethod
    async def _write_file(
        self, key: str, path: Path, sha256: str, size: int, *, owned: bool
    ) -> None:
        """Store a file's bytes at `key`; `owned` files are spool files the backend may move."""

    @abstractmethod
    async def _stat(self, key: str) -> StoredObject | None:
        """Size (and stored sha256 if known) of the object at `key`, or None when absent."""

    async def _read_all(self, key: str) -> bytes:
        """The whole object's bytes (a backend may read them in one go)."""
        return b"".join([chunk async for chunk in self._read_chunks(key, CHUNK_SIZE)])

    @abstractmethod
    def _read_chunks(self, key: str, chunk_size: int) -> AsyncIterator[bytes]:
        """Yield the object's bytes in chunks; ObjectNotFound when absent."""

    @abstractmethod
    async def _delete(self, key: str) -> bool:
        """Remove the object; True when it existed."""

    @abstractmethod
    async def _list(self, prefix: str) -> list[str]:
        """Keys (relative to the store) starting with `prefix`, any order."""

    def _prefix_bytes(self) -> int:
        """Bytes the store prepends to every key (cloud prefixes count toward the 1024 cap)."""
        return 0

    def _spool_dir(self) -> Path | None:
        """Where streamed puts are spooled to; None means the system temp dir."""
        return None

    async def close(self) -> None:  # noqa: B027 (a hook: the local store holds nothing open)
        """Release clients and connections; the store is unusable afterwards."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- the contract -------------------------------------------------------------------

    def key_for(self, target: str | ObjectRef) -> str:
        """The key a key, URI or ObjectRef names in this store (validated)."""
        if isinstance(target, ObjectRef):
            target = target.uri
        if isinstance(target, str) and looks_like_uri(target):
            key = self._key_from_uri(target)
        else:
            key = target
        return validate_key(key, prefix_bytes=self._prefix_bytes())

    async def put(self, key: str, data: PutData, *, overwrite: bool = False) -> ObjectRef:
        """Store bytes, a file, or an async stream of bytes at `key` and return its ObjectRef.

        Re-putting identical content is a no-op; different content under an existing key
        raises ObjectConflict unless `overwrite` (blobs referenced by events must not change).
        """
        # A key, never a URI: writing by URI could silently target another store.
        key = validate_key(key, prefix_bytes=self._prefix_bytes())
        spooled: Path | None = None
        payload: bytes | None = None
        source: Path | None = None
        try:
            if isinstance(data, bytes | bytearray | memoryview):
                payload = bytes(data)
                sha, size = sha256_bytes(payload), len(payload)
            elif isinstance(data, Path):
                source = data
                sha, size = await self._hash_source_file(data)
            elif isinstance(data, AsyncIterable):
                spooled, sha, size = await self._spool(data)
            else:
                raise ObjectStoreError(
                    f"cannot store {type(data).__name__} at {key!r}",
                    problems=["data must be bytes, a pathlib.Path or an async iterator of bytes"],
                )
            ref = ObjectRef(uri=self.uri_for(key), sha256=sha, size=size)
            existing = await self._stat(key)
            if existing is not None:
                if await self._holds(key, existing, sha, size):
                    log.debug("objectstore.put.unchanged", uri=ref.uri, size=size)
                    return ref
                if not overwrite:
                    raise ObjectConflict(
                        ref.uri, existing_size=existing.size, new_sha256=sha, new_size=size
                    )
            if payload is not None:
                await self._write_bytes(key, payload, sha)
            elif spooled is not None:
                await self._write_file(key, spooled, sha, size, owned=True)
            else:
                assert source is not None
                await self._write_file(key, source, sha, size, owned=False)
            log.debug("objectstore.put", uri=ref.uri, size=size, sha256=sha)
            return ref
        finally:
            if spooled is not None:
                _remove(spooled)

    async def get(self, target: str | ObjectRef, *, sha256: str | None = None) -> bytes:
        """The whole object; verified against `sha256` (or the ObjectRef's) when one is known."""
        key, expected = self._resolve(target, sha256)
        data = await self._read_all(key)
        check_sha256(
            self.uri_for(key), expected=expected, actual=sha256_bytes(data), size=len(data)
        )
        return data

    async def stream(
        self,
        target: str | ObjectRef,
        *,
        sha256: str | None = None,
        chunk_size: int = CHUNK_SIZE,
    ) -> AsyncIterator[bytes]:
        """Yield the object in chunks; ObjectCorrupted is raised after the last chunk on mismatch.

        Treat the bytes as unverified until the iteration ends without an error.
        """
        key, expected = self._resolve(target, sha256)
        digest = hashlib.sha256()
        size = 0
        async for chunk in self._read_chunks(key, chunk_size):
            digest.update(chunk)
            size += len(chunk)
            yield chunk
        check_sha256(self.uri_for(key), expected=expected, actual=digest.hexdigest(), size=size)

    async def download_to(
        self, target: str | ObjectRef, path: Path, *, sha256: str | None = None
    ) -> ObjectRef:
        """Stream the object to `path` atomically; a corrupted blob never appears at `path`."""
        key, expected = self._resolve(target, sha256)
        path = Path(path)
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
        digest = hashlib.sha256()
        size = 0
        handle = await asyncio.to_thread(partial.open, "wb")
        try:
            try:
                async for chunk in self._read_chunks(key, CHUNK_SIZE):
                    digest.update(chunk)
                    size += len(chunk)
                    await asyncio.to_thread(handle.write, chunk)
            finally:
                await asyncio.to_thread(handle.close)
            uri = self.uri_for(key)
            check_sha256(uri, expected=expected, actual=digest.hexdigest(), size=size)
            await asyncio.to_thread(os.replace, partial, path)
        finally:
            _remove(partial)
        return ObjectRef(uri=uri, sha256=digest.hexdigest(), size=size)

    async def exists(self, target: str | ObjectRef) -> bool:
        """True when an object is stored at the key or URI."""
        return await self._stat(self.key_for(target)) is not None

    async def delete(self, target: str | ObjectRef) -> bool:
        """Remove the object; True when it existed (deleting a missing object is not an error)."""
        key = self.key_for(target)
        existed = await self._delete(key)
        log.debug("objectstore.delete", uri=self.uri_for(key), existed=existed)
        return existed

    async def list(self, prefix: str = "") -> list[str]:
        """Sorted keys that start with `prefix` (a plain string prefix, as in S3 and GCS)."""
        return sorted(await self._list(validate_prefix(prefix)))

    # --- helpers --------------------------------------------------------------------------

    def _resolve(self, target: str | ObjectRef, sha256: str | None) -> tuple[str, str | None]:
        """The key and the expected sha256 (explicit argument first, then the ObjectRef's)."""
        expected = sha256 if sha256 is not None else getattr(target, "sha256", None)
        if expected is not None:
            expected = normalize_sha256(expected)
        return self.key_for(target), expected

    async def _holds(self, key: str, existing: StoredObject, sha: str, size: int) -> bool:
        """True when the stored object already has this content (hashing it if need be)."""
        if existing.size != size:
            return False
        if existing.sha256 is not None:
            return existing.sha256 == sha
        digest = hashlib.sha256()
        async for chunk in self._read_chunks(key, CHUNK_SIZE):
            digest.update(chunk)
        return digest.hexdigest() == sha

    async def _hash_source_file(self, path: Path) -> tuple[str, int]:
        """sha256 and size of a file given to put(), with a clear error when it is unreadable."""
        try:
            return await asyncio.to_thread(sha256_file, path)
        except OSError as exc:
            raise ObjectStoreError(
                f"cannot read {path} to store it: {exc.strerror or exc}",
                problems=["put() takes a path to a readable regular file"],
            ) from exc

    async def _spool(self, chunks: AsyncIterable[bytes]) -> tuple[Path, str, int]:
        """Write a stream to a temp file while hashing it; the sha256 must be known before commit."""
        spool_dir = self._spool_dir()
        try:
            if spool_dir is not None:
                await asyncio.to_thread(spool_dir.mkdir, parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix="spool-", suffix=".part", dir=spool_dir)
        except OSError as exc:
            where = spool_dir or tempfile.gettempdir()
            raise ObjectStoreError(
                f"cannot spool a streamed put under {where}: {exc.strerror or exc}",
                problems=["check that the folder is writable and has free space"],
            ) from exc
        path = Path(name)
        digest = hashlib.sha256()
        size = 0
        buffer = bytearray()
        try:
            with os.fdopen(fd, "wb") as handle:
                async for chunk in chunks:
                    if not isinstance(chunk, bytes | bytearray | memoryview):
                        raise ObjectStoreError(
                            f"a streamed put yielded {type(chunk).__name__}, expected bytes"
                        )
                    digest.update(chunk)
                    size += len(chunk)
                    buffer += chunk
                    # Batch small chunks so each thread hop writes at least a MiB.
                    if len(buffer) >= CHUNK_SIZE:
                        await asyncio.to_thread(handle.write, bytes(buffer))
                        buffer.clear()
                if buffer:
                    await asyncio.to_thread(handle.write, bytes(buffer))
                await asyncio.to_thread(_flush_and_sync, handle)
        except BaseException:
            _remove(path)
            raise
        return path, digest.hexdigest(), size


def _flush_and_sync(handle: BinaryIO) -> None:
    """Flush a file and fsync it, so a committed blob survives a crash."""
    handle.flush()
    os.fsync(handle.fileno())


def _remove(path: Path) -> None:
    """Delete a temp file if it is still there (one quick metadata call, fine on the loop)."""
    path.unlink(missing_ok=True)
