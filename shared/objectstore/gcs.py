"""Google Cloud Storage through gcloud-aio-storage; part of the cloud layer (`cloud` extra)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import aiohttp
from gcloud.aio.storage import Storage
from gcloud.aio.storage.storage import MAX_CONTENT_LENGTH_SIMPLE_UPLOAD

from rollout.shared.objectstore.base import ObjectStore, StoredObject
from rollout.shared.objectstore.errors import InvalidObjectKey, ObjectNotFound, ObjectStoreError
from rollout.shared.objectstore.keys import normalize_store_prefix

# Kept as custom object metadata, so a re-put can skip the upload.
SHA256_METADATA = "sha256"
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


class GCSObjectStore(ObjectStore):
    """Objects under `gs://bucket/prefix/`; `emulator_host` (or STORAGE_EMULATOR_HOST) for tests."""

    scheme: ClassVar[str] = "gs"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        emulator_host: str | None = None,
        service_file: str | None = None,
        timeout_s: int = 300,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ObjectStoreError(
                f"invalid GCS bucket name {bucket!r}", problems=["expected gs://bucket/prefix"]
            )
        self.bucket = bucket
        self.prefix = normalize_store_prefix(prefix)
        host = emulator_host or os.environ.get(EMULATOR_ENV) or None
        if host and not host.startswith(("http://", "https://")):
            host = f"http://{host}"
        self.emulator_host = host
        self.service_file = service_file
        self.timeout_s = timeout_s
        self._storage: Storage | None = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"GCSObjectStore({self.base_uri!r}, emulator_host={self.emulator_host!r})"

    @property
    def base_uri(self) -> str:
        """`gs://bucket/prefix/`."""
        return f"gs://{self.bucket}/{self.prefix}"

    def uri_for(self, key: str) -> str:
        """`gs://bucket/prefix/key` (keys appear verbatim, as gsutil writes them)."""
        return self.base_uri + key

    def _key_from_uri(self, uri: str) -> str:
        if not uri.startswith(self.base_uri):
            raise InvalidObjectKey(
                f"URI {uri!r} is not in this store",
                problems=[f"this store holds URIs under {self.base_uri}"],
            )
        return uri[len(self.base_uri) :]

    def _prefix_bytes(self) -> int:
        return len(self.prefix.encode())

    async def _gcs(self) -> Storage:
        """The client, created on first use inside the running event loop (aiohttp needs one)."""
        async with self._lock:
            if self._storage is None:
                # An explicit api_root puts the client in dev mode: no auth, plain HTTP.
                self._storage = Storage(api_root=self.emulator_host, service_file=self.service_file)
            return self._storage

    async def close(self) -> None:
        """Close the HTTP session."""
        async with self._lock:
            if self._storage is not None:
                await self._storage.close()
            self._storage = None

    async def _write_bytes(self, key: str, data: bytes, sha256: str) -> None:
        await self._upload(key, data, sha256)

    async def _write_file(
        self, key: str, path: Path, sha256: str, size: int, *, owned: bool
    ) -> None:
        if size <= MAX_CONTENT_LENGTH_SIMPLE_UPLOAD:
            # The client reads small files whole for a multipart upload; do that off the loop.
            await self._upload(key, await asyncio.to_thread(path.read_bytes), sha256)
            return
        handle = await asyncio.to_thread(path.open, "rb")
        try:
            # Above 5 MiB the client makes a resumable upload that streams the file.
            await self._upload(key, handle, sha256)
        finally:
            await asyncio.to_thread(handle.close)

    async def _upload(self, key: str, data: Any, sha256: str) -> None:
        storage = await self._gcs()
        try:
            await storage.upload(
                self.bucket,
                self.prefix + key,
                data,
                content_type="application/octet-stream",
                metadata={"metadata": {SHA256_METADATA: sha256}},
                timeout=self.timeout_s,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._raise(exc, key, missing_means_bucket=True)

    async def _stat(self, key: str) -> StoredObject | None:
        storage = await self._gcs()
        try:
            meta = await storage.download_metadata(
                self.bucket, self.prefix + key, timeout=self.timeout_s
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            if _status(exc) == 404:
                return None
            self._raise(exc, key)
        sha = (meta.get("metadata") or {}).get(SHA256_METADATA)
        return StoredObject(size=int(meta.get("size", 0)), sha256=sha or None)

    async def _read_chunks(self, key: str, chunk_size: int) -> AsyncIterator[bytes]:
        storage = await self._gcs()
        try:
            stream = await storage.download_stream(
                self.bucket, self.prefix + key, timeout=self.timeout_s
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._raise(exc, key)
        async with stream:
            while chunk := await stream.read(chunk_size):
                yield chunk

    async def _delete(self, key: str) -> bool:
        storage = await self._gcs()
        try:
            await storage.delete(self.bucket, self.prefix + key, timeout=self.timeout_s)
        except (aiohttp.ClientError, TimeoutError) as exc:
            if _status(exc) == 404:
                return False
            self._raise(exc, key)
        return True

    async def _list(self, prefix: str) -> list[str]:
        storage = await self._gcs()
        keys: list[str] = []
        params = {"prefix": self.prefix + prefix}
        try:
            while True:
                page = await storage.list_objects(
                    self.bucket, params=params, timeout=self.timeout_s
                )
                keys.extend(item["name"][len(self.prefix) :] for item in page.get("items", []))
                token = page.get("nextPageToken")
                if not token:
                    return keys
                params = {**params, "pageToken": token}
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._raise(exc, prefix, missing_means_bucket=True)

    def _raise(self, exc: Exception, key: str, *, missing_means_bucket: bool = False) -> NoReturn:
        """Translate HTTP errors into ObjectStoreErrors that say what to fix."""
        status = _status(exc)
        if status == 404 and missing_means_bucket:
            raise ObjectStoreError(
                f"GCS bucket {self.bucket!r} does not exist ({self._where()})",
                problems=["create the bucket, or point the object store URL at an existing one"],
            ) from exc
        if status == 404:
            raise ObjectNotFound(self.uri_for(key)) from exc
        if status in (401, 403):
            raise ObjectStoreError(
                f"GCS refused access to {self.uri_for(key)} ({self._where()})",
                problems=["set GOOGLE_APPLICATION_CREDENTIALS or pass a service account file"],
            ) from exc
        if isinstance(exc, aiohttp.ClientConnectionError | TimeoutError):
            raise ObjectStoreError(
                f"cannot reach GCS ({self._where()}): {exc}",
                problems=[f"check the network, or {EMULATOR_ENV} when using an emulator"],
            ) from exc
        raise ObjectStoreError(
            f"GCS request for {self.uri_for(key)} failed ({self._where()}): {exc}"
        ) from exc

    def _where(self) -> str:
        return f"emulator {self.emulator_host}" if self.emulator_host else "storage.googleapis.com"


def _status(exc: Exception) -> int | None:
    """The HTTP status of a failed request, if it got that far."""
    return exc.status if isinstance(exc, aiohttp.ClientResponseError) else None
