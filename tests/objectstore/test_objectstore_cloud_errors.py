"""Cloud backends fail with errors that say what to fix: missing bucket, unreachable endpoint."""

from __future__ import annotations

import socket

import pytest
from objectstore_backends import gcs_store, s3_store

from rollout.shared.objectstore import ObjectStore, ObjectStoreError


def _closed_port() -> int:
    # Bound then released: nothing listens there for the rest of the test.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_s3_missing_bucket(moto_endpoint: str) -> None:
    async with s3_store(moto_endpoint, "p", bucket="no-such-bucket") as store:
        with pytest.raises(ObjectStoreError, match="S3 bucket 'no-such-bucket' does not exist"):
            await store.put("k", b"x")
        with pytest.raises(ObjectStoreError, match="does not exist"):
            await store.list()


async def test_gcs_missing_bucket(gcs_endpoint: str) -> None:
    async with gcs_store(gcs_endpoint, "p", bucket="no-such-bucket") as store:
        with pytest.raises(ObjectStoreError, match="GCS bucket 'no-such-bucket' does not exist"):
            await store.put("k", b"x")
        with pytest.raises(ObjectStoreError, match="does not exist"):
            await store.list()


@pytest.mark.parametrize("kind", ["s3", "gcs"])
async def test_unreachable_endpoint(kind: str) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    store: ObjectStore = s3_store(endpoint, "p") if kind == "s3" else gcs_store(endpoint, "p")
    async with store:
        with pytest.raises(ObjectStoreError) as caught:
            await store.get("k")
    assert endpoint in str(caught.value)
