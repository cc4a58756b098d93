"""S3 (and S3-compatible: MinIO, moto) through aioboto3; part of the cloud layer (`cloud` extra)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import aioboto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from rollout.shared.objectstore.base import ObjectStore, StoredObject
from rollout.shared.objectstore.errors import InvalidObjectKey, ObjectNotFound, ObjectStoreError
from rollout.shared.objectstore.keys import normalize_store_prefix

# Where the sha256 is kept on each object (x-amz-meta-sha256), so a re-put can skip the upload.
SHA256_METADATA = "sha256"
_MISSING_OBJECT = {"NoSuchKey", "404", "NotFound"}
_MISSING_BUCKET = {"NoSuchBucket"}


class S3ObjectStore(ObjectStore):
    """Objects under `s3://bucket/prefix/`; `endpoint_url` points at MinIO or moto."""

    scheme: ClassVar[str] = "s3"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ObjectStoreError(
                f"invalid S3 bucket name {bucket!r}", problems=["expected s3://bucket/prefix"]
            )
        self.bucket = bucket
        self.prefix = normalize_store_prefix(prefix)
        self.endpoint_url = endpoint_url
        self._session = aioboto3.Session(
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            aws_session_token=session_token,
            region_name=region,
        )
        self._stack: AsyncExitStack | None = None
        self._client: Any = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.base_uri!r}, endpoint_url={self.endpoint_url!r})"

    @property
    def base_uri(self) -> str:
        """`s3://bucket/prefix/`."""
        return f"s3://{self.bucket}/{self.prefix}"

    def uri_for(self, key: str) -> str:
        """`s3://bucket/prefix/key` (keys appear verbatim, as the AWS CLI writes them)."""
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

    async def _s3(self) -> Any:
        """The aiobotocore client, opened on first use inside the running event loop."""
        async with self._lock:
            if self._client is None:
                stack = AsyncExitStack()
                config = Config(retries={"max_attempts": 3, "mode": "standard"})
                self._client = await stack.enter_async_context(
                    self._session.client("s3", endpoint_url=self.endpoint_url, config=config)
                )
                self._stack = stack
            return self._client

    async def close(self) -> None:
        """Close the HTTP client."""
        async with self._lock:
            if self._stack is not None:
                await self._stack.aclose()
            self._stack = None
            self._client = None

    async def _write_bytes(self, key: str, data: bytes, sha256: str) -> None:
        s3 = await self._s3()
        try:
            await s3.put_object(
                Bucket=self.bucket,
                Key=self.prefix + key,
                Body=data,
                Metadata={SHA256_METADATA: sha256},
            )
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, key)

    async def _write_file(
        self, key: str, path: Path, sha256: str, size: int, *, owned: bool
    ) -> None:
        s3 = await self._s3()
        try:
            # Managed transfer: multipart above 8 MiB, reading the file in chunks.
            await s3.upload_file(
                str(path),
                self.bucket,
                self.prefix + key,
                ExtraArgs={"Metadata": {SHA256_METADATA: sha256}},
                Config=TransferConfig(),
            )
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, key)

    async def _stat(self, key: str) -> StoredObject | None:
        s3 = await self._s3()
        try:
            head = await s3.head_object(Bucket=self.bucket, Key=self.prefix + key)
        except (ClientError, BotoCoreError) as exc:
            if _code(exc) in _MISSING_OBJECT:
                return None
            self._raise(exc, key)
        sha = (head.get("Metadata") or {}).get(SHA256_METADATA)
        return StoredObject(size=int(head["ContentLength"]), sha256=sha or None)

    async def _read_chunks(self, key: str, chunk_size: int) -> AsyncIterator[bytes]:
        s3 = await self._s3()
        try:
            response = await s3.get_object(Bucket=self.bucket, Key=self.prefix + key)
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, key)
        body = response["Body"]
        # Entering the body releases the HTTP connection on exit, even if the reader stops early.
        async with body:
            async for chunk in body.iter_chunks(chunk_size):
                yield chunk

    async def _delete(self, key: str) -> bool:
        if await self._stat(key) is None:
            return False
        s3 = await self._s3()
        try:
            await s3.delete_object(Bucket=self.bucket, Key=self.prefix + key)
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, key)
        return True

    async def _list(self, prefix: str) -> list[str]:
        s3 = await self._s3()
        keys: list[str] = []
        try:
            paginator = s3.get_paginator("list_objects_v2")
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                keys.extend(item["Key"][len(self.prefix) :] for item in page.get("Contents", []))
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, prefix or "")
        return keys

    def _raise(self, exc: ClientError | BotoCoreError, key: str) -> NoReturn:
        """Translate botocore errors into ObjectStoreErrors that say what to fix."""
        code = _code(exc)
        if code in _MISSING_OBJECT:
            raise ObjectNotFound(self.uri_for(key)) from exc
        if code in _MISSING_BUCKET:
            raise ObjectStoreError(
                f"S3 bucket {self.bucket!r} does not exist ({self._where()})",
                problems=["create the bucket, or point the object store URL at an existing one"],
            ) from exc
        if isinstance(exc, NoCredentialsError) or code in {"InvalidAccessKeyId", "AccessDenied"}:
            raise ObjectStoreError(
                f"S3 refused access to {self.uri_for(key)} ({self._where()}): {exc}",
                problems=["set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or an AWS profile"],
            ) from exc
        raise ObjectStoreError(
            f"S3 request for {self.uri_for(key)} failed ({self._where()}): {exc}"
        ) from exc

    def _where(self) -> str:
        return f"endpoint {self.endpoint_url}" if self.endpoint_url else "AWS"


def _code(exc: Exception) -> str:
    """The S3 error code of a ClientError ('' for transport errors)."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""
